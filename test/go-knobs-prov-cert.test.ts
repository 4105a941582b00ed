// PROV_CERT on the CA connection (issue 23), as Go's citadel client (pkg/istio-agent GetKeyCertsForCA,
// pilot/pkg/grpc/tls.go GetClientCertificate): over TLS the CA client presents PROV_CERT's cert-chain.pem/key.pem,
// read at each call (a renewed provisioning certificate is presented from the next call on), and still sends the
// token; files that are absent, unparseable or expired present none. With a certificate presented a missing token
// file is no error (Go sends no token then), so a VM whose token is gone renews with its certificate alone.
// The CA here (test/helpers/stub-ca.ts) is a TLS HTTP/2 server that asks for a client certificate without requiring
// one and records, per call, which one it got.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { X509Certificate } from 'node:crypto';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { CaClient, caClientOptions, type CaClientOptions } from '../lib/ca-client';
import { buildConfig } from '../lib/config';
import { generateKeyAndCsr } from '../lib/csr';
import { agentFixture } from './helpers/agent-fixture';
import { tempDir, waitFor } from './helpers/harness';
import { makeLeaf, makeRoot } from './helpers/test-ca';
import { startStubCa, type StubCa } from './helpers/stub-ca';

const ID = 'spiffe://cluster.local/ns/vm/sa/vm';

/** The last call's certificate and token (not its time). */
const lastCall = (ca: StubCa) => ({ client: ca.calls.at(-1)!.client, token: ca.calls.at(-1)!.token });

const fingerprint = (pem: string) => new X509Certificate(pem).fingerprint256;

async function sign(o: CaClientOptions): Promise<void> {
  const { csrPem } = await generateKeyAndCsr({ identity: ID, algorithm: { kind: 'ECDSA' } });
  const chain = await new CaClient({ ...o, timeoutMs: 5000 }).sign(csrPem, 3600);
  assert.is(chain.length, 2);
}

test('caClientOptions: PROV_CERT is the CA client certificate over TLS, none in plaintext (as Go, for :15010)', () => {
  const opts = (env: Record<string, string>) => caClientOptions(buildConfig({ flags: {}, env, readFile: () => undefined }), env);
  assert.is(opts({ PROV_CERT: '/prov', CA_ADDR: 'ca.example:15012' }).clientCertDir, '/prov');
  assert.is(opts({ PROV_CERT: '/prov', CA_ADDR: 'ca.example:15010' }).clientCertDir, undefined);
  assert.is(opts({ CA_ADDR: 'ca.example:15012' }).clientCertDir, undefined);
  // The mounted xDS client certificate is not the CA's (Go's GetKeyCertsForCA reads PROV_CERT only).
  const mounted = { FILE_MOUNTED_CERTS: 'true', ISTIO_META_TLS_CLIENT_KEY: '/k', ISTIO_META_TLS_CLIENT_CERT_CHAIN: '/c', CA_ADDR: 'ca.example:15012' };
  assert.is(opts(mounted).clientCertDir, undefined);
});

test('PROV_CERT: the CA sees that client certificate with the token, a renewed one on the next call, none when absent or expired', async () => {
  const ca = await startStubCa();
  const dir = tempDir('pa-provcert-');
  try {
    const prov = path.join(dir.path, 'prov');
    fs.mkdirSync(prov);
    fs.writeFileSync(path.join(dir.path, 'root.pem'), ca.serverRoot.pem);
    fs.writeFileSync(path.join(dir.path, 'token'), 'the-jwt\n');
    const provRoot = await makeRoot('provisioning root');
    const put = (c: { certPem: string; keyPem: string }) => {
      fs.writeFileSync(path.join(prov, 'cert-chain.pem'), c.certPem);
      fs.writeFileSync(path.join(prov, 'key.pem'), c.keyPem, { mode: 0o600 });
    };
    const o: CaClientOptions = {
      address: ca.address, tls: true, rootCaFile: path.join(dir.path, 'root.pem'), serverName: 'istiod.istio-system.svc',
      tokenFile: path.join(dir.path, 'token'), headers: { ClusterID: 'c1' }, clientCertDir: prov,
    };
    const first = await makeLeaf(provRoot, { uri: ID });
    put(first);
    await sign(o);
    assert.equal(lastCall(ca), { client: fingerprint(first.certPem), token: 'Bearer the-jwt' }, 'the provisioning certificate and the token');

    // Renewed in place (as OUTPUT_CERTS into PROV_CERT does): the next call presents the new one.
    const renewed = await makeLeaf(provRoot, { uri: ID });
    put(renewed);
    await sign(o);
    assert.is(ca.calls.at(-1)!.client, fingerprint(renewed.certPem));

    // The token file gone: with the certificate the call still goes, without an authorization header.
    fs.rmSync(path.join(dir.path, 'token'));
    await sign(o);
    assert.equal(lastCall(ca), { client: fingerprint(renewed.certPem), token: undefined });
    fs.writeFileSync(path.join(dir.path, 'token'), 'the-jwt\n');

    // Expired: not presented, the token alone goes (Go: "cert expired, using token instead").
    put(await makeLeaf(provRoot, { uri: ID, notBefore: new Date(Date.now() - 7_200_000), notAfter: new Date(Date.now() - 60_000) }));
    await sign(o);
    assert.equal(lastCall(ca), { client: 'none', token: 'Bearer the-jwt' });

    // No files: none presented.
    fs.rmSync(path.join(prov, 'cert-chain.pem'));
    fs.rmSync(path.join(prov, 'key.pem'));
    await sign(o);
    assert.equal(lastCall(ca), { client: 'none', token: 'Bearer the-jwt' });
    // Nor without PROV_CERT; and then a missing token is refused before the CA is asked, as before.
    put(first);
    await sign({ ...o, clientCertDir: undefined });
    assert.is(ca.calls.at(-1)!.client, 'none');
    fs.rmSync(path.join(dir.path, 'token'));
    const before = ca.calls.length;
    await sign({ ...o, clientCertDir: undefined }).then(() => assert.unreachable('signed without a token'), (e: Error) => assert.match(e.message, /cannot read the CA token file/));
    assert.is(ca.calls.length, before);
  } finally {
    await ca.close();
    dir.cleanup();
  }
});

test('the agent with PROV_CERT and OUTPUT_CERTS in one directory (Istio\'s VM setup): the CA sees the provisioning certificate, then the workload one', async () => {
  const ca = await startStubCa();
  const agent = await agentFixture({ prefix: 'pa-provcert-agent-' });
  try {
    const dir = agent.dir.path;
    const certs = path.join(dir, 'etc/certs');
    fs.mkdirSync(certs, { recursive: true });
    const provRoot = await makeRoot('provisioning root');
    const prov = await makeLeaf(provRoot, { uri: ID });
    fs.writeFileSync(path.join(certs, 'cert-chain.pem'), prov.certPem);
    fs.writeFileSync(path.join(certs, 'key.pem'), prov.keyPem, { mode: 0o600 });
    fs.writeFileSync(path.join(dir, 'ca-root.pem'), ca.serverRoot.pem);
    await agent.start({
      env: {
        PROV_CERT: certs, OUTPUT_CERTS: certs, CA_ADDR: ca.address, CA_ROOT_CA: path.join(dir, 'ca-root.pem'),
        POD_NAME: 'vm-1', POD_NAMESPACE: 'vm', SERVICE_ACCOUNT: 'vm', SECRET_TTL: '4s',
      },
      ready: 'none',
    });
    await waitFor('a renewal after the workload certificate was written', () => ca.calls.length >= 2, 20_000)
      .catch((e: Error) => { throw new Error(`${e.message}\n${agent.log()}`); });
    assert.is(ca.calls[0]!.client, fingerprint(prov.certPem), 'the first CSR: the provisioning certificate');
    assert.is(ca.calls[0]!.token, undefined, 'no token file here: the certificate alone');
    assert.is(ca.calls[1]!.client, ca.issued[0], 'the renewal: the workload certificate OUTPUT_CERTS wrote over it');
  } finally {
    await agent.close();
    await ca.close();
  }
});

test.run();
