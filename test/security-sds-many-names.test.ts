// Issue 21 #4 through the real Envoy: a standalone gateway whose Gateway has 1000 TLS servers, each with its own
// certificate files, so Envoy opens 1000 SDS streams for 1000 `file-cert:` names. Every one is read and sent once,
// the agent's status port answers within a second all along (on main each new name re-read every known file, and
// the agent stalled for seconds), and when the servers go away again Envoy's streams close and the agent forgets
// the names and stops watching their files.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as https from 'node:https';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';
import { agentFixture } from './helpers/agent-fixture';
import { freePort, httpRequest, waitFor } from './helpers/harness';
import { makeCerts } from './helpers/test-certs';

const N = 1000;

function get(port: number, sni: string, ca: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = https.request({ host: '127.0.0.1', port, servername: sni, ca, headers: { host: sni }, agent: false, timeout: 5000 }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('timeout', () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end();
  });
}

test('1000 file certificates over SDS through the real Envoy: each sent once, the agent answers within a second throughout, and released names are forgotten', async () => {
  const agent = await agentFixture({ prefix: 'pa-sds-many-' });
  const { dir, ports: { status } } = agent;
  const certs = await makeCerts(dir.path, { ca: {}, w: { ca: 'ca', hosts: ['*.example.com'] } });
  const files: { cert: string; key: string }[] = [];
  for (let i = 0; i < N; i++) {
    const d = path.join(dir.path, 'certs', String(i % 50));
    fs.mkdirSync(d, { recursive: true });
    const f = { cert: path.join(d, `h${i}.crt`), key: path.join(d, `h${i}.key`) };
    fs.copyFileSync(certs.w!.certPath, f.cert);
    fs.copyFileSync(certs.w!.keyPath, f.key);
    files.push(f);
  }
  const backend = http.createServer((req, res) => {
    req.resume();
    res.end('app');
  });
  await new Promise<void>((r) => backend.listen(0, '127.0.0.1', () => r()));
  const [servicePort, gatewayPort] = [await freePort(), await freePort()];
  const cfgDir = path.join(dir.path, 'mesh');
  fs.mkdirSync(cfgDir);
  const config = (n: number) => `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: app, namespace: test}
spec:
  hosts: [app.example.local]
  ports: [{number: ${servicePort}, name: http, protocol: HTTP}]
  endpoints: [{address: 127.0.0.1, ports: {http: ${(backend.address() as AddressInfo).port}}}]
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: ingress, namespace: test}
spec:
  servers:
${files.slice(0, n).map((f, i) => `  - port: {number: ${gatewayPort}, name: https-${i}, protocol: HTTPS}
    bind: 127.0.0.1
    hosts: [h${i}.example.com]
    tls: {mode: SIMPLE, serverCertificate: ${f.cert}, privateKey: ${f.key}}
`).join('')}---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: app, namespace: test}
spec:
  hosts: ["*.example.com"]
  gateways: [ingress]
  http:
  - route: [{destination: {host: app.example.local}}]
`;
  fs.writeFileSync(path.join(cfgDir, 'gw.yaml'), config(N));
  const { withLog } = agent;
  const certsDebug = async () => JSON.parse((await httpRequest(`http://127.0.0.1:${status}/debug/certs`, { timeoutMs: 1000 })).body) as { fileSecrets: { loaded: boolean }[]; watchedFiles: number };
  const pushes = async () => Number(/^istio_agent_sds_pushes_total (\d+)/m.exec((await httpRequest(`http://127.0.0.1:${status}/stats/prometheus`, { timeoutMs: 5000 })).body)?.[1] ?? -1);
  try {
    await agent.start({
      args: ['proxy', 'router', '--standalone', cfgDir],
      env: { POD_NAME: 'ingress-0' },
      ready: 'listening',
    });
    // While Envoy asks for the 1000 names, the status port keeps answering (a 2 s timeout: the machine is shared).
    let failed = 0;
    let requests = 0;
    let maxMs = 0;
    let polling = true;
    const poller = (async () => {
      while (polling) {
        const t = performance.now();
        requests++;
        await httpRequest(`http://127.0.0.1:${status}/healthz/ready`, { timeoutMs: 2000 }).catch(() => void failed++);
        maxMs = Math.max(maxMs, performance.now() - t);
        await new Promise((r) => setTimeout(r, 100));
      }
    })();
    await waitFor('all 1000 secrets loaded', async () => {
      const d = await certsDebug().catch(() => undefined);
      return d && d.fileSecrets.length === N && d.fileSecrets.every((f) => f.loaded);
    }, 90_000, 200).catch(withLog);
    polling = false;
    await poller;
    console.log(`status port while loading ${N} names: ${requests} requests, slowest ${maxMs.toFixed(0)} ms`);
    assert.is(failed, 0, `${failed} of ${requests} status requests failed or took more than 2 s`);
    for (const i of [0, 499, N - 1]) assert.is(await waitFor(`h${i} served`, () => get(gatewayPort, `h${i}.example.com`, certs.ca!.cert).catch(() => undefined), 30_000), 200);
    assert.is(await pushes(), N, 'each secret sent once');
    const nacks = /^istio_agent_sds_nacks_total (\d+)/m.exec((await httpRequest(`http://127.0.0.1:${status}/stats/prometheus`, { timeoutMs: 5000 })).body)?.[1];
    assert.is(nacks, '0', 'Envoy took every response that carried only new or changed secrets');

    // Down to one server: Envoy drops 999 subscriptions, and the agent forgets those names.
    fs.writeFileSync(path.join(cfgDir, 'gw.yaml'), config(1));
    await waitFor('the released names to be forgotten', async () => (await certsDebug()).fileSecrets.length === 1, 60_000).catch(withLog);
    assert.is((await certsDebug()).watchedFiles, 2, 'only the remaining certificate and key are watched');
    assert.is(await get(gatewayPort, 'h0.example.com', certs.ca!.cert), 200);
  } finally {
    backend.close();
    await agent.close();
  }
});

test.run();
