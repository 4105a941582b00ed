// The VM health checker end to end: a VM's readiness probe fails, its health event goes through the xDS proxy to
// the discovery server, and another sidecar's real Envoy stops routing to the VM (real requests), routes again when
// it recovers, and the state survives a control-plane restart (the xDS proxy re-sends it). Also: thresholds, and
// an exec probe that never exits.

import * as fs from 'node:fs';
import * as http from 'node:http';
import type * as net from 'node:net';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { DiscoveryServer } from '../lib/discovery/index';
import { HealthChecker, type HealthEvent, healthInformationRequest, parseReadinessProbe } from '../lib/health-checker';
import { configureLogging, resetLogging } from '../lib/log';
import { XdsProxy } from '../lib/xds-proxy';
import { type Backend, fetchText, startBackend, startEnvoy, type TestEnvoy } from './helpers/discovery-envoy';
import { freePort, pidAlive, sleep, tempDir, waitFor } from './helpers/harness';

const HOSTNAME = 'vm.test.local';

function config(servicePort: number, a: number, b: number): string {
  const we = (name: string, port: number) => `apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: ${name}, namespace: test}
spec: {address: 127.0.0.1, labels: {app: vm}, ports: {http: ${port}}, serviceAccount: vm}
`;
  return `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: vm, namespace: test}
spec:
  hosts: [${HOSTNAME}]
  ports:
  - {number: ${servicePort}, name: http, protocol: HTTP}
  resolution: STATIC
  workloadSelector: {labels: {app: vm}}
---
${we('vm-a', a)}---
${we('vm-b', b)}`;
}

/** The VM app's health endpoint: 200 or 500 as the test says. */
async function healthEndpoint(): Promise<{ port: number; healthy: boolean; close(): Promise<void> }> {
  const h = { port: 0, healthy: true, close: async () => {} };
  const s = http.createServer((_req, res) => res.writeHead(h.healthy ? 200 : 500).end(h.healthy ? 'ok' : 'database down'));
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', () => r()));
  h.port = (s.address() as net.AddressInfo).port;
  h.close = () => new Promise<void>((r) => {
    s.closeAllConnections();
    s.close(() => r());
  });
  return h;
}

/** Which backends 20 requests through the other sidecar reached. */
async function reached(url: string): Promise<Set<string>> {
  const seen = new Set<string>();
  for (let i = 0; i < 20; i++) seen.add(await fetchText(url));
  return seen;
}

test.before(() => configureLogging({ write: () => {} }));
test.after(() => resetLogging());

const only = (s: Set<string>, ...names: string[]) => s.size === names.length && names.every((n) => s.has(n));

test('an unhealthy VM leaves the other sidecar\'s endpoints, returns when healthy, and stays out across a control-plane restart', async () => {
  const logs: string[] = [];
  configureLogging({ write: (l) => logs.push(l) });
  const dir = tempDir('pa-health-');
  const backends: Backend[] = [];
  const envoys: TestEnvoy[] = [];
  let servers: DiscoveryServer[] = [];
  let proxy: XdsProxy | undefined;
  let checker: HealthChecker | undefined;
  const app = await healthEndpoint();
  try {
    const a = await startBackend('a');
    const b = await startBackend('b');
    backends.push(a, b);
    const servicePort = await freePort();
    const cfgDir = path.join(dir.path, 'config');
    fs.mkdirSync(cfgDir);
    fs.writeFileSync(path.join(cfgDir, 'vm.yaml'), config(servicePort, a.port, b.port));
    // The VM's identity: its agent authenticates its stream with this token, or its health events are ignored.
    fs.mkdirSync(path.join(cfgDir, 'ca', 'identities', 'test'), { recursive: true });
    fs.writeFileSync(path.join(cfgDir, 'ca', 'identities', 'test', 'vm'), 'vm-token\n', { mode: 0o600 });
    fs.writeFileSync(path.join(dir.path, 'vm-token'), 'vm-token\n', { mode: 0o600 });
    const listen = `127.0.0.1:${await freePort()}`;
    const startServer = async () => {
      const s = new DiscoveryServer({ configDir: cfgDir, listen, debounceMs: 50 });
      await s.start();
      servers.push(s);
      return s;
    };
    await startServer();

    // The VM: its Envoy talks ADS (Delta) to its agent's xDS proxy, which carries the health events upstream.
    proxy = new XdsProxy({ socketPath: path.join(dir.path, 'XDS'), upstream: { address: listen, tls: false, tokenFile: path.join(dir.path, 'vm-token') }, backoff: { initialMs: 100, maxMs: 500 } });
    await proxy.start();
    envoys.push(await startEnvoy({ xdsAddress: path.join(dir.path, 'XDS'), nodeId: 'sidecar~127.0.0.1~vm-a.test~test.svc.cluster.local', delta: true, metadata: { WORKLOAD_ENTRY: 'vm-a' } }));
    const events: HealthEvent[] = [];
    const px = proxy;
    checker = new HealthChecker({
      probe: parseReadinessProbe({ httpGet: { path: '/healthz', port: app.port }, periodSeconds: 1, failureThreshold: 2 }, 'test'),
      defaultHost: '127.0.0.1',
      onChange: (e) => {
        events.push(e);
        px.send(healthInformationRequest(e));
      },
    });
    await checker.start();

    // The other sidecar, straight to the discovery server (SotW), calls the VM's service.
    const other = await startEnvoy({ xdsAddress: listen, nodeId: 'sidecar~127.0.0.1~client.test~test.svc.cluster.local' });
    envoys.push(other);
    const url = `http://127.0.0.1:${servicePort}/`;
    await waitFor('the other sidecar to reach both VMs', async () => only(await reached(url), 'a', 'b'), 20_000, 200);
    await waitFor('the first health event (healthy)', () => events.length === 1 && events[0]!.healthy);

    app.healthy = false;
    await waitFor('the other sidecar to route only to the healthy VM', async () => only(await reached(url), 'b'), 20_000, 200);
    assert.equal(events.map((e) => e.healthy), [true, false]);
    assert.match(events[1]!.message, /app answered 500/);
    assert.equal(servers[0]!.status().health.map((h) => [h.workloadEntry, h.healthy]), [['test/vm-a', false]]);
    // It stays out: no request reaches a while the probe keeps failing.
    const before = a.requests;
    for (let i = 0; i < 30; i++) assert.is(await fetchText(url), 'b');
    assert.is(a.requests, before);

    // Restart the control plane: the new one knows nothing until the xDS proxy re-sends the state.
    await servers[0]!.close();
    servers = [];
    const s2 = await startServer();
    await waitFor('the re-sent health event at the new control plane', () => s2.status().health.some((h) => h.workloadEntry === 'test/vm-a' && !h.healthy), 20_000, 100);
    await waitFor('the other sidecar to route only to the healthy VM after the restart', async () => only(await reached(url), 'b'), 20_000, 200);
    assert.equal(events.length, 2, 'no new event: the restart alone re-sent the state');

    app.healthy = true;
    await waitFor('the other sidecar to reach both VMs again', async () => only(await reached(url), 'a', 'b'), 20_000, 200);
    assert.equal(events.map((e) => e.healthy), [true, false, true]);
    assert.ok(logs.some((l) => l.includes('WorkloadEntry test/vm-a is unhealthy')));
    assert.ok(logs.some((l) => l.includes('WorkloadEntry test/vm-a is healthy again')));
  } finally {
    await checker?.close();
    await Promise.all(envoys.map((e) => e.stop()));
    await proxy?.close();
    for (const s of servers) await s.close();
    await Promise.all(backends.map((b) => b.close()));
    await app.close();
    dir.cleanup();
    configureLogging({ write: () => {} });
  }
});

test('thresholds: the state changes only after failureThreshold failures and successThreshold successes in a row (TCP probe)', async () => {
  const app = await healthEndpoint();
  const port = app.port;
  const events: HealthEvent[] = [];
  const checker = new HealthChecker({
    probe: parseReadinessProbe({ tcpSocket: { port }, periodSeconds: 1, failureThreshold: 3, successThreshold: 2 }, 'test'),
    defaultHost: '127.0.0.1',
    onChange: (e) => events.push(e),
  });
  try {
    await checker.start();
    // The first success does not reach successThreshold 2: nothing is reported yet.
    await sleep(300);
    assert.is(events.length, 0);
    await waitFor('healthy after two successes', () => events.length === 1, 10_000);
    assert.ok(events[0]!.healthy);
    await app.close();
    const t0 = Date.now();
    await waitFor('unhealthy after three failures', () => events.length === 2, 15_000);
    assert.ok(Date.now() - t0 >= 1500, 'three failures one period apart take at least two periods');
    assert.not.ok(events[1]!.healthy);
    assert.match(events[1]!.message, /ECONNREFUSED/);
  } finally {
    await checker.close();
    await app.close();
  }
});

test('an exec probe that never exits is killed at its timeout and reported unhealthy; exit 0 is healthy', async () => {
  const dir = tempDir('pa-exec-');
  const pidFile = path.join(dir.path, 'pid');
  const events: HealthEvent[] = [];
  const checker = new HealthChecker({
    probe: parseReadinessProbe({ exec: { command: ['sh', '-c', `echo $$ > ${pidFile}; exec sleep 1000`] }, timeoutSeconds: 1, periodSeconds: 5 }, 'test'),
    defaultHost: '127.0.0.1',
    onChange: (e) => events.push(e),
  });
  const ok = new HealthChecker({
    probe: parseReadinessProbe({ exec: { command: ['true'] } }, 'test'),
    defaultHost: '127.0.0.1',
    onChange: (e) => events.push(e),
  });
  try {
    await checker.start();
    await waitFor('the hung probe to be reported', () => events.length === 1, 10_000);
    assert.not.ok(events[0]!.healthy);
    assert.match(events[0]!.message, /did not finish within 1000 ms and was killed/);
    const pid = Number(fs.readFileSync(pidFile, 'utf8'));
    await waitFor('the hung probe process to be gone', () => !pidAlive(pid), 5000);
    await ok.start();
    await waitFor('the exec success', () => events.length === 2, 10_000);
    assert.ok(events[1]!.healthy);
    // Closing the checker kills a probe still running.
    fs.rmSync(pidFile);
    const hung = new HealthChecker({
      probe: parseReadinessProbe({ exec: { command: ['sh', '-c', `echo $$ > ${pidFile}; exec sleep 1000`] }, timeoutSeconds: 60 }, 'test'),
      defaultHost: '127.0.0.1',
      onChange: (e) => events.push(e),
    });
    await hung.start();
    await waitFor('the probe to run', () => fs.existsSync(pidFile) && fs.readFileSync(pidFile, 'utf8').trim() !== '', 5000);
    const pid2 = Number(fs.readFileSync(pidFile, 'utf8'));
    await hung.close();
    await waitFor('the probe of a closed checker to be gone', () => !pidAlive(pid2), 5000);
  } finally {
    await checker.close();
    await ok.close();
    dir.cleanup();
  }
});

test('gRPC and HTTP probes: SERVING and 2xx/3xx are healthy, NOT_SERVING and 4xx are not', async () => {
  const grpc = await import('@grpc/grpc-js');
  let serving = 1;
  const server = new grpc.Server();
  server.addService({
    Check: {
      path: '/grpc.health.v1.Health/Check', requestStream: false, responseStream: false,
      requestSerialize: (b: Buffer) => b, requestDeserialize: (b: Buffer) => b,
      responseSerialize: (b: Buffer) => b, responseDeserialize: (b: Buffer) => b,
    },
  }, { Check: (_call: unknown, cb: (e: null, b: Buffer) => void) => cb(null, Buffer.from([0x08, serving])) });
  const port = await new Promise<number>((res, rej) => server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (e, p) => (e ? rej(e) : res(p))));
  const app = await healthEndpoint();
  const events: Record<string, HealthEvent[]> = { grpc: [], http: [] };
  const checkers = [
    new HealthChecker({ probe: parseReadinessProbe({ grpc: { port }, periodSeconds: 1 }, 'test'), defaultHost: '127.0.0.1', onChange: (e) => events.grpc!.push(e) }),
    new HealthChecker({ probe: parseReadinessProbe({ httpGet: { port: app.port, path: '/' }, periodSeconds: 1 }, 'test'), defaultHost: '127.0.0.1', onChange: (e) => events.http!.push(e) }),
  ];
  try {
    for (const c of checkers) await c.start();
    await waitFor('both healthy', () => events.grpc!.length === 1 && events.http!.length === 1, 10_000);
    assert.ok(events.grpc![0]!.healthy && events.http![0]!.healthy);
    serving = 2;
    app.healthy = false;
    await waitFor('both unhealthy', () => events.grpc!.length === 2 && events.http!.length === 2, 10_000);
    assert.match(events.grpc![1]!.message, /NOT_SERVING/);
    assert.match(events.http![1]!.message, /500/);
  } finally {
    for (const c of checkers) await c.close();
    server.forceShutdown();
    await app.close();
  }
});

test('a bad readinessProbe names the field and its source; Istio\'s defaults apply', () => {
  assert.throws(() => parseReadinessProbe({}, 'PROXY_CONFIG'), /readinessProbe \(from PROXY_CONFIG\): want exactly one of httpGet, tcpSocket, exec or grpc/);
  assert.throws(() => parseReadinessProbe({ httpGet: { port: 'x' } }, 'PROXY_CONFIG'), /readinessProbe\.httpGet\.port \(from PROXY_CONFIG\)/);
  assert.throws(() => parseReadinessProbe({ exec: { command: [] } }, 'mesh config'), /readinessProbe\.exec\.command/);
  assert.throws(() => parseReadinessProbe({ tcpSocket: { port: 1 }, periodSeconds: -1 }, 'x'), /readinessProbe\.periodSeconds/);
  const p = parseReadinessProbe({ http_get: { port: 8080 } }, 'x');
  assert.equal([p.periodMs, p.timeoutMs, p.successThreshold, p.failureThreshold, p.initialDelayMs], [10_000, 1000, 1, 1, 0]);
  assert.equal([p.httpGet!.path, p.httpGet!.scheme], ['/', 'http']);
  assert.equal(healthInformationRequest({ healthy: true, message: '' }), { typeUrl: 'type.googleapis.com/istio.v1.HealthInformation' });
  assert.equal(healthInformationRequest({ healthy: false, message: 'down' }), { typeUrl: 'type.googleapis.com/istio.v1.HealthInformation', errorDetail: { code: 13, message: 'down' } });
});

test.run();
