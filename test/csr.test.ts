// Workload keys and CSRs (ECDSA P-256 or RSA, URI SAN only, no CN), and the chain checks every certificate passes
// before Envoy may see it: our key, our identity, a chain that verifies to the root, inside its validity window.

import { spawnSync } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { checkChain, parseCerts } from '../lib/cert-chain';
import { generateKeyAndCsr, keyAlgorithm, keyAndCsrNow, pregenerateKey, spiffeId } from '../lib/csr';
import { x509 as loadX509, type X509 } from '../lib/x509';

import { makeIntermediate, makeRoot, signCsr } from './helpers/test-ca';

const x509 = loadX509();

const ID = spiffeId('cluster.local', 'ns1', 'sa1');

test('the CSR carries only the SPIFFE URI SAN, no common name; ECDSA P-256', async () => {
  const { keyPem, csrPem } = await generateKeyAndCsr({ identity: ID, algorithm: keyAlgorithm('ECDSA', 2048) });
  const csr = new x509.Pkcs10CertificateRequest(csrPem);
  assert.ok(await csr.verify());
  assert.is(csr.subject, '');
  const san = csr.extensions.find((e): e is X509.SubjectAlternativeNameExtension => e instanceof x509.SubjectAlternativeNameExtension)!;
  assert.equal(san.names.items.map((n) => [n.type, n.value]), [['url', ID]]);
  assert.is((csr.publicKey.algorithm as { namedCurve?: string }).namedCurve, 'P-256');
  assert.match(keyPem, /BEGIN EC PRIVATE KEY/);
});

test('RSA by default, of WORKLOAD_RSA_KEY_SIZE bits; PKCS#8 when asked', async () => {
  const { keyPem, csrPem } = await generateKeyAndCsr({ identity: ID, algorithm: keyAlgorithm('', 2048), pkcs8: true });
  const csr = new x509.Pkcs10CertificateRequest(csrPem);
  assert.is((csr.publicKey.algorithm as { modulusLength?: number }).modulusLength, 2048);
  assert.match(keyPem, /BEGIN PRIVATE KEY/);
  assert.throws(() => keyAlgorithm('ED25519', 2048), /ECC_SIGNATURE_ALGORITHM/);
  assert.throws(() => keyAlgorithm('', 1000), /WORKLOAD_RSA_KEY_SIZE/);
});

test('OpenSSL reads and verifies the CSR as Istio\'s CA would: SHA-256 signature, critical URI SAN, empty subject', async () => {
  for (const algorithm of [{ kind: 'ECDSA' }, { kind: 'RSA', bits: 3072 }] as const) {
    const { csrPem } = await generateKeyAndCsr({ identity: ID, algorithm });
    const r = spawnSync('openssl', ['req', '-noout', '-verify', '-text'], { input: csrPem, encoding: 'utf8' });
    assert.is(r.status, 0, r.stderr);
    assert.match(r.stderr + r.stdout, /verify OK|Certificate request self-signature verify OK/);
    assert.match(r.stdout, /Subject:\s*\n/);
    assert.match(r.stdout, /X509v3 Subject Alternative Name: critical\s+URI:spiffe:\/\/cluster\.local\/ns\/ns1\/sa\/sa1/);
    assert.match(r.stdout, algorithm.kind === 'ECDSA' ? /ecdsa-with-SHA256/ : /sha256WithRSAEncryption/);
    if (algorithm.kind === 'RSA') assert.match(r.stdout, /Public-Key: \(3072 bit\)/);
  }
});

test('a pregenerated key is used once, and only for the algorithm it was made for', async () => {
  pregenerateKey({ kind: 'RSA', bits: 2048 });
  const ec = await generateKeyAndCsr({ identity: ID, algorithm: { kind: 'ECDSA' } });
  assert.match(ec.keyPem, /BEGIN EC PRIVATE KEY/, 'another algorithm gets a key of its own');
  pregenerateKey({ kind: 'ECDSA' });
  const a = await generateKeyAndCsr({ identity: ID, algorithm: { kind: 'ECDSA' } });
  const b = await generateKeyAndCsr({ identity: ID, algorithm: { kind: 'ECDSA' } });
  assert.is.not(a.keyPem, b.keyPem, 'the pregenerated key is taken once');
  assert.ok(await new x509.Pkcs10CertificateRequest(a.csrPem).verify());
});

test('keyAndCsrNow: the CSR at once from a pregenerated ECDSA key, once; nothing for RSA (its key is still being made)', async () => {
  pregenerateKey({ kind: 'ECDSA' });
  assert.is(keyAndCsrNow({ identity: ID, algorithm: { kind: 'ECDSA', curve: 'P384' } }), undefined, 'another curve');
  const now = keyAndCsrNow({ identity: ID, algorithm: { kind: 'ECDSA' } });
  assert.ok(now, 'made synchronously');
  assert.ok(await new x509.Pkcs10CertificateRequest(now.csrPem).verify());
  assert.match(now.keyPem, /BEGIN EC PRIVATE KEY/);
  assert.is(keyAndCsrNow({ identity: ID, algorithm: { kind: 'ECDSA' } }), undefined, 'taken once');
  const later = await generateKeyAndCsr({ identity: ID, algorithm: { kind: 'ECDSA' } });
  assert.is.not(later.keyPem, now.keyPem, 'the next CSR gets a key of its own');
  pregenerateKey({ kind: 'ECDSA' });
  assert.throws(() => keyAndCsrNow({ identity: 'spiffe://a b', algorithm: { kind: 'ECDSA' } }), /not an IA5 URI/);
  pregenerateKey({ kind: 'RSA', bits: 2048 });
  assert.is(keyAndCsrNow({ identity: ID, algorithm: { kind: 'RSA', bits: 2048 } }), undefined);
  const rsa = await generateKeyAndCsr({ identity: ID, algorithm: { kind: 'RSA', bits: 2048 } });
  assert.match(rsa.keyPem, /BEGIN RSA PRIVATE KEY/, 'the pregenerated RSA key, through the async path');
});

test('the key the executable started before the bundle loaded (scripts/sea-main.js) is taken when the algorithm matches', async () => {
  const { generateKeyPairSync, createPublicKey } = await import('node:crypto');
  const g = globalThis as { __pilotAgentEarlyKey?: unknown };
  const made = generateKeyPairSync('rsa', { modulusLength: 2048 });
  g.__pilotAgentEarlyKey = { algorithm: JSON.stringify({ kind: 'RSA', bits: 2048 }), pair: Promise.resolve(made) };
  pregenerateKey({ kind: 'RSA', bits: 2048 });
  assert.is(g.__pilotAgentEarlyKey, undefined, 'taken out of the global');
  const got = await generateKeyAndCsr({ identity: ID, algorithm: { kind: 'RSA', bits: 2048 } });
  const spki = (k: Parameters<typeof createPublicKey>[0]) => createPublicKey(k).export({ type: 'spki', format: 'der' });
  assert.ok(spki(got.keyPem).equals(spki(made.privateKey)), 'the CSR is for the early key');
  // Another algorithm in the settings (proxyMetadata): the early key is dropped, never used.
  g.__pilotAgentEarlyKey = { algorithm: JSON.stringify({ kind: 'RSA', bits: 2048 }), pair: Promise.resolve(made) };
  pregenerateKey({ kind: 'RSA', bits: 3072 });
  assert.is(g.__pilotAgentEarlyKey, undefined);
  const other = await generateKeyAndCsr({ identity: ID, algorithm: { kind: 'RSA', bits: 3072 } });
  assert.not.ok(spki(other.keyPem).equals(spki(made.privateKey)));
  assert.is((createPublicKey(other.keyPem).asymmetricKeyDetails as { modulusLength: number }).modulusLength, 3072);
});

test('a good chain passes; the root is split off as ROOTCA', async () => {
  const root = await makeRoot();
  const inter = await makeIntermediate(root);
  const { keyPem, csrPem } = await generateKeyAndCsr({ identity: ID, algorithm: { kind: 'ECDSA' } });
  const leaf = await signCsr(inter, csrPem);
  const chain = parseCerts(leaf + inter.pem + root.pem, 'test');
  const r = checkChain({ chain, roots: [chain[2]!], keyPem, identity: ID, now: Date.now(), where: 'test' });
  assert.equal(r.leaf.identities, [ID]);
  assert.is(parseCerts(r.chainPem, 'x').length, 2);
  assert.is(parseCerts(r.rootPem, 'x')[0]!.fingerprint256, new X509Certificate(root.pem).fingerprint256);
  assert.ok(r.leaf.notAfter > Date.now());
});

test('refused: another key, another identity, expired, not yet valid, a broken link, an unknown root', async () => {
  const root = await makeRoot();
  const other = await makeRoot('other root');
  const inter = await makeIntermediate(root);
  const { keyPem, csrPem } = await generateKeyAndCsr({ identity: ID, algorithm: { kind: 'ECDSA' } });
  const mine = await signCsr(inter, csrPem);
  const otherKey = (await generateKeyAndCsr({ identity: ID, algorithm: { kind: 'ECDSA' } })).keyPem;
  const check = (pem: string, o: { key?: string; roots?: string } = {}) =>
    checkChain({ chain: parseCerts(pem, 'CA answer'), roots: parseCerts(o.roots ?? root.pem, 'root'), keyPem: o.key ?? keyPem, identity: ID, now: Date.now(), where: 'CA answer' });
  assert.throws(() => check(mine + inter.pem + root.pem, { key: otherKey }), /not for our private key/);
  const evil = await signCsr(inter, csrPem, { uri: 'spiffe://cluster.local/ns/x/sa/evil' });
  assert.throws(() => check(evil + inter.pem + root.pem), /ns\/x\/sa\/evil, not spiffe/);
  const expired = await signCsr(inter, csrPem, { notBefore: new Date(Date.now() - 7200_000), notAfter: new Date(Date.now() - 3600_000) });
  assert.throws(() => check(expired + inter.pem + root.pem), /expired at/);
  const early = await signCsr(inter, csrPem, { notBefore: new Date(Date.now() + 3600_000), notAfter: new Date(Date.now() + 7200_000) });
  assert.throws(() => check(early + inter.pem + root.pem), /not valid before/);
  assert.throws(() => check(mine + root.pem), /not signed by certificate 2/);
  assert.throws(() => check(mine + inter.pem + other.pem, { roots: other.pem }), /not signed by certificate 3/);
  assert.throws(() => check(mine + inter.pem, { roots: other.pem }), /does not verify to the root/);
  assert.throws(() => parseCerts('garbage', 'CA answer'), /no PEM certificate/);
  assert.throws(() => parseCerts('-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----', 'CA answer'), /does not parse/);
});

test.run();
