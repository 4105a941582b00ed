// The whole thing with the real executable: `pilot-agent discovery` as a small fleet's control plane and two
// `pilot-agent proxy` sidecars. The VM's agent has a readinessProbe; when its app goes unhealthy the other
// sidecar's Envoy stops routing to it (real requests, and its /clusters), routes again when it recovers, and the
// state is re-sent after the control plane restarts. The other agent also serves an app probe and /debug/pprof/.

import * as fs from 'node:fs';
import * as http from 'node:http';
import type * as net from 'node:net';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { type AgentFixture, agentFixture } from './helpers/agent-fixture';
import { type DiscoveryProcess, startDiscoveryProcess } from './helpers/discovery-process';
import { type Backend, fetchText, startBackend } from './helpers/discovery-envoy';
import { freePort, httpRequest, tempDir, waitFor } from './helpers/harness';

function meshYaml(servicePort: number, a: number, b: number): string {
  const we = (name: string, port: number) => `apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: ${name}, namespace: test}
spec: {address: 127.0.0.1, labels: {app: vm}, ports: {http: ${port}}, serviceAccount: vm}
`;
  return `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: vm, namespace: test}
spec:
  hosts: [vm.test.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: ${servicePort}, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: vm}}
---
${we('vm-a', a)}---
${we('vm-b', b)}`;
}


/** Endpoints (ports) of the VM service in an Envoy's /clusters. */
async function endpointsSeen(adminPort: number, servicePort: number): Promise<number[]> {
  const body = (await httpRequest(`http://127.0.0.1:${adminPort}/clusters`)).body;
  const re = new RegExp(`^outbound\\|${servicePort}\\|\\|vm\\.test\\.local::127\\.0\\.0\\.1:(\\d+)::cx_total::`, 'gm');
  return [...body.matchAll(re)].map((m) => Number(m[1])).sort();
}

test('standalone fleet: an unhealthy VM leaves the other sidecar\'s endpoints, returns, and the state survives a control-plane restart', async () => {
  const dir = tempDir('pa-vmhealth-');
  const backends: Backend[] = [];
  const agents: AgentFixture[] = [];
  let discovery: DiscoveryProcess | undefined;
  let healthy = true;
  const app = http.createServer((_req, res) => res.writeHead(healthy ? 200 : 503).end(healthy ? 'ok' : 'draining'));
  await new Promise<void>((r) => app.listen(0, '127.0.0.1', () => r()));
  const appPort = (app.address() as net.AddressInfo).port;
  try {
    const a = await startBackend('a');
    const b = await startBackend('b');
    backends.push(a, b);
    const servicePort = await freePort();
    const meshDir = path.join(dir.path, 'mesh');
    fs.mkdirSync(meshDir);
    fs.writeFileSync(path.join(meshDir, 'vm.yaml'), meshYaml(servicePort, a.port, b.port));
    // The VM's identity: its agent sends this token on its xDS stream (as for the CA), or its health is ignored.
    fs.mkdirSync(path.join(meshDir, 'ca', 'identities', 'test'), { recursive: true });
    fs.writeFileSync(path.join(meshDir, 'ca', 'identities', 'test', 'vm'), 'vm-token\n', { mode: 0o600 });
    const discoveryAddr = `127.0.0.1:${await freePort()}`;
    discovery = startDiscoveryProcess(meshDir, discoveryAddr);
    await waitFor('the discovery server', () => discovery!.out().includes('discovery server listening'), 20_000);

    const agent = async (name: string, proxyConfig: Record<string, unknown>, env: Record<string, string>) => {
      const fixture = await agentFixture({ prefix: `pa-vmhealth-${name}-` });
      agents.push(fixture);
      const home = fixture.dir.path;
      if (env.SERVICE_ACCOUNT === 'vm') {
        fs.mkdirSync(path.join(home, 'var/run/secrets/tokens'), { recursive: true });
        fs.writeFileSync(path.join(home, 'var/run/secrets/tokens/istio-token'), 'vm-token\n', { mode: 0o600 });
      }
      const ports = { status: fixture.ports.status, admin: fixture.ports.admin };
      await fixture.start({
        proxyConfig: { discoveryAddress: discoveryAddr, controlPlaneAuthPolicy: 'NONE', ...proxyConfig },
        env: { POD_NAME: name, ...env },
      });
      return { ...ports, running: fixture.agent };
    };
    await agent('vm-a', { readinessProbe: { httpGet: { path: '/healthz', port: appPort }, periodSeconds: 1, failureThreshold: 2 } }, { ISTIO_META_WORKLOAD_ENTRY: 'vm-a', SERVICE_ACCOUNT: 'vm' });
    const client = await agent('client', {}, {
      ISTIO_KUBE_APP_PROBERS: JSON.stringify({ '/app-health/client/readyz': { httpGet: { path: '/', port: b.port }, timeoutSeconds: 2 } }),
    });

    // The other agent serves kubelet's rewritten probe and the profiling index.
    const probe = await httpRequest(`http://127.0.0.1:${client.status}/app-health/client/readyz`);
    assert.is(probe.status, 200);
    assert.is(probe.body, 'b');
    assert.is((await httpRequest(`http://127.0.0.1:${client.status}/debug/pprof/`)).status, 200);

    const url = `http://127.0.0.1:${servicePort}/`;
    const both = [a.port, b.port].sort();
    await waitFor('the other sidecar to have both VMs', async () => JSON.stringify(await endpointsSeen(client.admin, servicePort)) === JSON.stringify(both), 20_000, 200);
    const seen = new Set<string>();
    await waitFor('requests to reach both VMs', async () => {
      seen.add(await fetchText(url));
      return seen.has('a') && seen.has('b');
    }, 20_000, 20);

    healthy = false;
    await waitFor('the other sidecar to drop the unhealthy VM', async () => JSON.stringify(await endpointsSeen(client.admin, servicePort)) === JSON.stringify([b.port]), 20_000, 200);
    const before = a.requests;
    for (let i = 0; i < 30; i++) assert.is(await fetchText(url), 'b');
    assert.is(a.requests, before, 'no request reached the unhealthy VM');
    assert.match(discovery.out(), /WorkloadEntry test\/vm-a is unhealthy/);

    // A new control plane knows nothing of vm-a's health until the VM's agent re-sends it on its new stream.
    await discovery.stop();
    discovery = startDiscoveryProcess(meshDir, discoveryAddr);
    await waitFor('the re-sent health event at the new control plane', () => /WorkloadEntry test\/vm-a is unhealthy/.test(discovery!.out()), 30_000, 100)
      .catch((e: Error) => { throw new Error(`${e.message}\n${discovery!.out()}`); });
    // Until then the other sidecar still holds the old control plane's [b], and if it reconnects inside the
    // debounce after the event it is first sent both (the push context from before the event, as istiod would):
    // wait for it to be connected and for the push that follows the event before looking at its endpoints.
    const pushedAfterEvent = () => {
      const out = discovery!.out();
      const event = out.indexOf('WorkloadEntry test/vm-a is unhealthy');
      return /proxy connected\tproxy=sidecar~[^~]*~client\./.test(out) && event >= 0 && /\tpush\t/.test(out.slice(event));
    };
    await waitFor('the other sidecar to connect to the new control plane, and its push after the event', pushedAfterEvent, 20_000, 100)
      .catch((e: Error) => { throw new Error(`${e.message}\n${discovery!.out()}`); });
    await waitFor('the other sidecar, reconnected, without the unhealthy VM', async () => JSON.stringify(await endpointsSeen(client.admin, servicePort)) === JSON.stringify([b.port]), 20_000, 200);

    healthy = true;
    // The log first: the sidecar's endpoints must change because of the report, not before it.
    await waitFor('the VM\'s recovery at the control plane', () => /WorkloadEntry test\/vm-a is healthy again/.test(discovery!.out()), 20_000, 100)
      .catch((e: Error) => { throw new Error(`${e.message}\n${discovery!.out()}`); });
    await waitFor('the other sidecar to have both VMs again', async () => JSON.stringify(await endpointsSeen(client.admin, servicePort)) === JSON.stringify(both), 20_000, 200);
    const after = a.requests;
    await waitFor('requests to reach the recovered VM', async () => (await fetchText(url)) && a.requests > after, 10_000, 20);
  } finally {
    await Promise.all(agents.map((ag) => ag.close()));
    await discovery?.stop();
    await Promise.all(backends.map((x) => x.close()));
    app.closeAllConnections();
    await new Promise<void>((r) => app.close(() => r()));
    dir.cleanup();
  }
});

test.run();
