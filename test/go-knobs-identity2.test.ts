// The Go agent's trust knobs (issue 23, identity part), each against a real Envoy that verifies peers with ROOTCA:
// - roots the control plane pushes in ProxyConfig.caCertificatesPem (PCDS, PROXY_CONFIG_XDS_AGENT) join ROOTCA, as
//   Go's UpdateConfigTrustBundle merges them (root migration): a peer signed by the pushed root is accepted after
//   the push, one signed by the old root still is, and a root that does not parse NACKs the push;
// - the plugged-in CA's CRL (PILOT_ENABLE_CA_CRL, Istio's /var/run/secrets/istio/crl/ca-crl.pem) goes into ROOTCA's
//   validation context: a revoked peer is refused once the file appears, accepted again once it is gone (the secret
//   cache with a real Envoy, and the whole agent in a mount namespace where that path is a test directory).

import 'reflect-metadata';
import * as fs from 'node:fs';
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';
import * as tls from 'node:tls';
import { webcrypto } from 'node:crypto';
import * as x509 from '@peculiar/x509';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spiffeId } from '../lib/csr';
import { SdsServer, secretResource } from '../lib/sds-server';
import { configTrustBundle, mergeRoots, readCrl, SecretCache } from '../lib/secret-cache';
import { decodeProxyConfigCaCerts, encodeProxyConfigCaCerts, PROXY_CONFIG_TYPE } from '../lib/xds-istio';
import { agentFixture } from './helpers/agent-fixture';
import { CLUSTER, ControlPlane, LISTENER } from './helpers/control-plane';
import { freePort, httpRequest, tempDir, waitFor } from './helpers/harness';
import { startSdsEnvoy, type SdsEnvoy } from './helpers/sds-envoy';
import { makeLeaf, makeRoot, signCsr, type Issuer } from './helpers/test-ca';
import type { CertificateSigner } from '../lib/ca-client';

const ID = spiffeId('cluster.local', 'ns', 'web');

/** One HTTPS request through Envoy's mTLS listener with a client certificate: the body, or the error's message. */
function mtlsGet(port: number, ca: string, client: { certPem: string; keyPem: string }): Promise<string> {
  return new Promise((resolve) => {
    const s = tls.connect({ host: '127.0.0.1', port, ca, cert: client.certPem, key: client.keyPem, checkServerIdentity: () => undefined }, () => {
      s.write('GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n');
    });
    let out = '';
    s.setTimeout(5000, () => s.destroy(new Error('timeout')));
    s.on('data', (c: Buffer) => (out += c.toString()));
    s.on('error', (e) => resolve(`error: ${e.message}`));
    s.on('close', () => resolve(out.includes('\r\n\r\n') ? out.slice(out.indexOf('\r\n\r\n') + 4) : `error: closed (${out.length} bytes)`));
  });
}

async function backend(): Promise<http.Server> {
  const b = http.createServer((_q, r) => r.end('from-backend'));
  await new Promise<void>((r) => b.listen(0, '127.0.0.1', r));
  return b;
}

/** A CRL from `issuer` revoking the given serials (hex). */
async function makeCrl(issuer: Issuer, serials: string[]): Promise<string> {
  x509.cryptoProvider.set(webcrypto as never);
  const crl = await x509.X509CrlGenerator.create({
    issuer: issuer.cert.subject, thisUpdate: new Date(Date.now() - 60_000), nextUpdate: new Date(Date.now() + 86_400_000),
    // With a reason: BoringSSL refuses an entry whose extensions are an empty SEQUENCE, as @peculiar writes without one.
    entries: serials.map((serialNumber) => ({ serialNumber, revocationDate: new Date(Date.now() - 60_000), reason: x509.X509CrlReason.keyCompromise })),
    signingKey: issuer.keys.privateKey as never, signingAlgorithm: { name: 'ECDSA', hash: 'SHA-256' },
  });
  // OpenSSL's label (what Envoy reads): @peculiar/x509 writes "BEGIN CRL".
  const b64 = Buffer.from(crl.rawData).toString('base64').replace(/.{64}/g, '$&\n').replace(/\n$/, '');
  return `-----BEGIN X509 CRL-----\n${b64}\n-----END X509 CRL-----\n`;
}

function writeAtomic(file: string, text: string): void {
  fs.writeFileSync(`${file}.tmp`, text);
  fs.renameSync(`${file}.tmp`, file);
}

function mountCerts(dir: string, leaf: { certPem: string; keyPem: string }, root: Issuer): void {
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'cert-chain.pem'), leaf.certPem);
  fs.writeFileSync(path.join(dir, 'key.pem'), leaf.keyPem, { mode: 0o600 });
  fs.writeFileSync(path.join(dir, 'root-cert.pem'), root.pem);
}

test('PCDS roots: merged into ROOTCA once each, sorted, as Go does; one that does not parse is refused by name', async () => {
  const [a, b] = [await makeRoot('root a'), await makeRoot('root b')];
  const pushed = configTrustBundle([b.pem, a.pem + b.pem]);
  assert.is(pushed.length, 2);
  const merged = mergeRoots(a.pem, pushed);
  assert.is(merged.match(/BEGIN CERTIFICATE/g)?.length, 2, 'root a is there once');
  assert.is(merged, [...pushed].sort().join(''));
  assert.is(mergeRoots(a.pem, []), a.pem);
  assert.throws(() => configTrustBundle([a.pem, 'junk']), /ProxyConfig\.caCertificatesPem\[1\]: no PEM certificate/);
  assert.equal(decodeProxyConfigCaCerts(Buffer.from(wrapAny(encodeProxyConfigCaCerts([a.pem, b.pem])))), [a.pem, b.pem]);
});

test('PCDS roots with a CA: ROOTCA is pushed with them, the workload certificate is renewed (as Go), OUTPUT_CERTS has the union', async () => {
  const dir = tempDir('pa-knobs-pcds-ca-');
  const [ca, extra] = [await makeRoot('mesh ca'), await makeRoot('next ca')];
  let signed = 0;
  const signer: CertificateSigner = {
    address: 'test-ca',
    async sign(csr: string) {
      signed++;
      return [await signCsr(ca, csr), ca.pem];
    },
  };
  const cache = new SecretCache({ identity: ID, algorithm: { kind: 'ECDSA' }, ttlMs: 3600_000, graceRatio: 0.5, graceJitter: 0, signer, outputDir: path.join(dir.path, 'out') });
  const pushed: string[] = [];
  cache.onUpdate((n) => pushed.push(n));
  try {
    await cache.start();
    await waitFor('first certificate', () => cache.secret('default'));
    assert.is(signed, 1);
    cache.setConfigTrustBundle([extra.pem]);
    const root = cache.secret('ROOTCA');
    assert.ok(root?.kind === 'root' && root.rootPem.includes(extra.pem.trim()) && root.rootPem.includes(ca.pem.trim()));
    await waitFor('renewed', () => signed === 2);
    await waitFor('OUTPUT_CERTS root has both', () => fs.readFileSync(path.join(dir.path, 'out/root-cert.pem'), 'utf8').includes(extra.pem.trim()));
    cache.setConfigTrustBundle([extra.pem]);
    assert.is(signed, 2, 'the same bundle again changes nothing');
    assert.ok(pushed.filter((n) => n === 'ROOTCA').length >= 2);
  } finally {
    await cache.close();
    dir.cleanup();
  }
});

/** An Any (type_url 1, value 2) as the xDS proxy hands resources to agent handlers. */
function wrapAny(value: Uint8Array): Uint8Array {
  const url = Buffer.from(PROXY_CONFIG_TYPE);
  const len = (n: number) => (n < 128 ? [n] : [(n & 0x7f) | 0x80, n >> 7]);
  return Buffer.concat([Buffer.from([0x0a, ...len(url.length)]), url, Buffer.from([0x12, ...len(value.length)]), Buffer.from(value)]);
}

test('PCDS (PROXY_CONFIG_XDS_AGENT): after the push a real Envoy accepts a peer signed by the pushed root', async () => {
  const dir = tempDir('pa-knobs-pcds-');
  const [oldRoot, newRoot] = [await makeRoot('old mesh root'), await makeRoot('new mesh root')];
  mountCerts(path.join(dir.path, 'etc/certs'), await makeLeaf(oldRoot, { uri: ID }), oldRoot);
  const oldPeer = await makeLeaf(oldRoot, { uri: spiffeId('cluster.local', 'ns', 'old') });
  const newPeer = await makeLeaf(newRoot, { uri: spiffeId('cluster.local', 'ns', 'new') });
  const cp = new ControlPlane();
  const be = await backend();
  const agent = await agentFixture({ dir });
  const { status } = agent.ports;
  let envoy: SdsEnvoy | undefined;
  try {
    await cp.start();
    await agent.start({
      proxyConfig: { discoveryAddress: cp.address, controlPlaneAuthPolicy: 'NONE' },
      env: {
        POD_NAME: 'web-1', POD_NAMESPACE: 'ns', SERVICE_ACCOUNT: 'web', FILE_MOUNTED_CERTS: 'true',
        PROXY_CONFIG_XDS_AGENT: 'true',
      },
      ready: 'none',
    });
    cp.set(CLUSTER, 'c1', []);
    cp.set(LISTENER, 'l1', []);
    const sock = path.join(dir.path, 'var/run/secrets/workload-spiffe-uds/socket');
    await waitFor('the agent subscribes to ProxyConfig', () => cp.requests.some((r) => r.typeUrl === PROXY_CONFIG_TYPE), 20_000)
      .catch((e: Error) => { throw new Error(`${e.message}\n${agent.log()}`); });
    const port = await freePort();
    envoy = await startSdsEnvoy({ sdsSocket: sock, inbound: { port, backendPort: (be.address() as AddressInfo).port } });
    await waitFor('Envoy accepts a peer of the old root', async () => (await mtlsGet(port, oldRoot.pem, oldPeer)) === 'from-backend', 20_000, 200);
    assert.match(await mtlsGet(port, oldRoot.pem, newPeer), /^error/, 'before the push the new root is not trusted');

    cp.set(PROXY_CONFIG_TYPE, 'p1', [{ name: 'pc', any: { type_url: PROXY_CONFIG_TYPE, value: encodeProxyConfigCaCerts([newRoot.pem]) } }]);
    await waitFor('Envoy accepts a peer of the pushed root', async () => (await mtlsGet(port, oldRoot.pem, newPeer)) === 'from-backend', 15_000, 200)
      .catch((e: Error) => { throw new Error(`${e.message}\n${agent.log()}`); });
    assert.is(await mtlsGet(port, oldRoot.pem, oldPeer), 'from-backend', 'ROOTCA is the union: the old root still verifies');
    const certs = JSON.parse((await httpRequest(`http://127.0.0.1:${status}/debug/certs`)).body);
    assert.is(certs.rootsFromControlPlane, 1);
    assert.equal(certs.crl, { file: '/var/run/secrets/istio/crl/ca-crl.pem', loaded: false });

    cp.set(PROXY_CONFIG_TYPE, 'p2', [{ name: 'pc', any: { type_url: PROXY_CONFIG_TYPE, value: encodeProxyConfigCaCerts(['-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n']) } }]);
    const nack = await cp.waitForRequest('the agent NACKs a root that does not parse', (q) => q.typeUrl === PROXY_CONFIG_TYPE && !!q.error);
    assert.match(nack.error!, /caCertificatesPem\[0\]: certificate 1 does not parse/);
    assert.is(await mtlsGet(port, oldRoot.pem, newPeer), 'from-backend', 'the last good trust bundle stays');

    // An empty list takes the pushed roots away again.
    cp.set(PROXY_CONFIG_TYPE, 'p3', [{ name: 'pc', any: { type_url: PROXY_CONFIG_TYPE, value: encodeProxyConfigCaCerts([]) } }]);
    await waitFor('the pushed root is no longer trusted', async () => /^error/.test(await mtlsGet(port, oldRoot.pem, newPeer)), 15_000, 200);
  } finally {
    await envoy?.stop();
    await agent.close();
    await cp.stop();
    be.close();
  }
});

test('the CA CRL file: served inline in ROOTCA while it exists; a file holding no CRL keeps the last good one', async () => {
  const dir = tempDir('pa-knobs-crl-unit-');
  try {
    const f = path.join(dir.path, 'ca-crl.pem');
    assert.equal(readCrl(f), {});
    const root = await makeRoot();
    const crl = await makeCrl(root, ['0a']);
    fs.writeFileSync(f, crl);
    assert.is(readCrl(f).pem, crl);
    fs.writeFileSync(f, 'not a crl');
    assert.match(readCrl(f).error ?? '', /holds no PEM X509 CRL/);
    const any = secretResource('ROOTCA', { kind: 'root', rootPem: root.pem, crlPem: crl });
    assert.ok(Buffer.from(any.value).includes(Buffer.from('BEGIN X509 CRL')), 'the CRL is in the secret');
  } finally {
    dir.cleanup();
  }
});

test('PILOT_ENABLE_CA_CRL: a real Envoy refuses a revoked peer once the CRL file appears, and again accepts it when it goes', async () => {
  const dir = tempDir('pa-knobs-crl-');
  const root = await makeRoot('plugged-in ca');
  const mounted = path.join(dir.path, 'certs');
  mountCerts(mounted, await makeLeaf(root, { uri: ID }), root);
  const revoked = await makeLeaf(root, { uri: spiffeId('cluster.local', 'ns', 'revoked') });
  const good = await makeLeaf(root, { uri: spiffeId('cluster.local', 'ns', 'good') });
  const crlDir = path.join(dir.path, 'crl');
  fs.mkdirSync(crlDir);
  const crlFile = path.join(crlDir, 'ca-crl.pem');
  const cache = new SecretCache({ identity: ID, algorithm: { kind: 'ECDSA' }, ttlMs: 3600_000, graceRatio: 0.5, graceJitter: 0, mountedDir: mounted, crlFile, debounceMs: 20 });
  const sds = new SdsServer({ socketPath: path.join(dir.path, 'sds.sock'), provider: cache });
  cache.onUpdate((n) => sds.push(n));
  const be = await backend();
  let envoy: SdsEnvoy | undefined;
  try {
    await sds.start();
    await cache.start();
    const port = await freePort();
    envoy = await startSdsEnvoy({ sdsSocket: path.join(dir.path, 'sds.sock'), inbound: { port, backendPort: (be.address() as AddressInfo).port } });
    await waitFor('Envoy serves', async () => (await mtlsGet(port, root.pem, good)) === 'from-backend', 20_000, 200);
    assert.is(await mtlsGet(port, root.pem, revoked), 'from-backend', 'without a CRL the peer is accepted');

    writeAtomic(crlFile, await makeCrl(root, [revoked.certPem ? new x509.X509Certificate(revoked.certPem).serialNumber : '']));
    await waitFor('Envoy refuses the revoked peer', async () => /^error/.test(await mtlsGet(port, root.pem, revoked)), 15_000, 200);
    assert.is(await mtlsGet(port, root.pem, good), 'from-backend', 'a peer not on the list is still accepted');

    fs.writeFileSync(crlFile, 'half written');
    await new Promise((r) => setTimeout(r, 500));
    assert.match(await mtlsGet(port, root.pem, revoked), /^error/, 'a file that holds no CRL keeps the last good one');

    fs.rmSync(crlFile);
    await waitFor('Envoy accepts the peer again once the CRL is gone', async () => (await mtlsGet(port, root.pem, revoked)) === 'from-backend', 15_000, 200);
  } finally {
    await envoy?.stop();
    await sds.close();
    await cache.close();
    be.close();
    dir.cleanup();
  }
});

test('the agent reads Istio\'s CRL path: in a mount namespace with /var/run/secrets/istio/crl mounted, a revoked peer is refused', async () => {
  const dir = tempDir('pa-knobs-crl-agent-');
  const root = await makeRoot('plugged-in ca');
  mountCerts(path.join(dir.path, 'etc/certs'), await makeLeaf(root, { uri: ID }), root);
  const revoked = await makeLeaf(root, { uri: spiffeId('cluster.local', 'ns', 'revoked') });
  const crlDir = path.join(dir.path, 'crl-configmap');
  fs.mkdirSync(crlDir);
  const cp = new ControlPlane();
  const be = await backend();
  const agent = await agentFixture({ dir });
  const out = () => agent.log();
  // A private /run holding only the config map's directory at Istio's path; the host's /run is untouched.
  const script = 'mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/istio/crl && mount --bind "$CRL_DIR" /run/secrets/istio/crl && exec "$@"';
  let envoy: SdsEnvoy | undefined;
  try {
    await cp.start();
    cp.set(CLUSTER, 'c1', []);
    await agent.start({
      proxyConfig: { discoveryAddress: cp.address, controlPlaneAuthPolicy: 'NONE' },
      env: { POD_NAME: 'web-1', POD_NAMESPACE: 'ns', SERVICE_ACCOUNT: 'web', FILE_MOUNTED_CERTS: 'true', CRL_DIR: crlDir },
      wrap: ['unshare', '-m', '--propagation', 'private', 'sh', '-c', script, 'sh'],
      ready: 'none',
    });
    const sock = path.join(dir.path, 'var/run/secrets/workload-spiffe-uds/socket');
    await waitFor('the agent serves SDS', () => fs.existsSync(sock), 20_000).catch((e: Error) => { throw new Error(`${e.message}\n${out()}`); });
    const port = await freePort();
    envoy = await startSdsEnvoy({ sdsSocket: sock, inbound: { port, backendPort: (be.address() as AddressInfo).port } });
    await waitFor('Envoy accepts the peer while there is no CRL', async () => (await mtlsGet(port, root.pem, revoked)) === 'from-backend', 20_000, 200)
      .catch((e: Error) => { throw new Error(`${e.message}\n${out()}`); });
    writeAtomic(path.join(crlDir, 'ca-crl.pem'), await makeCrl(root, [new x509.X509Certificate(revoked.certPem).serialNumber]));
    await waitFor('Envoy refuses the revoked peer', async () => /^error/.test(await mtlsGet(port, root.pem, revoked)), 15_000, 200)
      .catch((e: Error) => { throw new Error(`${e.message}\n${out()}`); });
    assert.match(out(), /CA CRL from \/var\/run\/secrets\/istio\/crl\/ca-crl\.pem put into ROOTCA/);
  } finally {
    await envoy?.stop();
    await agent.close();
    await cp.stop();
    be.close();
  }
});

test.run();
