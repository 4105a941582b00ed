// The whole agent as a standalone TLS gateway: dist/pilot-agent proxy router --standalone DIR. Two HTTPS servers
// share one port, told apart by SNI: one's certificate is a `kind: Secret` the embedded discovery server sends over
// ADS (so the xDS proxy must pass the SDS type through to Envoy), the other's is a pair of files the agent's own SDS
// server reads (`file-cert:<cert>~<key>` through the bootstrap's sds-grpc cluster). Editing the Secret rotates the
// certificate Envoy presents, with no Envoy restart.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { X509Certificate } from 'node:crypto';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as https from 'node:https';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';
import type { TLSSocket } from 'node:tls';
import { startAgent } from './helpers/agent';
import { envoyBin, freePort, httpRequest, tempDir, waitFor } from './helpers/harness';
import { makeCerts } from './helpers/test-certs';

const b64 = (s: string) => Buffer.from(s).toString('base64');

function config(servicePort: number, backendPort: number, gatewayPort: number, secretCert: { cert: string; key: string }, files: { cert: string; key: string }): string {
  return `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: app, namespace: test}
spec:
  hosts: [app.example.local]
  ports: [{number: ${servicePort}, name: http, protocol: HTTP}]
  endpoints: [{address: 127.0.0.1, ports: {http: ${backendPort}}}]
---
apiVersion: v1
kind: Secret
metadata: {name: a-cred, namespace: test}
type: kubernetes.io/tls
data: {tls.crt: ${b64(secretCert.cert)}, tls.key: ${b64(secretCert.key)}}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: ingress, namespace: test}
spec:
  servers:
  - port: {number: ${gatewayPort}, name: https-a, protocol: HTTPS}
    bind: 127.0.0.1
    hosts: [a.example.com]
    tls: {mode: SIMPLE, credentialName: a-cred}
  - port: {number: ${gatewayPort}, name: https-b, protocol: HTTPS}
    bind: 127.0.0.1
    hosts: [b.example.com]
    tls: {mode: SIMPLE, serverCertificate: ${files.cert}, privateKey: ${files.key}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: app, namespace: test}
spec:
  hosts: [a.example.com, b.example.com]
  gateways: [ingress]
  http:
  - route:
    - destination: {host: app.example.local}
`;
}

/** The fingerprint of the certificate the gateway presents for `sni`, and the answer's body. */
function fetchTls(port: number, sni: string, ca: string): Promise<{ fingerprint: string; body: string }> {
  return new Promise((resolve, reject) => {
    const req = https.request({ host: '127.0.0.1', port, servername: sni, ca, headers: { host: sni }, agent: false, timeout: 5000 }, (res) => {
      const fingerprint = (res.socket as TLSSocket).getPeerCertificate().fingerprint256;
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => resolve({ fingerprint, body }));
    });
    req.on('timeout', () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end();
  });
}

test('a standalone gateway serves a Secret over ADS and file certificates over the agent SDS on one port, and rotates the Secret without restarting Envoy', async () => {
  const dir = tempDir('pa-gwtls-');
  const certs = await makeCerts(dir.path, { ca: {}, a1: { ca: 'ca', hosts: ['a.example.com'] }, a2: { ca: 'ca', hosts: ['a.example.com'] }, b: { ca: 'ca', hosts: ['b.example.com'] } });
  const fp = (n: string) => new X509Certificate(certs[n]!.cert).fingerprint256;
  const backend = http.createServer((req, res) => {
    req.resume();
    res.end('app');
  });
  await new Promise<void>((r) => backend.listen(0, '127.0.0.1', () => r()));
  const [servicePort, gatewayPort, status, admin] = [await freePort(), await freePort(), await freePort(), await freePort()];
  const cfgDir = path.join(dir.path, 'mesh');
  fs.mkdirSync(cfgDir);
  const file = path.join(cfgDir, 'gateway.yaml');
  const files = { cert: certs.b!.certPath, key: certs.b!.keyPath };
  const write = (secret: string) => fs.writeFileSync(file, config(servicePort, (backend.address() as AddressInfo).port, gatewayPort, certs[secret]!, files));
  write('a1');
  const agent = startAgent(['proxy', 'router', '--standalone', cfgDir], {
    PROXY_CONFIG: JSON.stringify({ configPath: path.join(dir.path, 'proxy'), binaryPath: envoyBin(), statusPort: status, proxyAdminPort: admin, drainDuration: '1s', parentShutdownDuration: '2s', terminationDrainDuration: '1s' }),
    POD_NAME: 'ingress-0', POD_NAMESPACE: 'test', INSTANCE_IP: '127.0.0.1',
    ENVOY_STATUS_PORT: String(await freePort()), ENVOY_PROMETHEUS_PORT: String(await freePort()),
  }, dir.path);
  const ca = certs.ca!.cert;
  try {
    await waitFor('agent ready', async () => (await httpRequest(`http://127.0.0.1:${status}/healthz/ready`)).status === 200, 30_000)
      .catch((e: Error) => { throw new Error(`${e.message}\n${agent.log()}`); });
    const a = await waitFor('a.example.com served', () => fetchTls(gatewayPort, 'a.example.com', ca).catch(() => undefined), 15_000)
      .catch((e: Error) => { throw new Error(`${e.message}\n${agent.log()}`); });
    assert.is(a.body, 'app');
    assert.is(a.fingerprint, fp('a1'), 'the Secret\'s certificate, sent over ADS through the xDS proxy');
    const b = await waitFor('b.example.com served', () => fetchTls(gatewayPort, 'b.example.com', ca).catch(() => undefined), 15_000);
    assert.is(b.body, 'app');
    assert.is(b.fingerprint, fp('b'), 'the file certificate, from the agent\'s SDS server');
    const epochs = () => httpRequest(`http://127.0.0.1:${status}/debug/epochs`).then((r) => JSON.parse(r.body).epochs.map((e: { pid: number }) => e.pid) as number[]);
    const before = await epochs();

    write('a2');
    await waitFor('the rotated certificate served', async () => (await fetchTls(gatewayPort, 'a.example.com', ca).catch(() => undefined))?.fingerprint === fp('a2'), 15_000);
    assert.equal(await epochs(), before, 'the same Envoy serves the new certificate');
    assert.not.match(agent.log(), /BEGIN (EC )?PRIVATE KEY/, 'no key material in the agent\'s log');
  } finally {
    agent.proc.kill('SIGTERM');
    await waitFor('agent exit', () => agent.exited, 15_000).catch(() => undefined);
    await agent.stop();
    backend.close();
    dir.cleanup();
  }
});

test.run();
