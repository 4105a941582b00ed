// One unary gRPC call over node:http2, on a connection of its own that ends with the call: the CA client's
// transport. The agent asks the CA for the workload certificate before anything else loads (so that the CA's answer
// overlaps Envoy's start, as the Go agent's pre-generated certificate does). The wire pieces are lib/grpc-wire.ts.
//
// What it speaks (the gRPC over HTTP/2 protocol): POST with content-type application/grpc, te: trailers, a
// grpc-timeout, the metadata as lowercased headers; one length-prefixed, uncompressed message each way (no
// grpc-accept-encoding is sent, so a server must not compress); the status from grpc-status/grpc-message in the
// trailers, or in the headers of a trailers-only answer. Whatever the peer sends or does ends as a GrpcError with a
// gRPC status code, never as an exception elsewhere: a refused or broken connection, a reset stream, a non-200
// answer, a response over the size cap, a compressed or truncated message.

import type * as http2 from 'node:http2';
import { GrpcStatus, grpcStatusName } from './grpc-status';
import {
  type ClientTls,
  connectionFailure,
  connectSession,
  describeTarget,
  GrpcError,
  header,
  httpStatusCode,
  messagePrefix,
  requestHeaders,
  rstStatusCode,
  statusFromHeaders,
} from './grpc-wire';

export { GrpcError } from './grpc-wire';

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
  tls?: ClientTls;
  /** Deadline of the whole call, connect included. */
  timeoutMs: number;
  /** Largest response message accepted (default 4 MiB, gRPC's default). */
  maxResponseBytes?: number;
  /**
   * A connection opened ahead for this call (connectSession with the same address and TLS), which the call then
   * owns and closes; one already closed or failed is not used, and the call connects as usual.
   */
  session?: http2.ClientHttp2Session;
}

const DEFAULT_MAX_RESPONSE = 4 * 1024 * 1024;

/** The response message of one unary call; rejects with a GrpcError. */
export function unaryCall(c: UnaryCall): Promise<Buffer> {
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
      () =>
        fail(
          GrpcStatus.DEADLINE_EXCEEDED,
          `no answer from ${describeTarget(c.address, session)} within ${c.timeoutMs} ms`,
        ),
      c.timeoutMs,
    );
    try {
      session = c.session && !c.session.closed && !c.session.destroyed ? c.session : connectSession(c.address, c.tls);
      if (session !== c.session) c.session?.destroy();
      else session.ref();
      session.on('error', (e: Error) =>
        fail(GrpcStatus.UNAVAILABLE, connectionFailure(c.address, session, e.message)!),
      );
      session.on('goaway', () => fail(GrpcStatus.UNAVAILABLE, `${c.address} closed the connection (GOAWAY)`));
      session.on('close', () =>
        fail(
          GrpcStatus.UNAVAILABLE,
          connectionFailure(c.address, session) ?? `connection to ${c.address} closed before an answer`,
        ),
      );
      const headers = requestHeaders(c.path, c.metadata);
      headers['grpc-timeout'] = `${Math.max(1, Math.ceil(c.timeoutMs))}m`;
      const stream = session.request(headers, { endStream: false });
      stream.end(Buffer.concat([messagePrefix(c.message.length), c.message]));

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
          if (!httpStatus)
            return setImmediate(() => fail(GrpcStatus.UNAVAILABLE, connectionFailure(c.address, session) ?? what));
          return fail(rstStatusCode(rst), what);
        }
        const st = statusFromHeaders(status, message, c.address);
        if (st.code !== GrpcStatus.OK) return fail(st.code, st.details || `status ${grpcStatusName(st.code)}`);
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
