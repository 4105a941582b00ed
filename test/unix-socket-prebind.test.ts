// A Unix socket bound before its gRPC server loads (the agent spawns Envoy before gRPC and the xDS proxy load):
// connections made early wait and are then served, the file has the agent's mode, and a socket nobody adopted is
// gone when the process exits. The status port, bound the same way, hands its early requests to the status server.

import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { bindUnixSocket } from '../lib/grpc-unix';
import { GrpcServer } from '../lib/grpc-server';
import * as net from 'node:net';
import { prebindPort, prebindUnixSocket } from '../lib/prebind';
import { StatusServer } from '../lib/status-server';
import { freePort, httpRequest, REPO, sleep, tempDir } from './helpers/harness';

const bytes = (b: Buffer) => b;
const ECHO = { echo: { path: '/t.T/Echo', requestStream: false, responseStream: false, requestSerialize: bytes, requestDeserialize: bytes, responseSerialize: bytes, responseDeserialize: bytes } };
const EchoClient = grpc.makeGenericClientConstructor(ECHO as grpc.ServiceDefinition, 'T');

/** One call, failing after 10 s (a connection the server never reads would otherwise hang the test). */
function call(client: grpc.Client, msg: string): Promise<string> {
  const deadline = new Date(Date.now() + 10_000);
  return new Promise((resolve, reject) =>
    (client as unknown as { echo(b: Buffer, m: grpc.Metadata, o: grpc.CallOptions, cb: (e: Error | null, r?: Buffer) => void): void })
      .echo(Buffer.from(msg), new grpc.Metadata(), { deadline }, (e, r) => (e ? reject(e) : resolve(r!.toString()))));
}

/** The agent's own gRPC server (lib/grpc-server.ts) answering each message with it and '!', grpc-js as the client. */
function echoServer(): GrpcServer {
  return new GrpcServer({
    methods: {
      '/t.T/Echo': (c) => {
        c.on('message', (m) => c.write(Buffer.concat([m, Buffer.from('!')])));
        c.on('halfClose', () => c.end());
      },
    },
    maxMessageBytes: 1024,
    peerName: 'test',
  });
}

test('calls made before the server loads are answered once it adopts the pre-bound socket', async () => {
  const dir = tempDir();
  const sock = path.join(dir.path, 'XDS');
  const clients: grpc.Client[] = [];
  try {
    await prebindUnixSocket(sock);
    assert.is(fs.statSync(sock).mode & 0o777, 0o660, "the agent's socket mode from the start");
    // Two clients connect and send while nothing serves the socket yet.
    for (let i = 0; i < 2; i++) clients.push(new EchoClient(`unix://${sock}`, grpc.credentials.createInsecure()));
    const early = clients.map((c, i) => call(c, `early${i}`));
    await sleep(300);
    const server = echoServer();
    const bound = await bindUnixSocket(server, sock);
    assert.equal(await Promise.all(early), ['early0!', 'early1!']);
    // And later connections are served by the same server.
    const late = new EchoClient(`unix://${sock}`, grpc.credentials.createInsecure());
    clients.push(late);
    assert.is(await call(late, 'late'), 'late!');
    bound.stop();
    assert.not.ok(fs.existsSync(sock), 'stopping the server removes its socket');
  } finally {
    for (const c of clients) c.close();
    dir.cleanup();
  }
});

test('a socket bound before a start-up that failed is removed when the process exits', () => {
  const dir = tempDir();
  try {
    const sock = path.join(dir.path, 'XDS');
    const script = `require(${JSON.stringify(path.join(REPO, 'lib/prebind.ts'))}).prebindUnixSocket(${JSON.stringify(sock)}).then(() => { require('fs').statSync(${JSON.stringify(sock)}); process.exit(3); });`;
    const r = spawnSync(process.execPath, ['--import', 'tsx', '-e', script], { cwd: REPO, encoding: 'utf8', timeout: 30_000 });
    assert.is(r.status, 3, r.stderr);
    assert.not.ok(fs.existsSync(sock), 'no socket file left behind');
  } finally {
    dir.cleanup();
  }
});

test('a status request made before the status server loads waits in the pre-bound port and is answered by it', async () => {
  const port = await freePort();
  await prebindPort(port, '127.0.0.1');
  const early = net.connect({ port, host: '127.0.0.1' });
  let answer = '';
  early.setEncoding('utf8').on('data', (d: string) => (answer += d));
  const ended = new Promise<void>((r) => early.once('end', () => r()).once('error', () => r()));
  early.write('GET /healthz/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
  await new Promise<void>((r) => early.once('connect', () => r()));
  // Connections that send nothing, one waiting before the server adopts the port and one after: the server tracks
  // both as its own (closing it ends them), as it does the connections it accepts on a port it bound itself.
  const closedSoon = (c: net.Socket) => new Promise<boolean>((r) => {
    c.on('error', () => undefined).once('close', () => r(true));
    setTimeout(() => r(false), 10_000).unref();
  });
  const idleEarly = net.connect({ port, host: '127.0.0.1' });
  const idleEarlyClosed = closedSoon(idleEarly);
  await sleep(300);
  assert.is(answer, '', 'nothing answers before a server adopts the port');
  const status = new StatusServer({ port, host: '127.0.0.1', readiness: async () => ({ ready: true, reason: '' }) });
  try {
    await status.start();
    assert.is(status.port, port);
    await ended;
    assert.match(answer, /^HTTP\/1\.1 200 /, answer);
    assert.is((await httpRequest(`http://127.0.0.1:${port}/healthz/ready`)).status, 200, 'later requests too');
  } finally {
    const idleLate = net.connect({ port, host: '127.0.0.1' });
    const idleLateClosed = closedSoon(idleLate);
    await new Promise<void>((r) => idleLate.once('connect', () => r()));
    await sleep(100);
    // Bounded: a server that does not track the connections it was handed never finishes closing.
    await Promise.race([status.close(), sleep(10_000)]);
    assert.ok(await idleEarlyClosed, 'closing the status server ends a connection that waited before it loaded');
    assert.ok(await idleLateClosed, 'and one it accepted itself');
  }
  const refused = await new Promise<string>((r) => net.connect({ port, host: '127.0.0.1' }).once('connect', () => r('connected')).once('error', (e: NodeJS.ErrnoException) => r(e.code ?? '')));
  assert.is(refused, 'ECONNREFUSED', 'closing the status server closes the pre-bound port');
});

test.run();
