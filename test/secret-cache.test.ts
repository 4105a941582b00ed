// Mounted certificates instead of a CA: Kubernetes' `..data` symlink swap is picked up and pushed, a half-written
// file is refused (the last good certificate stays) and taken once complete; file-cert:/file-root: secrets;
// when rotation happens.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { X509Certificate } from 'node:crypto';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { configureLogging, resetLogging } from '../lib/log';
import { mountedCertsDir, rotationTime, SecretCache } from '../lib/secret-cache';
import { sleep, tempDir, waitFor } from './helpers/harness';
import { makeLeaf, makeRoot } from './helpers/test-ca';

const ID = 'spiffe://cluster.local/ns/vm/sa/app';

/** Writes a Kubernetes-style projected volume generation and swaps `..data` to it atomically. */
function k8sSwap(dir: string, gen: string, files: Record<string, string>): void {
  const g = path.join(dir, gen);
  fs.mkdirSync(g);
  for (const [n, v] of Object.entries(files)) fs.writeFileSync(path.join(g, n), v);
  fs.symlinkSync(gen, path.join(dir, '..data_tmp'));
  fs.renameSync(path.join(dir, '..data_tmp'), path.join(dir, '..data'));
  for (const n of Object.keys(files)) {
    if (!fs.existsSync(path.join(dir, n))) fs.symlinkSync(path.join('..data', n), path.join(dir, n));
  }
}

function newCache(dir: string) {
  return new SecretCache({ identity: ID, algorithm: { kind: 'ECDSA' }, ttlMs: 3600_000, graceRatio: 0.5, graceJitter: 0, mountedDir: dir, debounceMs: 50 });
}

test('mounted certificates: a ..data symlink swap is picked up and pushed', async () => {
  const dir = tempDir();
  const root = await makeRoot();
  const a = await makeLeaf(root, { uri: ID });
  const b = await makeLeaf(root, { uri: ID });
  k8sSwap(dir.path, '..gen_a', { 'cert-chain.pem': a.certPem, 'key.pem': a.keyPem, 'root-cert.pem': root.pem });
  const c = newCache(dir.path);
  const pushed: string[] = [];
  c.onUpdate((n) => pushed.push(n));
  try {
    await c.start();
    assert.is(c.current()!.serial, new X509Certificate(a.certPem).serialNumber);
    assert.equal(c.secret('ROOTCA'), { kind: 'root', rootPem: root.pem });
    pushed.length = 0;
    k8sSwap(dir.path, '..gen_b', { 'cert-chain.pem': b.certPem, 'key.pem': b.keyPem, 'root-cert.pem': root.pem });
    await waitFor('the swapped certificate', () => c.current()!.serial === new X509Certificate(b.certPem).serialNumber, 10_000);
    assert.equal(pushed, ['default']);
  } finally {
    await c.close();
    dir.cleanup();
  }
});

test('a half-written mounted file is not taken; the last good certificate stays until the file is complete', async () => {
  const dir = tempDir();
  const logs: string[] = [];
  configureLogging({ write: (l) => void logs.push(l) });
  const root = await makeRoot();
  const a = await makeLeaf(root, { uri: ID });
  const b = await makeLeaf(root, { uri: ID });
  fs.writeFileSync(path.join(dir.path, 'cert-chain.pem'), a.certPem);
  fs.writeFileSync(path.join(dir.path, 'key.pem'), a.keyPem);
  fs.writeFileSync(path.join(dir.path, 'root-cert.pem'), root.pem);
  const c = newCache(dir.path);
  const pushed: string[] = [];
  c.onUpdate((n) => pushed.push(n));
  try {
    await c.start();
    const serialA = c.current()!.serial;
    pushed.length = 0;
    // The new key lands first, then half of the new certificate.
    fs.writeFileSync(path.join(dir.path, 'key.pem'), b.keyPem);
    fs.writeFileSync(path.join(dir.path, 'cert-chain.pem'), b.certPem.slice(0, b.certPem.length / 2));
    await waitFor('the refusal', () => logs.some((l) => /error\tcache\trefused: .*cert-chain\.pem/.test(l)), 10_000);
    await sleep(300);
    assert.is(c.current()!.serial, serialA);
    assert.equal(pushed, []);
    fs.writeFileSync(path.join(dir.path, 'cert-chain.pem'), b.certPem);
    await waitFor('the complete certificate', () => c.current()!.serial === new X509Certificate(b.certPem).serialNumber, 10_000);
    assert.equal(pushed, ['default']);
    // A key that does not match is refused too, naming the files.
    fs.writeFileSync(path.join(dir.path, 'key.pem'), a.keyPem);
    await waitFor('the mismatch refusal', () => logs.some((l) => /not for our private key/.test(l)), 10_000);
    assert.is(c.current()!.serial, new X509Certificate(b.certPem).serialNumber);
  } finally {
    await c.close();
    resetLogging();
    dir.cleanup();
  }
});

test('file-cert:<cert>~<key> and file-root:<path> secrets are read, checked and watched; file-root:system is the OS bundle', async () => {
  const dir = tempDir();
  const root = await makeRoot();
  const a = await makeLeaf(root, { dns: ['gw.example.com'] });
  const mounted = path.join(dir.path, 'mounted');
  fs.mkdirSync(mounted);
  fs.writeFileSync(path.join(mounted, 'cert-chain.pem'), a.certPem);
  fs.writeFileSync(path.join(mounted, 'key.pem'), a.keyPem);
  const cert = path.join(dir.path, 'gw.pem');
  const key = path.join(dir.path, 'gw.key');
  const ca = path.join(dir.path, 'ca.pem');
  fs.writeFileSync(cert, a.certPem);
  fs.writeFileSync(key, a.keyPem);
  fs.writeFileSync(ca, root.pem);
  const c = newCache(mounted);
  const pushed: string[] = [];
  c.onUpdate((n) => pushed.push(n));
  try {
    await c.start();
    const certName = `file-cert:${cert}~${key}`;
    const missing = `file-root:${path.join(dir.path, 'missing.pem')}`;
    for (const n of [certName, `file-root:${ca}`, 'file-root:system', missing]) c.requested(n);
    // Read without blocking: each one is pushed once it has been read.
    await waitFor('the file secrets', () => [certName, `file-root:${ca}`, 'file-root:system'].every((n) => pushed.includes(n)));
    assert.equal(c.secret(certName), { kind: 'tls', certChainPem: a.certPem, keyPem: a.keyPem });
    assert.equal(c.secret(`file-root:${ca}`), { kind: 'root', rootPem: root.pem });
    const sys = c.secret('file-root:system');
    assert.ok(sys && sys.kind === 'root' && sys.rootPem.includes('BEGIN CERTIFICATE'));
    assert.is(c.secret(missing), undefined);
    assert.is(c.secret('file-root:/never/asked'), undefined, 'a name nobody asked for is not read');
    const other = await makeRoot('rotated root');
    pushed.length = 0;
    fs.writeFileSync(ca, other.pem);
    await waitFor('the changed root to be pushed', () => pushed.includes(`file-root:${ca}`), 10_000);
    assert.equal(c.secret(`file-root:${ca}`), { kind: 'root', rootPem: other.pem });
    // Released by every stream: forgotten, and its file no longer watched.
    const before = c.fileSecretCount();
    c.released(`file-root:${ca}`);
    assert.equal(c.fileSecretCount(), { secrets: before.secrets - 1, watchedFiles: before.watchedFiles - 1 });
    assert.is(c.secret(`file-root:${ca}`), undefined);
  } finally {
    await c.close();
    dir.cleanup();
  }
});

test('rotation at expiry - lifetime x (ratio +- jitter), the lifetime counted from issuance, not from a backdated notBefore', () => {
  const leaf = { notAfter: 100_000 };
  assert.is(rotationTime(leaf, 0.5, 0.01, () => 0.5, 0), 50_000);
  assert.is(rotationTime(leaf, 0.5, 0.01, () => 1, 0), 49_000);
  assert.is(rotationTime(leaf, 0.5, 0.01, () => 0, 0), 51_000);
  // Received at 80 s (whatever notBefore says): half of the 20 s left.
  assert.is(rotationTime({ notBefore: -120_000, notAfter: 100_000 } as typeof leaf, 0.5, 0, () => 0.5, 80_000), 90_000);
  // istiod: notBefore 2 minutes back, SECRET_TTL=150s -> renewed after 75 s (the Go agent: 74.5 s), not 15 s.
  assert.is(rotationTime({ notAfter: 150_000 }, 0.5, 0, () => 0.5, 0), 75_000);
  assert.is(rotationTime({ notAfter: 50_000 }, 0.5, 0, () => 0.5, 60_000), 60_000, 'already expired: at once');
});

test('mounted certificates are used when present: the credentials directory first, then ./etc/certs', () => {
  const has = (files: string[]) => (p: string) => files.includes(p);
  assert.is(mountedCertsDir(false, has([])), undefined);
  assert.is(mountedCertsDir(true, has([])), './etc/certs');
  assert.is(mountedCertsDir(false, has(['etc/certs/cert-chain.pem', 'etc/certs/key.pem'])), './etc/certs');
  assert.is(mountedCertsDir(false, has(['var/run/secrets/workload-spiffe-credentials/cert-chain.pem', 'var/run/secrets/workload-spiffe-credentials/key.pem'])), './var/run/secrets/workload-spiffe-credentials');
});

test.run();
