// Traffic through a real Envoy follows the VirtualService served by the discovery server: header and path
// matches, weights, over state-of-the-world and Delta ADS, for a sidecar and a router.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { fetchText } from './helpers/discovery-envoy';
import { destinationRule, gateway, HOST, serviceEntry, type Stack, startStack, virtualService } from './helpers/discovery-fixtures';
import { freePort, waitFor } from './helpers/harness';
import { startLoad } from './helpers/load';

const MATCHES = `  - name: by-header
    match:
    - headers: {x-version: {exact: v2}}
    route:
    - destination: {host: ${HOST}, subset: v2}
  - name: by-exact-path
    match:
    - uri: {exact: /only/v1}
    route:
    - destination: {host: ${HOST}, subset: v1}
  - name: by-prefix-and-regex-header
    match:
    - uri: {prefix: /v2/}
    - headers: {x-user: {regex: "tester-[0-9]+"}}
    route:
    - destination: {host: ${HOST}, subset: v2}
`;

let stack: Stack;
let gwPort = 0;

test.before(async () => {
  gwPort = await freePort();
  stack = await startStack(['v1', 'v2'], ({ servicePort, backends }) => ({
    'service.yaml': serviceEntry(servicePort, [{ port: backends.v1!.port, version: 'v1' }, { port: backends.v2!.port, version: 'v2' }]),
    'routing.yaml': `${destinationRule(['v1', 'v2'])}---\n${virtualService({ v1: 80, v2: 20 }, MATCHES, ['mesh', 'ingress'])}---\n${gateway(gwPort)}`,
  }));
});

test.after(async () => {
  await stack?.stop();
});

const url = (p = '/') => `http://127.0.0.1:${stack.servicePort}${p}`;

test('sidecar over SotW ADS: header and path matches pick the subset', async () => {
  await stack.addEnvoy('sidecar', false);
  await waitFor('the sidecar listener to serve', async () => /^v[12]$/.test(await fetchText(url())));
  for (let i = 0; i < 10; i++) {
    assert.is(await fetchText(url('/anything'), { 'x-version': 'v2' }), 'v2');
    assert.is(await fetchText(url('/only/v1')), 'v1');
    assert.is(await fetchText(url('/v2/x')), 'v2');
    assert.is(await fetchText(url('/x'), { 'x-user': 'tester-42' }), 'v2');
  }
  // By Host too: the service's name reaches it like the bare loopback address does.
  assert.is(await fetchText(url('/'), { host: HOST, 'x-version': 'v2' }), 'v2');
});

test('weights 80/20 hold within a statistical bound over 2,000 requests', async () => {
  const load = startLoad({ url: url('/split'), concurrency: 8, countBodies: true });
  await waitFor('2,000 responses', () => load.snapshot().ok + load.snapshot().failed >= 2000, 60_000, 50);
  const r = await load.stop();
  assert.is(r.failed, 0, r.errors.join('\n'));
  const n = (r.bodies.v1 ?? 0) + (r.bodies.v2 ?? 0);
  assert.is(n, r.ok);
  // Binomial(n, 0.2): the standard deviation is about 18 for n = 2,000; allow five of them.
  const sd = Math.sqrt(n * 0.2 * 0.8);
  const v2 = r.bodies.v2 ?? 0;
  assert.ok(Math.abs(v2 - n * 0.2) < 5 * sd, `v2 got ${v2} of ${n}`);
});

test('sidecar over Delta ADS serves the same routes', async () => {
  // Same listener address as the first sidecar: stop that one so this Envoy can bind it.
  await stack.envoys.shift()!.stop();
  const e = await stack.addEnvoy('sidecar', true);
  await waitFor('the delta sidecar to serve', async () => (await fetchText(url('/'), { 'x-version': 'v2' })) === 'v2');
  assert.is(await fetchText(url('/only/v1')), 'v1');
  const status = stack.server.status();
  const conn = status.connections.find((c) => c.delta)!;
  assert.ok(conn, 'a delta connection is listed');
  assert.is(conn.subscriptions.length, 4);
  for (const s of conn.subscriptions) assert.is(s.acked, status.version, `${s.typeUrl} acked`);
  assert.ok(e.proc.exitCode === null);
});

test('router binds its Gateway port and routes by Host', async () => {
  await stack.addEnvoy('router', true);
  const gw = (p: string, h: Record<string, string> = {}) => fetchText(`http://127.0.0.1:${gwPort}${p}`, { host: HOST, ...h });
  await waitFor('the gateway listener to serve', async () => /^v[12]$/.test(await gw('/')));
  assert.is(await gw('/', { 'x-version': 'v2' }), 'v2');
  assert.is(await gw('/only/v1'), 'v1');
  assert.is(await fetchText(`http://127.0.0.1:${gwPort}/`, { host: 'unknown.example' }), 'HTTP 404');
});

test.run();
