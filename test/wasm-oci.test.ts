// The OCI Wasm fetcher against a real registry (Debian's docker-registry, images pushed with skopeo): each image
// layout Istio reads, Basic and Bearer auth from a pull secret, TLS, and every way a fetch must fail (wrong digest,
// corrupt blob, registry down or silent, over the cap, blocked address, unsafe token realm, plain HTTP when secure).

import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as net from 'node:net';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import {
  fetchOciModule, type OciFailure, OciFetchError, type OciFetchOptions, parseChallenge, parseImageReference,
} from '../lib/wasm-oci';
import { findTarFile } from '../lib/tar-reader';
import { type OciRegistry, startOciRegistry, tarOf } from './helpers/oci-registry';

const WASM = Buffer.from('\0asm\x01\0\0\0', 'latin1');
const opts = (o: Partial<OciFetchOptions> = {}): OciFetchOptions => ({
  insecure: true, timeoutMs: 5000, maxRetries: 2, maxBytes: 1 << 20, isBlocked: () => false, ...o,
});

async function failure(p: Promise<unknown>): Promise<OciFetchError> {
  try {
    await p;
  } catch (err) {
    if (err instanceof OciFetchError) return err;
    throw new Error(`expected an OciFetchError, got ${String(err)}`);
  }
  throw new Error('expected the fetch to fail');
}

async function assertFails(p: Promise<unknown>, reason: OciFailure, text: RegExp): Promise<void> {
  const err = await failure(p);
  assert.is(err.reason, reason, `reason of: ${err.message}`);
  assert.match(err.message, text);
}

const registries: OciRegistry[] = [];
let plain: OciRegistry;
test.before(async () => {
  plain = await startOciRegistry();
  registries.push(plain);
});
test.after(async () => {
  for (const r of registries) await r.stop();
});

for (const layout of ['compat', 'docker', 'artifact'] as const) {
  test(`${layout} layout: the module comes back with the registry's manifest digest, by tag and by digest`, async () => {
    const pushed = await plain.push({ repo: `wasm/${layout}`, tag: 'v1', module: WASM, layout });
    const byTag = await fetchOciModule(pushed.ref, opts());
    assert.ok(byTag.module.equals(WASM));
    assert.is(byTag.manifestDigest, pushed.manifestDigest);
    const byDigest = await fetchOciModule(pushed.refByDigest, opts());
    assert.ok(byDigest.module.equals(WASM));
    // The expected digest may be bare hex, as a WasmPlugin's sha256 is.
    await fetchOciModule(pushed.ref, opts({ expectedManifestDigest: pushed.manifestDigest.slice(7) }));
  });
}

test('the docker layout really is a Docker schema 2 manifest with a Docker layer', async () => {
  const pushed = await plain.push({ repo: 'wasm/docker-check', tag: 'v1', module: WASM, layout: 'docker' });
  const raw = await new Promise<string>((resolve, reject) => {
    http.get(`http://${plain.host}/v2/wasm/docker-check/manifests/v1`, {
      headers: { accept: 'application/vnd.docker.distribution.manifest.v2+json' },
    }, (res) => {
      let body = '';
      res.on('data', (c) => (body += c));
      res.on('end', () => resolve(body));
    }).on('error', reject);
  });
  const m = JSON.parse(raw);
  assert.is(m.mediaType, 'application/vnd.docker.distribution.manifest.v2+json');
  assert.is(m.layers[0].mediaType, 'application/vnd.docker.image.rootfs.diff.tar.gzip');
  assert.is((await fetchOciModule(pushed.ref, opts())).manifestDigest, pushed.manifestDigest);
});

test('an image index (multi-platform) resolves to its linux/amd64 image, whose digest is the manifest digest', async () => {
  const other = Buffer.concat([WASM, Buffer.from([0])]);
  for (const layout of ['compat', 'artifact'] as const) {
    const pushed = await plain.push({ repo: `wasm/index-${layout}`, tag: 'v1', module: WASM, layout, index: { otherModule: other } });
    assert.ok(pushed.indexDigest && pushed.indexDigest !== pushed.manifestDigest);
    for (const ref of [pushed.ref, pushed.refByDigest]) {
      const got = await fetchOciModule(ref, opts());
      assert.ok(got.module.equals(WASM), 'the amd64 module, not the arm64 one');
      assert.is(got.manifestDigest, pushed.manifestDigest);
    }
  }
  const noAmd = await plain.push({ repo: 'wasm/index-arm', tag: 'v1', module: WASM, layout: 'compat',
    index: { otherModule: other, otherPlatform: null } });
  assert.ok((await fetchOciModule(noAmd.ref, opts())).module.equals(WASM), 'an attestation-like entry with no platform is skipped');
});

test('htpasswd registry: Basic credentials from the pull secret; none or wrong ones fail as auth', async () => {
  const reg = await startOciRegistry({ auth: 'htpasswd' });
  registries.push(reg);
  const pushed = await reg.push({ repo: 'wasm/basic', tag: 'v1', module: WASM, layout: 'compat' });
  const got = await fetchOciModule(pushed.ref, opts({ pullSecret: reg.pullSecret() }));
  assert.ok(got.module.equals(WASM));
  await assertFails(fetchOciModule(pushed.ref, opts()), 'auth', /no pull secret for 127\.0\.0\.1:/);
  await assertFails(fetchOciModule(pushed.ref, opts({ pullSecret: reg.pullSecret(reg.user, 'wrong') })), 'auth', /refused/);
  // A secret for another registry is no secret for this one.
  const other = Buffer.from(JSON.stringify({ auths: { 'other.example:5000': { username: reg.user, password: reg.password } } }));
  await assertFails(fetchOciModule(pushed.ref, opts({ pullSecret: other })), 'auth', /no pull secret/);
  // username/password entries (not only "auth") and keys written as URLs match too.
  const asUrl = Buffer.from(JSON.stringify({ auths: { [`https://${reg.host}/v1/`]: { username: reg.user, password: reg.password } } }));
  assert.ok((await fetchOciModule(pushed.ref, opts({ pullSecret: asUrl }))).module.equals(WASM));
  await assertFails(fetchOciModule(pushed.ref, opts({ pullSecret: Buffer.from('not json') })), 'auth', /pull secret is not JSON/);
});

test('token registry: a Bearer token from the WWW-Authenticate realm, with the pull secret as Basic credentials', async () => {
  const reg = await startOciRegistry({ auth: 'token' });
  registries.push(reg);
  for (const layout of ['compat', 'artifact'] as const) {
    const pushed = await reg.push({ repo: `team/${layout}`, tag: '1.0', module: WASM, layout });
    const got = await fetchOciModule(pushed.ref, opts({ pullSecret: reg.pullSecret() }));
    assert.ok(got.module.equals(WASM));
    assert.is(got.manifestDigest, pushed.manifestDigest);
  }
  await assertFails(fetchOciModule(`oci://${reg.host}/team/compat:1.0`, opts()), 'auth', /token service refused: HTTP 401/);
});

test('token registry over verified TLS whose realm is plain HTTP: refused, it would carry the credentials in clear', async () => {
  const reg = await startOciRegistry({ auth: 'token', tls: true });
  registries.push(reg);
  const pushed = await reg.push({ repo: 'team/tls', tag: '1.0', module: WASM, layout: 'compat' });
  const secure = opts({ insecure: false, ca: reg.ca, pullSecret: reg.pullSecret() });
  await assertFails(fetchOciModule(pushed.ref, secure), 'auth', /realm: scheme http: is not allowed/);
  // Listed as insecure, the same registry works.
  const got = await fetchOciModule(pushed.ref, opts({ pullSecret: reg.pullSecret() }));
  assert.is(got.manifestDigest, pushed.manifestDigest);
});

test('TLS registry: verified HTTPS with the CA, refused without it (no fallback to HTTP), skip-verify when insecure', async () => {
  const reg = await startOciRegistry({ tls: true });
  registries.push(reg);
  const pushed = await reg.push({ repo: 'wasm/tls', tag: 'v1', module: WASM, layout: 'compat' });
  const verified = await fetchOciModule(pushed.ref, opts({ insecure: false, ca: reg.ca }));
  assert.ok(verified.module.equals(WASM));
  await assertFails(fetchOciModule(pushed.ref, opts({ insecure: false })), 'manifest', /TLS/);
  assert.ok((await fetchOciModule(pushed.ref, opts({ insecure: true }))).module.equals(WASM));
});

test('a plain-HTTP registry that is not listed as insecure is refused, naming WASM_INSECURE_REGISTRIES', async () => {
  const pushed = await plain.push({ repo: 'wasm/secure-only', tag: 'v1', module: WASM, layout: 'compat' });
  await assertFails(fetchOciModule(pushed.ref, opts({ insecure: false })), 'manifest', /WASM_INSECURE_REGISTRIES/);
});

test('wrong digest: a manifest digest that does not match fails before any layer; an unknown digest is not found', async () => {
  const pushed = await plain.push({ repo: 'wasm/digest', tag: 'v1', module: WASM, layout: 'artifact' });
  const wrong = 'a'.repeat(64);
  // The layer is made unreadable: had the fetcher downloaded it, the failure would be a checksum of the layer.
  fs.writeFileSync(plain.blobFile(pushed.layerDigest), Buffer.from('XXXXXXXX'));
  await assertFails(fetchOciModule(pushed.ref, opts({ expectedManifestDigest: wrong })), 'checksum', /does not match sha256:a{64}/);
  await assertFails(fetchOciModule(`oci://${plain.host}/wasm/digest@sha256:${wrong}`, opts()), 'manifest', /HTTP 404/);
});

test('a blob the registry serves corrupt (same size, other bytes) fails its digest check, in both layouts', async () => {
  for (const layout of ['compat', 'artifact'] as const) {
    const pushed = await plain.push({ repo: `wasm/corrupt-${layout}`, tag: 'v1', module: WASM, layout });
    const file = plain.blobFile(pushed.layerDigest);
    const bytes = fs.readFileSync(file);
    bytes[bytes.length - 1] ^= 0xff;
    fs.writeFileSync(file, bytes);
    await assertFails(fetchOciModule(pushed.ref, opts()), 'checksum', /corrupt or tampered/);
  }
});

test('a registry that is down fails as a manifest failure after the configured attempts', async () => {
  const reg = await startOciRegistry();
  const pushed = await reg.push({ repo: 'wasm/down', tag: 'v1', module: WASM, layout: 'compat' });
  await reg.stop();
  await assertFails(fetchOciModule(pushed.ref, opts({ maxRetries: 3 })), 'manifest', /after 3 attempts: .*ECONNREFUSED/);
});

test('a registry that accepts and never answers times out per request and fails', async () => {
  const sockets = new Set<net.Socket>();
  const silent = net.createServer((s) => sockets.add(s));
  await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
  try {
    const port = (silent.address() as net.AddressInfo).port;
    const ref = `oci://127.0.0.1:${port}/wasm/silent:v1`;
    await assertFails(fetchOciModule(ref, opts({ timeoutMs: 300, maxRetries: 2 })), 'manifest', /after 2 attempts: no full answer/);
  } finally {
    for (const s of sockets) s.destroy();
    await new Promise((r) => silent.close(r));
  }
});

test('over the cap: a layer larger than maxBytes is refused by its size, a gzip bomb while unpacking', async () => {
  const big = Buffer.concat([WASM, Buffer.alloc(64 * 1024, 7)]);
  const art = await plain.push({ repo: 'wasm/big-artifact', tag: 'v1', module: big, layout: 'artifact' });
  await assertFails(fetchOciModule(art.ref, opts({ maxBytes: 16 * 1024 })), 'too-large', /more than the cap/);
  assert.ok((await fetchOciModule(art.ref, opts({ maxBytes: big.length }))).module.equals(big));
  // 4 MiB of zeros gzips to a few KB: the compressed layer is under the cap, what it unpacks to is not.
  const bomb = Buffer.concat([WASM, Buffer.alloc(4 << 20)]);
  const compat = await plain.push({ repo: 'wasm/bomb', tag: 'v1', module: bomb, layout: 'compat' });
  await assertFails(fetchOciModule(compat.ref, opts({ maxBytes: 1 << 20 })), 'too-large', /unpacks to more than|more than the cap/);
});

test('blocked addresses: an IP literal and a name that resolves to a blocked address are never connected to', async () => {
  const pushed = await plain.push({ repo: 'wasm/blocked', tag: 'v1', module: WASM, layout: 'compat' });
  const isBlocked = (a: string) => a === '127.0.0.1' || a === '::1';
  await assertFails(fetchOciModule(pushed.ref, opts({ isBlocked })), 'blocked', /127\.0\.0\.1.*block list/);
  const byName = pushed.ref.replace('127.0.0.1', 'localhost');
  await assertFails(fetchOciModule(byName, opts({ isBlocked, maxRetries: 3 })), 'blocked', /localhost \((127\.0\.0\.1|::1)\)/);
});

test('a registry that sends the token request to a metadata or internal address is refused', async () => {
  const seen: string[] = [];
  const hostile = http.createServer((req, res) => {
    seen.push(req.url ?? '');
    res.writeHead(401, { 'www-authenticate': 'Bearer realm="http://169.254.169.254/latest/meta-data",service="x"' }).end();
  });
  await new Promise<void>((r) => hostile.listen(0, '127.0.0.1', r));
  try {
    const port = (hostile.address() as net.AddressInfo).port;
    await assertFails(fetchOciModule(`oci://127.0.0.1:${port}/wasm/x:v1`, opts()), 'blocked', /unsafe bearer realm/);
    hostile.removeAllListeners('request');
    hostile.on('request', (_req, res) => res.writeHead(401, { 'www-authenticate': 'Bearer realm="file:///etc/passwd"' }).end());
    await assertFails(fetchOciModule(`oci://127.0.0.1:${port}/wasm/x:v1`, opts()), 'auth', /scheme file: is not allowed/);
    assert.ok(seen.length >= 1);
  } finally {
    await new Promise((r) => hostile.close(r));
  }
});

test('a blob redirected to storage elsewhere: followed without the credentials; a redirect to a blocked address refused', async () => {
  const blob = WASM;
  const digest = `sha256:${createHash('sha256').update(blob).digest('hex')}`;
  const manifest = JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json',
    layers: [{ mediaType: 'application/vnd.module.wasm.content.layer.v1+wasm', digest, size: blob.length }] });
  const cdnSaw: (string | undefined)[] = [];
  const cdn = http.createServer((req, res) => {
    cdnSaw.push(req.headers.authorization);
    res.end(blob);
  });
  await new Promise<void>((r) => cdn.listen(0, '127.0.0.2', r));
  const cdnUrl = `http://127.0.0.2:${(cdn.address() as net.AddressInfo).port}/blob`;
  const auth = `Basic ${Buffer.from('u:p').toString('base64')}`;
  const registry = http.createServer((req, res) => {
    if (req.headers.authorization !== auth) return res.writeHead(401, { 'www-authenticate': 'Basic realm="r"' }).end();
    if (req.url?.includes('/manifests/')) return res.writeHead(200, { 'content-type': 'application/vnd.oci.image.manifest.v1+json' }).end(manifest);
    res.writeHead(307, { location: cdnUrl }).end();
  });
  await new Promise<void>((r) => registry.listen(0, '127.0.0.1', r));
  try {
    const host = `127.0.0.1:${(registry.address() as net.AddressInfo).port}`;
    const pullSecret = Buffer.from(JSON.stringify({ auths: { [host]: { username: 'u', password: 'p' } } }));
    const got = await fetchOciModule(`oci://${host}/wasm/redirect:v1`, opts({ pullSecret }));
    assert.ok(got.module.equals(blob));
    assert.equal(cdnSaw, [undefined], 'the storage host never sees the registry credentials');
    const isBlocked = (a: string) => a === '127.0.0.2';
    await assertFails(fetchOciModule(`oci://${host}/wasm/redirect:v1`, opts({ pullSecret, isBlocked })), 'blocked', /127\.0\.0\.2/);
    assert.is(cdnSaw.length, 1, 'nothing reached the blocked address');
  } finally {
    await new Promise((r) => registry.close(r));
    await new Promise((r) => cdn.close(r));
  }
});

test('hostile manifests: not JSON, an index, a bad digest, no layer holding the module', async () => {
  let body = '';
  let type = 'application/vnd.oci.image.manifest.v1+json';
  const server = http.createServer((_req, res) => res.writeHead(200, { 'content-type': type }).end(body));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const ref = `oci://127.0.0.1:${(server.address() as net.AddressInfo).port}/wasm/x:v1`;
  try {
    body = '{"schemaVersion": 2, "layers": [';
    await assertFails(fetchOciModule(ref, opts()), 'manifest', /not JSON/);
    const arm = { mediaType: 'application/vnd.oci.image.manifest.v1+json', digest: `sha256:${'2'.repeat(64)}`, size: 10,
      platform: { os: 'linux', architecture: 'arm64' } };
    body = JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.index.v1+json', manifests: [arm] });
    await assertFails(fetchOciModule(ref, opts()), 'manifest', /has no linux\/amd64 image \(it has: linux\/arm64\)/);
    body = JSON.stringify({ schemaVersion: 2, layers: [{ mediaType: 'x', digest: 'sha256:../../etc', size: 1 }] });
    await assertFails(fetchOciModule(ref, opts()), 'manifest', /layers\[0\]\.digest is not a sha256 digest/);
    body = JSON.stringify({ schemaVersion: 2, layers: [{ mediaType: 'text/plain', digest: `sha256:${'0'.repeat(64)}`, size: 1 }] });
    await assertFails(fetchOciModule(ref, opts()), 'format', /neither a tar layer .* nor a Wasm layer/);
    // Asked by digest, a registry that answers with another manifest is caught.
    body = JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json', layers: [] });
    const byDigest = ref.replace(':v1', `@sha256:${'1'.repeat(64)}`);
    await assertFails(fetchOciModule(byDigest, opts()), 'checksum', /not the one asked for/);
    type = 'application/json';
    body = 'x'.repeat(5 << 20);
    await assertFails(fetchOciModule(ref, opts()), 'too-large', /manifest is/);
  } finally {
    await new Promise((r) => server.close(r));
  }
});

test('challenges: Bearer parameters, several challenges in one header (the first wins)', () => {
  assert.equal(parseChallenge('Bearer realm="https://auth.test/token",service="reg",scope="repository:a/b:pull"'),
    { scheme: 'bearer', params: { realm: 'https://auth.test/token', service: 'reg', scope: 'repository:a/b:pull' } });
  assert.is(parseChallenge('Bearer realm="https://a.test/t", Basic realm="http://169.254.169.254/"')?.params.realm, 'https://a.test/t');
  assert.is(parseChallenge('Basic realm="Registry Realm"')?.scheme, 'basic');
});

test('references: Docker Hub short names, ports, digests; bad ones are refused by name', () => {
  assert.equal(parseImageReference('oci://ghcr.io/org/plugin:1.2'), { registry: 'ghcr.io', repository: 'org/plugin', reference: '1.2', byDigest: false });
  assert.equal(parseImageReference('oci://plugin'), { registry: 'docker.io', repository: 'library/plugin', reference: 'latest', byDigest: false });
  assert.equal(parseImageReference('localhost:5000/a/b').registry, 'localhost:5000');
  const d = `sha256:${'f'.repeat(64)}`;
  assert.equal(parseImageReference(`oci://r.io:443/p@${d}`), { registry: 'r.io:443', repository: 'p', reference: d, byDigest: true });
  assert.throws(() => parseImageReference('oci://r.io/p@sha256:abc'), /digest is not sha256/);
  assert.throws(() => parseImageReference('oci://r.io/UPPER:v1'), /lowercase path components/);
  assert.throws(() => parseImageReference('oci://r.io/p/../x:v1'), /lowercase path components/);
  assert.throws(() => parseImageReference('oci://r.io/p:bad tag'), /tag is not a valid tag/);
});

test('tar reader: finds plugin.wasm under a directory and through a PAX long name; refuses a bad checksum', () => {
  const one = tarOf('dir/plugin.wasm', WASM);
  assert.ok(findTarFile(one, 'plugin.wasm')?.data.equals(WASM));
  assert.is(findTarFile(tarOf('other.wasm', WASM), 'plugin.wasm'), undefined);
  const longName = `${'d'.repeat(150)}/plugin.wasm`;
  const record = ` path=${longName}\n`;
  const len = String(record.length + 3).length + record.length;
  const pax = tarOf('PaxHeader', Buffer.from(`${len}${record}`));
  pax[156] = 'x'.charCodeAt(0);
  fixChecksum(pax);
  const paxTar = Buffer.concat([pax.subarray(0, pax.length - 1024), tarOf('short', WASM)]);
  const entry = findTarFile(paxTar, 'plugin.wasm');
  assert.is(entry?.name, longName);
  const bad = Buffer.from(one);
  bad[0] ^= 1;
  assert.throws(() => findTarFile(bad, 'plugin.wasm'), /bad checksum/);
});

function fixChecksum(t: Buffer): void {
  t.write('        ', 148, 'latin1');
  let sum = 0;
  for (let i = 0; i < 512; i++) sum += t[i];
  t.write(sum.toString(8).padStart(6, '0') + '\0 ', 148, 'latin1');
}

test.run();
