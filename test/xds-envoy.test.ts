// The xDS proxy with the real Envoy: Envoy's ADS goes over the proxy's Unix socket to the in-test control plane,
// and Envoy serves real HTTP with what it gets. Also: the control plane restarts under load.

import { spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { buildBootstrap } from '../lib/bootstrap';
import { buildConfig } from '../lib/config';
import { configureLogging, resetLogging } from '../lib/log';
import { buildNodeIdentity } from '../lib/node-identity';
import { decodeNameTable, encodeNameTable, NAME_TABLE_TYPE } from '../lib/xds-istio';
import { upstreamFromConfig, XdsProxy } from '../lib/xds-proxy';
import { CLUSTER, ControlPlane, edsCluster, ENDPOINT, endpoints, LISTENER, listener, NODE_ID, ROUTE, route } from './helpers/control-plane';
import { envoyBin, freePort, httpRequest, sleep, tempDir, waitFor, type TempDir } from './helpers/harness';
import { startLoad } from './helpers/load';
import { adsBootstrap } from './helpers/ads-bootstrap';

type Kind = 'sotw' | 'delta';

const bootstrap = (kind: Kind, socket: string, adminPort: number) =>
  adsBootstrap({ nodeId: NODE_ID, cluster: 'app.ns', adminPort, delta: kind === 'delta', xdsAddress: socket });

interface Envoy {
  admin: number;
  proc: ChildProcess;
  output(): string;
  stat(name: string): Promise<number | undefined>;
  stop(): Promise<void>;
}

async function startEnvoy(dir: string, kind: Kind, socket: string, own?: { admin: number; bootstrap: unknown }): Promise<Envoy> {
  const admin = own?.admin ?? await freePort();
  const file = path.join(dir, 'envoy.json');
  fs.writeFileSync(file, JSON.stringify(own?.bootstrap ?? bootstrap(kind, socket, admin)));
  // Other suites run Envoy on this machine at the same time: no hot-restart shared memory, one worker.
  const proc = spawn(envoyBin(), ['-c', file, '--disable-hot-restart', '--concurrency', '1', '-l', 'warning'], { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  proc.stdout!.on('data', (d) => (out += d));
  proc.stderr!.on('data', (d) => (out += d));
  const exited = new Promise<void>((r) => proc.once('exit', () => r()));
  const e: Envoy = {
    admin,
    proc,
    output: () => out,
    async stat(name) {
      const r = await httpRequest(`http://127.0.0.1:${admin}/stats?filter=${encodeURIComponent(`^${name.replace(/\./g, '\\.')}$`)}`);
      const m = new RegExp(`^${name.replace(/\./g, '\\.')}: (\\d+)$`, 'm').exec(r.body);
      return m ? Number(m[1]) : undefined;
    },
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
      await exited;
    },
  };
  await waitFor('Envoy\'s admin port', async () => (await httpRequest(`http://127.0.0.1:${admin}/ready`, { timeoutMs: 500 })).status > 0, 15_000, 100).catch((err) => {
    throw new Error(`${(err as Error).message}\nEnvoy output:\n${out}`);
  });
  return e;
}

function backend(body: string): Promise<{ port: number; close(): Promise<void> }> {
  const s = http.createServer((_req, res) => res.end(body));
  return new Promise((resolve) => s.listen(0, '127.0.0.1', () => resolve({
    port: (s.address() as { port: number }).port,
    close: () => new Promise<void>((r) => {
      s.closeAllConnections();
      s.close(() => r());
    }),
  })));
}

function config(cp: ControlPlane, listenPort: number, backendPort: number): void {
  cp.set(CLUSTER, 'c1', [edsCluster('backend')]);
  cp.set(ENDPOINT, 'e1', [endpoints('backend', backendPort)]);
  cp.set(LISTENER, 'l1', [listener('http', listenPort, 'local')]);
  cp.set(ROUTE, 'r1', [route('local', 'backend')]);
  cp.set(NAME_TABLE_TYPE, 'n1', [{ name: 'nds', any: { type_url: NAME_TABLE_TYPE, value: encodeNameTable({ table: { 'backend.ns.svc.cluster.local': { ips: ['127.0.0.1'], registry: 'Kubernetes', shortname: 'backend', namespace: 'ns' } } }) } }]);
}

interface World {
  dir: TempDir;
  cp: ControlPlane;
  proxy: XdsProxy;
  envoy: Envoy;
  a: { port: number; close(): Promise<void> };
  b: { port: number; close(): Promise<void> };
  url: string;
  tables: string[][];
  done(): Promise<void>;
}

async function world(kind: Kind): Promise<World> {
  const dir = tempDir('pa-xds-envoy-');
  const logs: string[] = [];
  configureLogging({ write: (l) => logs.push(l) });
  const cleanup: Array<() => Promise<void> | void> = [() => dir.cleanup(), () => resetLogging()];
  const done = async () => {
    for (const f of cleanup.reverse()) await f();
  };
  try {
    const a = await backend('a');
    cleanup.push(() => a.close());
    const b = await backend('b');
    cleanup.push(() => b.close());
    const cp = new ControlPlane();
    await cp.start(0);
    cleanup.push(() => cp.stop());
    const listenPort = await freePort();
    config(cp, listenPort, a.port);
    const socket = path.join(dir.path, 'XDS');
    const proxy = new XdsProxy({ socketPath: socket, upstream: { address: cp.address, tls: false }, backoff: { initialMs: 100, maxMs: 500 } });
    const tables: string[][] = [];
    proxy.registerHandler(NAME_TABLE_TYPE, (res) => {
      tables.push(Object.keys(decodeNameTable(res[0]!).table));
    });
    await proxy.start();
    cleanup.push(() => proxy.close());
    const envoy = await startEnvoy(dir.path, kind, socket);
    cleanup.push(() => envoy.stop());
    const w: World = { dir, cp, proxy, envoy, a, b, url: `http://127.0.0.1:${listenPort}/`, tables, done };
    return w;
  } catch (e) {
    await done();
    throw e;
  }
}

for (const kind of ['sotw', 'delta'] as const) {
  test(`${kind}: Envoy gets clusters, endpoints, listeners and routes through the proxy and serves HTTP with them`, async () => {
    const w = await world(kind);
    try {
      const r = await waitFor('HTTP through Envoy', async () => {
        const res = await httpRequest(w.url, { timeoutMs: 1000 });
        return res.status === 200 ? res : undefined;
      }, 15_000, 100);
      assert.is(r.body, 'a');
      assert.is(await w.envoy.stat('control_plane.connected_state'), 1);
      assert.ok((await w.envoy.stat('cluster_manager.cds.update_success'))! >= 1);
      assert.ok((await w.envoy.stat('listener_manager.lds.update_success'))! >= 1);
      // The name table, subscribed after Envoy's first LDS request, went to the agent and not to Envoy.
      await waitFor('the name table', () => w.tables.length > 0);
      assert.equal(w.tables[0], ['backend.ns.svc.cluster.local']);
      const nds = await w.cp.waitForRequest('the NDS ACK', (q) => q.typeUrl === NAME_TABLE_TYPE && q.nonce !== '' && !q.error);
      assert.ok(nds);
      const m = w.proxy.metrics();
      assert.is(m.xds_proxy_envoy_nacks_total, 0, `Envoy NACKed something:\n${w.envoy.output()}`);
      assert.ok(m.xds_proxy_responses_to_envoy >= 4);
      // Every ACK Envoy sent reached the control plane.
      for (const t of [CLUSTER, ENDPOINT, LISTENER, ROUTE]) {
        await w.cp.waitForRequest(`the ${t} ACK`, (q) => q.typeUrl === t && q.nonce !== '' && !q.error);
      }
    } finally {
      await w.done();
    }
  });

  test(`${kind}: the control plane restarts under load: no failed request, Envoy's ADS stream is never reset, and a change made after the restart reaches Envoy`, async () => {
    const w = await world(kind);
    let cp2: ControlPlane | undefined;
    try {
      await waitFor('HTTP through Envoy', async () => (await httpRequest(w.url, { timeoutMs: 1000 })).body === 'a', 15_000, 100);
      const streams = await w.envoy.stat('cluster.xds-grpc.upstream_rq_total');
      const conns = await w.envoy.stat('cluster.xds-grpc.upstream_cx_total');
      assert.is(streams, 1);
      const load = startLoad({ url: w.url, concurrency: 4, countBodies: true, maxDurationMs: 30_000 });
      await sleep(300);

      await w.cp.stop();
      await waitFor('the proxy to notice', () => w.proxy.metrics().xds_proxy_upstream_connected === 0);
      for (let i = 0; i < 4; i++) {
        await sleep(250);
        assert.is(await w.envoy.stat('control_plane.connected_state'), 1, 'Envoy saw its ADS stream drop');
      }
      cp2 = new ControlPlane({ noncePrefix: 'second-' });
      config(cp2, Number(new URL(w.url).port), w.a.port);
      await cp2.start(w.cp.port);
      await waitFor('the proxy to reconnect', () => w.proxy.metrics().xds_proxy_upstream_connected === 1, 10_000);
      const resent = await cp2.waitForRequest('CDS re-sent', (q) => q.typeUrl === CLUSTER);
      if (kind === 'delta') assert.equal(Object.keys(resent.initialVersions!), ['backend']);
      else assert.is(resent.versionInfo, 'c1');

      cp2.set(ENDPOINT, 'e2', [endpoints('backend', w.b.port)]);
      await waitFor('traffic to move to backend b', () => (load.snapshot().bodies.b ?? 0) > 20, 15_000);
      const res = await load.stop();
      assert.is(res.failed, 0, `failed requests: ${res.errors.join('; ')}`);
      assert.ok(res.ok > 50, `only ${res.ok} requests ran`);
      assert.ok((res.bodies.a ?? 0) > 0);

      assert.is(await w.envoy.stat('cluster.xds-grpc.upstream_rq_total'), streams, 'Envoy opened a new ADS stream');
      assert.is(await w.envoy.stat('cluster.xds-grpc.upstream_cx_total'), conns, 'Envoy reconnected to the proxy');
      assert.is(await w.envoy.stat('control_plane.connected_state'), 1);
      const m = w.proxy.metrics();
      assert.is(m.xds_proxy_downstream_streams_total, 1);
      assert.ok(m.xds_proxy_upstream_reconnects_total >= 1);
      assert.is(m.xds_proxy_envoy_nacks_total, 0, `Envoy NACKed something:\n${w.envoy.output()}`);
      // The agent's own subscription came back too.
      await cp2.waitForRequest('NDS re-subscribed', (q) => q.typeUrl === NAME_TABLE_TYPE);
    } finally {
      await cp2?.stop();
      await w.done();
    }
  });
}

test('the agent\'s own bootstrap (lib/bootstrap.ts) and upstreamFromConfig work end to end with the proxy and a real Envoy', async () => {
  const dir = tempDir('pa-xds-boot-');
  configureLogging({ write: () => undefined });
  const cp = new ControlPlane();
  const a = await backend('a');
  let proxy: XdsProxy | undefined;
  let envoy: Envoy | undefined;
  try {
    await cp.start(0);
    const [admin, status, readiness, prometheus, listenPort] = [await freePort(), await freePort(), await freePort(), await freePort(), await freePort()];
    const env = {
      POD_NAME: 'web-1', POD_NAMESPACE: 'ns', INSTANCE_IP: '127.0.0.1', ISTIO_META_CLUSTER_ID: 'east',
      ENVOY_STATUS_PORT: String(readiness), ENVOY_PROMETHEUS_PORT: String(prometheus), XDS_HEADER_X_ISTIO_REVISION: 'canary',
      PROXY_CONFIG: JSON.stringify({
        configPath: path.join(dir.path, 'etc/istio/proxy'), proxyAdminPort: admin, statusPort: status,
        discoveryAddress: cp.address, controlPlaneAuthPolicy: 'NONE',
      }),
    };
    const cfg = buildConfig({ flags: {}, env, readFile: () => undefined });
    const node = buildNodeIdentity(cfg, env, [{ address: '127.0.0.1', family: 'IPv4', internal: true }], '0.0.0-test');
    config(cp, listenPort, a.port);
    proxy = new XdsProxy({ socketPath: cfg.xdsSocket, upstream: upstreamFromConfig(cfg, env) });
    await proxy.start();
    envoy = await startEnvoy(dir.path, 'delta', cfg.xdsSocket, { admin, bootstrap: buildBootstrap({ cfg, node }) });
    const r = await waitFor('HTTP through Envoy', async () => {
      const res = await httpRequest(`http://127.0.0.1:${listenPort}/`, { timeoutMs: 1000 });
      return res.status === 200 ? res : undefined;
    }, 15_000, 100);
    assert.is(r.body, 'a');
    assert.is(cp.requests[0]!.kind, 'delta');
    assert.is(cp.requests[0]!.nodeId, node.id);
    assert.is(cp.metadata[0]!.clusterid, 'east');
    assert.is(cp.metadata[0]!.x_istio_revision, 'canary');
    assert.is(proxy.metrics().xds_proxy_envoy_nacks_total, 0, envoy.output());
  } finally {
    await envoy?.stop();
    await proxy?.close();
    await a.close();
    await cp.stop();
    resetLogging();
    dir.cleanup();
  }
});

test.run();
