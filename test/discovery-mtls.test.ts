// Istio's mTLS in the discovery server's clusters: auto-mTLS for endpoints labelled as having a sidecar
// (transport socket matches on tlsMode, the SPIFFE id of the endpoint's service account checked), a
// DestinationRule's ISTIO_MUTUAL (with its subjectAltNames) and DISABLE; certificates from the agent's SDS.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { MemoryConfigStore } from '../lib/discovery/config-store';
import { FileConfigSource } from '../lib/discovery/file-source';
import { generate } from '../lib/discovery/generate';
import { proxyFromNode } from '../lib/discovery/proxy';
import { PushContext } from '../lib/discovery/push-context';
import { ServiceEntryRegistry } from '../lib/discovery/registry';
import { TYPE_URLS } from '../lib/discovery/resources';
import { formatIssue } from '../lib/discovery/yaml-file';
import { unpackAny } from '../lib/envoy-protos';
import { tempDir } from './helpers/harness';

const SE = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: web, namespace: shop }
spec:
  hosts: [web.shop.local]
  location: MESH_INTERNAL
  ports: [{ number: 8080, name: http, protocol: HTTP }]
  endpoints:
  - { address: 10.0.0.1, ports: { http: 9080 }, labels: { security.istio.io/tlsMode: istio }, serviceAccount: web }
  - { address: 10.0.0.2, ports: { http: 9080 } }
`;

async function clusters(files: Record<string, string>): Promise<{ cluster: Record<string, any>; endpoints: Record<string, any> }> {
  const dir = tempDir();
  try {
    for (const [n, t] of Object.entries(files)) fs.writeFileSync(path.join(dir.path, n), t);
    const store = new MemoryConfigStore();
    const reg = new ServiceEntryRegistry(store);
    reg.run();
    const src = new FileConfigSource({ dir: dir.path, store });
    assert.equal((await src.sync({ report: false })).issues.map(formatIssue), []);
    const push = PushContext.build('x', store, reg);
    const proxy = proxyFromNode({ id: 'sidecar~10.0.0.9~c.shop~shop.svc.cluster.local' });
    const name = 'outbound|8080||web.shop.local';
    const cluster = unpackAny(generate(push, proxy, TYPE_URLS.cluster).get(name)!.any) as Record<string, any>;
    const endpoints = unpackAny(generate(push, proxy, TYPE_URLS.endpoint).get(name)!.any) as Record<string, any>;
    return { cluster, endpoints };
  } finally {
    dir.cleanup();
  }
}

const tlsOf = (ts: Record<string, any>) => unpackAny(ts.typed_config) as Record<string, any>;

test('auto-mTLS: endpoints with a sidecar get mTLS from SDS with their SPIFFE id checked, the others plaintext', async () => {
  const { cluster, endpoints } = await clusters({ 'se.yaml': SE });
  assert.is(cluster.transport_socket, undefined);
  const [istio, plain] = cluster.transport_socket_matches;
  assert.is(istio.name, 'tlsMode-istio');
  assert.equal(istio.match, { fields: { tlsMode: { stringValue: 'istio' } } });
  const tls = tlsOf(istio.transport_socket);
  assert.is(tls.sni, 'outbound_.8080_._.web.shop.local');
  const ctx = tls.common_tls_context;
  assert.is(ctx.tls_certificate_sds_secret_configs[0].name, 'default');
  assert.is(ctx.tls_certificate_sds_secret_configs[0].sds_config.api_config_source.grpc_services[0].envoy_grpc.cluster_name, 'sds-grpc');
  assert.is(ctx.combined_validation_context.validation_context_sds_secret_config.name, 'ROOTCA');
  assert.equal(ctx.combined_validation_context.default_validation_context.match_typed_subject_alt_names, [
    { san_type: 'URI', matcher: { safe_regex: { regex: '^spiffe://[^/]+/ns/shop/sa/web$' } } },
  ]);
  assert.is(plain.transport_socket.name, 'envoy.transport_sockets.raw_buffer');
  const eps = endpoints.endpoints[0].lb_endpoints;
  assert.equal(eps[0].metadata, { filter_metadata: { 'envoy.transport_socket_match': { fields: { tlsMode: { stringValue: 'istio' } } } } });
  assert.is(eps[1].metadata, undefined);
});

test('DestinationRule tls ISTIO_MUTUAL forces mTLS (its subjectAltNames checked); DISABLE turns auto-mTLS off', async () => {
  const dr = (tls: string) => `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: { name: web, namespace: shop }
spec:
  host: web.shop.local
  trafficPolicy: { tls: ${tls} }
`;
  const mutual = (await clusters({ 'se.yaml': SE, 'dr.yaml': dr('{ mode: ISTIO_MUTUAL, subjectAltNames: [spiffe://cluster.local/ns/shop/sa/web] }') })).cluster;
  assert.is(mutual.transport_socket_matches, undefined);
  assert.equal(tlsOf(mutual.transport_socket).common_tls_context.combined_validation_context.default_validation_context.match_typed_subject_alt_names, [
    { san_type: 'URI', matcher: { exact: 'spiffe://cluster.local/ns/shop/sa/web' } },
  ]);
  const off = (await clusters({ 'se.yaml': SE, 'dr.yaml': dr('{ mode: DISABLE }') })).cluster;
  assert.is(off.transport_socket, undefined);
  assert.is(off.transport_socket_matches, undefined);
});

test('DestinationRule tls in portLevelSettings overrides the top-level tls for that port only', async () => {
  const dr = `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: { name: web, namespace: shop }
spec:
  host: web.shop.local
  trafficPolicy:
    tls: { mode: DISABLE }
    portLevelSettings:
    - port: { number: 8080 }
      tls: { mode: ISTIO_MUTUAL }
`;
  const c = (await clusters({ 'se.yaml': SE, 'dr.yaml': dr })).cluster;
  assert.is(c.transport_socket_matches, undefined);
  assert.is(tlsOf(c.transport_socket).sni, 'outbound_.8080_._.web.shop.local');
  const other = (await clusters({ 'se.yaml': SE, 'dr.yaml': dr.replace('number: 8080', 'number: 9999') })).cluster;
  assert.is(other.transport_socket, undefined, 'top-level DISABLE holds on the other ports');
  assert.is(other.transport_socket_matches, undefined);
});

async function inbound(files: Record<string, string>, nodeIp: string): Promise<{ listeners: Record<string, any>[]; clusters: Record<string, any>[] }> {
  const dir = tempDir();
  try {
    for (const [n, t] of Object.entries(files)) fs.writeFileSync(path.join(dir.path, n), t);
    const store = new MemoryConfigStore();
    const reg = new ServiceEntryRegistry(store);
    reg.run();
    const src = new FileConfigSource({ dir: dir.path, store });
    assert.equal((await src.sync({ report: false })).issues.map(formatIssue), []);
    const push = PushContext.build('x', store, reg);
    const proxy = proxyFromNode({ id: `sidecar~${nodeIp}~web-1.shop~shop.svc.cluster.local` });
    const pick = (t: string) => [...generate(push, proxy, t).values()].filter((r) => r.name.startsWith('inbound')).map((r) => unpackAny(r.any) as Record<string, any>);
    return { listeners: pick(TYPE_URLS.listener), clusters: pick(TYPE_URLS.cluster) };
  } finally {
    dir.cleanup();
  }
}

const PA = (mode: string) => `apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: { name: default, namespace: shop }
spec: { mtls: { mode: ${mode} } }
`;

test('inbound for the sidecar\'s own workload: PERMISSIVE by default (TLS inspector, mTLS and plaintext chains), STRICT mTLS only, DISABLE plaintext only', async () => {
  const none = await inbound({ 'se.yaml': SE }, '10.0.0.9');
  assert.equal(none.listeners, [], 'no inbound for a proxy that is not an endpoint');
  const def = await inbound({ 'se.yaml': SE }, '10.0.0.1');
  assert.is(def.listeners.length, 1);
  const l = def.listeners[0]!;
  assert.is(l.name, 'inbound_10.0.0.1_9080');
  assert.equal(l.address.socket_address, { address: '10.0.0.1', port_value: 9080 });
  assert.is(l.listener_filters[0].name, 'envoy.filters.listener.tls_inspector');
  assert.is(l.filter_chains.length, 2);
  assert.equal(l.filter_chains[0].filter_chain_match, { transport_protocol: 'tls' });
  const tls = unpackAny(l.filter_chains[0].transport_socket.typed_config) as Record<string, any>;
  assert.equal(tls.require_client_certificate, { value: true });
  assert.is(tls.common_tls_context.tls_certificate_sds_secret_configs[0].name, 'default');
  assert.is(l.filter_chains[1].transport_socket, undefined);
  // istiod's inbound HCM: the caller's subject, SPIFFE URI and DNS SANs appended to any XFCC already there.
  const hcm = unpackAny(l.filter_chains[0].filters[0].typed_config) as Record<string, any>;
  assert.is(hcm.forward_client_cert_details, 'APPEND_FORWARD');
  assert.equal(hcm.set_current_client_cert_details, { subject: { value: true }, dns: true, uri: true });
  assert.is(hcm.server_name, 'istio-envoy');
  assert.equal(def.clusters.map((c) => [c.name, c.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address]), [['inbound|9080||', { address: '127.0.0.1', port_value: 9080 }]]);
  const strict = (await inbound({ 'se.yaml': SE, 'pa.yaml': PA('STRICT') }, '10.0.0.1')).listeners[0]!;
  assert.is(strict.filter_chains.length, 1);
  assert.ok(strict.filter_chains[0].transport_socket);
  assert.is(strict.listener_filters, undefined);
  const off = (await inbound({ 'se.yaml': SE, 'pa.yaml': PA('DISABLE') }, '10.0.0.1')).listeners[0]!;
  assert.is(off.filter_chains.length, 1);
  assert.is(off.filter_chains[0].transport_socket, undefined);
});

test('a Sidecar that hides every service leaves the sidecar its inbound cluster and the fixed clusters', async () => {
  const sidecar = `apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: { name: default, namespace: shop }
spec:
  egress:
  - hosts: ["./nothing.shop.local"]
`;
  const dir = tempDir();
  try {
    fs.writeFileSync(path.join(dir.path, 'se.yaml'), SE);
    fs.writeFileSync(path.join(dir.path, 'sc.yaml'), sidecar);
    const store = new MemoryConfigStore();
    const reg = new ServiceEntryRegistry(store);
    reg.run();
    const src = new FileConfigSource({ dir: dir.path, store });
    assert.equal((await src.sync({ report: false })).issues.map(formatIssue), []);
    const push = PushContext.build('x', store, reg);
    const proxy = proxyFromNode({ id: 'sidecar~10.0.0.1~web-1.shop~shop.svc.cluster.local' });
    assert.equal([...generate(push, proxy, TYPE_URLS.cluster).keys()].sort(), ['BlackHoleCluster', 'PassthroughCluster', 'inbound|9080||']);
  } finally {
    dir.cleanup();
  }
});

test.run();
