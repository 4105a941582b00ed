// The control plane goes away for 3 s, 10 s and 30 s under load (its server shut down and its port closed), then a
// new one starts on the same address. The proxy must be back within max(1 s, 25 % of the outage) of the return,
// a push made right after the return must reach Envoy, and Envoy must never notice: its ADS stream stays open and
// no request fails. Each outage runs over TCP (Delta, as the agent's bootstrap asks) and over a Unix socket (state
// of the world) side by side, each with its own real Envoy, proxy and control plane. First, what one attempt
// does: it makes exactly one connection, and a failed one leaves nothing that connects later.

import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { configureLogging, resetLogging } from '../lib/log';
import { XdsProxy } from '../lib/xds-proxy';
import { CLUSTER, ControlPlane, edsCluster, ENDPOINT, endpoints, FakeEnvoy, LISTENER, listener, NODE_ID, ROUTE, route } from './helpers/control-plane';
import { startBackend, startEnvoy, type Backend, type TestEnvoy } from './helpers/discovery-envoy';
import { freePort, httpRequest, sleep, tempDir, waitFor, type TempDir } from './helpers/harness';
import { startLoad } from './helpers/load';

type Transport = 'tcp' | 'unix';

function config(cp: ControlPlane, listenPort: number, backendPort: number): void {
  cp.set(CLUSTER, 'c1', [edsCluster('backend')]);
  cp.set(ENDPOINT, 'e1', [endpoints('backend', backendPort)]);
  cp.set(LISTENER, 'l1', [listener('http', listenPort, 'local')]);
  cp.set(ROUTE, 'r1', [route('local', 'backend')]);
}

/** The error a client gets at the address, or a rejection if it still accepts connections (the outage is real). */
function refused(address: string): Promise<string> {
  const to = address.startsWith('unix://') ? { path: address.slice('unix://'.length) } : { host: '127.0.0.1', port: Number(address.split(':')[1]) };
  return new Promise((resolve, reject) => {
    const s = net.connect(to);
    s.once('connect', () => {
      s.destroy();
      reject(new Error(`${address} still accepts connections`));
    });
    s.once('error', (e: NodeJS.ErrnoException) => resolve(e.code ?? e.message));
  });
}

async function stat(envoy: TestEnvoy, name: string): Promise<number | undefined> {
  const re = `^${name.replace(/\./g, '\\.')}$`;
  const r = await httpRequest(`http://127.0.0.1:${envoy.adminPort}/stats?filter=${encodeURIComponent(re)}`);
  const m = new RegExp(`^${name.replace(/\./g, '\\.')}: (\\d+)$`, 'm').exec(r.body);
  return m ? Number(m[1]) : undefined;
}

interface Outcome {
  transport: Transport;
  backMs: number;
  pushMs: number;
}

/** One control-plane outage of outageMs, with the control plane on transport; returns when the proxy was back. */
async function outage(transport: Transport, outageMs: number): Promise<Outcome> {
  const kind = transport === 'tcp' ? 'delta' : 'sotw';
  const cleanup: Array<() => Promise<void> | void> = [];
  const dir: TempDir = tempDir('pa-xds-outage-');
  cleanup.push(() => dir.cleanup());
  try {
    const a: Backend = await startBackend('a');
    cleanup.push(() => a.close());
    const b: Backend = await startBackend('b');
    cleanup.push(() => b.close());
    const cpOpts = transport === 'unix' ? { socketPath: path.join(dir.path, 'istiod.sock') } : {};
    const cp = new ControlPlane(cpOpts);
    cleanup.push(() => cp.stop());
    await cp.start(0);
    const listenPort = await freePort();
    config(cp, listenPort, a.port);
    const socket = path.join(dir.path, 'XDS');
    // The agent's defaults: this is the behaviour a deployed proxy has.
    const proxy = new XdsProxy({ socketPath: socket, upstream: { address: cp.address, tls: false } });
    await proxy.start();
    cleanup.push(() => proxy.close());
    const envoy = await startEnvoy({ xdsAddress: socket, nodeId: NODE_ID, delta: kind === 'delta' });
    cleanup.push(() => envoy.stop());
    const url = `http://127.0.0.1:${listenPort}/`;
    await waitFor(`${transport}: HTTP through Envoy`, async () => (await httpRequest(url, { timeoutMs: 1000 })).body === 'a', 20_000, 100);
    const adsStreams = await stat(envoy, 'cluster.xds-grpc.upstream_rq_total');

    const load = startLoad({ url, concurrency: 2, pauseMs: 5, countBodies: true, maxDurationMs: outageMs + 60_000 });
    cleanup.push(async () => void (await load.stop()));
    await sleep(200);
    await cp.stop();
    const why = await refused(cp.address);
    await waitFor(`${transport}: the proxy to notice`, () => proxy.metrics().xds_proxy_upstream_connected === 0, 5000, 10);
    await sleep(outageMs);

    const cp2 = new ControlPlane({ ...cpOpts, noncePrefix: 'second-' });
    cleanup.push(() => cp2.stop());
    config(cp2, listenPort, a.port);
    await cp2.start(cp.port);
    const returned = Date.now();
    // The push made right after the return: traffic moves to backend b.
    cp2.set(ENDPOINT, 'e2', [endpoints('backend', b.port)]);
    await waitFor(`${transport}: the proxy to reconnect after a ${outageMs} ms outage`, () => proxy.metrics().xds_proxy_upstream_connected === 1, 120_000, 10);
    const backMs = Date.now() - returned;
    await waitFor(`${transport}: the push made after the return to reach Envoy`, async () => (await httpRequest(url, { timeoutMs: 1000 })).body === 'b', 20_000, 20);
    const pushMs = Date.now() - returned;
    await waitFor(`${transport}: the load to reach backend b`, () => (load.snapshot().bodies.b ?? 0) > 0, 10_000, 20);

    const res = await load.stop();
    assert.is(res.failed, 0, `${transport}: failed requests: ${res.errors.join('; ')}`);
    assert.ok((res.bodies.a ?? 0) > 0, `${transport}: load saw ${JSON.stringify(res.bodies)}`);
    assert.is(await stat(envoy, 'cluster.xds-grpc.upstream_rq_total'), adsStreams, `${transport}: Envoy opened a new ADS stream`);
    assert.is(await stat(envoy, 'control_plane.connected_state'), 1);
    const m = proxy.metrics();
    assert.is(m.xds_proxy_downstream_streams_total, 1);
    assert.is(m.xds_proxy_envoy_nacks_total, 0, envoy.logs());
    // The endpoint Envoy holds is b's, as its config dump says.
    const dump = JSON.stringify(await envoy.configDump());
    assert.ok(dump.includes(`"port_value":${b.port}`) && !dump.includes(`"port_value":${a.port}`), `${transport}: Envoy's endpoints are not b's`);
    console.log(`  ${transport}: ${outageMs} ms outage (${why}): back ${backMs} ms after the return, push in Envoy after ${pushMs} ms; ${res.ok} requests, 0 failed`);
    return { transport, backMs, pushMs };
  } finally {
    for (const f of cleanup.reverse()) await f();
  }
}

/** Established TCP connections whose local end is 127.0.0.1:port (the server's side), from /proc/net/tcp. */
function establishedTo(port: number): number {
  const local = `0100007F:${port.toString(16).toUpperCase().padStart(4, '0')}`;
  return fs.readFileSync('/proc/net/tcp', 'utf8').split('\n').filter((l) => {
    const f = l.trim().split(/\s+/);
    return f[1] === local && f[3] === '01';
  }).length;
}

test('each reconnect attempt is one real connection attempt, and a failed one leaves no connection behind', async () => {
  const dir = tempDir('pa-xds-attempts-');
  const logs: string[] = [];
  configureLogging({ write: (l) => logs.push(l) });
  const cp = new ControlPlane();
  let cp2: ControlPlane | undefined;
  let proxy: XdsProxy | undefined;
  let env: FakeEnvoy | undefined;
  let broken: net.Server | undefined;
  try {
    cp.set(CLUSTER, 'c1', [edsCluster('a')]);
    await cp.start(0);
    // A fixed, short delay: this test is about what one attempt does, not about how they are spaced.
    proxy = new XdsProxy({ socketPath: path.join(dir.path, 'XDS'), upstream: { address: cp.address, tls: false }, backoff: { initialMs: 100, maxMs: 100 } });
    await proxy.start();
    env = new FakeEnvoy(`unix://${path.join(dir.path, 'XDS')}`, 'sotw');
    env.request({ typeUrl: CLUSTER });
    await env.waitForResponse('CDS', (x) => x.version === 'c1');
    await cp.stop();
    // A control plane that accepts connections and drops them at once: every attempt is seen, and fails.
    let connections = 0;
    broken = net.createServer((s) => {
      connections++;
      s.destroy();
    });
    await new Promise<void>((r) => broken!.listen(cp.port, '127.0.0.1', r));
    const before = proxy.metrics().xds_proxy_upstream_reconnects_total;
    await sleep(3000);
    const attempts = proxy.metrics().xds_proxy_upstream_reconnects_total - before;
    const seen = connections;
    assert.ok(attempts >= 10, `only ${attempts} attempts in 3 s`);
    // The attempt in flight when counting stopped may not have connected yet.
    assert.ok(seen >= attempts - 1 && seen <= attempts + 1, `${attempts} attempts made ${seen} connections`);
    assert.not.match(logs.join('\n'), /Last error: null/);
    await new Promise((r) => broken!.close(r));
    broken = undefined;

    // Back: one connection, and none opened later by a failed attempt's channel (grpc-js's own backoff is ~1 s).
    cp2 = new ControlPlane();
    cp2.set(CLUSTER, 'c2', [edsCluster('a')]);
    await cp2.start(cp.port);
    await env.waitForResponse('CDS from the new control plane', (x) => x.version === 'c2', 5000);
    await sleep(2500);
    assert.is(establishedTo(cp.port), 1, 'connections to the control plane');
    assert.is(cp2.streamsOpened, 1);
  } finally {
    env?.close();
    await proxy?.close();
    await new Promise((r) => (broken ? broken.close(r) : r(undefined)));
    await cp.stop();
    await cp2?.stop();
    resetLogging();
    dir.cleanup();
  }
});

for (const outageMs of [3_000, 10_000, 30_000]) {
  const limit = Math.max(1000, outageMs / 4);
  test(`after a ${outageMs / 1000} s control-plane outage the proxy is back within ${limit} ms of the return and a push made then reaches Envoy (TCP and Unix socket)`, async () => {
    configureLogging({ write: () => undefined });
    try {
      const settled = await Promise.allSettled([outage('tcp', outageMs), outage('unix', outageMs)]);
      for (const s of settled) if (s.status === 'rejected') throw s.reason;
      for (const r of settled.map((s) => (s as PromiseFulfilledResult<Outcome>).value)) assert.ok(r.backMs <= limit, `${r.transport}: back ${r.backMs} ms after the control plane returned (limit ${limit} ms)`);
    } finally {
      resetLogging();
    }
  });
}

test.run();
