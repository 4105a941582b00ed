// One probe of an app: HTTP GET, TCP connect or gRPC health Check, each bounded by a deadline and a size cap.
// Shared by the app probes on the status port (kubelet's probes, rewritten by Istio's injector) and the VM health
// checker. A probe never throws: every failure becomes a result with a reason, so a hanging, resetting or
// garbage-answering target costs its timeout and nothing else.

import type * as http2 from 'node:http2';
import * as net from 'node:net';
import * as os from 'node:os';
import { errorMessage } from './errors';
import { ProbeClient } from './probe-client';

export interface ProbeResult {
  /** HTTP status to answer with: the app's code (3xx -> 200), 200 for TCP/gRPC success, 500 for any failure. */
  status: number;
  body: string;
  /** Why a probe failed (for logs and the health event); absent on success. */
  reason?: string;
  /** Something worth a warning on a success (a redirect that was not followed). */
  warning?: string;
}

export interface HttpProbeOptions {
  scheme: 'http' | 'https';
  host: string;
  port: number;
  path: string;
  /** Request headers in order; a `Host` header sets the request's Host. */
  headers: Array<[string, string]>;
  timeoutMs: number;
  /** Source address of the connection (Istio's 127.0.0.6, so captured ports let the probe through). */
  localAddress?: string;
  /**
   * Ports a redirect is never followed to (the agent's and Envoy's own): the probe's answer goes back to whoever
   * called the status port, so following one would hand a remote caller the agent's loopback-only pages.
   */
  refusedPorts?: ReadonlySet<number>;
  /**
   * The connections to use (the app probes' per-path client: keep-alive, HTTP/2). Without one, a single-use
   * HTTP/1.1 client, as the Go agent's VM health checks (DisableKeepAlives, no h2).
   */
  client?: ProbeClient;
  signal?: AbortSignal;
}

const MAX_BODY = 10 * 1024;
const MAX_REDIRECTS = 10;
const FOLLOWED = new Set([301, 302, 303, 307, 308]);

const fail = (reason: string): ProbeResult => ({ status: 500, body: reason + '\n', reason });

/**
 * Where to connect and from which address: 127.0.0.6 (or ::6) for a target on this host, so the probe is not
 * captured; no source address for a remote target. `localhost` becomes 127.0.0.1, as Go's dialer picks the
 * loopback address of the source's family.
 */
export function probeTarget(host: string): { host: string; localAddress?: string } {
  const h = host === 'localhost' ? '127.0.0.1' : host;
  return { host: h, localAddress: probeSourceAddress(h) };
}

/** 127.0.0.6 (or ::6) for a target on this host, so the probe is not captured; undefined for a remote target. */
export function probeSourceAddress(target: string): string | undefined {
  const v6 = net.isIPv6(target);
  const src = v6 ? '::6' : '127.0.0.6';
  if (!v6 && (target === 'localhost' || target.startsWith('127.'))) return src;
  const local = Object.values(os.networkInterfaces())
    .flat()
    .map((i) => i?.address);
  if (!local.includes(target)) return undefined;
  // ::6 is usable only where the pod's network set it up (an IPv6 pod under Istio's capture).
  return v6 && !local.includes('::6') ? undefined : src;
}

function deadline(timeoutMs: number, outer?: AbortSignal): { signal: AbortSignal; done(): void } {
  const ac = new AbortController();
  const t = setTimeout(() => ac.abort(new Error(`timed out after ${timeoutMs} ms`)), timeoutMs);
  t.unref();
  const onOuter = () => ac.abort(new Error('probe cancelled'));
  outer?.addEventListener('abort', onOuter, { once: true });
  return { signal: ac.signal, done: () => (clearTimeout(t), outer?.removeEventListener('abort', onOuter)) };
}

const portOf = (u: URL): number => Number(u.port || (u.protocol === 'https:' ? 443 : 80));

/**
 * GET with kubelet's redirect rules: same-host redirects followed (at most 10), an off-host one is a success. A
 * redirect to a refused port is not followed either, and counts as kubelet counts a redirect it does not follow.
 */
export async function httpProbe(o: HttpProbeOptions): Promise<ProbeResult> {
  const d = deadline(o.timeoutMs, o.signal);
  const host = net.isIPv6(o.host) ? `[${o.host}]` : o.host;
  let url = new URL(`${o.scheme}://${host}:${o.port}${o.path.startsWith('/') ? o.path : '/' + o.path}`);
  const first = url.hostname;
  const client = o.client ?? new ProbeClient({ keepAlive: false, http2: false });
  try {
    for (let redirects = 0; ; redirects++) {
      const r = await client.get({
        url,
        headers: o.headers,
        localAddress: o.localAddress,
        signal: d.signal,
        maxBody: MAX_BODY,
      });
      if (FOLLOWED.has(r.status) && r.location) {
        const next = new URL(r.location, url);
        if (next.hostname !== first) return { status: 200, body: '' };
        if (o.refusedPorts?.has(portOf(next))) {
          const warning = `redirect to port ${portOf(next)} (the agent's or Envoy's own) not followed`;
          return { status: 200, body: '', warning };
        }
        if (redirects + 1 > MAX_REDIRECTS)
          return fail(`stopped after ${MAX_REDIRECTS} redirects (last to ${next.pathname})`);
        url = next;
        continue;
      }
      // A redirect answered by the probe itself has no Location to give kubelet: it becomes a plain success.
      if (r.status >= 300 && r.status < 400) return { status: 200, body: '' };
      return r.status >= 200 && r.status < 400
        ? { status: r.status, body: r.body }
        : { status: r.status, body: r.body, reason: `app answered ${r.status}` };
    }
  } catch (err) {
    const e = d.signal.aborted ? d.signal.reason : err;
    return fail(`GET ${url.href} failed: ${errorMessage(e)}`);
  } finally {
    d.done();
    if (!o.client) client.close();
  }
}

export function tcpProbe(o: {
  host: string;
  port: number;
  timeoutMs: number;
  localAddress?: string;
  signal?: AbortSignal;
}): Promise<ProbeResult> {
  const d = deadline(o.timeoutMs, o.signal);
  return new Promise<ProbeResult>((resolve) => {
    const sock = net.connect({ host: o.host, port: o.port, localAddress: o.localAddress });
    const end = (r: ProbeResult) => {
      sock.destroy();
      d.done();
      resolve(r);
    };
    sock.once('connect', () => end({ status: 200, body: '' }));
    sock.once('error', (e) => end(fail(`connect to ${o.host}:${o.port} failed: ${e.message}`)));
    d.signal.addEventListener(
      'abort',
      () => end(fail(`connect to ${o.host}:${o.port} failed: ${errorMessage(d.signal.reason)}`)),
      { once: true },
    );
  });
}

const SERVING_STATUS = ['UNKNOWN', 'SERVING', 'NOT_SERVING', 'SERVICE_UNKNOWN'];

function encodeCheckRequest(service: string): Buffer {
  const s = Buffer.from(service, 'utf8');
  const msg = s.length ? Buffer.concat([Buffer.from([0x0a]), varint(s.length), s]) : Buffer.alloc(0);
  const frame = Buffer.alloc(5);
  frame.writeUInt32BE(msg.length, 1);
  return Buffer.concat([frame, msg]);
}

function varint(n: number): Buffer {
  const out: number[] = [];
  while (n > 0x7f) {
    out.push((n & 0x7f) | 0x80);
    n >>>= 7;
  }
  out.push(n);
  return Buffer.from(out);
}

/** HealthCheckResponse.status (field 1, enum); 0 when absent. */
function decodeServingStatus(msg: Buffer): number {
  let i = 0;
  while (i < msg.length) {
    const tag = msg[i++]!;
    if (tag === 0x08) {
      let v = 0;
      let shift = 0;
      while (i < msg.length) {
        const b = msg[i++]!;
        v |= (b & 0x7f) << shift;
        shift += 7;
        if (!(b & 0x80)) break;
      }
      return v;
    }
    return 0;
  }
  return 0;
}

/**
 * grpc.health.v1.Health/Check over plaintext HTTP/2: SERVING -> 200, any other status or error -> 500.
 * Written on node:http2 rather than grpc-js because the probe must come from a chosen source address,
 * which grpc-js cannot bind.
 */
export function grpcProbe(o: {
  host: string;
  port: number;
  service: string;
  timeoutMs: number;
  localAddress?: string;
  userAgent?: string;
  signal?: AbortSignal;
}): Promise<ProbeResult> {
  const d = deadline(o.timeoutMs, o.signal);
  const where = `grpc.health.v1.Health/Check on port ${o.port}`;
  return new Promise<ProbeResult>((resolve) => {
    const authority = `http://${net.isIPv6(o.host) ? `[${o.host}]` : o.host}:${o.port}`;
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const client = (require('node:http2') as typeof http2).connect(authority, {
      createConnection: () => net.connect({ host: o.host, port: o.port, localAddress: o.localAddress }),
    });
    let settled = false;
    const end = (r: ProbeResult) => {
      if (settled) return;
      settled = true;
      client.destroy();
      d.done();
      resolve(r);
    };
    d.signal.addEventListener('abort', () => end(fail(`${where}: ${errorMessage(d.signal.reason)}`)), { once: true });
    client.on('error', (e) => end(fail(`${where}: ${e.message}`)));
    const stream = client.request({
      ':method': 'POST',
      ':path': '/grpc.health.v1.Health/Check',
      'content-type': 'application/grpc',
      te: 'trailers',
      'grpc-timeout': `${Math.max(1, o.timeoutMs)}m`,
      'user-agent': o.userAgent ?? 'istio-probe/1.0',
    });
    const chunks: Buffer[] = [];
    let size = 0;
    let grpcStatus: string | undefined;
    let grpcMessage = '';
    const noteStatus = (h: http2.IncomingHttpHeaders) => {
      if (h['grpc-status'] !== undefined) {
        grpcStatus = String(h['grpc-status']);
        grpcMessage = percentDecoded(String(h['grpc-message'] ?? ''));
      }
    };
    stream.on('response', (h) => {
      if (h[':status'] !== 200) end(fail(`${where}: HTTP status ${h[':status']}`));
      noteStatus(h);
    });
    stream.on('trailers', noteStatus);
    stream.on('data', (c: Buffer) => {
      size += c.length;
      if (size > MAX_BODY) return end(fail(`${where}: response larger than ${MAX_BODY} bytes`));
      chunks.push(c);
    });
    stream.on('error', (e) => end(fail(`${where}: ${e.message}`)));
    stream.on('close', () => {
      if (grpcStatus === undefined) return end(fail(`${where}: stream ended without a gRPC status`));
      if (grpcStatus !== '0') {
        const why =
          grpcStatus === '12' ? 'the app does not implement the gRPC health protocol' : `gRPC status ${grpcStatus}`;
        return end(fail(`${where}: ${why}${grpcMessage ? `: ${grpcMessage}` : ''}`));
      }
      const buf = Buffer.concat(chunks);
      if (buf.length < 5) return end(fail(`${where}: empty response`));
      const st = decodeServingStatus(buf.subarray(5, 5 + buf.readUInt32BE(1)));
      if (st === 1) return end({ status: 200, body: '' });
      end(fail(`${where}: service ${JSON.stringify(o.service)} is ${SERVING_STATUS[st] ?? `status ${st}`}`));
    });
    stream.end(encodeCheckRequest(o.service));
  });
}

/** grpc-message is percent-encoded; the app's malformed escape is kept as sent (it must not throw in a listener). */
function percentDecoded(text: string): string {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}
