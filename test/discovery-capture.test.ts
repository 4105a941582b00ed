// What the discovery server sends a capture-mode sidecar (node metadata STANDALONE_CAPTURE) and, unchanged, one
// without it. The end-to-end proof, with iptables and a real Envoy in network namespaces, is capture-agent.test.ts.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { MemoryConfigStore } from '../lib/discovery/config-store';
import { FileConfigSource } from '../lib/discovery/file-source';
import { formatIssue } from '../lib/discovery/yaml-file';
import { generate } from '../lib/discovery/generate';
import { buildNameTable } from '../lib/discovery/gen-nametable';
import { proxyFromNode } from '../lib/discovery/proxy';
import { PushContext } from '../lib/discovery/push-context';
import { ServiceEntryRegistry } from '../lib/discovery/registry';
import { TYPE_URLS } from '../lib/discovery/resources';
import { unpackAny } from '../lib/envoy-protos';
import { tempDir } from './helpers/harness';

const TCP = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: tcp, namespace: demo}
spec:
  hosts: [db.example.local]
  ports: [{number: 5432, name: tcp, protocol: TCP}]
  resolution: DNS
  endpoints: [{address: db.internal}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: cidr, namespace: demo}
spec:
  hosts: [legacy.example.local]
  addresses: [10.8.0.0/16, 10.9.0.1]
  ports: [{number: 5432, name: tcp, protocol: TCP}]
  resolution: STATIC
  endpoints: [{address: 10.8.0.10}]
`;

const meta = (fields: Record<string, string>) => ({ fields: Object.fromEntries(Object.entries(fields).map(([k, v]) => [k, { stringValue: v }])) });

async function push(files: Record<string, string>, policy: 'ALLOW_ANY' | 'REGISTRY_ONLY' = 'ALLOW_ANY'): Promise<PushContext> {
  const dir = tempDir('pa-capture-gen-');
  try {
    for (const [f, t] of Object.entries(files)) fs.writeFileSync(path.join(dir.path, f), t);
    const store = new MemoryConfigStore();
    const reg = new ServiceEntryRegistry(store);
    reg.run();
    assert.equal((await new FileConfigSource({ dir: dir.path, store }).sync({ report: false })).issues.map(formatIssue), []);
    return PushContext.build('x', store, reg, undefined, { outboundTrafficPolicy: policy });
  } finally {
    dir.cleanup();
  }
}

const ID = 'sidecar~10.0.0.5~vm-1.demo~demo.svc.cluster.local';
type L = {
  name: string; address: { socket_address: { address: string; port_value: number } }; use_original_dst?: { value: boolean }; bind_to_port?: { value: boolean };
  listener_filters?: { name: string }[];
  filter_chains: { name?: string; filter_chain_match?: { destination_port?: { value: number }; prefix_ranges?: { address_prefix: string; prefix_len: { value: number } }[] }; filters: { name: string; typed_config: unknown }[] }[];
  default_filter_chain?: { name: string; filters: { typed_config: unknown }[] };
};
const listeners = (p: PushContext, metadata?: unknown) =>
  new Map([...generate(p, proxyFromNode({ id: ID, metadata }), TYPE_URLS.listener)].map(([k, r]) => [k, unpackAny(r.any) as unknown as L]));
const tcpCluster = (f: { typed_config: unknown }) => (unpackAny(f.typed_config as never) as { cluster: string }).cluster;

test('capture mode is off unless node metadata STANDALONE_CAPTURE is "true": loopback listeners as before', async () => {
  const p = await push({ 'tcp.yaml': TCP });
  assert.equal([...listeners(p).keys()], ['127.0.0.1_5432']);
  assert.equal([...listeners(p, meta({ STANDALONE_CAPTURE: 'false' })).keys()], ['127.0.0.1_5432']);
  assert.not.ok(proxyFromNode({ id: ID }).capture);
  assert.ok(proxyFromNode({ id: ID, metadata: meta({ STANDALONE_CAPTURE: 'true' }) }).capture);
});

test('capture mode: virtualOutbound with original destination, TCP services matched by address or auto VIP, passthrough for the rest; virtualInbound to the app', async () => {
  const p = await push({ 'tcp.yaml': TCP });
  const ls = listeners(p, meta({ STANDALONE_CAPTURE: 'true' }));
  assert.equal([...ls.keys()].sort(), ['0.0.0.0_5432', 'virtualInbound', 'virtualOutbound']);
  const out = ls.get('virtualOutbound')!;
  assert.equal([out.address.socket_address.port_value, out.use_original_dst?.value], [15001, true]);
  assert.is(tcpCluster(out.default_filter_chain!.filters[0]!), 'PassthroughCluster');
  assert.equal(out.filter_chains.map((c) => [c.filter_chain_match?.destination_port?.value, tcpCluster(c.filters[0]!)]), [[15001, 'BlackHoleCluster']], 'a direct connection to 15001 does not loop');

  const tcp = ls.get('0.0.0.0_5432')!;
  assert.is(tcp.bind_to_port?.value, false);
  const vip = buildNameTable(p).table['db.example.local']!.ips[0]!;
  assert.equal(tcp.filter_chains.map((c) => [c.filter_chain_match!.prefix_ranges!.map((r) => `${r.address_prefix}/${r.prefix_len.value}`), tcpCluster(c.filters[0]!)]), [
    [[`${vip}/32`], 'outbound|5432||db.example.local'],
    [['10.8.0.0/16', '10.9.0.1/32'], 'outbound|5432||legacy.example.local'],
  ], 'the DNS proxy\'s VIP and the ServiceEntry addresses pick the service');
  assert.is(tcpCluster(tcp.default_filter_chain!.filters[0]!), 'PassthroughCluster');

  const inb = ls.get('virtualInbound')!;
  assert.equal([inb.address.socket_address.port_value, inb.use_original_dst?.value ?? false], [15006, false]);
  assert.equal(inb.listener_filters!.map((f) => f.name), ['envoy.filters.listener.original_dst']);
  assert.is(tcpCluster(inb.default_filter_chain!.filters[0]!), 'InboundPassthroughCluster');

  const clusters = [...generate(p, proxyFromNode({ id: ID, metadata: meta({ STANDALONE_CAPTURE: 'true' }) }), TYPE_URLS.cluster).keys()];
  assert.ok(clusters.includes('InboundPassthroughCluster'));
  assert.not.ok([...generate(p, proxyFromNode({ id: ID }), TYPE_URLS.cluster).keys()].includes('InboundPassthroughCluster'));
});

test('capture mode under REGISTRY_ONLY: unknown destinations go to BlackHoleCluster', async () => {
  const ls = listeners(await push({ 'tcp.yaml': TCP }, 'REGISTRY_ONLY'), meta({ STANDALONE_CAPTURE: 'true' }));
  assert.is(tcpCluster(ls.get('virtualOutbound')!.default_filter_chain!.filters[0]!), 'BlackHoleCluster');
  assert.is(tcpCluster(ls.get('0.0.0.0_5432')!.default_filter_chain!.filters[0]!), 'BlackHoleCluster');
});

test('capture mode with the workload\'s own ports: their mTLS chains sit on virtualInbound, matched by original destination port, instead of listeners bound to the address', async () => {
  const own = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: self, namespace: demo}
spec:
  hosts: [self.example.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 7070, name: http, protocol: HTTP}]
  endpoints: [{address: 10.0.0.5, ports: {http: 7070}, labels: {security.istio.io/tlsMode: istio}}]
`;
  const p = await push({ 'own.yaml': own });
  assert.ok([...listeners(p).keys()].includes('inbound_10.0.0.5_7070'), 'loopback mode: a listener on the address');
  const ls = listeners(p, meta({ STANDALONE_CAPTURE: 'true' }));
  assert.not.ok([...ls.keys()].some((k) => k.startsWith('inbound_')));
  const inb = ls.get('virtualInbound')!;
  assert.equal(inb.listener_filters!.map((f) => f.name), ['envoy.filters.listener.original_dst', 'envoy.filters.listener.tls_inspector']);
  const chains = inb.filter_chains as { filter_chain_match?: Record<string, unknown>; transport_socket?: unknown }[];
  assert.equal(chains.map((c) => [c.filter_chain_match, Boolean(c.transport_socket)]), [
    [{ destination_port: { value: 15006 } }, false],
    [{ destination_port: { value: 7070 }, transport_protocol: 'tls' }, true],
    [{ destination_port: { value: 7070 } }, false],
  ], 'PERMISSIVE: mTLS or plaintext on the port, everything else passes through');
  assert.ok([...generate(p, proxyFromNode({ id: ID, metadata: meta({ STANDALONE_CAPTURE: 'true' }) }), TYPE_URLS.cluster).keys()].includes('inbound|7070||'));
});

test.run();
