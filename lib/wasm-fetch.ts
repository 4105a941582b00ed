// Fetching a Wasm module over HTTP(S) for the Wasm cache, and the SSRF block list every Wasm fetch goes through.
//
// The URL comes from the control plane (a WasmPlugin's `url`), so whoever can write a WasmPlugin can make every
// agent fetch it: each address a host name resolves to, an IP literal, and each redirect's target is checked
// against BLOCKED_CIDRS_IN_WASM_FETCH (cloud metadata addresses by default) before a connection is made. As Go's
// HTTPFetcher: GET with a per-request timeout, up to WASM_HTTP_REQUEST_MAX_RETRIES attempts with exponential backoff
// from 500 ms on connection errors and 5xx (not 501, 505, 511), a gzip or tar wrapper around the module removed.
// Unlike Go, which cuts the body at ISTIO_WASM_MAX_BINARY_SIZE_BYTES and goes on with what it read, a larger body
// is refused.

import type * as dns from 'node:dns';
import * as http from 'node:http';
import * as net from 'node:net';
import { promisify } from 'node:util';
import type * as zlib from 'node:zlib';
import { AgentError, errorMessage } from './errors';

export interface HttpFetchOptions {
  /** One request's timeout (WASM_HTTP_REQUEST_TIMEOUT). */
  timeoutMs: number;
  /** Attempts in all (WASM_HTTP_REQUEST_MAX_RETRIES, as Go counts them). */
  maxRetries: number;
  maxBytes: number;
  /** Skip TLS verification (the host is in WASM_INSECURE_REGISTRIES). */
  insecure: boolean;
  isBlocked(address: string): boolean;
  /** The whole fetch's deadline (the filter's http_uri timeout). */
  signal?: AbortSignal;
  /** First retry's delay (default 500 ms, as Go). */
  initialBackoffMs?: number;
}

// node:dns and node:zlib are required on the first fetch, not when the agent loads this module (before its xDS
// proxy serves, to register the ECDS rewriter): ~2 ms of module set-up a mesh without remote Wasm never needs.
// require, not import(): a single executable has no dynamic-import callback for built-ins.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const lazyDns = () => require('node:dns') as typeof dns;
let gunzipAsync: ((b: Buffer, o: zlib.ZlibOptions) => Promise<Buffer>) | undefined;
const gunzip = (b: Buffer, o: zlib.ZlibOptions): Promise<Buffer> =>
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  (gunzipAsync ??= promisify((require('node:zlib') as typeof zlib).gunzip))(b, o);
const MAX_REDIRECTS = 10; // Go's http.Client
const WASM_MAGIC = Buffer.from([0x00, 0x61, 0x73, 0x6d]);

/** Why a fetch failed, for Go's istio_agent_wasm_remote_fetch_count result label and for the log. */
export type FetchFailure = 'download_failure' | 'manifest_failure' | 'checksum_mismatched' | 'fetch_failure';

export class WasmFetchError extends AgentError {
  constructor(
    readonly result: FetchFailure,
    message: string,
    readonly retryable = false,
    cause?: unknown,
  ) {
    super('UPSTREAM', message, cause);
  }
}

/**
 * Parses a comma-separated CIDR list ("none" for an empty one); throws naming the bad entry. IPv4-mapped IPv6
 * addresses are checked as IPv4.
 *
 * The family is told by the separator and the address checked by BlockList itself (inet_pton), not by net.isIP:
 * this runs at every sidecar's start, and the first two runs of Node's IPv6 regular expression (the default list
 * has one IPv6 prefix) cost ~5 ms of the main thread while Envoy starts (interpreted, then compiled).
 */
export function blockList(text: string): (address: string) => boolean {
  const list = new net.BlockList();
  if (text.trim() !== 'none') {
    for (const part of text
      .split(',')
      .map((p) => p.trim())
      .filter(Boolean)) {
      const m = /^([^/]+)\/(\d+)$/.exec(part);
      const family = m?.[1]!.includes(':') ? 'ipv6' : 'ipv4';
      const bits = m ? Number(m[2]) : -1;
      const bad = () => new Error(`${JSON.stringify(part)} is not a CIDR (a.b.c.d/n or an IPv6 prefix)`);
      if (!m || bits > (family === 'ipv4' ? 32 : 128)) throw bad();
      try {
        list.addSubnet(m[1]!, bits, family);
      } catch {
        throw bad();
      }
    }
  }
  return (address) => {
    const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
    const a = mapped ? mapped[1]! : address;
    // Anything that is not an address of that family (a host name) is not in the list.
    return list.check(a, a.includes(':') ? 'ipv6' : 'ipv4');
  };
}

/** Fetches the module at an http(s) URL; rejects with a WasmFetchError. */
export async function fetchHttpModule(url: string, o: HttpFetchOptions): Promise<Buffer> {
  let backoff = o.initialBackoffMs ?? 500;
  let last: WasmFetchError | undefined;
  const attempts = Math.max(1, o.maxRetries);
  for (let i = 1; i <= attempts; i++) {
    try {
      return await unbox(await getFollowingRedirects(url, o), o.maxBytes);
    } catch (e) {
      last = e instanceof WasmFetchError ? e : new WasmFetchError('download_failure', errorMessage(e), true, e);
      if (!last.retryable || o.signal?.aborted || i === attempts) break;
      const delay = backoff * (0.5 + Math.random());
      backoff = Math.min(backoff * 1.5, 30_000);
      await sleep(delay, o.signal);
    }
  }
  if (o.signal?.aborted) {
    throw new WasmFetchError(
      'download_failure',
      `wasm module download from ${safeUrl(url)} timed out (last error: ${last?.message ?? 'none'})`,
    );
  }
  throw new WasmFetchError(last!.result, `wasm module download from ${safeUrl(url)} failed: ${last!.message}`);
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(done, ms);
    t.unref();
    signal?.addEventListener('abort', done, { once: true });
    function done() {
      clearTimeout(t);
      signal?.removeEventListener('abort', done);
      resolve();
    }
  });
}

/** The URL without user info or query, for messages (a token in a query string is not logged). */
export function safeUrl(url: string): string {
  try {
    const u = new URL(url);
    return `${u.protocol}//${u.host}${u.pathname}`;
  } catch {
    return JSON.stringify(url.slice(0, 100));
  }
}

async function getFollowingRedirects(start: string, o: HttpFetchOptions): Promise<Buffer> {
  let url = start;
  for (let hop = 0; hop <= MAX_REDIRECTS; hop++) {
    const r = await getOnce(url, o);
    if (r.kind === 'body') return r.body;
    url = r.location;
  }
  throw new WasmFetchError('download_failure', `more than ${MAX_REDIRECTS} redirects`);
}

type Once = { kind: 'body'; body: Buffer } | { kind: 'redirect'; location: string };

function getOnce(url: string, o: HttpFetchOptions): Promise<Once> {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return Promise.reject(new WasmFetchError('download_failure', `${safeUrl(url)} is not a URL`));
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') {
    return Promise.reject(
      new WasmFetchError('download_failure', `unsupported URL scheme ${u.protocol} (${safeUrl(url)})`),
    );
  }
  const host = u.hostname.replace(/^\[|\]$/g, '');
  // An IP literal never goes through lookup(): check it here.
  if (net.isIP(host) && o.isBlocked(host)) {
    return Promise.reject(new WasmFetchError('download_failure', `${host} is in BLOCKED_CIDRS_IN_WASM_FETCH`));
  }
  const lookup: net.LookupFunction = (hostname, options, cb) => {
    lazyDns().lookup(hostname, { ...options, all: true }, (err, addresses) => {
      if (err) return cb(err, '', 0);
      const list = addresses as dns.LookupAddress[];
      const blocked = list.find((a) => o.isBlocked(a.address));
      if (blocked) {
        const e = new WasmFetchError(
          'download_failure',
          `${hostname} resolves to ${blocked.address}, which is in BLOCKED_CIDRS_IN_WASM_FETCH`,
        );
        return cb(e as unknown as NodeJS.ErrnoException, '', 0);
      }
      if ((options as { all?: boolean }).all)
        return (cb as unknown as (e: null, a: dns.LookupAddress[]) => void)(null, list);
      cb(null, list[0]!.address, list[0]!.family);
    });
  };
  // TLS is loaded on the first https fetch, not at the agent's start; require, not import(): a single executable
  // has no dynamic-import callback for built-ins.
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const mod = u.protocol === 'https:' ? (require('node:https') as typeof import('node:https')) : http;
  return new Promise<Once>((resolve, reject) => {
    const req = mod.request(
      u,
      {
        method: 'GET',
        lookup,
        agent: false,
        rejectUnauthorized: !o.insecure,
        signal: o.signal,
        headers: { 'user-agent': 'pilot-agent-ts wasm fetch', accept: '*/*' },
      },
      (res) => {
        const status = res.statusCode ?? 0;
        if ([301, 302, 303, 307, 308].includes(status) && res.headers.location) {
          res.resume();
          try {
            resolve({ kind: 'redirect', location: new URL(res.headers.location, u).toString() });
          } catch {
            reject(new WasmFetchError('download_failure', `redirect to a bad location from ${safeUrl(u.toString())}`));
          }
          return;
        }
        if (status !== 200) {
          res.resume();
          const retry = status >= 500 && status !== 501 && status !== 505 && status !== 511;
          reject(new WasmFetchError('download_failure', `status code ${status}`, retry));
          return;
        }
        const declared = Number(res.headers['content-length']);
        if (Number.isFinite(declared) && declared > o.maxBytes) {
          res.destroy();
          reject(
            new WasmFetchError(
              'download_failure',
              `module is ${declared} bytes, more than ISTIO_WASM_MAX_BINARY_SIZE_BYTES (${o.maxBytes})`,
            ),
          );
          return;
        }
        const chunks: Buffer[] = [];
        let n = 0;
        res.on('data', (c: Buffer) => {
          n += c.length;
          if (n > o.maxBytes) {
            res.destroy();
            reject(
              new WasmFetchError(
                'download_failure',
                `module is more than ISTIO_WASM_MAX_BINARY_SIZE_BYTES (${o.maxBytes}) bytes`,
              ),
            );
            return;
          }
          chunks.push(c);
        });
        res.on('end', () => resolve({ kind: 'body', body: Buffer.concat(chunks) }));
        res.on('error', (e) =>
          reject(new WasmFetchError('download_failure', `reading the body: ${errorMessage(e)}`, true, e)),
        );
      },
    );
    req.setTimeout(o.timeoutMs, () =>
      req.destroy(new WasmFetchError('download_failure', `no answer within ${o.timeoutMs} ms`, true)),
    );
    req.on('error', (e) =>
      reject(e instanceof WasmFetchError ? e : new WasmFetchError('download_failure', errorMessage(e), true, e)),
    );
    req.end();
  });
}

export function isWasmBinary(b: Buffer): boolean {
  return b.length >= 8 && b.subarray(0, 4).equals(WASM_MAGIC);
}

/** Go's unboxIfPossible: a gzip or tar (first file) around the module is removed; anything else is returned as is. */
export async function unbox(origin: Buffer, maxBytes: number): Promise<Buffer> {
  let b = origin;
  for (let depth = 0; depth < 8; depth++) {
    if (isWasmBinary(b)) return b;
    let next: Buffer | undefined;
    if (b.length > 2 && b[0] === 0x1f && b[1] === 0x8b) {
      try {
        next = await gunzip(b, { maxOutputLength: maxBytes });
      } catch {
        next = undefined;
      }
    } else if (b.length > 262 && b.toString('latin1', 257, 262) === 'ustar') {
      const size = parseInt(b.toString('latin1', 124, 136).replace(/\0.*$/s, '').trim() || '0', 8);
      next = Number.isFinite(size) && 512 + size <= b.length ? b.subarray(512, 512 + size) : undefined;
    }
    if (!next) return origin;
    b = next;
  }
  return origin;
}
