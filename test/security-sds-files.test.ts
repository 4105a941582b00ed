// Hostile SDS clients against the agent's file-backed secrets (`file-cert:`, `file-root:`). The SDS server and the
// secret cache are the agent's own, wired as agent.ts wires them, on a real Unix socket owned by another uid (as
// ENVOY_UID leaves it); the attacker is a separate process running as that uid (setpriv). Issue 20 #4: a name the
// configuration does not reference, or a file that uid could not read itself, gives nothing, and file-root: never
// gives a private key. Issue 21 #4: a thousand names on one stream cost a thousand secrets sent, not a quadratic
// number; a stream holds a bounded number of names; names no stream holds are forgotten and unwatched.

import { execFile } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { messageType } from '../lib/envoy-protos';
import { configureLogging, resetLogging } from '../lib/log';
import { SdsServer, SECRET_TYPE } from '../lib/sds-server';
import { SecretCache } from '../lib/secret-cache';
import { tempDir, waitFor } from './helpers/harness';
import { makeLeaf, makeRoot } from './helpers/test-ca';

const NOBODY = 65534;
const RESP = 'envoy.service.discovery.v3.DiscoveryResponse';
const SECRET = 'envoy.extensions.transport_sockets.tls.v3.Secret';
const ATTACKER = path.join(__dirname, 'helpers', 'sds-attacker.js');

/** What agent.ts does with the names the bootstrap and the xDS listeners/clusters hold (absent before the fix). */
const reference = (sds: SdsServer, source: string, names: string[]) => (sds as Partial<SdsServer>).references?.set(source, names);

function newCache(sdsSocket: string): SecretCache {
  return new SecretCache({ identity: 'spiffe://cluster.local/ns/a/sa/b', algorithm: { kind: 'ECDSA' }, ttlMs: 3600_000, graceRatio: 0.5, graceJitter: 0, debounceMs: 50, sdsSocket });
}

/** The secrets the attacker got per name: the PEM texts inside each Secret it was sent. */
async function attack(socket: string, names: string[], waitMs = 2500): Promise<Map<string, string[]>> {
  // Asynchronously: the SDS server under attack runs in this process.
  const stdout = await new Promise<string>((resolve, reject) => execFile('setpriv', [`--reuid=${NOBODY}`, `--regid=${NOBODY}`, '--clear-groups', process.execPath, ATTACKER, socket, String(waitMs), ...names],
    { encoding: 'utf8', timeout: waitMs + 10_000 }, (err, out, errOut) => (err ? reject(new Error(`attacker failed: ${err.message} ${errOut}`)) : resolve(out))));
  const r = { stdout };
  const got = new Map<string, string[]>(names.map((n) => [n, []]));
  for (const line of r.stdout.split('\n').filter(Boolean)) {
    const [name, b64] = line.split('\t') as [string, string];
    const resp = messageType(RESP).toObject(messageType(RESP).decode(Buffer.from(b64, 'base64')), { arrays: true }) as { resources: { value: Uint8Array }[] };
    for (const any of resp.resources) {
      const s = messageType(SECRET).toObject(messageType(SECRET).decode(any.value), { arrays: true }) as Record<string, any>;
      const texts = [s.tls_certificate?.certificate_chain?.inline_bytes, s.tls_certificate?.private_key?.inline_bytes, s.validation_context?.trusted_ca?.inline_bytes];
      got.get(name)!.push(texts.filter(Boolean).map((b: Uint8Array) => Buffer.from(b).toString()).join(''));
    }
  }
  return got;
}

test('another uid on the SDS socket gets no file the config does not reference, none it could not read itself, and no key through file-root:', async () => {
  const dir = tempDir('pa-sds-sec-');
  fs.chmodSync(dir.path, 0o755);
  const root = await makeRoot();
  const leaf = await makeLeaf(root, { dns: ['gw.example.com'] });
  const f = (name: string, text: string, mode: number, uid = 0) => {
    const p = path.join(dir.path, name);
    fs.mkdirSync(path.dirname(p), { recursive: true, mode: 0o755 });
    fs.writeFileSync(p, text, { mode });
    fs.chmodSync(p, mode);
    fs.chownSync(p, uid, uid);
    return p;
  };
  const rootKey = f('ca/root-key.pem', root.keyPem, 0o600);
  const rootCert = f('ca/root-cert.pem', root.pem, 0o644);
  const combined = f('combined.pem', root.pem + root.keyPem, 0o644);
  const locked = f('locked/cert.pem', root.pem, 0o644);
  fs.chmodSync(path.dirname(locked), 0o700);
  const gwCert = f('gw.pem', leaf.certPem, 0o644);
  const gwKeyRootOnly = f('gw.key', leaf.keyPem, 0o600);
  const gwKeyTheirs = f('gw-theirs.key', leaf.keyPem, 0o600, NOBODY);
  const socket = path.join(dir.path, 'sds', 'socket');
  const cache = newCache(socket);
  const sds = new SdsServer({ socketPath: socket, provider: cache });
  cache.onUpdate((n) => sds.push(n));
  const logs: string[] = [];
  configureLogging({ write: (l) => void logs.push(l) });
  try {
    await cache.start();
    await sds.start();
    fs.chmodSync(path.dirname(socket), 0o755);
    // What the Envoy runtime does with ENVOY_UID: the socket belongs to Envoy's uid and group.
    fs.chownSync(socket, NOBODY, NOBODY);
    const referenced = {
      rootCert: `file-root:${rootCert}`,
      combined: `file-root:${combined}`,
      locked: `file-root:${locked}`,
      keyRootOnly: `file-cert:${gwCert}~${gwKeyRootOnly}`,
      keyTheirs: `file-cert:${gwCert}~${gwKeyTheirs}`,
    };
    reference(sds, 'listeners of this Envoy', Object.values(referenced));
    const unreferenced = [
      `file-cert:${rootCert}~${rootKey}`,
      `file-root:${rootKey}`,
      // `..` spellings of referenced files (a name is compared as the config spells it).
      `file-root:${dir.path}/locked/../combined.pem`,
      `file-cert:${dir.path}/ca/../gw.pem~${dir.path}/gw-theirs.key`,
      'file-root:/etc/shadow',
    ];
    const got = await attack(socket, [...Object.values(referenced), ...unreferenced]);
    for (const n of unreferenced) assert.equal(got.get(n), [], `${n} is not referenced: nothing`);
    assert.equal(got.get(referenced.keyRootOnly), [], 'a key only root can read is not served to uid 65534');
    assert.equal(got.get(referenced.locked), [], 'a file in a directory uid 65534 cannot search is not served');
    assert.is(got.get(referenced.combined)!.length, 1);
    assert.ok(got.get(referenced.combined)![0]!.includes('BEGIN CERTIFICATE'));
    assert.not.ok(got.get(referenced.combined)![0]!.includes('PRIVATE KEY'), 'file-root: of a cert+key file gives only the certificate');
    assert.equal(got.get(referenced.rootCert), [root.pem], 'a referenced file the client can read is served');
    assert.ok(got.get(referenced.keyTheirs)![0]?.includes('PRIVATE KEY'), 'a key file the client owns is served with its certificate');
    for (const [n, texts] of got) if (n !== referenced.keyTheirs) for (const t of texts) assert.not.ok(t.includes('PRIVATE KEY'), n);
    const all = logs.join('\n');
    assert.match(all, /does not reference: not served/);
    assert.match(all, /not readable by uid 65534 gid 65534/);
    assert.match(all, /is not searchable by uid 65534/);
    assert.not.match(all, /BEGIN|PRIVATE KEY/, 'no file content in the log');
  } finally {
    resetLogging();
    await sds.close();
    await cache.close();
    dir.cleanup();
  }
});

const REQ = 'envoy.service.discovery.v3.DiscoveryRequest';
const DREQ = 'envoy.service.discovery.v3.DeltaDiscoveryRequest';
const DRESP = 'envoy.service.discovery.v3.DeltaDiscoveryResponse';
const enc = (n: string) => (v: object) => Buffer.from(messageType(n).encode(messageType(n).fromObject(v as Record<string, unknown>)).finish());
const dec = (n: string) => (b: Buffer) => messageType(n).toObject(messageType(n).decode(b), { arrays: true }) as Record<string, any>;

function client(socket: string, kind: 'Stream' | 'Delta') {
  const [req, resp] = kind === 'Stream' ? [REQ, RESP] : [DREQ, DRESP];
  const c = new grpc.Client(`unix://${socket}`, grpc.credentials.createInsecure());
  const call = c.makeBidiStreamRequest(`/envoy.service.secret.v3.SecretDiscoveryService/${kind}Secrets`, enc(req), dec(resp));
  const got = { responses: 0, resources: 0, names: new Set<string>() };
  call.on('data', (m: Record<string, any>) => {
    got.responses++;
    got.resources += m.resources.length;
    for (const r of m.resources) got.names.add(kind === 'Delta' ? r.name : dec(SECRET)(Buffer.from(r.value)).name);
  });
  call.on('error', () => undefined);
  return { call, got, close: () => { call.cancel(); c.close(); } };
}

/** The longest the event loop was blocked while fn ran (the agent's status port shares this loop). */
async function maxLoopLag<T>(fn: () => Promise<T>): Promise<{ lagMs: number; value: T }> {
  let lagMs = 0;
  let last = performance.now();
  const t = setInterval(() => {
    const now = performance.now();
    lagMs = Math.max(lagMs, now - last - 20);
    last = now;
  }, 20);
  try {
    return { lagMs, value: await fn() };
  } finally {
    clearInterval(t);
  }
}

test('a thousand names asked for one by one are read and sent once each, and forgotten when the stream ends; a stream holds a bounded number', async () => {
  const dir = tempDir('pa-sds-many-');
  const root = await makeRoot();
  const N = 1200;
  const names: string[] = [];
  for (let i = 0; i < N; i++) {
    const p = path.join(dir.path, `d${i % 40}`, `ca-${i}.pem`);
    fs.mkdirSync(path.dirname(p), { recursive: true });
    fs.writeFileSync(p, root.pem);
    names.push(`file-root:${p}`);
  }
  const socket = path.join(dir.path, 'socket');
  const cache = newCache(socket);
  const sds = new SdsServer({ socketPath: socket, provider: cache, maxNamesPerStream: 1000 });
  cache.onUpdate((n) => sds.push(n));
  const logs: string[] = [];
  configureLogging({ write: (l) => void logs.push(l) });
  await cache.start();
  await sds.start();
  reference(sds, 'clusters of this Envoy', names);
  const sotw = client(socket, 'Stream');
  try {
    // State of the world, one more name per request (each request lists all so far), as the attack did.
    const { lagMs } = await maxLoopLag(async () => {
      for (let i = 1; i <= N; i++) {
        sotw.call.write({ type_url: SECRET_TYPE, resource_names: names.slice(0, i) });
        if (i % 50 === 0) await new Promise((r) => setImmediate(r));
      }
      await waitFor('the first 1000 secrets', () => sotw.got.names.size === 1000, 60_000);
    });
    assert.is(sotw.got.resources, 1000, 'each secret sent once, not again with every new name');
    assert.ok(lagMs < 1000, `the event loop kept running (longest stall ${lagMs.toFixed(0)} ms)`);
    assert.equal(sds.heldNames(), { held: 1000, waiting: 0 });
    assert.match(logs.join('\n'), /asks for 1001 secrets; one stream may hold 1000 \(SDS_MAX_NAMES_PER_STREAM\)/);
    assert.equal(cache.fileSecretCount(), { secrets: 1000, watchedFiles: 1000 });
    // A file change re-sends that one secret only.
    const other = await makeRoot('rotated');
    fs.writeFileSync(names[7]!.slice('file-root:'.length), other.pem);
    await waitFor('the changed secret', () => sotw.got.resources === 1001, 15_000);
    sotw.close();
    await waitFor('the names to be released', () => sds.heldNames().held === 0);
    assert.equal(cache.fileSecretCount(), { secrets: 0, watchedFiles: 0 }, 'nothing held: nothing read or watched');
    // Delta: the same bound, and the names come back when asked for again.
    const delta = client(socket, 'Delta');
    try {
      delta.call.write({ type_url: SECRET_TYPE, resource_names_subscribe: names.slice(0, 1100) });
      await waitFor('1000 secrets over Delta', () => delta.got.names.size === 1000, 60_000);
      assert.is(delta.got.resources, 1000);
    } finally {
      delta.close();
    }
    await waitFor('the Delta names to be released', () => cache.fileSecretCount().secrets === 0);
  } finally {
    sotw.close();
    resetLogging();
    await sds.close();
    await cache.close();
    dir.cleanup();
  }
});

test('names that can never be served are bounded: an overlong name is not kept, and past 10000 unserved names none more is held', async () => {
  const dir = tempDir('pa-sds-junk-');
  const socket = path.join(dir.path, 'socket');
  const cache = newCache(socket);
  const sds = new SdsServer({ socketPath: socket, provider: cache });
  const logs: string[] = [];
  configureLogging({ write: (l) => void logs.push(l) });
  await cache.start();
  await sds.start();
  const streams = [0, 1, 2, 3].map(() => client(socket, 'Delta'));
  try {
    streams[0]!.call.write({ type_url: SECRET_TYPE, resource_names_subscribe: [`file-root:/${'x'.repeat(100_000)}`] });
    await waitFor('the overlong name refused', () => logs.some((l) => /asks for a name of 100011 characters/.test(l)));
    assert.equal(sds.heldNames(), { held: 0, waiting: 0 });
    streams.forEach((c, i) => c.call.write({ type_url: SECRET_TYPE, resource_names_subscribe: Array.from({ length: 4000 }, (_, j) => `file-root:/junk/${i}/${j}`) }));
    // Three streams fill the unserved names past the cap (a request's names are held together); the fourth gets none.
    await waitFor('the requests', () => sds.streamStatus().filter((st) => st.names.length === 4000).length === 3);
    await new Promise((r) => setTimeout(r, 200));
    const held = sds.heldNames();
    assert.ok(held.waiting <= 10_000 + 4000 && held.waiting >= 10_000, `unserved names held: ${held.waiting}`);
    assert.is(held.held, held.waiting, 'none of them is served');
    assert.match(logs.join('\n'), /10000 names already wait unserved/);
    assert.equal(cache.fileSecretCount(), { secrets: 0, watchedFiles: 0 }, 'nothing read for them');
  } finally {
    for (const c of streams) c.close();
    resetLogging();
    await sds.close();
    await cache.close();
    dir.cleanup();
  }
});

test.run();



