// The whole agent in standalone mode: dist/pilot-agent proxy --standalone DIR, with its embedded discovery
// server, its xDS proxy, the generated bootstrap and the real Envoy, routing to real HTTP backends on loopback.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';
import { agentFixture } from './helpers/agent-fixture';
import { freePort, httpRequest, pidAlive, sleep, waitFor } from './helpers/harness';
import { startLoad } from './helpers/load';

function backend(name: string): Promise<{ server: http.Server; port: number }> {
  const server = http.createServer((req, res) => {
    req.resume();
    res.end(name);
  });
  return new Promise((r) => server.listen(0, '127.0.0.1', () => r({ server, port: (server.address() as AddressInfo).port })));
}

function serviceYaml(servicePort: number, v1: number, v2: number, weights: [number, number]): string {
  return `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: web, namespace: test }
spec:
  hosts: [web.test.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{ number: ${servicePort}, name: http, protocol: HTTP }]
  endpoints:
  - { address: 127.0.0.1, ports: { http: ${v1} }, labels: { version: v1 } }
  - { address: 127.0.0.1, ports: { http: ${v2} }, labels: { version: v2 } }
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: { name: web, namespace: test }
spec:
  host: web.test.local
  subsets:
  - { name: v1, labels: { version: v1 } }
  - { name: v2, labels: { version: v2 } }
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: { name: web, namespace: test }
spec:
  hosts: [web.test.local]
  http:
  - route:
    - { destination: { host: web.test.local, subset: v1 }, weight: ${weights[0]} }
    - { destination: { host: web.test.local, subset: v2 }, weight: ${weights[1]} }
`;
}

test('standalone mode routes real traffic, follows file edits and survives hot restarts with zero failed requests', async () => {
  const agent = await agentFixture({ prefix: 'pa-standalone-' });
  const { dir, ports: { status } } = agent;
  const [b1, b2] = await Promise.all([backend('v1'), backend('v2')]);
  const servicePort = await freePort();
  const cfgDir = path.join(dir.path, 'mesh');
  fs.mkdirSync(cfgDir);
  const file = path.join(cfgDir, 'web.yaml');
  fs.writeFileSync(file, serviceYaml(servicePort, b1.port, b2.port, [100, 0]));
  const url = `http://127.0.0.1:${servicePort}/`;
  let pids: number[] = [];
  try {
    await agent.start({ args: ['proxy', 'sidecar', '--standalone', cfgDir, '--log_output_level=metrics:debug'], env: { POD_NAME: 'web-client' } });
    await waitFor('v1 served', async () => (await httpRequest(url)).body === 'v1', 10_000);

    const load = startLoad({ url, concurrency: 4, countBodies: true, maxDurationMs: 60_000 });
    // A file edit reaches Envoy through discovery server -> xDS proxy -> Envoy, without a restart.
    fs.writeFileSync(file, serviceYaml(servicePort, b1.port, b2.port, [0, 100]));
    await waitFor('v2 served after the edit', async () => (await httpRequest(url)).body === 'v2', 10_000);
    // Hot restarts under load: each new epoch gets its config over its own xDS stream through the proxy.
    for (const epoch of [1, 2, 3]) {
      agent.proc.kill('SIGHUP');
      await waitFor(`epoch ${epoch} live`, async () => {
        const d = JSON.parse((await httpRequest(`http://127.0.0.1:${status}/debug/epochs`)).body);
        return d.epochs.some((e: { epoch: number; state: string }) => e.epoch === epoch && e.state === 'live');
      }, 20_000);
      await sleep(300);
    }
    const r = await load.stop();
    assert.is(r.failed, 0, `failed requests: ${r.errors.join('; ')}`);
    assert.ok((r.bodies.v2 ?? 0) > 0 && r.ok > 100, `load ran: ${JSON.stringify(r.bodies)}`);
    assert.is((await httpRequest(url)).body, 'v2');
    const xds = JSON.parse((await httpRequest(`http://127.0.0.1:${status}/debug/xds`)).body);
    assert.ok(Array.isArray(xds.streams) && xds.streams.length >= 1, 'the xDS proxy reports its streams');
    const metrics = (await httpRequest(`http://127.0.0.1:${status}/stats/prometheus`)).body;
    assert.match(metrics, /istio_agent_envoy_epochs_started_total 4/);
    assert.match(metrics, /envoy_cluster_manager/, `Envoy's own metrics are merged in: ${agent.log().split('\n').filter((l) => l.includes('metrics')).slice(-5).join('\n')}`);
    const sockMode = (f: string) => (fs.statSync(path.join(dir.path, 'proxy', f)).mode & 0o777).toString(8);
    assert.is(sockMode('XDS'), '660', 'Envoy\'s xDS socket: owner and group only');
    assert.is(sockMode('discovery.sock'), '660', 'the embedded discovery socket: owner and group only');
    pids = JSON.parse((await httpRequest(`http://127.0.0.1:${status}/debug/epochs`)).body).epochs.map((e: { pid: number }) => e.pid);
  } finally {
    try {
      agent.proc.kill('SIGTERM');
      const exit = await waitFor('agent exit', () => agent.exited, 15_000);
      await agent.stop();
      b1.server.close();
      b2.server.close();
      assert.is(exit.code, 0);
      for (const pid of pids) assert.not.ok(pidAlive(pid));
      const left = fs.readdirSync(path.join(dir.path, 'proxy'));
      assert.equal(left, [], 'no socket, bootstrap or base id file left behind');
    } finally {
      await agent.close();
    }
  }
});

test.run();
