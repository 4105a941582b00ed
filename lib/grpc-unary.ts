// One unary gRPC call over node:http2, on a connection of its own that ends with the call: the CA client's
// transport. grpc-js costs ~20 ms of start-up to load, and the agent asks the CA for the workload certificate before
// anything else loads (so that the CA's answer overlaps Envoy's start, as the Go agent's pre-generated certificate
// does); everything that streams (xDS, SDS) stays on grpc-js.
//
// What it speaks (the gRPC over HTTP/2 protocol): POST with content-type application/grpc, te: trailers, a
// grpc-timeout, the metadata as lowercased headers; one length-prefixed, uncompressed message each way (no
// grpc-accept-encoding is sent, so a server must not compress); the status from grpc-status/grpc-message in the
// trailers, or in the headers of a trailers-only answer. Whatever the peer sends or does ends as a GrpcError with a
// gRPC status code, never as an exception elsewhere: a refused or broken connection, a reset stream, a non-200
// answer, a response over the size cap, a compressed or truncated message.

import type * as http2 from 'node:http2';
import * as net from 'node:net';
import type * as tls from 'node:tls';
import { GrpcStatus, grpcStatusName } from './grpc-status';

/** A call that did not end in OK: `code` is the gRPC status (as grpc-js's ServiceError has it). */
export class GrpcError extends Error {
  constructor(
    readonly code: number,
    readonly details: string,
  ) {
    super(`${code} ${grpcStatusName(code)}: ${details}`);
  }
}

export interface UnaryCall {
  /** host:port, [v6]:port, or unix:/path (also unix:///path). */
  address: string;
  /** e.g. /istio.v1.auth.IstioCertificateService/CreateCertificate */
  path: string;
  /** The encoded request message. */
  message: Buffer;
  /** Metadata, sent as headers (names lowercased). */
  metadata?: Record<string, string>;
  /** TLS: the options for tls.connect (ca, key, cert, secureContext, ...); `serverName` is the name checked. */
  tls?: { serverName: string; options: tls.ConnectionOptions };
  /** Deadline of the whole call, connect included. */
  timeoutMs: number;
  /** Largest response message accepted (default 4 MiB, gRPC's default). */
  maxResponseBytes?: number;
}

const DEFAULT_MAX_RESPONSE = 4 * 1024 * 1024;

/** gRPC's mapping of HTTP statuses of a non-gRPC answer (doc/http-grpc-status-mapping.md). */
function httpStatusCode(status: number): number {
  if (status === 400) return GrpcStatus.INTERNAL;
  if (status === 401) return GrpcStatus.UNAUTHENTICATED;
  if (status === 403) return GrpcStatus.PERMISSION_DENIED;
  if (status === 404) return GrpcStatus.UNIMPLEMENTED;
  if ([429, 502, 503, 504].includes(status)) return GrpcStatus.UNAVAILABLE;
  return GrpcStatus.UNKNOWN;
}

function decodeMessage(raw: string | undefined): string {
  if (!raw) return '';
  try {
    return decodeURIComponent(raw);
  } catch {
    return raw;
  }
}

function header(h: http2.IncomingHttpHeaders, name: string): string | undefined {
  const v = h[name];
  return Array.isArray(v) ? v[0] : v;
}

/** The response message of one unary call; rejects with a GrpcError. */
export function unaryCall(c: UnaryCall): Promise<Buffer> {
  // Required here: node:http2 (and TLS) load when the first call is made, not with the module.
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const h2 = require('node:http2') as typeof http2;
  const max = c.maxResponseBytes ?? DEFAULT_MAX_RESPONSE;
  return new Promise<Buffer>((resolve, reject) => {
    let session: http2.ClientHttp2Session | undefined;
    let done = false;
    const finish = (err: GrpcError | undefined, value?: Buffer) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      if (err) session?.destroy();
      else session?.close();
      if (err) reject(err);
      else resolve(value!);
    };
    const fail = (code: number, details: string) => finish(new GrpcError(code, details));
    const timer = setTimeout(
      () => fail(GrpcStatus.DEADLINE_EXCEEDED, `no answer from ${c.address} within ${c.timeoutMs} ms`),
      c.timeoutMs,
    );
    try {
      const unixPath = c.address.startsWith('unix:') ? c.address.slice(5).replace(/^\/\/(?=\/)/, '') : undefined;
      let authority = 'localhost';
      let connect: () => net.Socket | tls.TLSSocket;
      if (unixPath !== undefined) {
        connect = () => net.connect(unixPath);
      } else {
        const m = /^(?:\[([^\]]+)\]|([^:]+)):(\d+)$/.exec(c.address);
        if (!m) throw new GrpcError(GrpcStatus.UNAVAILABLE, `${c.address} is not host:port`);
        const host = m[1] ?? m[2]!;
        const port = Number(m[3]);
        authority = c.address;
        connect = () => net.connect({ host, port });
      }
      const t = c.tls;
      const scheme = t ? 'https' : 'http';
      session = h2.connect(`${scheme}://${authority}`, {
        createConnection: () => {
          if (!t) return connect();
          // eslint-disable-next-line @typescript-eslint/no-require-imports
          const tlsMod = require('node:tls') as typeof tls;
          const name = t.serverName;
          return tlsMod.connect({
            ...t.options,
            socket: connect() as net.Socket,
            ALPNProtocols: ['h2'],
            // SNI carries names only (RFC 6066); the certificate is checked against the name either way.
            ...(net.isIP(name) ? {} : { servername: name }),
            checkServerIdentity: (_host, cert) => tlsMod.checkServerIdentity(name, cert),
          });
        },
      });
      let connectionError: string | undefined;
      session.on('error', (e: Error) => {
        connectionError = `connection to ${c.address}: ${e.message}`;
        fail(GrpcStatus.UNAVAILABLE, connectionError);
      });
      session.on('goaway', () => fail(GrpcStatus.UNAVAILABLE, `${c.address} closed the connection (GOAWAY)`));
      session.on('close', () => fail(GrpcStatus.UNAVAILABLE, `connection to ${c.address} closed before an answer`));
      const headers: http2.OutgoingHttpHeaders = {
        ':method': 'POST',
        ':path': c.path,
        'content-type': 'application/grpc',
        te: 'trailers',
        'grpc-timeout': `${Math.max(1, Math.ceil(c.timeoutMs))}m`,
        'user-agent': 'pilot-agent',
      };
      for (const [k, v] of Object.entries(c.metadata ?? {})) {
        // gRPC's ASCII metadata: names of [0-9a-z_.-], values of printable ASCII (no CR/LF to split a header).
        const name = k.toLowerCase();
        if (!/^[0-9a-z_.-]+$/.test(name) || name.endsWith('-bin'))
          throw new GrpcError(GrpcStatus.INTERNAL, `metadata name ${JSON.stringify(k)} is not a gRPC header name`);
        if (!/^[\x20-\x7e]*$/.test(v))
          throw new GrpcError(GrpcStatus.INTERNAL, `metadata ${name}: the value is not printable ASCII`);
        headers[name] = v;
      }
      const stream = session.request(headers, { endStream: false });
      const frame = Buffer.alloc(5);
      frame.writeUInt32BE(c.message.length, 1);
      stream.end(Buffer.concat([frame, c.message]));

      const chunks: Buffer[] = [];
      let received = 0;
      let status: string | undefined;
      let message: string | undefined;
      let httpStatus = 0;
      stream.on('response', (h) => {
        httpStatus = Number(h[':status']);
        // A trailers-only answer has its status here.
        status = header(h, 'grpc-status');
        message = header(h, 'grpc-message');
        if (httpStatus !== 200) fail(httpStatusCode(httpStatus), `${c.address} answered HTTP ${httpStatus}`);
        else if (!/^application\/grpc/.test(header(h, 'content-type') ?? '') && status === undefined)
          fail(GrpcStatus.UNKNOWN, `${c.address} answered content-type ${header(h, 'content-type') ?? 'none'}`);
      });
      stream.on('trailers', (h) => {
        status = header(h, 'grpc-status') ?? status;
        message = header(h, 'grpc-message') ?? message;
      });
      stream.on('data', (d: Buffer) => {
        received += d.length;
        if (received > max + 5)
          return fail(GrpcStatus.RESOURCE_EXHAUSTED, `${c.address} answered more than ${max} bytes`);
        chunks.push(d);
      });
      // A reset stream also emits 'error'; what it means is decided on 'close', from the reset code.
      stream.on('error', () => {});
      stream.on('close', () => {
        if (done) return;
        if (status === undefined) {
          const rst = stream.rstCode;
          const what = `${c.address} ended the call without a status (stream reset code ${rst})`;
          // Nothing answered: the connection failed (its own error, reported first when there is one, says how).
          if (!httpStatus) return setImmediate(() => fail(GrpcStatus.UNAVAILABLE, connectionError ?? what));
          const code =
            rst === h2.constants.NGHTTP2_REFUSED_STREAM
              ? GrpcStatus.UNAVAILABLE
              : rst === h2.constants.NGHTTP2_CANCEL
                ? GrpcStatus.CANCELLED
                : GrpcStatus.INTERNAL;
          return fail(code, what);
        }
        const code = Number(status);
        if (!Number.isInteger(code) || code < 0 || code > 16)
          return fail(GrpcStatus.UNKNOWN, `${c.address} answered grpc-status ${JSON.stringify(status)}`);
        if (code !== GrpcStatus.OK) return fail(code, decodeMessage(message) || `status ${grpcStatusName(code)}`);
        const body = Buffer.concat(chunks);
        if (body.length < 5) return fail(GrpcStatus.INTERNAL, `${c.address} answered OK without a message`);
        if (body[0] !== 0)
          return fail(GrpcStatus.INTERNAL, `${c.address} answered a compressed message, not asked for`);
        const len = body.readUInt32BE(1);
        if (len > max) return fail(GrpcStatus.RESOURCE_EXHAUSTED, `${c.address} answered more than ${max} bytes`);
        if (body.length !== 5 + len)
          return fail(GrpcStatus.INTERNAL, `${c.address} answered ${body.length - 5} bytes for a ${len}-byte message`);
        finish(undefined, body.subarray(5));
      });
    } catch (e) {
      fail(
        e instanceof GrpcError ? e.code : GrpcStatus.INTERNAL,
        e instanceof GrpcError ? e.details : `call to ${c.address}: ${(e as Error).message}`,
      );
    }
  });
}
