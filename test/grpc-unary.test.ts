// The CA client's own unary gRPC transport (lib/grpc-unary.ts): against a real grpc-js server (OK, an error
// status with its message, metadata and the timeout as sent, over TCP, a Unix socket and TLS with the name
// checked) and against raw HTTP/2 and TCP peers that misbehave in every way a CA could: each ends as a GrpcError
// with the right status code, quickly, with nothing left open.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as grpc from '@grpc/grpc-js';
import * as http2 from 'node:http2';
import * as net from 'node:net';
import * as path from 'node:path';
import { GrpcStatus } from '../lib/grpc-status';
import { GrpcError, unaryCall } from '../lib/grpc-unary';
import { isLocalTarget } from '../lib/grpc-wire';
import { tempDir } from './helpers/harness';
import { makeLeaf, makeRoot } from './helpers/test-ca';

const PATH = '/test.Echo/Call';
const passthrough = { serialize: (b: Buffer) => b, deserialize: (b: Buffer) => b };

async function grpcServer(
  handler: (req: Buffer, md: grpc.Metadata, cb: grpc.sendUnaryData<Buffer>, deadline: grpc.Deadline) => void,
  bind: string,
  creds = grpc.ServerCredentials.createInsecure(),
): Promise<{ server: grpc.Server; port: number }> {
  const server = new grpc.Server();
  server.addService(
    { Call: { path: PATH, requestStream: false, responseStream: false, requestSerialize: passthrough.serialize, requestDeserialize: passthrough.deserialize, responseSerialize: passthrough.serialize, responseDeserialize: passthrough.deserialize } },
    { Call: (call: grpc.ServerUnaryCall<Buffer, Buffer>, cb: grpc.sendUnaryData<Buffer>) => handler(call.request, call.metadata, cb, call.getDeadline()) },
  );
  const port = await new Promise<number>((r, j) => server.bindAsync(bind, creds, (e, p) => (e ? j(e) : r(p))));
  return { server, port };
}

async function failure(p: Promise<unknown>): Promise<GrpcError> {
  try {
    await p;
  } catch (e) {
    assert.instance(e, GrpcError);
    return e as GrpcError;
  }
  throw new Error('the call succeeded');
}

/** A raw HTTP/2 server whose stream handler misbehaves. */
async function h2Server(onStream: (s: http2.ServerHttp2Stream) => void): Promise<{ port: number; close: () => Promise<void> }> {
  const server = http2.createServer();
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on('session', (s) => (sessions.add(s), s.on('close', () => sessions.delete(s)), s.on('error', () => {})));
  server.on('stream', (s) => {
    s.on('error', () => {});
    s.resume();
    s.on('end', () => onStream(s));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    port: (server.address() as net.AddressInfo).port,
    close: () => new Promise<void>((r) => (sessions.forEach((s) => s.destroy()), server.close(() => r()))),
  };
}

const grpcFrame = (b: Buffer, flag = 0) => {
  const f = Buffer.alloc(5);
  f[0] = flag;
  f.writeUInt32BE(b.length, 1);
  return Buffer.concat([f, b]);
};

test('OK against grpc-js: the message both ways, metadata lowercased, the timeout as grpc-timeout; an error status keeps its code and message', async () => {
  let seen: { md?: Record<string, unknown>; deadline?: number } = {};
  const { server, port } = await grpcServer((req, md, cb, deadline) => {
    seen = { md: md.getMap(), deadline: Number(deadline) - Date.now() };
    if (req.toString() === 'refuse') return cb({ code: grpc.status.PERMISSION_DENIED, details: 'not you: 100% sure' });
    cb(null, Buffer.concat([Buffer.from('echo:'), req]));
  }, '127.0.0.1:0');
  try {
    const address = `127.0.0.1:${port}`;
    const out = await unaryCall({ address, path: PATH, message: Buffer.from('hello'), metadata: { ClusterID: 'c1', authorization: 'Bearer t' }, timeoutMs: 5000 });
    assert.is(out.toString(), 'echo:hello');
    assert.is(seen.md!.clusterid, 'c1');
    assert.is(seen.md!.authorization, 'Bearer t');
    assert.ok(seen.deadline! > 3000 && seen.deadline! <= 5000, `deadline ${seen.deadline}`);
    const e = await failure(unaryCall({ address, path: PATH, message: Buffer.from('refuse'), timeoutMs: 5000 }));
    assert.is(e.code, GrpcStatus.PERMISSION_DENIED);
    assert.is(e.details, 'not you: 100% sure');
    const empty = await unaryCall({ address, path: PATH, message: Buffer.alloc(0), timeoutMs: 5000 });
    assert.is(empty.toString(), 'echo:');
    const missing = await failure(unaryCall({ address, path: '/test.Echo/Nope', message: Buffer.alloc(0), timeoutMs: 5000 }));
    assert.is(missing.code, GrpcStatus.UNIMPLEMENTED);
  } finally {
    server.forceShutdown();
  }
});

test('over a Unix socket (unix:/path and unix:///path), and over TLS with the server name checked (SNI and certificate)', async () => {
  const dir = tempDir('pa-unary-');
  const root = await makeRoot('unary root');
  const other = await makeRoot('other root');
  const leaf = await makeLeaf(root, { dns: ['ca.example'] });
  const pki = { rootPem: Buffer.from(root.pem), otherRootPem: Buffer.from(other.pem), serverKeyPem: Buffer.from(leaf.keyPem), serverCertPem: Buffer.from(leaf.certPem) };
  const sock = path.join(dir.path, 'ca.sock');
  const handler = (req: Buffer, _md: grpc.Metadata, cb: grpc.sendUnaryData<Buffer>) => cb(null, req);
  const unix = await grpcServer(handler, `unix:${sock}`);
  const secure = await grpcServer(handler, '127.0.0.1:0', grpc.ServerCredentials.createSsl(pki.rootPem, [{ private_key: pki.serverKeyPem, cert_chain: pki.serverCertPem }]));
  try {
    for (const address of [`unix:${sock}`, `unix://${sock}`]) {
      const out = await unaryCall({ address, path: PATH, message: Buffer.from('u'), timeoutMs: 5000 });
      assert.is(out.toString(), 'u');
    }
    const address = `127.0.0.1:${secure.port}`;
    const ok = await unaryCall({ address, path: PATH, message: Buffer.from('t'), tls: { serverName: 'ca.example', options: { ca: pki.rootPem } }, timeoutMs: 5000 });
    assert.is(ok.toString(), 't');
    const wrongName = await failure(unaryCall({ address, path: PATH, message: Buffer.from('t'), tls: { serverName: 'other.example', options: { ca: pki.rootPem } }, timeoutMs: 5000 }));
    assert.is(wrongName.code, GrpcStatus.UNAVAILABLE);
    assert.match(wrongName.details, /other\.example/);
    const wrongRoot = await failure(unaryCall({ address, path: PATH, message: Buffer.from('t'), tls: { serverName: 'ca.example', options: { ca: pki.otherRootPem } }, timeoutMs: 5000 }));
    assert.is(wrongRoot.code, GrpcStatus.UNAVAILABLE);
  } finally {
    unix.server.forceShutdown();
    secure.server.forceShutdown();
    dir.cleanup();
  }
});

test('every way a peer can misbehave is one GrpcError with a fitting code, within the deadline', async () => {
  const cases: Array<[string, (s: http2.ServerHttp2Stream) => void, number, RegExp]> = [
    ['HTTP 503', (s) => (s.respond({ ':status': 503 }), s.end()), GrpcStatus.UNAVAILABLE, /HTTP 503/],
    ['HTTP 401', (s) => (s.respond({ ':status': 401 }), s.end()), GrpcStatus.UNAUTHENTICATED, /HTTP 401/],
    ['not gRPC', (s) => (s.respond({ ':status': 200, 'content-type': 'text/html' }), s.end('<html>')), GrpcStatus.UNKNOWN, /text\/html/],
    ['no status', (s) => (s.respond({ ':status': 200, 'content-type': 'application/grpc' }), s.end(grpcFrame(Buffer.from('x')))), GrpcStatus.INTERNAL, /without a status/],
    ['bad status', (s) => (s.respond({ ':status': 200, 'content-type': 'application/grpc' }, { waitForTrailers: true }), s.on('wantTrailers', () => s.sendTrailers({ 'grpc-status': 'x1' })), s.end(grpcFrame(Buffer.from('x')))), GrpcStatus.UNKNOWN, /grpc-status "x1"/],
    ['reset', (s) => s.close(http2.constants.NGHTTP2_INTERNAL_ERROR), GrpcStatus.UNAVAILABLE, /reset code 2|without a status/],
    ['refused stream', (s) => s.close(http2.constants.NGHTTP2_REFUSED_STREAM), GrpcStatus.UNAVAILABLE, /reset code 7/],
    ['compressed', (s) => okWith(s, grpcFrame(Buffer.from('x'), 1)), GrpcStatus.INTERNAL, /compressed/],
    ['truncated', (s) => okWith(s, grpcFrame(Buffer.from('hello')).subarray(0, 7)), GrpcStatus.INTERNAL, /2 bytes for a 5-byte message/],
    ['empty OK', (s) => okWith(s, Buffer.alloc(0)), GrpcStatus.INTERNAL, /without a message/],
    ['over the cap', (s) => okWith(s, grpcFrame(Buffer.alloc(2048))), GrpcStatus.RESOURCE_EXHAUSTED, /more than 1024 bytes/],
    ['claims over the cap', (s) => okWith(s, Buffer.from([0, 0xff, 0xff, 0xff, 0xff])), GrpcStatus.RESOURCE_EXHAUSTED, /more than 1024/],
    ['never answers', () => {}, GrpcStatus.DEADLINE_EXCEEDED, /within 400 ms/],
    ['trailers-only error', (s) => (s.respond({ ':status': 200, 'content-type': 'application/grpc', 'grpc-status': '16', 'grpc-message': 'bad%20token' }, { endStream: true })), GrpcStatus.UNAUTHENTICATED, /^bad token$/],
  ];
  for (const [name, onStream, code, re] of cases) {
    const srv = await h2Server(onStream);
    try {
      const t0 = Date.now();
      const e = await failure(unaryCall({ address: `127.0.0.1:${srv.port}`, path: PATH, message: Buffer.from('q'), timeoutMs: 400, maxResponseBytes: 1024 }));
      assert.is(e.code, code, `${name}: ${e.message}`);
      assert.match(e.details, re, name);
      assert.ok(Date.now() - t0 < 1500, `${name} took ${Date.now() - t0} ms`);
    } finally {
      await srv.close();
    }
  }
});

function okWith(s: http2.ServerHttp2Stream, body: Buffer): void {
  s.respond({ ':status': 200, 'content-type': 'application/grpc' }, { waitForTrailers: true });
  s.on('wantTrailers', () => s.sendTrailers({ 'grpc-status': '0' }));
  s.end(body);
}

test('refused connections, a peer that speaks no HTTP/2, one that hangs up, and a bad address are UNAVAILABLE', async () => {
  const free = await new Promise<number>((r) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const p = (s.address() as net.AddressInfo).port;
      s.close(() => r(p));
    });
  });
  const junk = net.createServer((c) => c.end('HTTP/1.1 400 Bad Request\r\n\r\n'));
  const hangup = net.createServer((c) => c.destroy());
  const silent = net.createServer(() => {});
  await Promise.all([junk, hangup, silent].map((s) => new Promise<void>((r) => s.listen(0, '127.0.0.1', r))));
  const port = (s: net.Server) => (s.address() as net.AddressInfo).port;
  try {
    for (const [address, want, timeoutMs] of [
      [`127.0.0.1:${free}`, GrpcStatus.UNAVAILABLE, 2000],
      [`127.0.0.1:${port(junk)}`, GrpcStatus.UNAVAILABLE, 2000],
      [`127.0.0.1:${port(hangup)}`, GrpcStatus.UNAVAILABLE, 2000],
      [`127.0.0.1:${port(silent)}`, GrpcStatus.DEADLINE_EXCEEDED, 300],
      ['no-port-here', GrpcStatus.UNAVAILABLE, 2000],
      ['unix:/nonexistent/ca.sock', GrpcStatus.UNAVAILABLE, 2000],
    ] as const) {
      const e = await failure(unaryCall({ address, path: PATH, message: Buffer.from('q'), timeoutMs }));
      assert.is(e.code, want, `${address}: ${e.message}`);
    }
    // A metadata value no header may carry is refused before anything is sent.
    const bad = await failure(unaryCall({ address: `127.0.0.1:${port(silent)}`, path: PATH, message: Buffer.alloc(0), metadata: { x: 'a\r\nb' }, timeoutMs: 300 }));
    assert.is(bad.code, GrpcStatus.INTERNAL, bad.message);
  } finally {
    for (const s of [junk, hangup, silent]) s.close();
  }
});

test('a name that resolves to nowhere: the failure names the address it resolved to and how connecting failed', async () => {
  const free = await new Promise<number>((r) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const p = (s.address() as net.AddressInfo).port;
      s.close(() => r(p));
    });
  });
  const silent = net.createServer(() => {});
  await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
  const tls = { serverName: 'istiod.istio-system.svc', options: {} };
  try {
    for (const t of [undefined, tls]) {
      // Refused: HTTP/2 resets the pending stream (code 2) before it says why; the socket's own error is the answer.
      const refused = await failure(unaryCall({ address: `localhost:${free}`, tls: t, path: PATH, message: Buffer.from('q'), timeoutMs: 2000 }));
      assert.is(refused.code, GrpcStatus.UNAVAILABLE, refused.message);
      assert.match(refused.details, new RegExp(`^connection to localhost:${free} \\((127\\.0\\.0\\.1|::1)\\): connect ECONNREFUSED`), refused.details);
    }
    const silentPort = (silent.address() as net.AddressInfo).port;
    const late = await failure(unaryCall({ address: `localhost:${silentPort}`, path: PATH, message: Buffer.from('q'), timeoutMs: 300 }));
    assert.is(late.code, GrpcStatus.DEADLINE_EXCEEDED, late.message);
    assert.match(late.details, /\((127\.0\.0\.1|::1)\) within 300 ms/, late.details);
    const unresolvable = await failure(unaryCall({ address: 'no-such-host.invalid:15012', path: PATH, message: Buffer.from('q'), timeoutMs: 2000 }));
    assert.is(unresolvable.code, GrpcStatus.UNAVAILABLE, unresolvable.message);
    assert.match(unresolvable.details, /no-such-host\.invalid/, unresolvable.details);
  } finally {
    silent.close();
  }
});

test('isLocalTarget: Unix sockets and loopback addresses only (plaintext tokens go nowhere else)', () => {
  for (const a of ['unix:/run/x.sock', 'unix:///run/x.sock', '/run/x.sock', '127.0.0.1:15010', '127.1.2.3:15012', '[::1]:15010', 'localhost:15010', 'dns:///localhost:15010'])
    assert.ok(isLocalTarget(a), a);
  for (const a of ['10.0.0.1:15010', '127.evil.example:15010', '[::ffff:10.0.0.1]:15010', 'istiod.istio-system.svc:15010', '0.0.0.0:15010', 'localhost', '127.0.0.1', ''])
    assert.not.ok(isLocalTarget(a), a);
});

test.run();
