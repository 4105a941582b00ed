// A gRPC server of bidirectional streams on node:http2, for the two services Envoy calls on the agent's Unix sockets
// (ADS through the xDS proxy, SDS). Messages are Buffers; the services decode them. Connections come from whoever
// accepts them (lib/grpc-unix.ts: the socket, or a listener bound before this loaded).
//
// What a peer can do, and what it gets: a path that is no method here, UNIMPLEMENTED; a request that is not gRPC
// (not POST, no application/grpc), HTTP 415 or 405; a compressed message (none was agreed), UNIMPLEMENTED or
// INTERNAL; a message over the cap, RESOURCE_EXHAUSTED before it is buffered; more streams on a connection than
// allowed, refused by HTTP/2 itself (SETTINGS_MAX_CONCURRENT_STREAMS). Protocol errors end that connection only;
// nothing a peer sends reaches an exception outside this file.

import type * as http2 from 'node:http2';
import type * as net from 'node:net';
import { EventEmitter } from 'node:events';
import { GrpcStatus } from './grpc-status';
import { encodeGrpcMessage, GrpcError, header, MessageReader, messagePrefix } from './grpc-wire';

export interface CallStatus {
  code: number;
  details: string;
}

/**
 * One stream of a call. Events: 'message' (Buffer), 'halfClose' (the client ended its side), 'aborted' (the call
 * ended without this side ending it: the peer cancelled or the connection went, status undefined; or the transport
 * ended it, e.g. a message over the cap, with the status it sent). After 'aborted' nothing more is emitted.
 */
export interface ServerCall extends EventEmitter {
  readonly peer: string;
  /** True once the call has ended either way. */
  readonly ended: boolean;
  /** Sends one message; `done` once HTTP/2 has taken it (not called if the call ends first). */
  write(message: Buffer, done?: () => void): void;
  /** Ends the call with OK. */
  end(): void;
  /** Ends the call with a status other than OK. */
  fail(code: number, details: string): void;
  on(event: 'message', cb: (m: Buffer) => void): this;
  on(event: 'halfClose', cb: () => void): this;
  on(event: 'aborted', cb: (status: CallStatus | undefined) => void): this;
}

export type CallHandler = (call: ServerCall) => void;

export interface GrpcServerOptions {
  /** Full method path (/package.Service/Method) -> handler. */
  methods: Record<string, CallHandler>;
  /** Largest message accepted (and sent, unless maxSendBytes is given). */
  maxMessageBytes: number;
  maxSendBytes?: number;
  /** Streams per connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS). */
  maxConcurrentStreams?: number;
  /** How peers are named in logs (e.g. the socket path). */
  peerName: string;
}

class Call extends EventEmitter implements ServerCall {
  private responded = false;
  private done = false;
  private pendingStatus: CallStatus | undefined;
  private readonly reader: MessageReader;

  constructor(
    private readonly stream: http2.ServerHttp2Stream,
    readonly peer: string,
    maxReceiveBytes: number,
    private readonly maxBytes: number,
  ) {
    super();
    this.reader = new MessageReader(maxReceiveBytes);
    stream.on('data', (chunk: Buffer) => this.onData(chunk));
    stream.on('end', () => {
      if (this.done) return;
      if (this.reader.pending) return this.abort(GrpcStatus.INTERNAL, 'the stream ended inside a message');
      this.emit('halfClose');
    });
    // A reset or a broken connection: 'close' says it.
    stream.on('error', () => undefined);
    stream.on('close', () => {
      if (this.done) return;
      this.done = true;
      this.emit('aborted', undefined);
    });
    stream.on('wantTrailers', () => {
      const st = this.pendingStatus ?? { code: GrpcStatus.OK, details: '' };
      try {
        stream.sendTrailers(statusHeaders(st));
      } catch {
        stream.close();
      }
    });
  }

  get ended(): boolean {
    return this.done;
  }

  write(message: Buffer, done?: () => void): void {
    if (this.done) return;
    if (message.length > this.maxBytes) {
      const details = `Sent message larger than max (${message.length} vs ${this.maxBytes})`;
      return this.abort(GrpcStatus.RESOURCE_EXHAUSTED, details);
    }
    this.respond();
    this.stream.write(messagePrefix(message.length));
    this.stream.write(message, (err) => {
      if (!err && done) done();
    });
  }

  end(): void {
    this.finish({ code: GrpcStatus.OK, details: '' });
  }

  fail(code: number, details: string): void {
    this.finish({ code, details });
  }

  private respond(): void {
    if (this.responded) return;
    this.responded = true;
    this.stream.respond({ ':status': 200, 'content-type': 'application/grpc' }, { waitForTrailers: true });
  }

  private finish(st: CallStatus): void {
    if (this.done) return;
    this.done = true;
    if (this.stream.destroyed || this.stream.closed) return;
    try {
      if (this.responded) {
        this.pendingStatus = st;
        this.stream.end();
      } else {
        // Trailers-only: the status in the only headers.
        this.responded = true;
        this.stream.respond(
          { ':status': 200, 'content-type': 'application/grpc', ...statusHeaders(st) },
          { endStream: true },
        );
      }
    } catch {
      this.stream.close();
    }
  }

  /** The transport ends the call itself: the peer gets the status, the handler 'aborted' with it. */
  private abort(code: number, details: string): void {
    if (this.done) return;
    this.finish({ code, details });
    this.emit('aborted', { code, details });
  }

  private onData(chunk: Buffer): void {
    if (this.done) return;
    let messages: Buffer[];
    try {
      messages = this.reader.push(chunk);
    } catch (e) {
      const g = e as GrpcError;
      return this.abort(g.code, g.details);
    }
    for (const m of messages) {
      if (this.done) return;
      this.emit('message', m);
    }
  }
}

function statusHeaders(st: CallStatus): http2.OutgoingHttpHeaders {
  return { 'grpc-status': String(st.code), ...(st.details && { 'grpc-message': encodeGrpcMessage(st.details) }) };
}

/** Serves the methods on the connections handed to it. */
export class GrpcServer {
  private readonly h2server: http2.Http2Server;
  private readonly sessions = new Set<http2.ServerHttp2Session>();
  private closed = false;

  constructor(private readonly o: GrpcServerOptions) {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const h2 = require('node:http2') as typeof http2;
    this.h2server = h2.createServer({
      settings: { maxConcurrentStreams: o.maxConcurrentStreams ?? 100 },
      // A large push waits in the session while Envoy reads it; node's default (10 MB) would refuse new streams.
      maxSessionMemory: Math.max(
        10,
        Math.ceil((2 * Math.min(o.maxSendBytes ?? o.maxMessageBytes, 2 ** 30)) / (1024 * 1024)),
      ),
    });
    this.h2server.on('session', (s: http2.ServerHttp2Session) => {
      if (this.closed) return s.destroy();
      this.sessions.add(s);
      s.on('error', () => undefined);
      s.on('close', () => this.sessions.delete(s));
    });
    this.h2server.on('sessionError', () => undefined);
    this.h2server.on('stream', (stream, headers) => this.onStream(stream, headers));
    this.h2server.setTimeout(0);
  }

  /** Serves one accepted connection (a paused one is resumed by HTTP/2 reading it). */
  handleConnection(socket: net.Socket): void {
    if (this.closed) return void socket.destroy();
    socket.on('error', () => undefined);
    this.h2server.emit('connection', socket);
  }

  /** Ends every connection at once (open calls see 'aborted'). */
  close(): void {
    this.closed = true;
    for (const s of this.sessions) s.destroy();
    this.sessions.clear();
  }

  private onStream(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders): void {
    stream.on('error', () => undefined);
    try {
      const method = header(headers, ':method');
      const contentType = header(headers, 'content-type') ?? '';
      if (method !== 'POST') {
        stream.respond({ ':status': 405 }, { endStream: true });
        return;
      }
      if (!/^application\/grpc(?:$|[+;])/.test(contentType)) {
        stream.respond({ ':status': 415 }, { endStream: true });
        return;
      }
      const trailersOnly = (code: number, details: string) =>
        stream.respond(
          { ':status': 200, 'content-type': 'application/grpc', ...statusHeaders({ code, details }) },
          { endStream: true },
        );
      const encoding = header(headers, 'grpc-encoding');
      if (encoding && encoding !== 'identity')
        return trailersOnly(GrpcStatus.UNIMPLEMENTED, `message encoding ${encoding} is not supported`);
      const path = header(headers, ':path') ?? '';
      const handler = Object.hasOwn(this.o.methods, path) ? this.o.methods[path] : undefined;
      if (!handler) return trailersOnly(GrpcStatus.UNIMPLEMENTED, `the method ${path} is not served here`);
      handler(new Call(stream, this.o.peerName, this.o.maxMessageBytes, this.o.maxSendBytes ?? this.o.maxMessageBytes));
    } catch {
      stream.close();
    }
  }
}

export { GrpcError };
