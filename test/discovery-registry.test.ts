import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { MemoryConfigStore } from '../lib/discovery/config-store';
import { Debouncer, type PushRequest, pushRequest } from '../lib/discovery/debounce';
import { generate } from '../lib/discovery/generate';
import type { Config } from '../lib/discovery/model';
import { proxyFromNode } from '../lib/discovery/proxy';
import { PushContext } from '../lib/discovery/push-context';
import { ServiceEntryRegistry } from '../lib/discovery/registry';
import { ResourceCache, TYPE_URLS } from '../lib/discovery/resources';
import { parseConfigFile } from '../lib/discovery/yaml-file';
import { unpackAny } from '../lib/envoy-protos';
import { sleep } from './helpers/harness';

function config(yaml: string): Config {
  const r = parseConfigFile('/t.yaml', yaml);
  if (r.issues.length) throw new Error(r.issues.map((i) => i.message).join('; '));
  return r.configs[0]!;
}

const se = (endpoints: string[], selector = false) => config(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db, namespace: prod}
spec:
  hosts: [db.prod.local]
  ports: [{number: 5432, name: tcp, protocol: TCP}]
${selector ? '  workloadSelector: {labels: {app: db}}' : `  endpoints:\n${endpoints.map((a) => `  - address: ${a}`).join('\n')}`}
`);

const we = (name: string, address: string, app = 'db') => config(`apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: ${name}, namespace: prod}
spec: {address: ${address}, labels: {app: ${app}}, ports: {tcp: 6432}}
`);

function setup() {
  const store = new MemoryConfigStore();
  const reg = new ServiceEntryRegistry(store);
  const events: string[] = [];
  reg.appendServiceHandler((s, e) => events.push(`service ${e} ${s.hostname}`));
  reg.appendInstanceHandler((i, e) => events.push(`instance ${e} ${i.address}:${i.port}`));
  reg.run();
  return { store, reg, events };
}

test('registry: ServiceEntry endpoints become instances; edits emit only the difference', () => {
  const { store, reg, events } = setup();
  store.create(se(['10.0.0.1', '10.0.0.2']));
  assert.equal(events, ['service add db.prod.local', 'instance add 10.0.0.1:5432', 'instance add 10.0.0.2:5432']);
  assert.is(reg.instances('db.prod.local', 5432).length, 2);
  events.length = 0;
  const cur = store.get('ServiceEntry', 'db', 'prod')!;
  store.update({ ...se(['10.0.0.2', '10.0.0.3']), meta: { ...cur.meta, source: undefined } });
  assert.equal(events, ['instance delete 10.0.0.1:5432', 'instance add 10.0.0.3:5432']);
  events.length = 0;
  store.delete('ServiceEntry', 'db', 'prod');
  assert.equal(events, ['service delete db.prod.local', 'instance delete 10.0.0.2:5432', 'instance delete 10.0.0.3:5432']);
  assert.equal(reg.services(), []);
  assert.is(reg.instances('db.prod.local', 5432).length, 0);
});

test('registry: WorkloadEntries selected by label follow their own add, update and delete', () => {
  const { store, reg, events } = setup();
  store.create(se([], true));
  store.create(we('db-1', '10.1.0.1'));
  store.create(we('cache-1', '10.1.0.9', 'cache'));
  assert.equal(reg.instances('db.prod.local', 5432).map((i) => `${i.address}:${i.port}`), ['10.1.0.1:6432']);
  events.length = 0;
  const w = store.get('WorkloadEntry', 'db-1', 'prod')!;
  store.update({ ...we('db-1', '10.1.0.1', 'other'), meta: { ...w.meta } });
  assert.equal(events, ['instance delete 10.1.0.1:6432']);
  store.delete('WorkloadEntry', 'cache-1', 'prod');
  assert.equal(events, ['instance delete 10.1.0.1:6432']);
});

test('debounce: a burst merges into one push after the quiet period', async () => {
  const flushed: PushRequest[] = [];
  const d = new Debouncer({ quietMs: 40, maxDelayMs: 10_000, onFlush: (r) => flushed.push(r) });
  for (let i = 0; i < 5; i++) {
    d.push(pushRequest(`VirtualService/ns/vs${i % 2}`, 'config update'));
    await sleep(10);
  }
  d.push(pushRequest('Service/a', 'endpoint add'));
  assert.is(flushed.length, 0);
  await sleep(120);
  assert.is(flushed.length, 1);
  assert.is(flushed[0]!.events, 6);
  assert.equal([...flushed[0]!.updated].sort(), ['Service/a', 'VirtualService/ns/vs0', 'VirtualService/ns/vs1']);
  assert.equal(flushed[0]!.reasons, { 'config update': 5, 'endpoint add': 1 });
  d.close();
});

test('debounce: events that never stop still push after the maximum delay', async () => {
  const flushed: PushRequest[] = [];
  const d = new Debouncer({ quietMs: 50, maxDelayMs: 150, onFlush: (r) => flushed.push(r) });
  const t0 = Date.now();
  while (Date.now() - t0 < 400) {
    d.push(pushRequest('Service/a', 'endpoint update'));
    await sleep(20);
  }
  d.close();
  // 400 ms of events 20 ms apart never has a 50 ms quiet period: only the 150 ms cap can flush.
  assert.ok(flushed.length >= 2 && flushed.length <= 3, `flushes: ${flushed.length}`);
});

test('push context versions are fixed at build time; generation is shared and proxy-specific where needed', () => {
  const { store, reg } = setup();
  store.create(se(['10.0.0.1']));
  const p1 = PushContext.build('v1', store, reg);
  store.create(config(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: web, namespace: prod}
spec:
  hosts: [web.prod.local]
  ports: [{number: 8080, name: http}]
  endpoints: [{address: 10.0.0.5}]
`));
  const p2 = PushContext.build('v2', store, reg);
  assert.is(p1.services.length, 1, 'an old push context does not see later changes');
  assert.is(p2.services.length, 2);
  const sidecar = proxyFromNode({ id: 'sidecar~10.0.0.9~app-1.prod~prod.svc.cluster.local' });
  const router = proxyFromNode({ id: 'router~10.0.0.8~gw-1.prod~prod.svc.cluster.local' });
  assert.is(sidecar.namespace, 'prod');
  const cds = generate(p2, sidecar, TYPE_URLS.cluster);
  assert.ok(cds === generate(p2, router, TYPE_URLS.cluster), 'clusters are generated once per push context');
  assert.equal([...cds.keys()].sort(), ['BlackHoleCluster', 'PassthroughCluster', 'outbound|5432||db.prod.local', 'outbound|8080||web.prod.local']);
  const lds = generate(p2, sidecar, TYPE_URLS.listener);
  assert.equal([...lds.keys()], ['127.0.0.1_5432', '127.0.0.1_8080']);
  const tcp = unpackAny(lds.get('127.0.0.1_5432')!.any) as { filter_chains: { filters: { name: string }[] }[] };
  assert.is(tcp.filter_chains[0]!.filters[0]!.name, 'envoy.filters.network.tcp_proxy');
  assert.is(generate(p2, router, TYPE_URLS.listener).size, 0, 'a router without Gateways binds nothing');
  assert.throws(() => proxyFromNode({ id: 'waypoint~1~a.b~b.svc' }), /unknown proxy type/);
});

test('resources carry over between push contexts unless their inputs changed; DNS services are STRICT_DNS', () => {
  const { store, reg } = setup();
  store.create(se(['10.0.0.1']));
  store.create(config(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ext, namespace: prod}
spec:
  hosts: [api.example.com]
  ports: [{number: 443, name: tcp, protocol: TCP}]
  resolution: DNS
`));
  const cache = new ResourceCache();
  const sidecar = proxyFromNode({ id: 'sidecar~10.0.0.9~app-1.prod~prod.svc.cluster.local' });
  const p1 = PushContext.build('v1', store, reg, cache);
  const cds1 = generate(p1, sidecar, TYPE_URLS.cluster);
  const eds1 = generate(p1, sidecar, TYPE_URLS.endpoint);
  const ext = unpackAny(cds1.get('outbound|443||api.example.com')!.any) as { type: string; load_assignment: unknown };
  assert.is(ext.type, 'STRICT_DNS');
  assert.match(JSON.stringify(ext.load_assignment), /"address":"api\.example\.com","port_value":443/);
  assert.ok(!eds1.has('outbound|443||api.example.com'), 'no EDS for a DNS cluster');
  const cur = store.get('ServiceEntry', 'db', 'prod')!;
  store.update({ ...se(['10.0.0.2']), meta: { ...cur.meta, source: undefined } });
  const p2 = PushContext.build('v2', store, reg, cache);
  const cds2 = generate(p2, sidecar, TYPE_URLS.cluster);
  const eds2 = generate(p2, sidecar, TYPE_URLS.endpoint);
  assert.ok(cds2.get('outbound|443||api.example.com') === cds1.get('outbound|443||api.example.com'), 'untouched cluster reused');
  assert.ok(cds2.get('outbound|5432||db.prod.local') === cds1.get('outbound|5432||db.prod.local'), 'an endpoint change keeps the cluster');
  assert.is.not(eds2.get('outbound|5432||db.prod.local')!.hash, eds1.get('outbound|5432||db.prod.local')!.hash);
});

test.run();
