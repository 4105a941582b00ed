// The whole agent as a standalone TLS gateway: dist/pilot-agent proxy router --standalone DIR. Two HTTPS servers
// share one port, told apart by SNI: one's certificate is a `kind: Secret` the embedded discovery server sends over
// ADS (so the xDS proxy must pass the SDS type through to Envoy), the other's is a pair of files the agent's own SDS
// server reads (`file-cert:<cert>~<key>` through the bootstrap's sds-grpc cluster). Editing the Secret rotates the
// certificate Envoy presents, with no Envoy restart. And an ISTIO_MUTUAL server: the gateway's workload certificate
// from the embedded CA, clients verified against the same root.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { X509Certificate } from 'node:crypto';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as https from 'node:https';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';
import type { TLSSocket } from 'node:tls';
import { CaClient } from '../lib/ca-client';
import { SecretCache } from '../lib/secret-cache';
import { agentFixture } from './helpers/agent-fixture';
import { freePort, httpRequest, waitFor } from './helpers/harness';
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
  const agent = await agentFixture({ prefix: 'pa-gwtls-' });
  const { dir, ports: { status } } = agent;
  const certs = await makeCerts(dir.path, { ca: {}, a1: { ca: 'ca', hosts: ['a.example.com'] }, a2: { ca: 'ca', hosts: ['a.example.com'] }, b: { ca: 'ca', hosts: ['b.example.com'] } });
  const fp = (n: string) => new X509Certificate(certs[n]!.cert).fingerprint256;
  const backend = http.createServer((req, res) => {
    req.resume();
    res.end('app');
  });
  await new Promise<void>((r) => backend.listen(0, '127.0.0.1', () => r()));
  const [servicePort, gatewayPort] = [await freePort(), await freePort()];
  const cfgDir = path.join(dir.path, 'mesh');
  fs.mkdirSync(cfgDir);
  const file = path.join(cfgDir, 'gateway.yaml');
  const files = { cert: certs.b!.certPath, key: certs.b!.keyPath };
  const write = (secret: string) => fs.writeFileSync(file, config(servicePort, (backend.address() as AddressInfo).port, gatewayPort, certs[secret]!, files));
  write('a1');
  const ca = certs.ca!.cert;
  try {
    await agent.start({ args: ['proxy', 'router', '--standalone', cfgDir], env: { POD_NAME: 'ingress-0' } });
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
    backend.close();
    await agent.close();
  }
});

test('a standalone gateway ISTIO_MUTUAL server presents its workload certificate from the embedded CA and requires a client certificate of the same CA', async () => {
  const agent = await agentFixture({ prefix: 'pa-gwmtls-' });
  const { dir } = agent;
  const cfgDir = path.join(dir.path, 'mesh');
  agent.writeTokens(cfgDir, { ingress: 'gw-token', client: 'client-token' }, 'ingress');
  fs.writeFileSync(path.join(dir.path, 'client-token'), 'client-token');
  const backend = http.createServer((req, res) => {
    req.resume();
    res.end(String(req.headers['x-forwarded-client-cert'] ?? 'no xfcc'));
  });
  await new Promise<void>((r) => backend.listen(0, '127.0.0.1', () => r()));
  const [servicePort, gatewayPort] = [await freePort(), await freePort()];
  fs.writeFileSync(path.join(cfgDir, 'gw.yaml'), `apiVersion: networking.istio.io/v1
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
  - port: {number: ${gatewayPort}, name: https, protocol: HTTPS}
    bind: 127.0.0.1
    hosts: ["*"]
    tls: {mode: ISTIO_MUTUAL}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: app, namespace: test}
spec:
  hosts: ["*"]
  gateways: [ingress]
  http:
  - route: [{destination: {host: app.example.local}}]
`);
  let client: SecretCache | undefined;
  try {
    await agent.start({
      args: ['proxy', 'router', '--standalone', cfgDir],
      env: { POD_NAME: 'ingress-0', SERVICE_ACCOUNT: 'ingress' },
    });
    // A client workload certificate from the same embedded CA, proven with the client's token.
    const signer = new CaClient({ address: `unix:${path.join(dir.path, 'proxy', 'discovery.sock')}`, tls: false, rootCaFile: '', serverName: '', tokenFile: path.join(dir.path, 'client-token'), headers: {} });
    client = new SecretCache({ identity: 'spiffe://cluster.local/ns/test/sa/client', algorithm: { kind: 'ECDSA' }, ttlMs: 3600_000, graceRatio: 0.5, graceJitter: 0.01, signer });
    await client.start();
    const c = client;
    const tlsSecret = await waitFor('the client certificate', () => c.secret('default'), 15_000);
    const root = c.secret('ROOTCA');
    if (tlsSecret.kind !== 'tls' || root?.kind !== 'root') throw new Error('unexpected secret kinds');
    const get = (withCert: boolean) => new Promise<{ body: string; peer: string }>((resolve, reject) => {
      const req = https.request({
        host: '127.0.0.1', port: gatewayPort, agent: false, timeout: 5000, ca: root.rootPem, headers: { host: 'app.example.com' },
        // The gateway's certificate names a SPIFFE id, not a DNS name: check that instead of the host.
        checkServerIdentity: () => undefined,
        ...(withCert ? { cert: tlsSecret.certChainPem, key: tlsSecret.keyPem } : {}),
      }, (res) => {
        const peer = String((res.socket as TLSSocket).getPeerCertificate().subjectaltname);
        let body = '';
        res.on('data', (d: Buffer) => (body += d.toString()));
        res.on('end', () => resolve({ body, peer }));
      });
      req.on('timeout', () => req.destroy(new Error('timed out')));
      req.on('error', reject);
      req.end();
    });
    const ok = await waitFor('a request with the client certificate', () => get(true).catch(() => undefined), 15_000)
      .catch((e: Error) => { throw new Error(`${e.message}\n${agent.log().slice(-3000)}`); });
    assert.match(ok.peer, 'URI:spiffe://cluster.local/ns/test/sa/ingress', 'the gateway presents its workload certificate');
    assert.match(ok.body, 'URI=spiffe://cluster.local/ns/test/sa/client', 'the backend sees the client\'s SPIFFE id (XFCC)');
    const refused = await get(false).then(() => 'answered', (e: Error) => e.message);
    assert.is.not(refused, 'answered', 'no client certificate, no answer');
  } finally {
    await client?.close();
    backend.close();
    await agent.close();
  }
});

test.run();
