// Issue 20 #4 in the README's VM recipe: the agent runs as root, ENVOY_UID=1337 starts Envoy as 1337 and gives it
// the SDS socket. Uid 1337 (Envoy, or anything else running as 1337) could ask the agent for any file through a
// `file-cert:`/`file-root:` name and get it read as root: the embedded CA's root key, for one. Now the whole agent
// (a standalone gateway, the real Envoy as 1337) serves the file certificate its config names and 1337 may read,
// refuses the one whose key only root may read (the listener stays unserved, a log line says why), and an
// attacker running as 1337 on the SDS socket gets nothing for a name the config does not reference.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFile } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as https from 'node:https';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';
import type { TLSSocket } from 'node:tls';
import { agentFixture } from './helpers/agent-fixture';
import { freePort, waitFor } from './helpers/harness';
import { makeCerts } from './helpers/test-certs';

const ENVOY = 1337;

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

/** Raw DiscoveryResponse texts the attacker (uid 1337) got per name. */
function attack(socket: string, names: string[]): Promise<Map<string, string>> {
  const script = path.join(__dirname, 'helpers', 'sds-attacker.js');
  return new Promise((resolve, reject) => execFile('setpriv', [`--reuid=${ENVOY}`, `--regid=${ENVOY}`, '--clear-groups', process.execPath, script, socket, '2500', ...names],
    { encoding: 'utf8', timeout: 15_000 }, (err, out, errOut) => {
      if (err) return reject(new Error(`attacker failed: ${err.message} ${errOut}`));
      const got = new Map<string, string>(names.map((n) => [n, '']));
      for (const line of out.split('\n').filter(Boolean)) {
        const [name, b64] = line.split('\t') as [string, string];
        got.set(name, got.get(name)! + Buffer.from(b64, 'base64').toString('latin1'));
      }
      resolve(got);
    }));
}

test('VM recipe (root agent, ENVOY_UID=1337): Envoy gets the file certificate 1337 may read, not one whose key only root may read; uid 1337 on the SDS socket gets no unreferenced file', async () => {
  assert.is(process.getuid?.(), 0, 'this test runs as root, as CI does');
  const agent = await agentFixture({ prefix: 'pa-sds-uid-' });
  const { dir } = agent;
  fs.chmodSync(dir.path, 0o755);
  const certs = await makeCerts(dir.path, { ca: {}, ok: { ca: 'ca', hosts: ['ok.example.com'] }, bad: { ca: 'ca', hosts: ['bad.example.com'] } });
  const own = (p: string, mode: number, uid: number) => {
    fs.chmodSync(p, mode);
    fs.chownSync(p, uid, uid);
  };
  for (const c of Object.values(certs)) own(c.certPath, 0o644, 0);
  own(certs.ok!.keyPath, 0o600, ENVOY); // the VM recipe: the gateway's key given to istio-proxy
  own(certs.bad!.keyPath, 0o600, 0); // root's, like the embedded CA's root key
  own(certs.ca!.keyPath, 0o600, 0);
  const backend = http.createServer((req, res) => {
    req.resume();
    res.end('app');
  });
  await new Promise<void>((r) => backend.listen(0, '127.0.0.1', () => r()));
  const [servicePort, okPort, badPort] = [await freePort(), await freePort(), await freePort()];
  const cfgDir = path.join(dir.path, 'mesh');
  fs.mkdirSync(cfgDir);
  const server = (name: string, port: number, c: { certPath: string; keyPath: string }) => `  - port: {number: ${port}, name: ${name}, protocol: HTTPS}
    bind: 127.0.0.1
    hosts: ["*"]
    tls: {mode: SIMPLE, serverCertificate: ${c.certPath}, privateKey: ${c.keyPath}}
`;
  const config = (withBad: boolean) => `apiVersion: networking.istio.io/v1
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
${server('https-ok', okPort, certs.ok!)}${withBad ? server('https-bad', badPort, certs.bad!) : ''}---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: app, namespace: test}
spec:
  hosts: ["*"]
  gateways: [ingress]
  http:
  - route: [{destination: {host: app.example.local}}]
`;
  fs.writeFileSync(path.join(cfgDir, 'gw.yaml'), config(false));
  const { withLog } = agent;
  try {
    await agent.start({
      args: ['proxy', 'router', '--standalone', cfgDir],
      env: { POD_NAME: 'ingress-0', ENVOY_UID: String(ENVOY), ENVOY_GID: String(ENVOY) },
      ready: 'listening',
    });
    const fp = await waitFor('the file certificate uid 1337 may read, served', () => fetchTls(okPort, 'ok.example.com', certs.ca!.cert).catch(() => undefined), 30_000).catch(withLog);
    assert.is(fp, new X509Certificate(certs.ok!.cert).fingerprint256);
    const socket = path.join(dir.path, 'var/run/secrets/workload-spiffe-uds/socket');
    assert.is(fs.statSync(socket).uid, ENVOY, 'the SDS socket is Envoy\'s');

    // The attack first: the CA's key through names the config does not reference.
    const unreferenced = [`file-cert:${certs.ca!.certPath}~${certs.ca!.keyPath}`, `file-root:${certs.ca!.keyPath}`, `file-cert:${certs.bad!.certPath}~${certs.ca!.keyPath}`];
    for (const [n, text] of await attack(socket, unreferenced)) assert.is(text, '', `uid ${ENVOY} gets nothing for ${n}`);
    assert.match(agent.log(), /which this Envoy's configuration \(bootstrap, listeners, clusters\) does not reference: not served/);

    fs.writeFileSync(path.join(cfgDir, 'gw.yaml'), config(true));
    await waitFor('the refusal of the root-only key', () => agent.log().includes(`cannot read ${certs.bad!.keyPath}: not readable by uid ${ENVOY} gid ${ENVOY}`), 20_000).catch(withLog);
    assert.not.ok(await fetchTls(badPort, 'bad.example.com', certs.ca!.cert).catch(() => undefined), 'no server with a key Envoy could not read');
    const referencedRootOnly = `file-cert:${certs.bad!.certPath}~${certs.bad!.keyPath}`;
    assert.is((await attack(socket, [referencedRootOnly])).get(referencedRootOnly), '', 'referenced, but only root may read the key');

    assert.not.match(agent.log(), /PRIVATE KEY/);
    assert.is(await fetchTls(okPort, 'ok.example.com', certs.ca!.cert), fp, 'the good server is still served');
  } finally {
    backend.close();
    await agent.close();
  }
});

test.run();
