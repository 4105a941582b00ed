// The embedded CA of standalone mode: the discovery server serves CreateCertificate on its local socket, keeps
// its root on disk (created 0600 on first start, reused after), and signs only a declared identity for the
// caller holding that identity's token. The agent's own CA client and secret cache are its clients here.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { X509Certificate } from 'node:crypto';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { CaClient, type CaClientOptions } from '../lib/ca-client';
import { parseCerts } from '../lib/cert-chain';
import { generateKeyAndCsr, spiffeId } from '../lib/csr';
import { DiscoveryServer } from '../lib/discovery/index';
import { SecretCache } from '../lib/secret-cache';
import { tempDir, waitFor } from './helpers/harness';

const ID = spiffeId('cluster.local', 'shop', 'web');

function setup() {
  const dir = tempDir();
  const cfg = path.join(dir.path, 'config');
  fs.mkdirSync(path.join(cfg, 'ca', 'identities', 'shop'), { recursive: true });
  fs.writeFileSync(path.join(cfg, 'ca', 'identities', 'shop', 'web'), 'web-token\n', { mode: 0o600 });
  fs.writeFileSync(path.join(cfg, 'ca', 'identities', 'shop', 'db'), 'db-token\n', { mode: 0o600 });
  fs.writeFileSync(path.join(dir.path, 'token'), 'web-token');
  const sock = path.join(dir.path, 'discovery.sock');
  const client = (o: Partial<CaClientOptions> = {}) => new CaClient({ address: `unix:${sock}`, tls: false, rootCaFile: '', serverName: '', tokenFile: path.join(dir.path, 'token'), headers: {}, ...o });
  return { dir, cfg, sock, client };
}

test('the embedded CA signs the declared identity for its token; the root is created 0600 once and reused', async () => {
  const s = setup();
  let server = new DiscoveryServer({ configDir: s.cfg, listen: `unix:${s.sock}` });
  const cache = new SecretCache({ identity: ID, algorithm: { kind: 'ECDSA' }, ttlMs: 3600_000, graceRatio: 0.5, graceJitter: 0.01, signer: s.client() });
  try {
    await server.start();
    const rootFile = path.join(s.cfg, 'ca', 'root-cert.pem');
    assert.is(fs.statSync(path.join(s.cfg, 'ca', 'root-key.pem')).mode & 0o777, 0o600);
    const rootPem = fs.readFileSync(rootFile, 'utf8');
    await cache.start();
    const cur = await waitFor('a certificate from the embedded CA', () => cache.current());
    assert.equal(cur.identities, [ID]);
    assert.ok(cur.notAfter - cur.notBefore <= 3600_000 + 61_000);
    assert.equal(cache.secret('ROOTCA'), { kind: 'root', rootPem });
    const leaf = parseCerts((cache.secret('default') as { certChainPem: string }).certChainPem, 'x')[0]!;
    assert.ok(leaf.verify(new X509Certificate(rootPem).publicKey));
    assert.ok(!leaf.subject, 'no subject (no CN)');
    assert.is(server.status().ca!.signed, 1);
    await server.close();
    server = new DiscoveryServer({ configDir: s.cfg, listen: `unix:${s.sock}` });
    await server.start();
    assert.is(fs.readFileSync(rootFile, 'utf8'), rootPem, 'the root is reused');
  } finally {
    await cache.close();
    await server.close();
    s.dir.cleanup();
  }
});

test('refused: no token, an unknown token, another identity than the token proves, a garbled CSR', async () => {
  const s = setup();
  const server = new DiscoveryServer({ configDir: s.cfg, listen: `unix:${s.sock}` });
  try {
    await server.start();
    const { csrPem } = await generateKeyAndCsr({ identity: ID, algorithm: { kind: 'ECDSA' } });
    const dbCsr = (await generateKeyAndCsr({ identity: spiffeId('cluster.local', 'shop', 'db'), algorithm: { kind: 'ECDSA' } })).csrPem;
    const expectRefusal = async (p: Promise<unknown>, re: RegExp) => {
      try {
        await p;
      } catch (e) {
        assert.match((e as Error).message, re);
        return;
      }
      assert.unreachable(`expected ${re}`);
    };
    await expectRefusal(s.client({ tokenFile: undefined }).sign(csrPem, 60), /no bearer token/);
    fs.writeFileSync(path.join(s.dir.path, 'token'), 'guessed');
    await expectRefusal(s.client().sign(csrPem, 60), /matches no identity/);
    fs.writeFileSync(path.join(s.dir.path, 'token'), 'web-token');
    await expectRefusal(s.client().sign(dbCsr, 60), /token is for spiffe:\/\/cluster\.local\/ns\/shop\/sa\/web; the CSR asks for spiffe:\/\/cluster\.local\/ns\/shop\/sa\/db/);
    await expectRefusal(s.client().sign('-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n', 60), /CSR does not parse/);
    assert.is(server.status().ca!.refused, 4);
    assert.is(server.status().ca!.signed, 0);
    // Declared by its file: with the db token, the db identity is signed.
    fs.writeFileSync(path.join(s.dir.path, 'token'), 'db-token');
    const chain = await s.client().sign(dbCsr, 60);
    assert.is(chain.length, 2);
  } finally {
    await server.close();
    s.dir.cleanup();
  }
});

test('never a signer on a non-loopback address; nothing without ca/identities', async () => {
  const s = setup();
  const open = new DiscoveryServer({ configDir: s.cfg, listen: '0.0.0.0:0' });
  const none = new DiscoveryServer({ configDir: path.join(s.dir.path, 'empty'), listen: `unix:${s.sock}` });
  fs.mkdirSync(path.join(s.dir.path, 'empty'));
  try {
    await open.start();
    const port = open.address.split(':').pop();
    const { csrPem } = await generateKeyAndCsr({ identity: ID, algorithm: { kind: 'ECDSA' } });
    let err = '';
    await s.client({ address: `127.0.0.1:${port}` }).sign(csrPem, 60).catch((e) => (err = (e as Error).message));
    assert.match(err, /does not implement/);
    assert.not.ok(fs.existsSync(path.join(s.cfg, 'ca', 'root-key.pem')));
    await none.start();
    err = '';
    await s.client().sign(csrPem, 60).catch((e) => (err = (e as Error).message));
    assert.match(err, /does not implement/);
  } finally {
    await open.close();
    await none.close();
    s.dir.cleanup();
  }
});

test.run();
