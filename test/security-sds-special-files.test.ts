// Issue 21 #3: an SDS name that points at a FIFO, a character device or a huge file must not wedge the agent. The
// whole agent runs as a standalone gateway (dist/pilot-agent proxy router --standalone) whose Gateway names such
// files as server certificates, so the real Envoy asks the agent's SDS server for them. The agent refuses them
// (regular files of bounded size only, never opened if they are not, read without blocking), keeps serving the
// good server on the same port, its status port answers within a second throughout, and SIGTERM still ends it.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as https from 'node:https';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';
import type { TLSSocket } from 'node:tls';
import { agentFixture } from './helpers/agent-fixture';
import { freePort, httpRequest, sleep, waitFor } from './helpers/harness';
import { makeCerts } from './helpers/test-certs';

function fetchTls(port: number, sni: string, ca: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = https.request({ host: '127.0.0.1', port, servername: sni, ca, headers: { host: sni }, agent: false, timeout: 5000 }, (res) => {
      const fp = (res.socket as TLSSocket).getPeerCertificate().fingerprint256;
      res.resume();
      res.on('end', () => resolve(fp));
    });
    req.on('timeout', () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end();
  });
}

test('SDS names that point at a FIFO, /dev/zero or a huge file are refused without wedging the agent: the status port answers, the good server is served, SIGTERM ends it', async () => {
  const agent = await agentFixture({ prefix: 'pa-sds-special-' });
  const { dir, ports: { status } } = agent;
  const certs = await makeCerts(dir.path, { ca: {}, b: { ca: 'ca', hosts: ['b.example.com'] } });
  const fifo = path.join(dir.path, 'cert.fifo');
  execFileSync('mkfifo', [fifo]);
  const huge = path.join(dir.path, 'huge.pem');
  fs.closeSync(fs.openSync(huge, 'w'));
  fs.truncateSync(huge, 64 * 1024 * 1024); // sparse: no disk used
  const backend = http.createServer((req, res) => {
    req.resume();
    res.end('app');
  });
  await new Promise<void>((r) => backend.listen(0, '127.0.0.1', () => r()));
  const [servicePort, gatewayPort, badPort] = [await freePort(), await freePort(), await freePort()];
  const cfgDir = path.join(dir.path, 'mesh');
  fs.mkdirSync(cfgDir);
  // The bad servers come once Envoy serves the good one, on a port of their own: Envoy keeps a listener warming
  // until all of its secrets arrive (and, at start-up, all listeners).
  const server = (name: string, host: string, tls: string, port = badPort) => `  - port: {number: ${port}, name: ${name}, protocol: HTTPS}
    bind: 127.0.0.1
    hosts: [${host}]
    tls: ${tls}
`;
  const config = (bad: boolean) => `apiVersion: networking.istio.io/v1
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
${bad ? server('https-fifo', 'fifo.example.com', `{mode: SIMPLE, serverCertificate: ${fifo}, privateKey: ${fifo}}`) : ''}\
${bad ? server('https-zero', 'zero.example.com', '{mode: MUTUAL, serverCertificate: /dev/zero, privateKey: /dev/zero, caCertificates: /dev/zero}') : ''}\
${bad ? server('https-huge', 'huge.example.com', `{mode: SIMPLE, serverCertificate: ${huge}, privateKey: ${huge}}`) : ''}\
${server('https-b', 'b.example.com', `{mode: SIMPLE, serverCertificate: ${certs.b!.certPath}, privateKey: ${certs.b!.keyPath}}`, gatewayPort)}\
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: app, namespace: test}
spec:
  hosts: [b.example.com, fifo.example.com, zero.example.com, huge.example.com]
  gateways: [ingress]
  http:
  - route: [{destination: {host: app.example.local}}]
`;
  fs.writeFileSync(path.join(cfgDir, 'gw.yaml'), config(false));
  const { withLog } = agent;
  try {
    await agent.start({
      args: ['proxy', 'router', '--standalone', cfgDir],
      env: { POD_NAME: 'ingress-0' },
      ready: 'listening',
    });
    const fp = await waitFor('b.example.com served', () => fetchTls(gatewayPort, 'b.example.com', certs.ca!.cert).catch(() => undefined), 20_000).catch(withLog);
    assert.is(fp, new X509Certificate(certs.b!.cert).fingerprint256);
    fs.writeFileSync(path.join(cfgDir, 'gw.yaml'), config(true));
    await waitFor('the refusals', () => /a FIFO, not a regular file/.test(agent.log()) && /a character device, not a regular file/.test(agent.log())
      && /more than the 1048576 allowed/.test(agent.log()), 20_000).catch(withLog);
    // Envoy keeps its SDS streams for these names open and the watcher keeps looking at the files: the agent
    // must go on answering meanwhile (each request within a second), over a few of the watcher's polls.
    for (let i = 0; i < 20; i++) {
      const r = await httpRequest(`http://127.0.0.1:${status}/healthz/ready`, { timeoutMs: 1000 }).catch((e: Error) => withLog(new Error(`status port request ${i}: ${e.message}`)));
      assert.ok(r.status === 200 || r.status === 503, `status port answered ${r.status}`);
      await sleep(250);
    }
    assert.is(await fetchTls(gatewayPort, 'b.example.com', certs.ca!.cert), fp, 'the good server is still served');
    assert.is(agent.proc.exitCode, null, 'the agent is the same process');
    agent.proc.kill('SIGTERM');
    const end = await waitFor('the agent to end on SIGTERM', () => agent.exited, 15_000).catch(withLog);
    assert.equal(end, { code: 0, signal: null });
  } finally {
    backend.close();
    await agent.close();
  }
});

test.run();
