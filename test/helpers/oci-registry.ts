// A real OCI registry for the Wasm tests: Debian's `docker-registry` (the CNCF distribution registry) on a loopback
// port in a temp dir, anonymous, with htpasswd (Basic) auth, or with token (Bearer) auth served by a small token
// service here, over plain HTTP or TLS; and Wasm images pushed into it with the real `skopeo` from an OCI layout
// directory written here, in each layout Istio reads (Istio's "compat" tar.gz holding plugin.wasm, Docker schema 2,
// and the Wasm artifact layer). Both tools are installed on first use when missing.

import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes, sign } from 'node:crypto';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as https from 'node:https';
import * as path from 'node:path';
import * as zlib from 'node:zlib';
import { freePort, tempDir, waitFor } from './harness';
import { makeLeaf, makeRoot } from './test-ca';

let ensured = false;
/** Installs docker-registry and skopeo (Debian) when either is missing. */
export function ensureOciTools(): void {
  if (ensured) return;
  const missing = ['docker-registry', 'skopeo'].filter((c) => {
    try {
      execFileSync('sh', ['-c', `command -v ${c}`], { stdio: 'ignore' });
      return false;
    } catch {
      return true;
    }
  });
  if (missing.length) {
    const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
    const args = ['install', '-y', '-qq', '--no-install-recommends', ...missing];
    const install = () => execFileSync('apt-get', args, { stdio: 'inherit', env });
    try {
      install();
    } catch {
      execFileSync('apt-get', ['update', '-qq'], { stdio: 'inherit', env });
      install();
    }
  }
  ensured = true;
}

/** The three image layouts Istio's fetcher reads. */
export type WasmLayout = 'compat' | 'docker' | 'artifact';

export interface WasmImage {
  repo: string;
  tag: string;
  module: Buffer;
  layout: WasmLayout;
  /**
   * Push an image index (OCI) naming this image as linux/amd64 and a second one, with `otherModule`, as
   * linux/arm64 (or with no platform at all when `otherPlatform` is null).
   */
  index?: { otherModule: Buffer; otherPlatform?: { os: string; architecture: string } | null };
}

export interface PushedImage {
  /** `oci://127.0.0.1:PORT/repo:tag` */
  ref: string;
  /** `oci://127.0.0.1:PORT/repo@sha256:...` */
  refByDigest: string;
  /** The manifest digest as the registry holds it, `sha256:<hex>` (what a WasmPlugin's sha256 names). */
  manifestDigest: string;
  /** The layer that holds the module (a tar.gz or the raw module), as the manifest lists it. */
  layerDigest: string;
  /** With `index`: the index's digest (what the tag names); manifestDigest is then the linux/amd64 image's. */
  indexDigest?: string;
}

export interface RegistryOptions {
  /** none (default), htpasswd (Basic) or token (Bearer from a token service on its own loopback port). */
  auth?: 'none' | 'htpasswd' | 'token';
  /** Serve HTTPS with a certificate for 127.0.0.1 from a fresh test CA (see `ca`). */
  tls?: boolean;
}

export interface OciRegistry {
  /** `127.0.0.1:PORT` */
  host: string;
  /** The one user the registry (or its token service) accepts when auth is on. */
  user: string;
  password: string;
  /** PEM of the CA that signed the registry's certificate, when tls. */
  ca?: string;
  /** Token service URL, when auth is token. */
  realm?: string;
  /** A docker config JSON (an image pull secret's `.dockerconfigjson`) for this registry; default: the real user. */
  pullSecret(user?: string, password?: string): Buffer;
  push(image: WasmImage): Promise<PushedImage>;
  /** The file in the registry's storage that holds a blob (tests overwrite it to serve corrupt bytes). */
  blobFile(digest: string): string;
  /** Stops the registry (and token service) and removes the temp dir; safe to call twice. */
  stop(): Promise<void>;
}

export async function startOciRegistry(opts: RegistryOptions = {}): Promise<OciRegistry> {
  ensureOciTools();
  const auth = opts.auth ?? 'none';
  const dir = tempDir('pa-oci-registry-');
  const user = 'tester';
  const password = randomBytes(9).toString('hex');
  let child: ChildProcess | undefined;
  let tokenServer: http.Server | undefined;
  let stopped = false;
  // A test process that dies without its after-hook must not leave a registry behind.
  const killOnExit = () => child?.kill('SIGKILL');
  process.once('exit', killOnExit);
  const stop = async () => {
    if (stopped) return;
    stopped = true;
    process.removeListener('exit', killOnExit);
    if (child && child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((r) => child!.once('exit', r));
      child.kill('SIGTERM');
      const t = setTimeout(() => child!.kill('SIGKILL'), 3000);
      await exited;
      clearTimeout(t);
    }
    if (tokenServer) await new Promise((r) => tokenServer!.close(r));
    dir.cleanup();
  };
  try {
    const port = await freePort();
    const host = `127.0.0.1:${port}`;
    const lines = [
      'version: 0.1',
      'log: { level: warn, accesslog: { disabled: true } }',
      `storage: { filesystem: { rootdirectory: ${JSON.stringify(path.join(dir.path, 'data'))} } }`,
    ];
    const file = (name: string) => JSON.stringify(path.join(dir.path, name));
    const tls = opts.tls ? `, tls: { certificate: ${file('tls.crt')}, key: ${file('tls.key')} }` : '';
    lines.push(`http: { addr: ${JSON.stringify(host)}${tls} }`);
    let ca: string | undefined;
    if (opts.tls) {
      const root = await makeRoot('oci registry test CA');
      const leaf = await makeLeaf(root, { ip: ['127.0.0.1'], dns: ['localhost'] });
      fs.writeFileSync(path.join(dir.path, 'tls.crt'), leaf.certPem);
      fs.writeFileSync(path.join(dir.path, 'tls.key'), leaf.keyPem, { mode: 0o600 });
      ca = root.pem;
    }
    let realm: string | undefined;
    if (auth === 'htpasswd') {
      fs.writeFileSync(path.join(dir.path, 'htpasswd'), `${user}:${bcrypt(password)}\n`);
      lines.push(`auth: { htpasswd: { realm: test-registry, path: ${file('htpasswd')} } }`);
    } else if (auth === 'token') {
      const token = await startTokenService(user, password);
      tokenServer = token.server;
      realm = token.realm;
      fs.writeFileSync(path.join(dir.path, 'token-ca.crt'), token.rootPem);
      const who = `realm: ${JSON.stringify(realm)}, service: ${TOKEN_SERVICE}, issuer: ${TOKEN_ISSUER}`;
      lines.push(`auth: { token: { ${who}, ` +
        `rootcertbundle: ${file('token-ca.crt')} } }`);
    }
    const config = path.join(dir.path, 'config.yml');
    fs.writeFileSync(config, lines.join('\n') + '\n');
    const logs: string[] = [];
    child = spawn('docker-registry', ['serve', config], { stdio: ['ignore', 'pipe', 'pipe'] });
    for (const s of [child.stdout!, child.stderr!]) s.on('data', (c: Buffer) => logs.push(c.toString()));
    const scheme = opts.tls ? 'https' : 'http';
    await waitFor(`docker-registry on ${host}`, async () => {
      if (child!.exitCode !== null) throw new Error(`docker-registry exited: ${logs.join('').slice(-2000)}`);
      const status = await probe(`${scheme}://${host}/v2/`);
      return status === 200 || status === 401;
    }, 20_000, 100);
    const pullSecret = (u = user, p = password) => Buffer.from(JSON.stringify({
      auths: { [host]: { auth: Buffer.from(`${u}:${p}`).toString('base64') } },
    }));
    return {
      host,
      user,
      password,
      ca,
      realm,
      pullSecret,
      blobFile: (digest) => {
        const hex = digest.replace(/^sha256:/, '');
        return path.join(dir.path, 'data', 'docker', 'registry', 'v2', 'blobs', 'sha256', hex.slice(0, 2), hex, 'data');
      },
      push: (image) => pushImage(dir.path, host, image, auth === 'none' ? undefined : `${user}:${password}`),
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}

function probe(url: string): Promise<number> {
  return new Promise((resolve) => {
    const mod = url.startsWith('https:') ? https : http;
    const req = mod.get(url, { agent: false, rejectUnauthorized: false, timeout: 2000 }, (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    });
    req.on('timeout', () => req.destroy());
    req.on('error', () => resolve(0));
  });
}

/** bcrypt for htpasswd via Python's crypt (libxcrypt), cost 4: the registry checks it on every request. */
function bcrypt(password: string): string {
  const script = 'import crypt,sys;print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)))';
  return execFileSync('python3', ['-W', 'ignore', '-c', script, password], { encoding: 'utf8' }).trim();
}

interface TokenService {
  server: http.Server;
  realm: string;
  rootPem: string;
}

const TOKEN_SERVICE = 'test-registry';
const TOKEN_ISSUER = 'test-token-issuer';

/**
 * The token service of the registry's token auth (distribution's "token" scheme): Basic credentials in, a JWT
 * signed with ES256 out, its signing certificate in the `x5c` header and its CA in the registry's rootcertbundle.
 */
async function startTokenService(user: string, password: string): Promise<TokenService> {
  const root = await makeRoot('registry token CA');
  const leaf = await makeLeaf(root, { dns: ['token-signer'] });
  const der = Buffer.from(leaf.certPem.replace(/-----[^-]+-----|\s/g, ''), 'base64');
  const b64url = (b: Buffer | string) => Buffer.from(b).toString('base64url');
  const server = http.createServer((req, res) => {
    const u = new URL(req.url ?? '/', 'http://x');
    const expected = `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`;
    if (u.pathname !== '/token' || req.headers.authorization !== expected) {
      res.writeHead(401, { 'content-type': 'application/json' }).end('{"errors":[{"code":"UNAUTHORIZED"}]}');
      return;
    }
    const access = u.searchParams.getAll('scope').flatMap((s) => {
      const [type, ...rest] = s.split(':');
      const actions = rest.pop() ?? '';
      return [{ type, name: rest.join(':'), actions: actions.split(',').filter(Boolean) }];
    });
    const now = Math.floor(Date.now() / 1000);
    const header = { typ: 'JWT', alg: 'ES256', x5c: [der.toString('base64')] };
    const claims = {
      iss: TOKEN_ISSUER, sub: user, aud: u.searchParams.get('service') ?? TOKEN_SERVICE,
      exp: now + 300, nbf: now - 60, iat: now, jti: randomBytes(8).toString('hex'), access,
    };
    const input = `${b64url(JSON.stringify(header))}.${b64url(JSON.stringify(claims))}`;
    const sig = sign('sha256', Buffer.from(input), { key: leaf.keyPem, dsaEncoding: 'ieee-p1363' });
    const token = `${input}.${b64url(sig)}`;
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ token, access_token: token, expires_in: 300, issued_at: new Date().toISOString() }));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as { port: number }).port;
  return { server, realm: `http://127.0.0.1:${port}/token`, rootPem: root.pem };
}

/** Writes the image as an OCI layout directory and copies it into the registry with skopeo. */
async function pushImage(base: string, host: string, image: WasmImage, creds?: string): Promise<PushedImage> {
  const dir = fs.mkdtempSync(path.join(base, 'layout-'));
  try {
    const written = writeOciLayout(dir, image);
    const digestFile = path.join(dir, 'pushed-digest');
    const args = ['--insecure-policy', 'copy', '--quiet', '--dest-tls-verify=false', '--digestfile', digestFile];
    if (creds) args.push('--dest-creds', creds);
    // Docker schema 2 with Docker media types: skopeo converts the manifest, the layer bytes stay the same.
    if (image.layout === 'docker') args.push('--format', 'v2s2');
    if (image.index) args.push('--all');
    args.push(`oci:${dir}:${image.tag}`, `docker://${host}/${image.repo}:${image.tag}`);
    await new Promise<void>((resolve, reject) => {
      execFile('skopeo', args, { timeout: 60_000 }, (err, _out, stderr) => {
        if (err) reject(new Error(`skopeo copy failed: ${stderr || err.message}`));
        else resolve();
      });
    });
    const pushed = fs.readFileSync(digestFile, 'utf8').trim();
    if (image.index && pushed !== written.indexDigest) {
      throw new Error(`skopeo pushed ${pushed}, not the index written`);
    }
    const manifestDigest = image.index ? written.manifestDigest : pushed;
    return {
      ref: `oci://${host}/${image.repo}:${image.tag}`,
      refByDigest: `oci://${host}/${image.repo}@${pushed}`,
      manifestDigest,
      layerDigest: written.layerDigest,
      ...(image.index && { indexDigest: pushed }),
    };
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

const sha256 = (b: Buffer) => `sha256:${createHash('sha256').update(b).digest('hex')}`;

export interface WrittenLayout {
  manifestDigest: string;
  layerDigest: string;
  indexDigest?: string;
}

/** An OCI image layout (oci-layout, index.json, blobs/sha256/...) holding the module in the given layout. */
export function writeOciLayout(dir: string, image: WasmImage): WrittenLayout {
  fs.mkdirSync(path.join(dir, 'blobs', 'sha256'), { recursive: true });
  const blob = (b: Buffer) => {
    const d = sha256(b);
    fs.writeFileSync(path.join(dir, 'blobs', 'sha256', d.slice(7)), b);
    return { digest: d, size: b.length };
  };
  const imageManifest = (module: Buffer) => {
    let layer: { mediaType: string; digest: string; size: number };
    let config: { mediaType: string; digest: string; size: number };
    if (image.layout === 'artifact') {
      layer = { mediaType: 'application/vnd.module.wasm.content.layer.v1+wasm', ...blob(module) };
      config = { mediaType: 'application/vnd.module.wasm.config.v1+json', ...blob(Buffer.from('{}')) };
    } else {
      const tar = tarOf('plugin.wasm', module);
      layer = { mediaType: 'application/vnd.oci.image.layer.v1.tar+gzip', ...blob(zlib.gzipSync(tar)) };
      const rootfs = { type: 'layers', diff_ids: [sha256(tar)] };
      const cfg = { architecture: 'amd64', os: 'linux', rootfs, config: {} };
      config = { mediaType: 'application/vnd.oci.image.config.v1+json', ...blob(Buffer.from(JSON.stringify(cfg))) };
    }
    const manifest = Buffer.from(JSON.stringify({
      schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json', config, layers: [layer],
    }));
    return { ...blob(manifest), layerDigest: layer.digest };
  };
  const m = imageManifest(image.module);
  const MANIFEST = 'application/vnd.oci.image.manifest.v1+json';
  let top = { mediaType: MANIFEST, digest: m.digest, size: m.size };
  let indexDigest: string | undefined;
  if (image.index) {
    const other = imageManifest(image.index.otherModule);
    const given = image.index.otherPlatform;
    const otherPlatform = given === undefined ? { os: 'linux', architecture: 'arm64' } : given;
    const index = Buffer.from(JSON.stringify({
      schemaVersion: 2, mediaType: 'application/vnd.oci.image.index.v1+json',
      manifests: [
        {
          mediaType: MANIFEST, digest: other.digest, size: other.size,
          ...(otherPlatform && { platform: otherPlatform }),
        },
        { mediaType: MANIFEST, digest: m.digest, size: m.size, platform: { os: 'linux', architecture: 'amd64' } },
      ],
    }));
    const i = blob(index);
    indexDigest = i.digest;
    top = { mediaType: 'application/vnd.oci.image.index.v1+json', ...i };
  }
  fs.writeFileSync(path.join(dir, 'oci-layout'), '{"imageLayoutVersion":"1.0.0"}');
  fs.writeFileSync(path.join(dir, 'index.json'), JSON.stringify({
    schemaVersion: 2,
    manifests: [{ ...top, annotations: { 'org.opencontainers.image.ref.name': image.tag } }],
  }));
  return { manifestDigest: m.digest, layerDigest: m.layerDigest, ...(indexDigest && { indexDigest }) };
}

/** A one-file ustar archive. */
export function tarOf(name: string, data: Buffer): Buffer {
  const h = Buffer.alloc(512);
  h.write(name, 0, 100, 'utf8');
  h.write('0000644\0', 100, 'latin1');
  h.write('0000000\0', 108, 'latin1');
  h.write('0000000\0', 116, 'latin1');
  h.write(data.length.toString(8).padStart(11, '0') + '\0', 124, 'latin1');
  h.write(Math.floor(Date.now() / 1000).toString(8).padStart(11, '0') + '\0', 136, 'latin1');
  h.write('        ', 148, 'latin1');
  h.write('0', 156, 'latin1');
  h.write('ustar\0' + '00', 257, 'latin1');
  let sum = 0;
  for (const b of h) sum += b;
  h.write(sum.toString(8).padStart(6, '0') + '\0 ', 148, 'latin1');
  const pad = Buffer.alloc((512 - (data.length % 512)) % 512);
  return Buffer.concat([h, data, pad, Buffer.alloc(1024)]);
}
