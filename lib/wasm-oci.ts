// Fetching a Wasm module from an OCI registry (`oci://registry/repo:tag` or `@sha256:...`), for the Wasm cache.
//
// A small client of the registry v2 API, as Istio's pkg/wasm/imagefetcher.go uses it through go-containerregistry:
// anonymous, Basic or Bearer-token auth (credentials from the plugin's pull secret, a docker config JSON), OCI and
// Docker schema 2 manifests, and the three layouts Istio reads: a Docker or OCI layer tar(.gz) holding
// `plugin.wasm` ("compat"), or a raw Wasm layer ("oci" artifact). Every byte that comes back is peer input: each
// blob is checked against its digest and size, nothing is buffered past `maxBytes`, every address connected to
// (registry, token realm, redirect target) passes `isBlocked` after resolution, and HTTPS is the rule unless the
// registry is listed as insecure.

import { createHash } from 'node:crypto';
import * as dns from 'node:dns';
import * as http from 'node:http';
import * as https from 'node:https';
import * as net from 'node:net';
import * as zlib from 'node:zlib';
import { AgentError, errorMessage } from './errors';
import { scope } from './log';
import { findTarFile } from './tar-reader';

const log = scope('wasm');

/** What the cache asks for. */
export interface OciFetchOptions {
  /** Docker config JSON (`{"auths":{...}}`) from the plugin's pull secret, if any. */
  pullSecret?: Buffer;
  /** Registries (host or host:port) reached over plain HTTP and/or without TLS verification. */
  insecure: boolean;
  /** Per-request timeout (body included; 0: Go's default, 15 s) and attempts per request (Go counts them so). */
  timeoutMs: number;
  maxRetries: number;
  /** The module (and any layer read) may not be larger than this. */
  maxBytes: number;
  /** Refuse to connect to addresses in these CIDRs (SSRF block list); checked on every resolved address. */
  isBlocked(address: string): boolean;
  signal?: AbortSignal;
  /**
   * The manifest digest the plugin names (`sha256:<hex>` or bare hex), if any: checked before any layer is
   * downloaded, so a wrong `sha256` costs one manifest, not a module.
   */
  expectedManifestDigest?: string;
  /** Trust these CA certificates (PEM) instead of the system's for HTTPS; for tests and private registries. */
  ca?: string | Buffer;
}

export interface OciModule {
  /** The Wasm module bytes. */
  module: Buffer;
  /** The image's manifest digest, `sha256:<hex>` (what a WasmPlugin's `sha256` names for an OCI image, as in Go). */
  manifestDigest: string;
}

/** Why a fetch failed, for the cache's log line and its `istio_agent_wasm_remote_fetch_count` result. */
export type OciFailure =
  'reference' | 'blocked' | 'auth' | 'manifest' | 'checksum' | 'too-large' | 'format' | 'download';

export class OciFetchError extends AgentError {
  readonly reason: OciFailure;
  constructor(reason: OciFailure, message: string, cause?: unknown) {
    super(reason === 'reference' ? 'BAD_INPUT' : 'UPSTREAM', message, cause);
    this.reason = reason;
    this.name = 'OciFetchError';
  }
}

const MEDIA = {
  ociManifest: 'application/vnd.oci.image.manifest.v1+json',
  dockerManifest: 'application/vnd.docker.distribution.manifest.v2+json',
  ociIndex: 'application/vnd.oci.image.index.v1+json',
  dockerList: 'application/vnd.docker.distribution.manifest.list.v2+json',
  dockerLayer: 'application/vnd.docker.image.rootfs.diff.tar.gzip',
  ociLayerGzip: 'application/vnd.oci.image.layer.v1.tar+gzip',
  ociLayer: 'application/vnd.oci.image.layer.v1.tar',
  // Solo's Wasm artifact layer (Istio's "oci" variant) and the CNCF Wasm OCI artifact layer.
  wasmLayers: ['application/vnd.module.wasm.content.layer.v1+wasm', 'application/vnd.wasm.content.layer.v1+wasm'],
} as const;
const WASM_FILE = 'plugin.wasm';
/** A manifest is a few hundred bytes; anything near this is not one. */
const MAX_MANIFEST_BYTES = 4 << 20;
/** Room for tar headers and padding around a module of `maxBytes`. */
const TAR_SLACK = 1 << 20;
const MAX_REDIRECTS = 5;
const DIGEST = /^sha256:[0-9a-f]{64}$/;

export interface ImageReference {
  /** `host[:port]` as written (docker.io for Docker Hub). */
  registry: string;
  repository: string;
  /** A tag or a `sha256:` digest. */
  reference: string;
  byDigest: boolean;
}

const COMPONENT = '[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*';
const REPOSITORY = new RegExp(`^${COMPONENT}(?:/${COMPONENT})*$`);
const TAG = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/;
const LABEL = '[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?';
const HOST = new RegExp(`^(?:${LABEL}(?:\\.${LABEL})*|\\[[0-9A-Fa-f:.]+\\])(?::\\d{1,5})?$`);

/** Parses `oci://host/repo:tag`, `host/repo@sha256:...` or a Docker Hub short name, as Docker's reference rules do. */
export function parseImageReference(ref: string): ImageReference {
  const shown = JSON.stringify(ref.slice(0, 300));
  const bad = (why: string) => new OciFetchError('reference', `invalid OCI image reference ${shown}: ${why}`);
  let rest = ref.startsWith('oci://') ? ref.slice(6) : ref;
  if (!rest || rest.length > 1024) throw bad('empty or too long');
  let reference = 'latest';
  let byDigest = false;
  const at = rest.indexOf('@');
  if (at >= 0) {
    reference = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!DIGEST.test(reference)) throw bad('the digest is not sha256:<64 lowercase hex digits>');
    byDigest = true;
  }
  const slash = rest.indexOf('/');
  let registry = 'docker.io';
  let path = rest;
  if (slash > 0) {
    const first = rest.slice(0, slash);
    if (first.includes('.') || first.includes(':') || first === 'localhost' || first.startsWith('[')) {
      registry = first;
      path = rest.slice(slash + 1);
    }
  }
  if (!byDigest) {
    const colon = path.lastIndexOf(':');
    if (colon >= 0) {
      reference = path.slice(colon + 1);
      path = path.slice(0, colon);
      if (!TAG.test(reference)) throw bad('the tag is not a valid tag');
    }
  }
  if (!HOST.test(registry)) throw bad('the registry is not a host name or host:port');
  if (registry === 'docker.io' && !path.includes('/')) path = `library/${path}`;
  if (!REPOSITORY.test(path)) throw bad('the repository is not lowercase path components');
  return { registry, repository: path, reference, byDigest };
}

/** Fetches the manifest, checks its digest, then fetches and unpacks the one layer that holds the module. */
export async function fetchOciModule(ref: string, opts: OciFetchOptions): Promise<OciModule> {
  const image = parseImageReference(ref);
  const client = new RegistryClient(image, opts);
  log.info(`fetching image ${image.repository} from registry ${image.registry} with tag ${image.reference}`);
  const manifest = await client.manifest();
  const expected = opts.expectedManifestDigest;
  if (expected !== undefined) {
    const want = expected.startsWith('sha256:') ? expected : `sha256:${expected}`;
    if (want.toLowerCase() !== manifest.digest) {
      const why = `image ${ref} has manifest digest ${manifest.digest}, which does not match ${want}`;
      throw new OciFetchError('checksum', why);
    }
  }
  const module = await extractModule(client, manifest);
  return { module, manifestDigest: manifest.digest };
}

interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
}

interface Manifest {
  digest: string;
  mediaType: string;
  layers: Descriptor[];
}

interface Index {
  digest: string;
  index: (Descriptor & { platform?: { os: string; architecture: string } })[];
}

async function extractModule(client: RegistryClient, m: Manifest): Promise<Buffer> {
  if (m.layers.length === 0) throw new OciFetchError('format', 'the image has no layer');
  const last = m.layers[m.layers.length - 1];
  const tarLayers: string[] = [MEDIA.dockerLayer, MEDIA.ociLayerGzip, MEDIA.ociLayer];
  // Istio's order: a Docker manifest or an OCI "compat" image is read from its last layer; otherwise the Wasm layer.
  if (tarLayers.includes(last.mediaType)) {
    const blob = await client.blob(last, client.opts.maxBytes);
    return unpackLayer(blob, client.opts.maxBytes);
  }
  const wasm = m.layers.find((l) => (MEDIA.wasmLayers as readonly string[]).includes(l.mediaType));
  if (!wasm) {
    const types = m.layers.map((l) => l.mediaType).join(', ');
    const why = `the image has neither a tar layer holding ${WASM_FILE} last nor a Wasm layer (layers: ${types})`;
    throw new OciFetchError('format', why);
  }
  return client.blob(wasm, client.opts.maxBytes);
}

function unpackLayer(blob: Buffer, maxBytes: number): Buffer {
  let archive = blob;
  if (blob.length >= 2 && blob[0] === 0x1f && blob[1] === 0x8b) {
    try {
      archive = zlib.gunzipSync(blob, { maxOutputLength: maxBytes + TAR_SLACK });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ERR_BUFFER_TOO_LARGE' || err instanceof RangeError) {
        throw new OciFetchError('too-large', `the layer unpacks to more than ${maxBytes + TAR_SLACK} bytes`);
      }
      throw new OciFetchError('format', `the layer is not valid gzip: ${errorMessage(err)}`, err);
    }
  }
  let entry;
  try {
    entry = findTarFile(archive, WASM_FILE);
  } catch (err) {
    throw new OciFetchError('format', `the layer is not a valid tar archive: ${errorMessage(err)}`, err);
  }
  if (!entry) throw new OciFetchError('format', `${WASM_FILE} not found in the layer`);
  if (entry.data.length > maxBytes) {
    throw new OciFetchError('too-large', `${WASM_FILE} is ${entry.data.length} bytes, more than the cap, ${maxBytes}`);
  }
  return Buffer.from(entry.data);
}

type Headers = Record<string, string>;

interface Response {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

interface Credentials {
  basic?: string;
  registryToken?: string;
}

/** One fetch's conversation with one registry: scheme, auth and token are learnt once and reused for each blob. */
class RegistryClient {
  private scheme: 'https' | 'http' = 'https';
  private schemeKnown = false;
  private authorization?: string;
  private readonly creds: Credentials;

  constructor(
    readonly image: ImageReference,
    readonly opts: OciFetchOptions,
  ) {
    this.creds = credentialsFor(image.registry, opts.pullSecret);
    if (this.creds.registryToken) this.authorization = `Bearer ${this.creds.registryToken}`;
  }

  private get apiHost(): string {
    // Docker Hub's API lives at a different host than its name.
    return this.image.registry === 'docker.io' ? 'registry-1.docker.io' : this.image.registry;
  }

  /**
   * The image's manifest. A tag or digest that names an image index (a multi-platform image, or one with build
   * attestations) resolves, as go-containerregistry does for Istio, to its linux/amd64 image: the manifest
   * digest is then that image's.
   */
  async manifest(): Promise<Manifest> {
    const top = await this.fetchManifest(this.image.reference, MAX_MANIFEST_BYTES);
    if (this.image.byDigest && top.digest !== this.image.reference) {
      const why = `manifest ${this.image.reference} came back with digest ${top.digest}, not the one asked for`;
      throw new OciFetchError('checksum', why);
    }
    if (!('index' in top)) return top;
    const child = top.index.find((m) => m.platform?.os === 'linux' && m.platform.architecture === 'amd64');
    if (!child) {
      const have = top.index.map((m) => (m.platform ? `${m.platform.os}/${m.platform.architecture}` : '?')).join(', ');
      const why = `the image index ${top.digest} has no linux/amd64 image (it has: ${have || 'none'})`;
      throw new OciFetchError('manifest', why);
    }
    const m = await this.fetchManifest(child.digest, Math.min(child.size, MAX_MANIFEST_BYTES));
    if (m.digest !== child.digest) {
      throw new OciFetchError('checksum', `manifest ${child.digest} of the index came back with digest ${m.digest}`);
    }
    if ('index' in m) throw new OciFetchError('manifest', `the image index ${top.digest} names another index`);
    return m;
  }

  private async fetchManifest(reference: string, cap: number): Promise<Manifest | Index> {
    const accept = [MEDIA.ociManifest, MEDIA.dockerManifest, MEDIA.ociIndex, MEDIA.dockerList].join(', ');
    const path = `/v2/${this.image.repository}/manifests/${reference}`;
    const res = await this.registryGet(path, { accept }, cap, 'manifest');
    if (res.status !== 200) throw new OciFetchError('manifest', `could not fetch manifest: ${statusText(res)}`);
    const digest = sha256(res.body);
    let doc: unknown;
    try {
      doc = JSON.parse(res.body.toString('utf8'));
    } catch {
      throw new OciFetchError('manifest', 'could not fetch manifest: the registry sent a body that is not JSON');
    }
    const o = (doc ?? {}) as Record<string, unknown>;
    const mediaType = typeof o.mediaType === 'string' ? o.mediaType : (contentType(res) ?? MEDIA.ociManifest);
    if (mediaType === MEDIA.ociIndex || mediaType === MEDIA.dockerList || Array.isArray(o.manifests)) {
      if (o.schemaVersion !== 2 || !Array.isArray(o.manifests)) {
        throw new OciFetchError('manifest', 'the image index is not schema version 2 with a list of manifests');
      }
      return { digest, index: o.manifests.map((m, i) => indexEntry(m, `manifests[${i}]`)) };
    }
    if (mediaType !== MEDIA.ociManifest && mediaType !== MEDIA.dockerManifest) {
      throw new OciFetchError('manifest', `unsupported manifest media type ${JSON.stringify(mediaType.slice(0, 100))}`);
    }
    if (o.schemaVersion !== 2 || !Array.isArray(o.layers)) {
      throw new OciFetchError('manifest', 'the manifest is not schema version 2 with a list of layers');
    }
    const layers = o.layers.map((l, i) => descriptor(l, `layers[${i}]`));
    return { digest, mediaType, layers };
  }

  /** A blob, checked against its descriptor's size and digest; never more than `cap` bytes are read. */
  async blob(d: Descriptor, cap: number): Promise<Buffer> {
    if (d.size > cap) {
      throw new OciFetchError('too-large', `layer ${d.digest} is ${d.size} bytes, more than the cap of ${cap}`);
    }
    const res = await this.registryGet(`/v2/${this.image.repository}/blobs/${d.digest}`, {}, d.size, 'layer');
    if (res.status !== 200) {
      throw new OciFetchError('download', `could not fetch layer ${d.digest}: ${statusText(res)}`);
    }
    if (res.body.length !== d.size) {
      throw new OciFetchError('checksum', `layer ${d.digest} is ${res.body.length} bytes, its manifest says ${d.size}`);
    }
    const got = sha256(res.body);
    if (got !== d.digest) {
      throw new OciFetchError('checksum', `layer ${d.digest} has digest ${got} (corrupt or tampered)`);
    }
    return res.body;
  }

  /** GET on the registry with auth: on a 401 it answers the challenge once and repeats the request. */
  private async registryGet(path: string, headers: Headers, cap: number, what: string): Promise<Response> {
    const url = () => new URL(`${this.scheme}://${this.apiHost}${path}`);
    const first = await this.get(url(), headers, cap, what);
    if (first.status !== 401) return first;
    const challenge = first.headers['www-authenticate'];
    await this.authenticate(typeof challenge === 'string' ? challenge : '', first);
    const second = await this.get(url(), headers, cap, what);
    if (second.status === 401 || second.status === 403) {
      throw new OciFetchError('auth', `the registry refused the credentials for ${what}: ${statusText(second)}`);
    }
    return second;
  }

  private async authenticate(challenge: string, res: Response): Promise<void> {
    const parsed = parseChallenge(challenge);
    if (parsed?.scheme === 'basic') {
      if (!this.creds.basic) {
        const why = `the registry asks for credentials and there is no pull secret for ${this.image.registry}`;
        throw new OciFetchError('auth', why);
      }
      this.authorization = `Basic ${this.creds.basic}`;
      return;
    }
    if (parsed?.scheme !== 'bearer' || !parsed.params.realm) {
      throw new OciFetchError('auth', `the registry answered 401 with no usable challenge: ${statusText(res)}`);
    }
    const realm = this.checkRealm(parsed.params.realm);
    if (parsed.params.service) realm.searchParams.set('service', parsed.params.service);
    realm.searchParams.set('scope', parsed.params.scope ?? `repository:${this.image.repository}:pull`);
    const headers: Record<string, string> = {};
    if (this.creds.basic) headers.authorization = `Basic ${this.creds.basic}`;
    const tok = await this.get(realm, headers, 1 << 20, 'token', false);
    if (tok.status !== 200) throw new OciFetchError('auth', `the token service refused: ${statusText(tok)}`);
    let token: unknown;
    try {
      const body = JSON.parse(tok.body.toString('utf8')) as Record<string, unknown>;
      token = body.token ?? body.access_token;
    } catch {
      /* reported below */
    }
    if (typeof token !== 'string' || !token || /[\r\n]/.test(token)) {
      throw new OciFetchError('auth', 'the token service sent no token');
    }
    this.authorization = `Bearer ${token}`;
  }

  /**
   * A realm is an address the registry tells us to call with the pull secret's credentials, so it gets more than
   * the block list (Go's validateRealmURL): http(s) only, HTTPS unless insecure, and no loopback, private or
   * link-local host other than the registry's own host.
   */
  private checkRealm(realm: string): URL {
    let u: URL;
    try {
      u = new URL(realm);
    } catch {
      throw new OciFetchError('auth', 'rejected unsafe bearer realm: not a URL');
    }
    if (u.protocol !== 'https:' && !(u.protocol === 'http:' && this.opts.insecure)) {
      throw new OciFetchError('auth', `rejected unsafe bearer realm: scheme ${u.protocol} is not allowed`);
    }
    const host = u.hostname.replace(/^\[|\]$/g, '');
    const registryHost = new URL(`http://${this.apiHost}`).hostname.replace(/^\[|\]$/g, '');
    if (host !== registryHost && (host === 'localhost' || host === 'metadata.google.internal' || isInternalIp(host))) {
      throw new OciFetchError('blocked', `rejected unsafe bearer realm: ${host} is a local or metadata address`);
    }
    return u;
  }

  /** One GET with retries, following redirects; learns the scheme on the first call. */
  private async get(url: URL, headers: Headers, cap: number, what: string, auth = true): Promise<Response> {
    const attempts = Math.max(1, this.opts.maxRetries);
    let lastErr: unknown;
    for (let attempt = 1; attempt <= attempts; attempt++) {
      try {
        const res = await this.getFollowing(url, headers, cap, what, auth);
        if (!retryable(res.status) || attempt === attempts) return res;
        lastErr = new OciFetchError('download', `${what}: ${statusText(res)}`);
      } catch (err) {
        if (err instanceof OciFetchError) throw err;
        if (!(err instanceof TransientError)) throw new OciFetchError('download', `${what}: ${errorMessage(err)}`, err);
        lastErr = err.cause;
        if (attempt === attempts) break;
      }
      log.debug(`${what} request to ${url.host} failed (attempt ${attempt} of ${attempts}): ${errorMessage(lastErr)}`);
      await sleep(Math.min(2000, 100 * 2 ** (attempt - 1)), this.opts.signal);
    }
    const stage = what === 'manifest' || what === 'token' ? 'manifest' : 'download';
    const why = `could not fetch ${what} from ${url.host} after ${attempts} attempts: ${errorMessage(lastErr)}`;
    throw new OciFetchError(stage, why, lastErr);
  }

  private async getFollowing(url: URL, headers: Headers, cap: number, what: string, auth: boolean): Promise<Response> {
    let target = url;
    for (let hop = 0; ; hop++) {
      const h: Record<string, string> = { ...headers, 'user-agent': 'pilot-agent-ts wasm' };
      // Credentials go only to the registry itself, never to where it redirects (blob storage, CDNs).
      if (auth && this.authorization && target.host === url.host && !h.authorization) {
        h.authorization = this.authorization;
      }
      const res = await this.request(target, h, cap, what);
      const location = res.headers.location;
      if (![301, 302, 303, 307, 308].includes(res.status) || !location) return res;
      if (hop >= MAX_REDIRECTS) throw new OciFetchError('download', `${what}: more than ${MAX_REDIRECTS} redirects`);
      let next: URL;
      try {
        next = new URL(location, target);
      } catch {
        throw new OciFetchError('download', `${what}: redirect to an invalid location`);
      }
      if (next.protocol !== 'https:' && !(next.protocol === 'http:' && this.opts.insecure)) {
        throw new OciFetchError('download', `${what}: redirect to ${next.protocol} refused (HTTPS unless insecure)`);
      }
      target = next;
    }
  }

  /** The scheme: HTTPS, or for an insecure registry that answers TLS with plain HTTP, HTTP (Go does the same). */
  private async request(url: URL, headers: Record<string, string>, cap: number, what: string): Promise<Response> {
    const isRegistry = url.host === this.apiHost && url.protocol === `${this.scheme}:`;
    try {
      const res = await this.once(url, headers, cap, what);
      if (isRegistry) this.schemeKnown = true;
      return res;
    } catch (err) {
      if (!isRegistry || this.schemeKnown || !speaksPlainHttp(err)) throw err;
      if (!this.opts.insecure) {
        const why = `registry ${this.image.registry} answers plain HTTP, and it is not listed as insecure`;
        throw new OciFetchError('manifest', `${why} (WASM_INSECURE_REGISTRIES)`, err);
      }
      log.info(`registry ${this.image.registry} answers plain HTTP; using HTTP (it is listed as insecure)`);
      this.scheme = 'http';
      this.schemeKnown = true;
      const plain = new URL(url.href.replace(/^https:/, 'http:'));
      return this.once(plain, headers, cap, what);
    }
  }

  private once(url: URL, headers: Record<string, string>, cap: number, what: string): Promise<Response> {
    const opts = this.opts;
    return new Promise<Response>((resolve, reject) => {
      const host = url.hostname.replace(/^\[|\]$/g, '');
      if (net.isIP(host) && opts.isBlocked(host)) {
        reject(blockedError(url.hostname, host));
        return;
      }
      const mod = url.protocol === 'https:' ? https : http;
      const req = mod.request(url, {
        method: 'GET',
        headers,
        lookup: guardedLookup(opts.isBlocked),
        agent: false,
        signal: opts.signal,
        ...(url.protocol === 'https:' ? { rejectUnauthorized: !opts.insecure, ca: opts.ca } : {}),
      });
      // Go's http.Client timeout: the whole request, body included, so a registry that drips bytes cannot hold on.
      // Go's default when none is set (WASM_HTTP_REQUEST_TIMEOUT 0).
      const timeoutMs = opts.timeoutMs > 0 ? opts.timeoutMs : 15_000;
      const slow = () => fail(new TransientError(new Error(`no full answer within ${timeoutMs} ms`)));
      const deadline = setTimeout(slow, timeoutMs);
      deadline.unref();
      const fail = (err: unknown) => {
        clearTimeout(deadline);
        reject(err);
        req.destroy();
      };
      const done = (res: Response) => {
        clearTimeout(deadline);
        resolve(res);
      };
      req.on('error', (err) => fail(classify(err, what, opts.signal)));
      req.on('response', (res) => {
        const status = res.statusCode ?? 0;
        // Error bodies and redirects are read only a little, for the message.
        const limit = status === 200 ? cap : 4096;
        const declared = Number(res.headers['content-length']);
        if (status === 200 && Number.isFinite(declared) && declared > cap) {
          fail(new OciFetchError('too-large', `${what} is ${declared} bytes, more than the ${cap} allowed`));
          return;
        }
        const chunks: Buffer[] = [];
        let n = 0;
        res.on('data', (c: Buffer) => {
          n += c.length;
          if (n <= limit) chunks.push(c);
          else if (status !== 200) {
            done({ status, headers: res.headers, body: Buffer.concat(chunks) });
            req.destroy();
          } else fail(new OciFetchError('too-large', `${what} is more than the ${cap} bytes allowed`));
        });
        res.on('end', () => done({ status, headers: res.headers, body: Buffer.concat(chunks) }));
        res.on('error', (err) => fail(classify(err, what, opts.signal)));
        res.on('aborted', () => fail(new TransientError(new Error('the connection closed mid-body'))));
      });
      req.end();
    });
  }
}

/** Whether a socket or TLS error is worth another attempt; a refused address or a bad certificate is not. */
function classify(err: unknown, what: string, signal?: AbortSignal): unknown {
  if (err instanceof TransientError || err instanceof OciFetchError) return err;
  if (isBlockedLookup(err)) return (err as { ociError: OciFetchError }).ociError;
  if (signal?.aborted) return new OciFetchError('download', `${what}: aborted`, err);
  if (speaksPlainHttp(err)) return err;
  const code = String((err as NodeJS.ErrnoException).code ?? '');
  if (/CERT|SELF_SIGNED|UNABLE_TO_|ERR_TLS|ERR_SSL|HOSTNAME_MISMATCH/.test(code)) {
    return new OciFetchError(what === 'manifest' ? 'manifest' : 'download', `${what}: TLS: ${errorMessage(err)}`, err);
  }
  return new TransientError(err);
}

/** A failure worth another attempt (a network error, a timeout); anything else ends the fetch at once. */
class TransientError extends Error {
  constructor(override readonly cause: unknown) {
    super(errorMessage(cause));
  }
}

function descriptor(v: unknown, field: string): Descriptor {
  const o = (v ?? {}) as Record<string, unknown>;
  if (typeof o.mediaType !== 'string' || typeof o.digest !== 'string' || typeof o.size !== 'number') {
    throw new OciFetchError('manifest', `manifest ${field} lacks mediaType, digest or size`);
  }
  if (!DIGEST.test(o.digest)) throw new OciFetchError('manifest', `manifest ${field}.digest is not a sha256 digest`);
  if (!Number.isSafeInteger(o.size) || o.size < 0) {
    throw new OciFetchError('manifest', `manifest ${field}.size is not a size`);
  }
  return { mediaType: o.mediaType, digest: o.digest, size: o.size };
}

function indexEntry(v: unknown, field: string): Index['index'][number] {
  const d = descriptor(v, field);
  const p = (v as { platform?: { os?: unknown; architecture?: unknown } }).platform;
  if (p && typeof p.os === 'string' && typeof p.architecture === 'string') {
    return { ...d, platform: { os: p.os, architecture: p.architecture } };
  }
  return d;
}

/** The pull secret's credentials for this registry (docker config JSON `auths`, keys with or without scheme). */
export function credentialsFor(registry: string, secret: Buffer | undefined): Credentials {
  if (!secret || secret.length === 0) return {};
  let doc: unknown;
  try {
    doc = JSON.parse(secret.toString('utf8'));
  } catch {
    throw new OciFetchError('auth', 'the image pull secret is not JSON (want a docker config: {"auths":{...}})');
  }
  if (doc === null || typeof doc !== 'object') {
    throw new OciFetchError('auth', 'the image pull secret is not a docker config object');
  }
  const auths = ((doc as { auths?: unknown }).auths ?? doc) as Record<string, unknown>;
  if (typeof auths !== 'object' || auths === null) {
    throw new OciFetchError('auth', 'the image pull secret has no "auths" object');
  }
  const want = registry === 'docker.io' ? ['docker.io', 'index.docker.io', 'registry-1.docker.io'] : [registry];
  for (const [key, value] of Object.entries(auths)) {
    if (!want.includes(hostOfKey(key)) || value === null || typeof value !== 'object') continue;
    const e = value as Record<string, unknown>;
    if (typeof e.registrytoken === 'string' && e.registrytoken) return { registryToken: e.registrytoken };
    if (typeof e.auth === 'string' && e.auth) return { basic: e.auth.replace(/\s+/g, '') };
    if (typeof e.username === 'string' && typeof e.password === 'string') {
      return { basic: Buffer.from(`${e.username}:${e.password}`).toString('base64') };
    }
  }
  return {};
}

function hostOfKey(key: string): string {
  return key
    .replace(/^[a-z]+:\/\//i, '')
    .replace(/\/.*$/, '')
    .toLowerCase();
}

/** `Bearer realm="...",service="...",scope="..."` or `Basic realm="..."`. */
export function parseChallenge(header: string): { scheme: string; params: Record<string, string> } | undefined {
  const m = /^\s*([A-Za-z]+)\s*(.*)$/s.exec(header);
  if (!m) return undefined;
  const params: Record<string, string> = {};
  const re = /([A-Za-z_]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))\s*,?/g;
  // Several challenges arrive joined by commas: the first value of a parameter is the first challenge's.
  for (let p = re.exec(m[2]); p; p = re.exec(m[2])) {
    const key = p[1].toLowerCase();
    if (!(key in params)) params[key] = (p[2] ?? p[3] ?? '').replace(/\\(.)/g, '$1');
  }
  return { scheme: m[1].toLowerCase(), params };
}

function guardedLookup(isBlocked: (a: string) => boolean): net.LookupFunction {
  return (hostname, options, callback) => {
    dns.lookup(hostname, { family: options.family, hints: options.hints, all: true }, (err, addresses) => {
      if (err) return callback(err, '', 0);
      const bad = addresses.find((a) => isBlocked(a.address));
      if (bad) {
        const e = Object.assign(new Error('blocked'), { ociError: blockedError(hostname, bad.address) });
        return callback(e as NodeJS.ErrnoException, '', 0);
      }
      if (addresses.length === 0) {
        return callback(Object.assign(new Error(`${hostname} has no address`), { code: 'ENOTFOUND' }), '', 0);
      }
      type AllCallback = (e: null, a: dns.LookupAddress[]) => void;
      if ((options as { all?: boolean }).all) return (callback as unknown as AllCallback)(null, addresses);
      callback(null, addresses[0].address, addresses[0].family);
    });
  };
}

function isBlockedLookup(err: unknown): boolean {
  return typeof err === 'object' && err !== null && (err as { ociError?: unknown }).ociError instanceof OciFetchError;
}

function blockedError(host: string, address: string): OciFetchError {
  const why = `refusing to connect to ${host} (${address}): the address is in the Wasm fetch block list`;
  return new OciFetchError('blocked', why);
}

function isInternalIp(host: string): boolean {
  const v = net.isIP(host);
  if (v === 4) {
    const [a, b] = host.split('.').map(Number);
    const priv = a === 10 || (a === 172 && b >= 16 && b < 32) || (a === 192 && b === 168);
    return priv || a === 127 || a === 0 || (a === 169 && b === 254);
  }
  if (v === 6) {
    const h = host.toLowerCase();
    if (h.startsWith('::ffff:')) return isInternalIp(h.slice(7));
    return h === '::1' || h === '::' || /^f[cd]/.test(h) || /^fe[89ab]/.test(h);
  }
  return false;
}

/** TLS spoken to a plain-HTTP server fails in one of these ways. */
function speaksPlainHttp(err: unknown): boolean {
  const cause = err instanceof TransientError ? err.cause : err;
  const text = errorMessage(cause);
  if ((cause as NodeJS.ErrnoException)?.code === 'EPROTO') return true;
  return /wrong version number|packet length too long|http request/i.test(text);
}

function retryable(status: number): boolean {
  return status === 408 || status === 429 || (status >= 500 && ![501, 505, 511].includes(status));
}

function statusText(res: Response): string {
  const body = res.body
    .subarray(0, 200)
    .toString('utf8')
    .replace(/[^\x20-\x7e]+/g, ' ')
    .trim();
  return `HTTP ${res.status}${body ? ` (${body})` : ''}`;
}

function contentType(res: Response): string | undefined {
  const ct = res.headers['content-type'];
  return typeof ct === 'string' ? ct.split(';')[0].trim() : undefined;
}

function sha256(b: Buffer): string {
  return `sha256:${createHash('sha256').update(b).digest('hex')}`;
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(new OciFetchError('download', 'aborted'));
    const t = setTimeout(done, ms);
    t.unref();
    function done() {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }
    function onAbort() {
      clearTimeout(t);
      reject(new OciFetchError('download', 'aborted'));
    }
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
