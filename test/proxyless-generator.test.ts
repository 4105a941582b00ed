// The embedded discovery server's grpc generator (lib/discovery/gen-grpc.ts), driven by a bare ADS client playing
// a gRPC library whose node says GENERATOR=grpc: the resources by name, in the shapes istiod's grpcgen gives
// (api_listener over RDS named like the cluster, one virtual host per route configuration, EDS clusters with the
// DestinationRule's policy, endpoints in a weighted locality, the xDS server's inbound listener plaintext or mTLS).
// A node without GENERATOR still gets Envoy's resources.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { unpackAny } from '../lib/envoy-protos';
import { DiscoveryServer } from '../lib/discovery/index';
import { TYPE_URLS } from '../lib/discovery/resources';
import { configureLogging, resetLogging } from '../lib/log';
import { AdsClient } from './helpers/discovery-client';
import { tempDir } from './helpers/harness';

type Json = Record<string, any>;
const HOST = 'echo.test.svc.cluster.local';
const GRPC_META = { fields: { GENERATOR: { stringValue: 'grpc' } } };
const NODE = { id: 'sidecar~127.0.0.1~client-1.test~test.svc.cluster.local', metadata: GRPC_META };

const MESH = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: echo, namespace: test}
spec:
  hosts: [${HOST}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {number: 7070, name: grpc, protocol: GRPC}
  endpoints:
  - {address: 127.0.0.1, ports: {grpc: 17071}, labels: {version: v1}, serviceAccount: echo}
  - {address: 10.0.0.9, ports: {grpc: 17072}, labels: {version: v2}, weight: 3}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: test}
spec:
  host: ${HOST}
  trafficPolicy:
    loadBalancer: {simple: LEAST_REQUEST}
    connectionPool: {http: {http2MaxRequests: 17}}
  subsets:
  - {name: v1, labels: {version: v1}, trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}}
  - {name: v2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: test}
spec:
  hosts: [${HOST}]
  http:
  - match: [{headers: {x-version: {exact: v2}}}]
    route: [{destination: {host: ${HOST}, subset: v2}}]
  - route: [{destination: {host: ${HOST}, subset: v1}}]
`;

async function withServer(extra: string, fn: (c: (node?: Json) => AdsClient, s: DiscoveryServer, dir: string) => Promise<void>): Promise<void> {
  const dir = tempDir('pa-grpcgen-');
  configureLogging({ write: () => undefined });
  fs.writeFileSync(path.join(dir.path, 'mesh.yaml'), MESH + extra);
  const s = new DiscoveryServer({ configDir: dir.path, listen: '127.0.0.1:0', debounceMs: 10 });
  const clients: AdsClient[] = [];
  try {
    await s.start();
    await fn(() => {
      const c = AdsClient.connect(s.address, false);
      clients.push(c);
      return c;
    }, s, dir.path);
  } finally {
    for (const c of clients) c.close();
    await s.close();
    resetLogging();
    dir.cleanup();
  }
}

async function get(c: AdsClient, type: string, names: string[], node?: Json): Promise<Map<string, Json>> {
  c.send({ ...(node && { node }), type_url: type, resource_names: names });
  const r = await c.next(type);
  c.send({ type_url: type, resource_names: names, version_info: r.version_info, response_nonce: r.nonce });
  return new Map(r.resources.map((a) => {
    const o = unpackAny(a as never) as Json;
    return [o.name ?? o.cluster_name, o];
  }));
}

test('LDS: api_listener listeners for the names gRPC dials (FQDN and short), HCM over RDS named like the cluster', () =>
  withServer('', async (connect) => {
    const c = connect();
    const l = await get(c, TYPE_URLS.listener, [`${HOST}:7070`, 'echo:7070', 'echo.test:7070', 'nope:7070', `${HOST}:9999`], NODE);
    assert.equal([...l.keys()].sort(), [`${HOST}:7070`, 'echo.test:7070', 'echo:7070']);
    const hcm = unpackAny(l.get('echo:7070')!.api_listener.api_listener) as Json;
    assert.is(hcm.rds.route_config_name, `outbound|7070||${HOST}`);
    assert.ok(hcm.rds.config_source.ads);
    assert.equal(hcm.http_filters.map((f: Json) => f.name), ['envoy.filters.http.fault', 'envoy.filters.http.router']);
    assert.is(l.get('echo:7070')!.address.socket_address.port_value, 7070);
  }));

test('RDS: one virtual host answering every name of the service, with the VirtualService routes', () =>
  withServer('', async (connect) => {
    const c = connect();
    await get(c, TYPE_URLS.listener, [`${HOST}:7070`], NODE);
    const r = (await get(c, TYPE_URLS.route, [`outbound|7070||${HOST}`])).get(`outbound|7070||${HOST}`)!;
    assert.is(r.virtual_hosts.length, 1);
    const vh = r.virtual_hosts[0];
    for (const d of ['echo:7070', 'echo.test:7070', 'echo.test.svc:7070', `${HOST}:7070`, HOST]) assert.ok(vh.domains.includes(d), d);
    assert.is(vh.routes[0].match.headers[0].name, 'x-version');
    assert.is(vh.routes[0].route.cluster, `outbound|7070|v2|${HOST}`);
    assert.is(vh.routes[1].route.cluster, `outbound|7070|v1|${HOST}`);
  }));

test('CDS and EDS: EDS clusters with the DestinationRule policy, ISTIO_MUTUAL from the bootstrap certificate provider', () =>
  withServer('', async (connect) => {
    const c = connect();
    await get(c, TYPE_URLS.listener, [`${HOST}:7070`], NODE);
    const names = [`outbound|7070||${HOST}`, `outbound|7070|v1|${HOST}`, `outbound|7070|v2|${HOST}`, `outbound|7070|v9|${HOST}`];
    const cl = await get(c, TYPE_URLS.cluster, names);
    assert.equal([...cl.keys()].sort(), names.slice(0, 3).sort());
    const def = cl.get(names[0]!)!;
    assert.is(def.type, 'EDS');
    assert.is(def.eds_cluster_config.service_name, names[0]);
    assert.is(def.lb_policy, 'LEAST_REQUEST');
    assert.is(def.circuit_breakers.thresholds[0].max_requests.value, 17);
    assert.is(def.transport_socket, undefined, 'no auto-mTLS for gRPC');
    const tls = unpackAny(cl.get(names[1]!)!.transport_socket.typed_config) as Json;
    assert.equal(tls.common_tls_context.tls_certificate_provider_instance, { instance_name: 'default', certificate_name: 'default' });
    const vc = tls.common_tls_context.combined_validation_context.default_validation_context;
    assert.equal(vc.ca_certificate_provider_instance, { instance_name: 'default', certificate_name: 'ROOTCA' });
    assert.equal(vc.match_subject_alt_names, [{ safe_regex: { regex: '^spiffe://[^/]+/ns/test/sa/echo$' } }]);
    const eds = await get(c, TYPE_URLS.endpoint, names.slice(0, 2));
    const all = eds.get(names[0]!)!;
    assert.equal(all.endpoints.length, 1);
    assert.ok(all.endpoints[0].locality, 'a locality (gRPC rejects endpoints without)');
    assert.is(all.endpoints[0].load_balancing_weight.value, 4, 'the locality weight (gRPC skips localities without)');
    assert.equal(eds.get(names[1]!)!.endpoints[0].lb_endpoints.map((e: Json) => e.endpoint.address.socket_address.port_value), [17071]);
  }));

test('inbound LDS for an xDS server: its own endpoint port, plaintext under PERMISSIVE, unknown ports left out', () =>
  withServer('', async (connect) => {
    const c = connect();
    const l = await get(c, TYPE_URLS.listener, ['xds.istio.io/grpc/lds/inbound/127.0.0.1:17071', 'xds.istio.io/grpc/lds/inbound/127.0.0.1:17999'], NODE);
    assert.equal([...l.keys()], ['xds.istio.io/grpc/lds/inbound/127.0.0.1:17071']);
    const lis = l.get('xds.istio.io/grpc/lds/inbound/127.0.0.1:17071')!;
    assert.equal(lis.address.socket_address, { address: '127.0.0.1', port_value: 17071 });
    assert.is(lis.filter_chains[0].name, 'inbound-plaintext');
    assert.is(lis.filter_chains[0].transport_socket, undefined);
    const hcm = unpackAny(lis.filter_chains[0].filters[0].typed_config) as Json;
    assert.ok(hcm.route_config.virtual_hosts[0].routes[0].non_forwarding_action);
  }));

test('inbound LDS under PeerAuthentication STRICT: mTLS with a client certificate required', () =>
  withServer('---\napiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: default, namespace: test}\nspec: {mtls: {mode: STRICT}}\n', async (connect) => {
    const c = connect();
    const lis = (await get(c, TYPE_URLS.listener, ['xds.istio.io/grpc/lds/inbound/127.0.0.1:17071'], NODE)).get('xds.istio.io/grpc/lds/inbound/127.0.0.1:17071')!;
    assert.is(lis.filter_chains[0].name, 'inbound-mtls');
    const tls = unpackAny(lis.filter_chains[0].transport_socket.typed_config) as Json;
    assert.is(tls.require_client_certificate.value, true);
    assert.equal(tls.common_tls_context.tls_certificate_provider_instance.instance_name, 'default');
  }));

test('a node without GENERATOR=grpc still gets Envoy\'s listeners', () =>
  withServer('', async (connect) => {
    const c = connect();
    const l = await get(c, TYPE_URLS.listener, [], { id: NODE.id });
    assert.not.ok(l.has(`${HOST}:7070`));
    assert.ok([...l.values()].every((x) => !x.api_listener));
    assert.ok(l.size > 0);
  }));

test('a VirtualService edit is pushed to the gRPC node\'s route configuration', () =>
  withServer('', async (connect, s, dir) => {
    const c = connect();
    await get(c, TYPE_URLS.listener, [`${HOST}:7070`], NODE);
    const name = `outbound|7070||${HOST}`;
    assert.is((await get(c, TYPE_URLS.route, [name])).get(name)!.virtual_hosts[0].routes.length, 2);
    fs.writeFileSync(path.join(dir, 'mesh.yaml'), MESH.replace(`  - route: [{destination: {host: ${HOST}, subset: v1}}]\n`, ''));
    await s.reload();
    const r = await c.next(TYPE_URLS.route);
    const rc = unpackAny(r.resources[0] as never) as Json;
    assert.is(rc.name, name);
    assert.equal(rc.virtual_hosts[0].routes.map((x: Json) => x.route.cluster), [`outbound|7070|v2|${HOST}`]);
  }));

test.run();
