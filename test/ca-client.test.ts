// The CA client and the secret cache against a CA written here, independently of lib/ (grpc-js server over TLS,
// messages from proto/istio/ca.proto, its own signing): the token and headers arrive, the certificate is used,
// and every bad answer (garbage, one certificate, another identity, expired, not yet valid, an unverifiable
// root, a CA that is down, a missing token, a CA with the wrong name) is refused with one log line and a
// metric while the last good certificate stays in use.

import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import * as protobuf from 'protobufjs';
import { Registry } from 'prom-client';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { CaClient, caClientOptions, type CaClientOptions, caRetryDelay } from '../lib/ca-client';
import { buildConfig } from '../lib/config';
import { generateKeyAndCsr, spiffeId } from '../lib/csr';
import { configureLogging, resetLogging } from '../lib/log';
import { SecretCache } from '../lib/secret-cache';
import { freePort, REPO, sleep, tempDir, waitFor } from './helpers/harness';
import { makeIntermediate, makeLeaf, makeRoot, signCsr, type Issuer } from './helpers/test-ca';

async function rejects(p: Promise<unknown>, re: RegExp): Promise<void> {
  try {
    await p;
  } catch (e) {
    assert.match((e as Error).message, re);
    return;
  }
  assert.unreachable(`expected a rejection matching ${re}`);
}

const ID = spiffeId('cluster.local', 'ns1', 'sa1');
const TOKEN = 'header.payload.signature';

type Mode = 'good' | 'backdated' | 'garbage' | 'one-cert' | 'other-identity' | 'expired' | 'not-yet-valid' | 'unverifiable-root' | 'error';

interface TestCa {
  port: number;
  mode: Mode;
  calls: { token?: string; clusterId?: string; extra?: string; csr: string; validity: number; signer?: string }[];
  root: Issuer;
  serverRoot: Issuer;
  close(): Promise<void>;
}

async function startTestCa(port?: number, roots?: { root: Issuer; serverRoot: Issuer }): Promise<TestCa> {
  const pb = new protobuf.Root();
  pb.loadSync(path.join(REPO, 'proto/istio/ca.proto'), { keepCase: true });
  const Req = pb.lookupType('istio.v1.auth.IstioCertificateRequest');
  const Resp = pb.lookupType('istio.v1.auth.IstioCertificateResponse');
  const root = roots?.root ?? (await makeRoot('mesh root'));
  const inter = await makeIntermediate(root, 'mesh intermediate');
  const stranger = await makeRoot('stranger root');
  const serverRoot = roots?.serverRoot ?? (await makeRoot('istiod serving root'));
  const serving = await makeLeaf(serverRoot, { dns: ['istiod.istio-system.svc'] });
  const ca: TestCa = { port: port ?? (await freePort()), mode: 'good', calls: [], root, serverRoot, close: async () => undefined };
  const server = new grpc.Server();
  server.addService({
    CreateCertificate: {
      path: '/istio.v1.auth.IstioCertificateService/CreateCertificate', requestStream: false, responseStream: false,
      requestSerialize: (v: object) => Buffer.from(Req.encode(Req.fromObject(v)).finish()),
      requestDeserialize: (b: Buffer) => Req.toObject(Req.decode(b), { longs: Number }),
      // 'garbage' bypasses the encoder: bytes that are no protobuf message at all.
      responseSerialize: (v: { garbage?: boolean; cert_chain?: string[] }) => (v.garbage ? Buffer.from('not a protobuf message') : Buffer.from(Resp.encode(Resp.fromObject(v)).finish())),
      responseDeserialize: (b: Buffer) => Resp.decode(b),
    },
  } as grpc.ServiceDefinition, {
    CreateCertificate: async (call: grpc.ServerUnaryCall<{ csr: string; validity_duration: number; metadata?: { fields?: Record<string, { stringValue?: string }> } }, unknown>, cb: grpc.sendUnaryData<unknown>) => {
      const auth = call.metadata.get('authorization')[0]?.toString();
      ca.calls.push({ token: auth, clusterId: call.metadata.get('clusterid')[0]?.toString(), extra: call.metadata.get('x-extra')[0]?.toString(), csr: call.request.csr, validity: call.request.validity_duration, signer: call.request.metadata?.fields?.CertSigner?.stringValue });
      if (auth !== `Bearer ${TOKEN}`) return cb({ code: grpc.status.UNAUTHENTICATED, details: 'bad token' });
      const ttlMs = call.request.validity_duration * 1000;
      const now = Date.now();
      try {
        switch (ca.mode) {
          case 'good': return cb(null, { cert_chain: [await signCsr(inter, call.request.csr, { ttlMs }), inter.pem, root.pem] });
          // As istiod: notBefore 2 minutes back (clock skew), notAfter the requested lifetime from now.
          case 'backdated': return cb(null, { cert_chain: [await signCsr(inter, call.request.csr, { notBefore: new Date(now - 120_000), notAfter: new Date(now + ttlMs) }), inter.pem, root.pem] });
          case 'garbage': return cb(null, { garbage: true });
          case 'one-cert': return cb(null, { cert_chain: [await signCsr(inter, call.request.csr, { ttlMs })] });
          case 'other-identity': return cb(null, { cert_chain: [await signCsr(inter, call.request.csr, { uri: 'spiffe://cluster.local/ns/x/sa/other' }), inter.pem, root.pem] });
          case 'expired': return cb(null, { cert_chain: [await signCsr(inter, call.request.csr, { notBefore: new Date(now - 7200_000), notAfter: new Date(now - 60_000) }), inter.pem, root.pem] });
          case 'not-yet-valid': return cb(null, { cert_chain: [await signCsr(inter, call.request.csr, { notBefore: new Date(now + 3600_000), notAfter: new Date(now + 7200_000) }), inter.pem, root.pem] });
          case 'unverifiable-root': return cb(null, { cert_chain: [await signCsr(inter, call.request.csr, { ttlMs }), inter.pem, stranger.pem] });
          case 'error': return cb({ code: grpc.status.INTERNAL, details: 'signer broken' });
        }
      } catch (e) {
        cb({ code: grpc.status.INTERNAL, details: (e as Error).message });
      }
    },
  });
  const creds = grpc.ServerCredentials.createSsl(null, [{ private_key: Buffer.from(serving.keyPem), cert_chain: Buffer.from(serving.certPem) }], false);
  await new Promise<void>((res, rej) => server.bindAsync(`127.0.0.1:${ca.port}`, creds, (e) => (e ? rej(e) : res())));
  ca.close = async () => server.forceShutdown();
  return ca;
}

interface Fixture {
  dir: string;
  opts: CaClientOptions;
  logs: string[];
  cleanup(): void;
}

function fixture(ca: TestCa): Fixture {
  const dir = tempDir();
  fs.writeFileSync(path.join(dir.path, 'root.pem'), ca.serverRoot.pem);
  fs.writeFileSync(path.join(dir.path, 'token'), TOKEN + '\n');
  const logs: string[] = [];
  configureLogging({ write: (l) => void logs.push(l) });
  return {
    dir: dir.path,
    logs,
    opts: {
      address: `127.0.0.1:${ca.port}`, tls: true, rootCaFile: path.join(dir.path, 'root.pem'), serverName: 'istiod.istio-system.svc',
      tokenFile: path.join(dir.path, 'token'), headers: { ClusterID: 'c1', 'x-extra': 'yes' },
    },
    cleanup: () => {
      resetLogging();
      dir.cleanup();
    },
  };
}

function cache(f: Fixture, o: Partial<ConstructorParameters<typeof SecretCache>[0]> = {}, client = new CaClient(f.opts)) {
  return new SecretCache({
    identity: ID, algorithm: { kind: 'ECDSA' }, ttlMs: 3600_000, graceRatio: 0.5, graceJitter: 0.01, signer: client,
    backoff: { initialMs: 100, maxMs: 400 }, ...o,
  });
}

async function failures(c: SecretCache): Promise<Record<string, number>> {
  const r = new Registry();
  c.registerMetrics(r);
  const m = (await r.getMetricsAsJSON()).find((x) => x.name === 'istio_agent_certificate_failures_total')!;
  return Object.fromEntries(m.values.map((v) => [String(v.labels.reason), v.value]));
}

test('a certificate from the CA: token, ClusterID and CA_HEADER_* sent, chain checked, ROOTCA is the CA root, OUTPUT_CERTS written 0600', async () => {
  const ca = await startTestCa();
  const f = fixture(ca);
  const out = path.join(f.dir, 'out');
  const c = cache(f, { outputDir: out });
  const pushed: string[] = [];
  c.onUpdate((n) => pushed.push(n));
  try {
    await c.start();
    await waitFor('the first certificate', () => c.current());
    assert.equal(c.readiness(), { ready: true, reason: '' });
    assert.equal(pushed.sort(), ['ROOTCA', 'default']);
    assert.equal(ca.calls[0]!.token, `Bearer ${TOKEN}`);
    assert.is(ca.calls[0]!.clusterId, 'c1');
    assert.is(ca.calls[0]!.extra, 'yes');
    assert.is(ca.calls[0]!.validity, 3600);
    assert.equal(c.current()!.identities, [ID]);
    const tlsSecret = c.secret('default')!;
    assert.is(tlsSecret.kind, 'tls');
    const root = c.secret('ROOTCA');
    assert.equal(root, { kind: 'root', rootPem: ca.root.pem });
    for (const n of ['key.pem', 'cert-chain.pem', 'root-cert.pem']) assert.is(fs.statSync(path.join(out, n)).mode & 0o777, 0o600, n);
    assert.is(fs.readFileSync(path.join(out, 'key.pem'), 'utf8'), tlsSecret.kind === 'tls' ? tlsSecret.keyPem : '');
    const d = c.debug() as { certificate: { serial: string }; ca: { reachable: boolean }; nextRotation: string };
    assert.is(d.certificate.serial, c.current()!.serial);
    assert.is(d.ca.reachable, true);
    assert.ok(Date.parse(d.nextRotation) > Date.now() + 1700_000 && Date.parse(d.nextRotation) < Date.now() + 1900_000, d.nextRotation);
    assert.not.match(JSON.stringify(d), /PRIVATE KEY/);
    assert.not.ok(f.logs.some((l) => l.includes('PRIVATE KEY')), 'the key is never logged');
  } finally {
    await c.close();
    await ca.close();
    f.cleanup();
  }
});

const BAD: [Mode, RegExp, string][] = [
  ['garbage', /CA 127\.0\.0\.1:\d+ .*(pars|deserializ)/i, 'ca_refused'],
  ['one-cert', /chain of 1 certificate/, 'ca_refused'],
  ['other-identity', /ns\/x\/sa\/other, not spiffe:\/\/cluster\.local\/ns\/ns1\/sa\/sa1/, 'bad_chain'],
  ['expired', /expired at/, 'bad_chain'],
  ['not-yet-valid', /not valid before/, 'bad_chain'],
  ['unverifiable-root', /not signed by certificate 3/, 'bad_chain'],
  ['error', /signer broken/, 'ca_refused'],
];

test('every bad CA answer, and a CA down during a rotation, is refused or retried with one log line and a metric; the last good certificate stays; a good answer is taken again', async () => {
  const ca = await startTestCa();
  const f = fixture(ca);
  // A 4 s certificate is renewed after about 2 s: each bad answer meets a rotation.
  const c = cache(f, { ttlMs: 4000, backoff: { initialMs: 200, maxMs: 200 } });
  try {
    await c.start();
    const first = await waitFor('the first certificate', () => c.current());
    for (const [mode, re, reason] of BAD) {
      ca.mode = mode;
      const before = (await failures(c))[reason] ?? 0;
      await waitFor(`a refusal of the ${mode} answer`, async () => ((await failures(c))[reason] ?? 0) > before, 15_000, 50).catch(async (e) => { throw new Error(`${(e as Error).message}; failures ${JSON.stringify(await failures(c))}; logs:\n${f.logs.slice(-6).join("\n")}`); });
      assert.is(c.current()!.serial, first.serial, `${mode}: the good certificate stays`);
      const lines = f.logs.filter((l) => /\berror\b/.test(l) && re.test(l));
      assert.ok(lines.length >= 1, `${mode}: a log line matching ${re}; got:\n${f.logs.slice(-5).join('\n')}`);
    }
    // The same failure repeated by the retries is logged once.
    const errorLines = f.logs.filter((l) => l.includes('signer broken') && /\terror\t/.test(l));
    assert.is(errorLines.length, 1, errorLines.join('\n'));
    ca.mode = 'good';
    await waitFor('a new certificate once the CA answers well', () => c.current()!.serial !== first.serial, 15_000);
    // The CA goes down during a rotation: retried with backoff, the current certificate stays, then renewed.
    const current = c.current()!.serial;
    await ca.close();
    const down = (await failures(c)).ca_unreachable ?? 0;
    await waitFor('retries against the CA that is down', async () => ((await failures(c)).ca_unreachable ?? 0) >= down + 2, 15_000);
    assert.is(c.current()!.serial, current);
    assert.is((c.debug() as { ca: { reachable: boolean } }).ca.reachable, false);
    const back = await startTestCa(ca.port, { root: ca.root, serverRoot: ca.serverRoot });
    ca.close = back.close;
    await waitFor('a new certificate once the CA is back', () => c.current()!.serial !== current, 15_000);
  } finally {
    await c.close();
    await ca.close();
    f.cleanup();
  }
});

test('ISTIO_META_CERT_SIGNER goes with the CSR as the metadata CertSigner, as the Go agent sends it; unset, no metadata', async () => {
  const ca = await startTestCa();
  const f = fixture(ca);
  try {
    const { csrPem } = await generateKeyAndCsr({ identity: ID, algorithm: { kind: 'ECDSA' } });
    await new CaClient({ ...f.opts, certSigner: 'signer-a' }).sign(csrPem, 60);
    await new CaClient(f.opts).sign(csrPem, 60);
    assert.is(ca.calls[0]!.signer, 'signer-a');
    assert.is(ca.calls[1]!.signer, undefined);
  } finally {
    await ca.close();
    f.cleanup();
  }
});

/** A TCP relay in front of the test CA that counts connections and can cut the ones it holds. */
async function relayTo(port: number): Promise<{ port: number; connections: number; cut(): void; close(): Promise<void> }> {
  const held = new Set<net.Socket>();
  const r = { port: 0, connections: 0, cut: () => held.forEach((c) => c.destroy()), close: async (): Promise<void> => undefined };
  const server = net.createServer((c) => {
    r.connections++;
    const up = net.connect(port, '127.0.0.1');
    held.add(c).add(up);
    c.pipe(up).pipe(c);
    for (const s of [c, up]) s.on('error', () => undefined).on('close', () => (held.delete(s), c.destroy(), up.destroy()));
  });
  await new Promise<void>((res) => server.listen(0, '127.0.0.1', res));
  r.port = (server.address() as net.AddressInfo).port;
  r.close = () => new Promise<void>((res) => (r.cut(), server.close(() => res())));
  return r;
}

test('connectAhead: the call goes on the connection opened while the key was made; one that failed meanwhile, or unreadable roots, leave the call its own connection and its own error', async () => {
  const ca = await startTestCa();
  const relay = await relayTo(ca.port);
  const f = fixture(ca);
  try {
    const client = new CaClient({ ...f.opts, address: `127.0.0.1:${relay.port}` });
    const { csrPem } = await generateKeyAndCsr({ identity: ID, algorithm: { kind: 'ECDSA' } });
    client.connectAhead();
    client.connectAhead(); // a second call while one is open does nothing
    await waitFor('the connection ahead', () => relay.connections === 1, 5000);
    await sleep(50); // its TLS handshake done
    assert.ok((await client.sign(csrPem, 60)).length >= 2);
    assert.is(relay.connections, 1, 'the call used the connection opened ahead');
    // Opened ahead, then cut before the call: the call connects again and succeeds.
    client.connectAhead();
    await waitFor('the second connection ahead', () => relay.connections === 2, 5000);
    await sleep(50);
    relay.cut();
    await sleep(50);
    assert.ok((await client.sign(csrPem, 60)).length >= 2);
    assert.is(relay.connections, 3);
    assert.is(ca.calls.length, 2);
    // Roots that cannot be read: connectAhead does not throw, and sign() says what is wrong.
    const broken = new CaClient({ ...f.opts, rootCaFile: path.join(f.dir, 'no-such-root.pem') });
    broken.connectAhead();
    await rejects(broken.sign(csrPem, 60), /cannot read the CA root certificate .*no-such-root\.pem/);
  } finally {
    await relay.close();
    await ca.close();
    f.cleanup();
  }
});

test('a token file that is a FIFO is refused at once, without blocking the agent', async () => {
  const ca = await startTestCa();
  const f = fixture(ca);
  try {
    fs.rmSync(path.join(f.dir, 'token'));
    execFileSync('mkfifo', [path.join(f.dir, 'token')]);
    // (A synchronous read would wait for a writer forever: the test would hang, not fail.)
    await rejects(new CaClient(f.opts).sign('csr', 60), /cannot read the CA token file .*token.*not a regular file/);
    assert.is(ca.calls.length, 0);
  } finally {
    await ca.close();
    f.cleanup();
  }
});

test('a missing token file, or a CA that does not prove the expected name, is refused before anything is signed', async () => {
  const ca = await startTestCa();
  const f = fixture(ca);
  try {
    fs.rmSync(path.join(f.dir, 'token'));
    const client = new CaClient(f.opts);
    await rejects(client.sign('csr', 60), /cannot read the CA token file .*token/);
    assert.is(ca.calls.length, 0);
    fs.writeFileSync(path.join(f.dir, 'token'), TOKEN);
    const wrongName = new CaClient({ ...f.opts, serverName: 'evil.example.com' });
    await rejects(wrongName.sign('csr', 60), /CA 127\.0\.0\.1:\d+ \(TLS, name evil\.example\.com\)/);
    const otherRoot = path.join(f.dir, 'other.pem');
    fs.writeFileSync(otherRoot, (await makeRoot('other')).pem);
    await rejects(new CaClient({ ...f.opts, rootCaFile: otherRoot }).sign('csr', 60), /CA 127\.0\.0\.1/);
    await rejects(new CaClient({ ...f.opts, rootCaFile: path.join(f.dir, 'nope.pem') }).sign('csr', 60), /cannot read the CA root certificate .*nope\.pem/);
    assert.is(ca.calls.length, 0);
  } finally {
    await ca.close();
    f.cleanup();
  }
});

test('a CA that is down at start is retried with backoff until it answers', async () => {
  const first = await startTestCa();
  const roots = { root: first.root, serverRoot: first.serverRoot };
  await first.close();
  const f = fixture(first);
  const c = cache(f);
  let ca: TestCa | undefined;
  try {
    await c.start();
    await sleep(1000);
    assert.is(c.current(), undefined);
    assert.is(c.readiness().ready, false);
    assert.match(c.readiness().reason, /no workload certificate yet/);
    assert.ok(((await failures(c)).ca_unreachable ?? 0) >= 2, 'retried');
    assert.is((c.debug() as { ca: { reachable: boolean } }).ca.reachable, false);
    ca = await startTestCa(first.port, roots);
    await waitFor('the certificate once the CA is up', () => c.current(), 15_000);
    assert.is(c.readiness().ready, true);
  } finally {
    await c.close();
    await ca?.close();
    f.cleanup();
  }
});

test('CA retry schedule: 1 s doubling to 60 s, each spread down by at most 20 %', () => {
  const at = (rand: number) => Array.from({ length: 9 }, (_, i) => caRetryDelay(i + 1, undefined, () => rand));
  assert.equal(at(0), [1000, 2000, 4000, 8000, 16_000, 32_000, 60_000, 60_000, 60_000]);
  assert.equal(at(1), [800, 1600, 3200, 6400, 12_800, 25_600, 48_000, 48_000, 48_000]);
  assert.is(caRetryDelay(1000, undefined, () => 0), 60_000, 'a long outage stays at the cap');
  assert.is(caRetryDelay(3, { initialMs: 100, maxMs: 250 }, () => 0), 250);
});

test('a CA that refuses every request is asked 3 times in 4.5 s (retries after ~1 s and ~2 s more), not every second', async () => {
  const ca = await startTestCa();
  ca.mode = 'error';
  const f = fixture(ca);
  const c = cache(f, { backoff: undefined });
  try {
    await c.start();
    await sleep(4500);
    // 0, 0.8-1.0 s, 2.4-3.0 s; the next is due at 5.6 s at the earliest. On a 1 s loop it would be 5.
    assert.is(ca.calls.length, 3, f.logs.filter((l) => /retrying/.test(l)).join('\n'));
    const delays = f.logs.filter((l) => /retrying the CA/.test(l)).map((l) => Number(/in (\d+) ms/.exec(l)![1]));
    assert.is(delays.length, 3);
    delays.forEach((d, i) => assert.ok(d >= 800 * 2 ** i && d <= 1000 * 2 ** i, `retry ${i + 1} after ${d} ms`));
    assert.is(c.current(), undefined);
  } finally {
    await c.close();
    await ca.close();
    f.cleanup();
  }
});

test('a CA that backdates notBefore by 2 minutes (istiod): a 124 s certificate is renewed after ~62 s, not every 2 s', async () => {
  const ca = await startTestCa();
  ca.mode = 'backdated';
  const f = fixture(ca);
  const c = cache(f, { ttlMs: 124_000, graceRatio: 0.5, graceJitter: 0.01 });
  try {
    await c.start();
    const received = Date.now();
    await waitFor('the first certificate', () => c.current(), 15_000);
    const d = c.debug() as { certificate: { notBefore: string }; nextRotation: string };
    assert.ok(Date.parse(d.certificate.notBefore) < received - 100_000, 'the CA backdated it');
    const next = Date.parse(d.nextRotation) - received;
    // 124 s x (0.5 +- 0.01) after it arrived; counted from notBefore it was (124 - 120) / 2 = 2 s.
    assert.ok(next > 60_000 && next < 64_000, `next rotation in ${next} ms`);
    await sleep(5000);
    assert.is(ca.calls.length, 1, 'not renewed in the first 5 s');
  } finally {
    await c.close();
    await ca.close();
    f.cleanup();
  }
});

test('CA options as Istio decides them: CA_ADDR or the discovery address, plaintext on 15010, CA_HEADER_*, root and token defaults', () => {
  const cfg = (env: Record<string, string>) => buildConfig({ flags: {}, env, readFile: () => undefined });
  const d = caClientOptions(cfg({}), {});
  assert.is(d.address, 'istiod.istio-system.svc:15012');
  assert.is(d.tls, true);
  assert.is(d.serverName, 'istiod.istio-system.svc');
  assert.is(d.rootCaFile, './var/run/secrets/istio/root-cert.pem');
  assert.is(d.tokenFile, './var/run/secrets/tokens/istio-token');
  assert.equal(d.headers, { ClusterID: 'Kubernetes' });
  const env = { CA_ADDR: 'ca.example:15010', CA_HEADER_X_Tenant: 't1', CA_ROOT_CA: '/roots.pem', ISTIOD_SAN: 'ca.mesh', ISTIO_META_CLUSTER_ID: 'c9' };
  const o = caClientOptions(cfg(env), env);
  assert.is(o.address, 'ca.example:15010');
  assert.is(o.tls, false);
  assert.equal(o.headers, { ClusterID: 'c9', X_Tenant: 't1' });
  assert.is(o.rootCaFile, '/roots.pem');
  assert.is(o.serverName, 'ca.example', 'ISTIOD_SAN is for the default CA (the discovery address) only, as in Go');
  const san = { ISTIOD_SAN: 'ca.mesh' };
  assert.is(caClientOptions(cfg(san), san).serverName, 'ca.mesh', 'without CA_ADDR, ISTIOD_SAN names the CA');
  const local = { CA_ADDR: 'localhost:15012', ISTIOD_SAN: 'ca.mesh' };
  assert.is(caClientOptions(cfg(local), local).serverName, 'istiod.istio-system.svc', 'a port-forward to istiod');
  const sys = caClientOptions(cfg({ XDS_ROOT_CA: 'SYSTEM' }), { XDS_ROOT_CA: 'SYSTEM' });
  assert.is(sys.rootCaFile, 'SYSTEM');
});

// Sometimes (2 of 4 full runs here) a gRPC connection between a test CA and a client outlives both, and kept this
// file's process alive until the suite's deadline after every test had passed. Not found yet: when anything is
// left 2 s after the last test, say what and end the process (uvu's exit code stands).
test.after(() => {
  setTimeout(() => {
    const left = (process as unknown as { _getActiveHandles(): object[] })._getActiveHandles().map((h) => h.constructor.name);
    process.stderr.write(`ca-client.test: handles left after the tests: ${left.join(', ')}\n`);
    process.exit();
  }, 2000).unref();
});

test.run();
