// gRPC over HTTP/2 as this agent speaks it on node:http2, without grpc-js (whose load, channels and interceptors
// were a quarter of the agent's CPU while Envoy starts): the length-prefixed messages, the status in trailers, the
// metadata as headers, and the client connection (TCP, Unix socket or TLS with ALPN h2). The server is
// lib/grpc-server.ts, the unary client lib/grpc-unary.ts (the CA) and the streaming client lib/xds-upstream.ts.
// Messages are never compressed: no grpc-accept-encoding is sent, and a compressed message is refused.
// What a peer sends ends as a GrpcError with a gRPC status, never as an exception elsewhere.

import type * as http2 from 'node:http2';
import * as net from 'node:net';
import type * as tls from 'node:tls';
import { GrpcStatus, grpcStatusName } from './grpc-status';

/** A call that did not end in OK: `code` is the gRPC status. */
export class GrpcError extends Error {
  constructor(
    readonly code: number,
    readonly details: string,
  ) {
    super(`${code} ${grpcStatusName(code)}: ${details}`);
  }
}

/** gRPC's mapping of HTTP statuses of a non-gRPC answer (doc/http-grpc-status-mapping.md). */
export function httpStatusCode(status: number): number {
  if (status === 400) return GrpcStatus.INTERNAL;
  if (status === 401) return GrpcStatus.UNAUTHENTICATED;
  if (status === 403) return GrpcStatus.PERMISSION_DENIED;
  if (status === 404) return GrpcStatus.UNIMPLEMENTED;
  if ([429, 502, 503, 504].includes(status)) return GrpcStatus.UNAVAILABLE;
  return GrpcStatus.UNKNOWN;
}

/** grpc-message is percent-encoded UTF-8 (bytes outside printable ASCII, and '%'). */
export function decodeGrpcMessage(raw: string | undefined): string {
  if (!raw) return '';
  try {
    return decodeURIComponent(raw);
  } catch {
    return raw;
  }
}

export function encodeGrpcMessage(s: string): string {
  let out = '';
  for (const b of Buffer.from(s, 'utf8')) {
    out +=
      b >= 0x20 && b <= 0x7e && b !== 0x25
        ? String.fromCharCode(b)
        : `%${b.toString(16).toUpperCase().padStart(2, '0')}`;
  }
  return out;
}

export function header(h: http2.IncomingHttpHeaders, name: string): string | undefined {
  const v = h[name];
  return Array.isArray(v) ? v[0] : v;
}

/** The status a call ended with, from grpc-status (trailers, or a trailers-only answer's headers). */
export function statusFromHeaders(
  raw: string | undefined,
  message: string | undefined,
  who: string,
): { code: number; details: string } {
  const code = Number(raw);
  if (raw === undefined || !/^\d+$/.test(raw) || code > 16)
    return { code: GrpcStatus.UNKNOWN, details: `${who} answered grpc-status ${JSON.stringify(raw)}` };
  return { code, details: decodeGrpcMessage(message) };
}

/** The 5-byte prefix of an uncompressed message of `length` bytes. */
export function messagePrefix(length: number): Buffer {
  const p = Buffer.alloc(5);
  p.writeUInt32BE(length, 1);
  return p;
}

/**
 * Cuts a byte stream into gRPC messages. A message is handed out once all its bytes are there (one copy when it came
 * in pieces); its length is checked against the cap as soon as its prefix is read, so an oversized message is
 * refused before it is buffered.
 */
export class MessageReader {
  private chunks: Buffer[] = [];
  private buffered = 0;
  /** Length of the message being read, or -1 while its prefix is incomplete. */
  private need = -1;

  constructor(private readonly maxBytes: number) {}

  /** Bytes of an incomplete message held (a stream that ends with any was truncated). */
  get pending(): number {
    return this.buffered + (this.need >= 0 ? 5 : 0);
  }

  /** The messages completed by `chunk`; throws GrpcError for a message over the cap or a compressed one. */
  push(chunk: Buffer): Buffer[] {
    this.chunks.push(chunk);
    this.buffered += chunk.length;
    const out: Buffer[] = [];
    for (;;) {
      if (this.need < 0) {
        if (this.buffered < 5) break;
        const prefix = this.take(5);
        if (prefix[0] !== 0) {
          throw new GrpcError(
            GrpcStatus.INTERNAL,
            prefix[0] === 1 ? 'a compressed message, and no compression was agreed' : `bad message flags ${prefix[0]}`,
          );
        }
        const len = prefix.readUInt32BE(1);
        if (len > this.maxBytes)
          throw new GrpcError(
            GrpcStatus.RESOURCE_EXHAUSTED,
            `Received message larger than max (${len} vs ${this.maxBytes})`,
          );
        this.need = len;
      }
      if (this.buffered < this.need) break;
      out.push(this.take(this.need));
      this.need = -1;
    }
    return out;
  }

  private take(n: number): Buffer {
    this.buffered -= n;
    const first = this.chunks[0];
    if (n === 0) return Buffer.alloc(0);
    if (first && first.length >= n) {
      if (first.length === n) this.chunks.shift();
      else this.chunks[0] = first.subarray(n);
      return first.subarray(0, n);
    }
    const out = Buffer.allocUnsafe(n);
    let at = 0;
    while (at < n) {
      const c = this.chunks[0]!;
      const k = Math.min(c.length, n - at);
      c.copy(out, at, 0, k);
      at += k;
      if (k === c.length) this.chunks.shift();
      else this.chunks[0] = c.subarray(k);
    }
    return out;
  }
}

/** The request headers of a call: the metadata lowercased, checked as gRPC's ASCII metadata. Throws GrpcError. */
export function requestHeaders(path: string, metadata: Record<string, string> | undefined): http2.OutgoingHttpHeaders {
  const headers: http2.OutgoingHttpHeaders = {
    ':method': 'POST',
    ':path': path,
    'content-type': 'application/grpc',
    te: 'trailers',
    'user-agent': 'pilot-agent',
  };
  for (const [k, v] of Object.entries(metadata ?? {})) {
    // Names of [0-9a-z_.-], values of printable ASCII (no CR/LF to split a header).
    const name = k.toLowerCase();
    if (!/^[0-9a-z_.-]+$/.test(name) || name.endsWith('-bin'))
      throw new GrpcError(GrpcStatus.INTERNAL, `metadata name ${JSON.stringify(k)} is not a gRPC header name`);
    if (!/^[\x20-\x7e]*$/.test(v))
      throw new GrpcError(GrpcStatus.INTERNAL, `metadata ${name}: the value is not printable ASCII`);
    headers[name] = v;
  }
  return headers;
}

export interface ClientTls {
  /** The name the server's certificate must carry; also the SNI unless it is an IP address. */
  serverName: string;
  /** For tls.connect: ca, key, cert or secureContext. */
  options: tls.ConnectionOptions;
}

export interface ClientSessionOptions {
  /** Session settings and options beyond the connection (window sizes, maxSessionMemory). */
  h2?: http2.ClientSessionOptions;
}

/**
 * Where a gRPC target points: host:port, [v6]:port, dns:///host:port, or a Unix socket (unix:/path, unix:///path,
 * unix:relative, or a bare absolute path). Throws GrpcError for anything else.
 */
export function parseTarget(address: string): { unixPath: string } | { host: string; port: number } {
  if (address.startsWith('unix:')) return { unixPath: address.slice(5).replace(/^\/\/(?=\/)/, '') };
  if (address.startsWith('/')) return { unixPath: address };
  const a = address.replace(/^dns:(?:\/\/[^/]*\/)?/, '');
  const m = /^(?:\[([^\]]+)\]|([^:[\]]+)):(\d+)$/.exec(a);
  if (!m || Number(m[3]) > 65535) throw new GrpcError(GrpcStatus.UNAVAILABLE, `${address} is not host:port`);
  return { host: m[1] ?? m[2]!, port: Number(m[3]) };
}

/**
 * A Unix socket or a loopback address (127/8, ::1, localhost): a plaintext token sent there crosses no network.
 * Anything that is no target is not local.
 */
export function isLocalTarget(address: string): boolean {
  let t: ReturnType<typeof parseTarget>;
  try {
    t = parseTarget(address);
  } catch {
    return false;
  }
  if ('unixPath' in t) return true;
  return t.host === 'localhost' || t.host === '::1' || (net.isIPv4(t.host) && t.host.startsWith('127.'));
}

/** What the socket under a client session saw: the address its name resolved to, and how connecting failed. */
interface SocketRecord {
  resolved?: string;
  error?: string;
}
const socketRecords = new WeakMap<http2.ClientHttp2Session, SocketRecord>();

/**
 * "connection to istiod:15012 (10.0.0.1): connect EHOSTUNREACH 10.0.0.1:15012": how the connection of a session
 * from connectSession failed, from `message` or else from the socket's own error (HTTP/2 may end the session's
 * streams, reset code 2, before or without saying so on the session); undefined while nothing failed.
 */
export function connectionFailure(
  address: string,
  session: http2.ClientHttp2Session | undefined,
  message = session && socketRecords.get(session)?.error,
): string | undefined {
  return message === undefined ? undefined : `connection to ${describeTarget(address, session)}: ${message}`;
}

/** The target, with the address its name resolved to when that is known: "istiod:15012 (10.0.0.1)". */
export function describeTarget(address: string, session: http2.ClientHttp2Session | undefined): string {
  const resolved = session && socketRecords.get(session)?.resolved;
  return resolved ? `${address} (${resolved})` : address;
}

function watchSocket(sock: net.Socket, record: SocketRecord, name: string): net.Socket {
  sock.on('lookup', (err: Error | null, resolved: string) => {
    if (err) record.error ??= `cannot resolve ${name}: ${err.message}`;
    else record.resolved = resolved;
  });
  sock.on('error', (e: Error) => {
    record.error ??= e.message;
  });
  return sock;
}

/** An HTTP/2 client session to the target, over TLS with ALPN h2 when `tlsOpts` is given. Throws GrpcError. */
export function connectSession(
  address: string,
  tlsOpts: ClientTls | undefined,
  o: ClientSessionOptions = {},
): http2.ClientHttp2Session {
  // Required here: node:http2 (and TLS) load with the first connection, not with the module.
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const h2 = require('node:http2') as typeof http2;
  const target = parseTarget(address);
  const record: SocketRecord = {};
  const connect = (): net.Socket => {
    if ('unixPath' in target) return watchSocket(net.connect(target.unixPath), record, target.unixPath);
    return watchSocket(net.connect({ host: target.host, port: target.port }), record, target.host);
  };
  const authority = 'unixPath' in target ? 'localhost' : address.replace(/^dns:(?:\/\/[^/]*\/)?/, '');
  const session = h2.connect(`${tlsOpts ? 'https' : 'http'}://${authority}`, {
    ...o.h2,
    createConnection: () => {
      if (!tlsOpts) return connect();
      // eslint-disable-next-line @typescript-eslint/no-require-imports
      const tlsMod = require('node:tls') as typeof tls;
      const name = tlsOpts.serverName;
      return tlsMod.connect({
        ...tlsOpts.options,
        socket: connect(),
        ALPNProtocols: ['h2'],
        // SNI carries names only (RFC 6066); the certificate is checked against the name either way.
        ...(net.isIP(name) ? {} : { servername: name }),
        checkServerIdentity: (_host, cert) => tlsMod.checkServerIdentity(name, cert),
      });
    },
  });
  socketRecords.set(session, record);
  return session;
}

/** What a reset stream that carried no status means (gRPC's mapping of HTTP/2 error codes). */
export function rstStatusCode(rst: number | undefined): number {
  if (rst === 7 /* REFUSED_STREAM */) return GrpcStatus.UNAVAILABLE;
  if (rst === 8 /* CANCEL */) return GrpcStatus.CANCELLED;
  if (rst === 11 /* ENHANCE_YOUR_CALM */) return GrpcStatus.RESOURCE_EXHAUSTED;
  if (rst === 12 /* INADEQUATE_SECURITY */) return GrpcStatus.PERMISSION_DENIED;
  return GrpcStatus.INTERNAL;
}
