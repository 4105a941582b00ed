// Standalone mTLS with nothing else running: the agent (`proxy --standalone`, a client sidecar) gets its
// certificate from its embedded CA, and its discovery server generates Istio's auto-mTLS for a ServiceEntry
// endpoint labelled as having a sidecar (security.istio.io/tlsMode: istio, serviceAccount server). The server
// side is a second Envoy whose certificate comes from the same embedded CA (its own token) over its own SDS
// server. The app behind it sees the client's SPIFFE id in XFCC; the server's Envoy counts TLS handshakes; the
// client's cluster checks the server's SPIFFE id; a DestinationRule with tls.mode DISABLE turns mTLS off (and the server refuses).

import * as fs from 'node:fs';
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { CaClient } from '../lib/ca-client';
import { SdsServer } from '../lib/sds-server';
import { SecretCache } from '../lib/secret-cache';
import { agentFixture } from './helpers/agent-fixture';
import { freePort, httpRequest, waitFor } from './helpers/harness';
import { startSdsEnvoy, type SdsEnvoy } from './helpers/sds-envoy';

const CLIENT = 'spiffe://cluster.local/ns/test/sa/client';
const SERVER = 'spiffe://cluster.local/ns/test/sa/server';

function serviceEntry(servicePort: number, inboundPort: number): string {
  return `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: web, namespace: test }
spec:
  hosts: [web.test.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{ number: ${servicePort}, name: http, protocol: HTTP }]
  endpoints:
  - { address: 127.0.0.1, ports: { http: ${inboundPort} }, labels: { security.istio.io/tlsMode: istio }, serviceAccount: server }
`;
}

const DISABLE = `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: { name: web, namespace: test }
spec:
  host: web.test.local
  trafficPolicy: { tls: { mode: DISABLE } }
`;

test('two standalone sidecars talk mTLS with certificates from the embedded CA; DISABLE turns it off', async () => {
  const agent = await agentFixture({ prefix: 'pa-mtls-' });
  const { dir, ports: { admin } } = agent;
  const cfgDir = path.join(dir.path, 'mesh');
  agent.writeTokens(cfgDir, { client: 'client-token', server: 'server-token' }, 'client');
  fs.writeFileSync(path.join(dir.path, 'server-token'), 'server-token');
  const [servicePort, inboundPort] = [await freePort(), await freePort()];
  fs.writeFileSync(path.join(cfgDir, 'web.yaml'), serviceEntry(servicePort, inboundPort));
  const app = http.createServer((req, res) => {
    req.resume();
    res.end(String(req.headers['x-forwarded-client-cert'] ?? 'no xfcc'));
  });
  await new Promise<void>((r) => app.listen(0, '127.0.0.1', () => r()));
  let server: { cache: SecretCache; sds: SdsServer; envoy?: SdsEnvoy } | undefined;
  try {
    await agent.start({ args: ['proxy', 'sidecar', '--standalone', cfgDir], env: { POD_NAME: 'client-1', SERVICE_ACCOUNT: 'client' } });
    // The server sidecar: its certificate from the same embedded CA, proven with its own token.
    const signer = new CaClient({ address: `unix:${path.join(dir.path, 'proxy', 'discovery.sock')}`, tls: false, rootCaFile: '', serverName: '', tokenFile: path.join(dir.path, 'server-token'), headers: {} });
    const cache = new SecretCache({ identity: SERVER, algorithm: { kind: 'ECDSA' }, ttlMs: 3600_000, graceRatio: 0.5, graceJitter: 0.01, signer });
    const sds = new SdsServer({ socketPath: path.join(dir.path, 'server-sds.sock'), provider: cache });
    server = { cache, sds };
    cache.onUpdate((n) => sds.push(n));
    await sds.start();
    await cache.start();
    server.envoy = await startSdsEnvoy({ sdsSocket: path.join(dir.path, 'server-sds.sock'), inbound: { port: inboundPort, backendPort: (app.address() as AddressInfo).port, peerSanPrefix: 'spiffe://cluster.local/ns/test/' } });

    const url = `http://127.0.0.1:${servicePort}/`;
    const get = () => httpRequest(url, { headers: { host: 'web.test.local' }, timeoutMs: 3000 });
    const xfcc = await waitFor('a request over mTLS', async () => {
      const r = await get();
      return r.status === 200 ? r.body : undefined;
    }, 30_000, 300).catch((e: Error) => { throw new Error(`${e.message}\nagent log:\n${agent.log().slice(-3000)}\nserver envoy:\n${server?.envoy?.logs()}`); });
    assert.match(xfcc, `URI=${CLIENT}`, 'the app sees the client sidecar\'s SPIFFE id');
    // The agent's bootstrap keeps Istio's stats inclusion list (no per-cluster ssl stats): the server side counts.
    assert.ok((await server.envoy.stat(`listener.127.0.0.1_${inboundPort}.ssl.handshake`)) > 0);
    const cd = (await httpRequest(`http://127.0.0.1:${admin}/config_dump?resource=dynamic_active_clusters`)).body;
    assert.match(cd, /\^spiffe:\/\/\[\^\/\]\+\/ns\/test\/sa\/server\$/, 'the server\'s SPIFFE id is checked');

    // tls.mode DISABLE: the client sends plaintext, which the server (mTLS only) refuses. The updated cluster
    // warms as soon as its endpoints are re-sent with it (not after Envoy's 15 s initial fetch timeout).
    fs.writeFileSync(path.join(cfgDir, 'dr.yaml'), DISABLE);
    let last = '';
    await waitFor('plaintext after DISABLE, refused by the server', async () => {
      const r = await get();
      last = `${r.status} ${r.body}`;
      return r.status === 503;
    }, 8_000, 200).catch(async (e: Error) => {
      const dump = (await httpRequest(`http://127.0.0.1:${admin}/config_dump?resource=dynamic_warming_clusters`)).body;
      const active = (await httpRequest(`http://127.0.0.1:${admin}/config_dump?resource=dynamic_active_clusters`)).body;
      throw new Error(`${e.message}: last ${last}\nwarming: ${dump.slice(0, 3000)}\nactive: ${active.slice(0, 3000)}`);
    });
  } finally {
    try {
      await server?.envoy?.stop();
      await server?.cache.close();
      await server?.sds.close();
      agent.proc.kill('SIGTERM');
      const exit = await waitFor('agent exit', () => agent.exited, 15_000);
      await agent.stop();
      app.closeAllConnections();
      app.close();
      assert.is(exit.code, 0);
    } finally {
      await agent.close();
    }
  }
});

test.run();
