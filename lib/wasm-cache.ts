// The Wasm module cache: fetches a module once (HTTP(S) here, OCI in lib/wasm-oci.ts), checks its sha256 and keeps
// it on disk for Envoy to load as a local file.
//
// The rules are Go's LocalFileCache (pkg/wasm/cache.go): a module is keyed by its name (the URL; for OCI without
// tag or digest) and checksum; a URL without a checksum uses the checksum of its last fetch, unless the pull policy
// asks for a fresh pull when the WasmPlugin's resourceVersion changes (Always, or an OCI `:latest` tag when the
// policy is unspecified); IfNotPresent never re-pulls what is cached. An OCI image's checksum is its manifest
// digest. Modules not used for WASM_MODULE_EXPIRY are removed every WASM_PURGE_INTERVAL.
//
// Where this does better than Go: concurrent requests for one module share one fetch (Go fetches once per
// caller); files are 0600 in 0700 directories owned by Envoy's user (Go: 0644/0755), named by hashes only
// (`<sha256 of the module name>/<sha256 of the module>.wasm`), written to a temporary name and renamed, so Envoy
// never reads half a module; the modules are removed when the agent ends, and those an agent killed left behind
// (the index is in memory, as in Go) at the next start.

import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { errorMessage } from './errors';
import { scope } from './log';
import { fetchHttpModule, isWasmBinary, safeUrl, WasmFetchError, type FetchFailure } from './wasm-fetch';
import type { PullPolicy } from './wasm-config';

const log = scope('wasm');

export interface WasmCacheOptions {
  /** Where modules are kept (created 0700). */
  dir: string;
  moduleExpiryMs: number;
  purgeIntervalMs: number;
  /** One HTTP request's timeout and the number of attempts (WASM_HTTP_REQUEST_TIMEOUT, _MAX_RETRIES). */
  httpTimeoutMs: number;
  httpMaxRetries: number;
  /** ISTIO_WASM_MAX_BINARY_SIZE_BYTES */
  maxBytes: number;
  /** WASM_INSECURE_REGISTRIES: hosts (host or host:port) fetched without TLS verification; `*` for all. */
  insecureRegistries: ReadonlySet<string>;
  isBlocked(address: string): boolean;
  /** Envoy's user, when it is not the agent's: the directories and files are given to it. */
  owner?: { uid?: number; gid?: number };
}

export interface GetOptions {
  checksum: string;
  resourceName: string;
  resourceVersion: string;
  /** The whole fetch's deadline (the filter's http_uri timeout; Go: 5 s when absent). */
  requestTimeoutMs: number;
  pullSecret?: Buffer;
  pullPolicy: PullPolicy;
}

/** Counts for Go's istio_agent_wasm_* families. */
export interface WasmCacheCounts {
  lookups: { true: number; false: number };
  fetches: Record<'success' | FetchFailure, number>;
}

interface Entry {
  modulePath: string;
  last: number;
  /** URLs whose last-pulled checksum points here (dropped with the entry). */
  urls: Set<string>;
}

interface ChecksumEntry {
  checksum: string;
  versionByResource: Map<string, string>;
}

const OCI_PREFIX = 'oci://';
const HEX64 = /^[0-9a-f]{64}$/;

export class WasmCache {
  readonly counts: WasmCacheCounts = {
    lookups: { true: 0, false: 0 },
    fetches: { success: 0, download_failure: 0, manifest_failure: 0, checksum_mismatched: 0, fetch_failure: 0 },
  };
  private readonly modules = new Map<string, Entry>();
  private readonly checksums = new Map<string, ChecksumEntry>();
  private readonly inFlight = new Map<string, Promise<string>>();
  private readonly purgeTimer: NodeJS.Timeout;
  private readonly dir: string;
  private closed = false;
  private tmpSeq = 0;

  constructor(private readonly o: WasmCacheOptions) {
    this.dir = path.resolve(o.dir);
    this.ownDir(this.dir);
    removeEarlierModules(this.dir);
    this.purgeTimer = setInterval(() => this.purge(), Math.max(1, o.purgeIntervalMs));
    this.purgeTimer.unref();
  }

  get entries(): number {
    return this.modules.size;
  }

  /** The local file of the module at `url`; rejects with a WasmFetchError (or an I/O error). */
  async get(url: string, opts: GetOptions): Promise<string> {
    let u: URL;
    try {
      u = new URL(url);
    } catch {
      throw new WasmFetchError('download_failure', `fail to parse Wasm module fetch url ${safeUrl(url)}`);
    }
    const key: Key = {
      url,
      name: moduleName(url),
      checksum: opts.checksum,
      resourceName: opts.resourceName,
      resourceVersion: opts.resourceVersion,
    };
    const hit = this.lookup(key, ignoreResourceVersion(opts.pullPolicy, u));
    if (hit.entry) return hit.entry.modulePath;
    key.checksum = hit.checksum;
    const flightKey = `${url}\n${key.checksum}`;
    let p = this.inFlight.get(flightKey);
    if (!p) {
      p = this.fetch(key, u, opts).finally(() => this.inFlight.delete(flightKey));
      this.inFlight.set(flightKey, p);
    }
    return p;
  }

  /** Stops the purge and removes the modules and the directory: Envoy is gone, and configPath is left clean. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.purgeTimer);
    try {
      removeEarlierModules(this.dir);
      fs.rmdirSync(this.dir);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== 'ENOTEMPTY' && code !== 'ENOENT') {
        log.warn(`could not remove the Wasm cache ${this.dir}: ${errorMessage(err)}`);
      }
    }
  }

  private async fetch(key: Key, u: URL, opts: GetOptions): Promise<string> {
    const insecure = this.o.insecureRegistries.has('*') || this.o.insecureRegistries.has(u.host);
    const signal = AbortSignal.timeout(opts.requestTimeoutMs);
    let bytes: Buffer;
    let actual: string;
    if (u.protocol === 'http:' || u.protocol === 'https:') {
      try {
        bytes = await fetchHttpModule(key.url, {
          timeoutMs: this.o.httpTimeoutMs,
          maxRetries: this.o.httpMaxRetries,
          maxBytes: this.o.maxBytes,
          insecure,
          isBlocked: this.o.isBlocked,
          signal,
        });
      } catch (e) {
        this.counts.fetches.download_failure++;
        throw e;
      }
      actual = await sha256Chunked(bytes);
    } else if (u.protocol === 'oci:') {
      let m;
      // The expected digest lets the fetcher refuse a wrong sha256 after the manifest, before any layer.
      const ociOpts = {
        pullSecret: opts.pullSecret,
        insecure,
        timeoutMs: this.o.httpTimeoutMs,
        maxRetries: this.o.httpMaxRetries,
        maxBytes: this.o.maxBytes,
        isBlocked: this.o.isBlocked,
        signal,
        expectedManifestDigest: key.checksum ? `sha256:${key.checksum}` : undefined,
      };
      try {
        // Loaded on the first OCI pull (it brings TLS), not at the agent's start.
        const { fetchOciModule } = await import('./wasm-oci');
        m = await fetchOciModule(key.url.slice(OCI_PREFIX.length), ociOpts);
      } catch (e) {
        const result = ociResult((e as { reason?: unknown }).reason);
        this.counts.fetches[result]++;
        throw new WasmFetchError(result, `could not fetch Wasm OCI image: ${errorMessage(e)}`, false, e);
      }
      bytes = m.module;
      actual = m.manifestDigest.replace(/^sha256:/, '');
      if (!HEX64.test(actual)) {
        this.counts.fetches.manifest_failure++;
        throw new WasmFetchError(
          'manifest_failure',
          `OCI image ${safeUrl(key.url)} has manifest digest ` +
            `${JSON.stringify(m.manifestDigest.slice(0, 80))}, not a sha256`,
        );
      }
    } else {
      throw new WasmFetchError(
        'download_failure',
        `unsupported Wasm module downloading URL scheme: ${u.protocol.replace(/:$/, '')}`,
      );
    }
    if (key.checksum === '') {
      key.checksum = actual;
      const again = this.lookup(key, true);
      if (again.entry) return again.entry.modulePath;
    } else if (actual !== key.checksum) {
      this.counts.fetches.checksum_mismatched++;
      throw new WasmFetchError(
        'checksum_mismatched',
        `module downloaded from ${safeUrl(key.url)} has checksum ${actual}, which does not match: ${key.checksum}`,
      );
    }
    if (bytes.length > this.o.maxBytes) {
      this.counts.fetches.download_failure++;
      throw new WasmFetchError(
        'download_failure',
        `module from ${safeUrl(key.url)} is ${bytes.length} bytes, ` +
          `more than ISTIO_WASM_MAX_BINARY_SIZE_BYTES (${this.o.maxBytes})`,
      );
    }
    if (!isWasmBinary(bytes)) {
      this.counts.fetches.fetch_failure++;
      throw new WasmFetchError('fetch_failure', `fetched Wasm binary from ${safeUrl(key.url)} is invalid`);
    }
    this.counts.fetches.success++;
    key.checksum = actual;
    return await this.add(key, bytes);
  }

  /** Go's getEntry: finds a cached module; also works out the checksum a URL without one stands for. */
  private lookup(key: Key, ignoreVersion: boolean): { entry?: Entry; checksum: string } {
    let checksum = key.checksum;
    if (!checksum && key.url.startsWith(OCI_PREFIX)) {
      const m = /@sha256:([0-9a-f]{64})$/.exec(key.url);
      if (m) checksum = m[1]!;
    }
    if (!checksum) {
      const ce = this.checksums.get(key.url);
      if (ce) {
        if (ignoreVersion || key.resourceVersion === ce.versionByResource.get(key.resourceName)) checksum = ce.checksum;
        ce.versionByResource.set(key.resourceName, key.resourceVersion);
      }
    }
    const entry = this.modules.get(moduleKey(key.name, checksum));
    this.counts.lookups[entry ? 'true' : 'false']++;
    if (!entry) return { checksum };
    entry.last = Date.now();
    this.noteChecksum({ ...key, checksum });
    return { entry, checksum };
  }

  /** Go's updateChecksum: a tagged OCI URL or an http(s) URL remembers the checksum it was last pulled with. */
  private noteChecksum(key: Key): boolean {
    const tracked = !key.url.startsWith(OCI_PREFIX) || !key.url.includes('@');
    if (!tracked) return false;
    let ce = this.checksums.get(key.url);
    if (!ce) this.checksums.set(key.url, (ce = { checksum: key.checksum, versionByResource: new Map() }));
    ce.checksum = key.checksum;
    ce.versionByResource.set(key.resourceName, key.resourceVersion);
    return true;
  }

  private async add(key: Key, bytes: Buffer): Promise<string> {
    const tracked = this.noteChecksum(key);
    const mk = moduleKey(key.name, key.checksum);
    const have = this.modules.get(mk);
    if (have) {
      have.last = Date.now();
      if (tracked) have.urls.add(key.url);
      return have.modulePath;
    }
    const dir = path.join(this.dir, sha256Hex(Buffer.from(key.name, 'utf8')));
    this.ownDir(dir);
    // key.checksum is the sha256 computed here (or an OCI digest checked to be 64 hex digits): safe as a file name.
    const file = path.join(dir, `${key.checksum}.wasm`);
    const tmp = `${file}.${process.pid}.${++this.tmpSeq}.tmp`;
    // Off the event loop: a module may be hundreds of MB, and Envoy's other xDS types flow meanwhile.
    await fs.promises.writeFile(tmp, bytes, { mode: 0o600 });
    this.giveToEnvoy(tmp);
    await fs.promises.rename(tmp, file);
    const raced = this.modules.get(mk);
    if (raced) {
      raced.last = Date.now();
      if (tracked) raced.urls.add(key.url);
      return raced.modulePath;
    }
    const entry: Entry = { modulePath: file, last: Date.now(), urls: new Set(tracked ? [key.url] : []) };
    this.modules.set(mk, entry);
    log.info(`cached Wasm module from ${safeUrl(key.url)} (${bytes.length} bytes, sha256 ${key.checksum})`);
    return file;
  }

  private ownDir(dir: string): void {
    fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
    fs.chmodSync(dir, 0o700);
    this.giveToEnvoy(dir);
  }

  private giveToEnvoy(p: string): void {
    const owner = this.o.owner;
    if (owner && (owner.uid !== undefined || owner.gid !== undefined))
      fs.chownSync(p, owner.uid ?? -1, owner.gid ?? -1);
  }

  /** Go's purge: modules untouched for the expiry are removed, with the checksums their URLs remembered. */
  purge(now = Date.now()): void {
    if (this.closed) return;
    for (const [k, e] of this.modules) {
      if (now - e.last <= this.o.moduleExpiryMs) continue;
      try {
        fs.rmSync(e.modulePath, { force: true });
        try {
          fs.rmdirSync(path.dirname(e.modulePath));
        } catch {
          // another version of the module is still there
        }
      } catch (err) {
        log.error(`failed to purge Wasm module ${e.modulePath}: ${errorMessage(err)}`);
        continue;
      }
      for (const url of e.urls) this.checksums.delete(url);
      this.modules.delete(k);
      log.debug(`removed stale Wasm module ${e.modulePath}`);
    }
  }
}

/** Removes the modules in dir (an earlier run's are not in this run's index and would never be purged); only
 * names this cache makes. */
function removeEarlierModules(dir: string): void {
  for (const d of fs.readdirSync(dir, { withFileTypes: true })) {
    if (!d.isDirectory() || !HEX64.test(d.name)) continue;
    const sub = path.join(dir, d.name);
    for (const f of fs.readdirSync(sub))
      if (/^[0-9a-f]{64}\.wasm(\.\d+\.\d+\.tmp)?$/.test(f)) fs.rmSync(path.join(sub, f), { force: true });
    try {
      fs.rmdirSync(sub);
    } catch {
      // not ours alone
    }
  }
}

interface Key {
  url: string;
  name: string;
  checksum: string;
  resourceName: string;
  resourceVersion: string;
}

const moduleKey = (name: string, checksum: string) => `${name}\n${checksum}`;

/** The sha256 of a module, 4 MiB at a time with the event loop let through between (256 MiB take about a second). */
async function sha256Chunked(b: Buffer): Promise<string> {
  const chunk = 4 << 20;
  const h = createHash('sha256');
  for (let i = 0; i < b.length; i += chunk) {
    h.update(b.subarray(i, i + chunk));
    if (i + chunk < b.length) await new Promise((r) => setImmediate(r));
  }
  return h.digest('hex');
}

function sha256Hex(b: Buffer): string {
  return createHash('sha256').update(b).digest('hex');
}

/**
 * Go's result label for an OCI failure (lib/wasm-oci.ts's reasons): the manifest stage (reference, auth, blocked,
 * manifest) is manifest_failure, a wrong digest checksum_mismatched, the layer stage download_failure.
 */
function ociResult(reason: unknown): FetchFailure {
  if (reason === 'checksum') return 'checksum_mismatched';
  if (reason === 'download' || reason === 'too-large' || reason === 'format') return 'download_failure';
  return 'manifest_failure';
}

/** Go's moduleNameFromURL: an OCI reference without its tag or digest; any other URL as it is. */
export function moduleName(url: string): string {
  if (!url.startsWith(OCI_PREFIX)) return url;
  let ref = url.slice(OCI_PREFIX.length);
  const at = ref.indexOf('@');
  if (at >= 0) ref = ref.slice(0, at);
  const slash = ref.lastIndexOf('/');
  const colon = ref.lastIndexOf(':');
  if (colon > slash) ref = ref.slice(0, colon);
  return OCI_PREFIX + ref;
}

/** Go's shouldIgnoreResourceVersion. */
function ignoreResourceVersion(policy: PullPolicy, u: URL): boolean {
  if (policy === 'Always') return false;
  if (policy === 'IfNotPresent') return true;
  return u.protocol !== 'oci:' || !u.pathname.endsWith(':latest');
}
