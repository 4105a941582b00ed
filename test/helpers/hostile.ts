// Hostile peers for test/hostile-peers.test.ts. This file is two things:
// - run as a program (`node --require tsx/cjs hostile.ts peer`) inside the test's network namespace, it is a peer
//   driven over stdin/stdout (one JSON command a line, one JSON answer a line): an HTTP backend, a client keeping
//   requests flowing through Envoy, readiness probes, and the attacks, which need the namespace's loopback;
// - imported by the test, it starts the "VM" (namespace, dnsmasq, the agent in `proxy --standalone`, two peers).
// Every attack is bounded in connections, bytes and time, and only reaches 127.0.0.1 or a socket file of the agent.

import { type ChildProcess, execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as dgram from 'node:dgram';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as http2 from 'node:http2';
import * as net from 'node:net';
import * as path from 'node:path';
import * as readline from 'node:readline';
import { agentFixture } from './agent-fixture';
import { type DiscoveryProcess, discoveryListening, startDiscoveryProcess } from './discovery-process';
import { type Dnsmasq, ensureDnsTools, startDnsmasq } from './dns';
import { REPO, waitFor } from './harness';
import type { Netns } from './netns';

// ---------------------------------------------------------------------------------------------------------------
// Targets: every socket and port the agent and its servers listen on.

export type Proto = 'http1' | 'grpc' | 'dns' | 'raw';

export interface Target {
  name: string;
  proto: Proto;
  /** A TCP port on 127.0.0.1, a UDP port (`udp`), or a Unix socket path. */
  port?: number;
  udp?: boolean;
  path?: string;
  /** gRPC methods served there (full paths). */
  methods?: string[];
  /** A request path that makes a big response (slow readers). */
  bigPath?: string;
}

export const ADS_SOTW = '/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources';
export const ADS_DELTA = '/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources';
export const SDS_SOTW = '/envoy.service.secret.v3.SecretDiscoveryService/StreamSecrets';
export const SDS_DELTA = '/envoy.service.secret.v3.SecretDiscoveryService/DeltaSecrets';
export const CA_CREATE = '/istio.v1.auth.IstioCertificateService/CreateCertificate';
export const SECRET_TYPE = 'type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret';
export const CDS_TYPE = 'type.googleapis.com/envoy.config.cluster.v3.Cluster';
export const LDS_TYPE = 'type.googleapis.com/envoy.config.listener.v3.Listener';

export function agentTargets(dir: string): Target[] {
  const proxy = path.join(dir, 'proxy');
  return [
    { name: 'status 15020', proto: 'http1', port: 15020, bigPath: '/stats/prometheus' },
    { name: 'Envoy 15021', proto: 'http1', port: 15021, bigPath: '/healthz/ready' },
    { name: 'Envoy 15090', proto: 'http1', port: 15090, bigPath: '/stats/prometheus' },
    { name: 'DNS udp 15053', proto: 'dns', port: 15053, udp: true },
    { name: 'DNS tcp 15053', proto: 'dns', port: 15053 },
    { name: 'SDS socket', proto: 'grpc', path: path.join(dir, 'var/run/secrets/workload-spiffe-uds/socket'), methods: [SDS_SOTW, SDS_DELTA] },
    { name: 'xDS proxy socket', proto: 'grpc', path: path.join(proxy, 'XDS'), methods: [ADS_SOTW, ADS_DELTA] },
    { name: 'discovery server + CA', proto: 'grpc', path: path.join(proxy, 'discovery.sock'), methods: [ADS_SOTW, ADS_DELTA, CA_CREATE] },
    { name: 'lock socket', proto: 'raw', path: path.join(proxy, 'agent.lock.sock') },
    // `pilot-agent discovery` on TCP, as a small fleet runs it (the same server, over the network).
    { name: 'discovery server 15010', proto: 'grpc', port: 15010, methods: [ADS_SOTW, ADS_DELTA, CA_CREATE] },
  ];
}

// ---------------------------------------------------------------------------------------------------------------
// Wire builders: protobuf, gRPC, HTTP/2 frames, DNS packets. Hand-made so that they can be made wrong on purpose.

function varint(n: number): Buffer {
  const out: number[] = [];
  while (n > 0x7f) {
    out.push((n & 0x7f) | 0x80);
    n = Math.floor(n / 128);
  }
  out.push(n);
  return Buffer.from(out);
}

export function pbBytes(field: number, v: Buffer | string): Buffer {
  const b = typeof v === 'string' ? Buffer.from(v) : v;
  return Buffer.concat([varint((field << 3) | 2), varint(b.length), b]);
}

/** A DiscoveryRequest (node id, resource names, type URL); the Delta request has the same first fields' meaning. */
export function discoveryRequest(nodeId: string, typeUrl: string, names: string[] = []): Buffer {
  return Buffer.concat([pbBytes(2, pbBytes(1, nodeId)), ...names.map((n) => pbBytes(3, n)), pbBytes(4, typeUrl)]);
}

/** A DeltaDiscoveryRequest: node 1, type_url 2, resource_names_subscribe 3. */
export function deltaRequest(nodeId: string, typeUrl: string, names: string[] = []): Buffer {
  return Buffer.concat([pbBytes(1, pbBytes(1, nodeId)), pbBytes(2, typeUrl), ...names.map((n) => pbBytes(3, n))]);
}

export function grpcMessage(body: Buffer, opts: { compressed?: boolean; length?: number } = {}): Buffer {
  const h = Buffer.alloc(5);
  h[0] = opts.compressed ? 1 : 0;
  h.writeUInt32BE(opts.length ?? body.length, 1);
  return Buffer.concat([h, body]);
}

const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n');
const T = { DATA: 0, HEADERS: 1, PRIORITY: 2, RST: 3, SETTINGS: 4, PING: 6, GOAWAY: 7, WINDOW: 8, CONT: 9 } as const;

function frame(type: number, flags: number, stream: number, payload: Buffer = Buffer.alloc(0), length?: number): Buffer {
  const h = Buffer.alloc(9);
  h.writeUIntBE((length ?? payload.length) & 0xffffff, 0, 3);
  h[3] = type;
  h[4] = flags;
  h.writeUInt32BE(stream & 0x7fffffff, 5);
  return Buffer.concat([h, payload]);
}

function hpackString(s: string): Buffer {
  const b = Buffer.from(s);
  if (b.length > 126) throw new Error('hpack string too long for this encoder');
  return Buffer.concat([Buffer.from([b.length]), b]);
}

/** An HPACK block for a gRPC POST to `p`: indexed :method POST and :scheme http, literals for the rest. */
function grpcHeaderBlock(p: string): Buffer {
  const lit = (name: string, value: string) => Buffer.concat([Buffer.from([0x00]), hpackString(name), hpackString(value)]);
  return Buffer.concat([
    Buffer.from([0x83, 0x86]),
    Buffer.concat([Buffer.from([0x04]), hpackString(p)]),
    Buffer.concat([Buffer.from([0x01]), hpackString('localhost')]),
    lit('content-type', 'application/grpc'), lit('te', 'trailers'),
  ]);
}

const END_STREAM = 0x1;
const END_HEADERS = 0x4;

/** Raw HTTP/2 byte strings that break the protocol in one way each (sent after a real preface). */
export function badH2(method: string): { label: string; bytes: Buffer }[] {
  const settings = frame(T.SETTINGS, 0, 0);
  const headers = (stream: number, flags = END_HEADERS) => frame(T.HEADERS, flags, stream, grpcHeaderBlock(method));
  const start = Buffer.concat([PREFACE, settings]);
  const cases: { label: string; bytes: Buffer }[] = [
    { label: 'half a preface', bytes: PREFACE.subarray(0, 11) },
    { label: 'a frame header cut short', bytes: Buffer.concat([start, frame(T.PING, 0, 0, Buffer.alloc(8)).subarray(0, 5)]) },
    { label: 'DATA claiming 16 MiB', bytes: Buffer.concat([start, frame(T.DATA, 0, 1, randomBytes(100), 0xffffff)]) },
    { label: 'SETTINGS of 7 bytes', bytes: Buffer.concat([PREFACE, frame(T.SETTINGS, 0, 0, Buffer.alloc(7))]) },
    { label: 'SETTINGS MAX_FRAME_SIZE 1', bytes: Buffer.concat([PREFACE, frame(T.SETTINGS, 0, 0, Buffer.from([0, 5, 0, 0, 0, 1]))]) },
    { label: 'SETTINGS window 2^31', bytes: Buffer.concat([PREFACE, frame(T.SETTINGS, 0, 0, Buffer.from([0, 4, 0x80, 0, 0, 0]))]) },
    { label: 'HEADERS of garbage HPACK', bytes: Buffer.concat([start, frame(T.HEADERS, END_HEADERS, 1, randomBytes(64))]) },
    { label: 'HEADERS on an even stream', bytes: Buffer.concat([start, headers(2)]) },
    { label: 'CONTINUATION without HEADERS', bytes: Buffer.concat([start, frame(T.CONT, END_HEADERS, 1, randomBytes(32))]) },
    { label: 'DATA on stream 0', bytes: Buffer.concat([start, frame(T.DATA, 0, 0, randomBytes(32))]) },
    { label: 'PRIORITY on itself', bytes: Buffer.concat([start, frame(T.PRIORITY, 0, 1, Buffer.from([0, 0, 0, 1, 16]))]) },
    { label: 'window overflow', bytes: Buffer.concat([start, frame(T.WINDOW, 0, 0, Buffer.from([0x7f, 0xff, 0xff, 0xff])), frame(T.WINDOW, 0, 0, Buffer.from([0x7f, 0xff, 0xff, 0xff]))]) },
    { label: 'GOAWAY then more frames', bytes: Buffer.concat([start, frame(T.GOAWAY, 0, 0, randomBytes(20)), headers(1)]) },
    { label: 'gRPC message claiming 4 GiB', bytes: Buffer.concat([start, headers(1), frame(T.DATA, 0, 1, grpcMessage(randomBytes(10), { length: 0xffffffff }))]) },
    { label: 'gRPC message cut short', bytes: Buffer.concat([start, headers(1), frame(T.DATA, END_STREAM, 1, grpcMessage(randomBytes(10), { length: 1000 }))]) },
    { label: 'gRPC prefix cut short', bytes: Buffer.concat([start, headers(1), frame(T.DATA, END_STREAM, 1, Buffer.from([0, 0, 0]))]) },
    { label: 'gRPC compressed flag, no encoding', bytes: Buffer.concat([start, headers(1), frame(T.DATA, END_STREAM, 1, grpcMessage(randomBytes(40), { compressed: true }))]) },
    { label: 'gRPC garbage protobuf', bytes: Buffer.concat([start, headers(1), frame(T.DATA, 0, 1, grpcMessage(randomBytes(300)))]) },
    // CVE-2024-27316: a header block that never ends.
    { label: 'CONTINUATION flood', bytes: Buffer.concat([start, frame(T.HEADERS, 0, 1, grpcHeaderBlock(method)), ...Array.from({ length: 60 }, () => frame(T.CONT, 0, 1, Buffer.alloc(16_000, 0x41)))]) },
    { label: 'PING flood', bytes: Buffer.concat([start, ...Array.from({ length: 2000 }, (_, i) => frame(T.PING, 0, 0, Buffer.alloc(8, i & 0xff)))]) },
    { label: 'SETTINGS flood', bytes: Buffer.concat([PREFACE, ...Array.from({ length: 2000 }, () => settings)]) },
  ];
  return cases;
}

/** CVE-2023-44487: open a stream and cancel it at once, `n` times, in one write. */
export function rapidReset(method: string, n: number): Buffer {
  const open = (stream: number) => frame(T.HEADERS, END_HEADERS, stream, grpcHeaderBlock(method));
  const cancel = (stream: number) => frame(T.RST, 0, stream, Buffer.from([0, 0, 0, 8]));
  return Buffer.concat([PREFACE, frame(T.SETTINGS, 0, 0), ...Array.from({ length: n }, (_, i) => Buffer.concat([open(2 * i + 1), cancel(2 * i + 1)]))]);
}

/** Broken HTTP/1 requests (never a real POST: /quitquitquit from loopback would end the agent, by design). */
export function badHttp1(): { label: string; bytes: Buffer }[] {
  const b = (s: string) => Buffer.from(s, 'latin1');
  return [
    { label: 'body shorter than Content-Length', bytes: b('PUT /healthz/ready HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\nabc') },
    { label: 'two Content-Lengths', bytes: b('PUT /healthz/ready HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd') },
    { label: 'chunk size not hex', bytes: b('PUT /healthz/ready HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n') },
    { label: 'chunk size 2^72', bytes: b('PUT /healthz/ready HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\nabc') },
    { label: 'request line of 70 KB', bytes: b(`GET /${'a'.repeat(70_000)} HTTP/1.1\r\nHost: x\r\n\r\n`) },
    { label: 'one header of 100 KB', bytes: b(`GET /healthz/ready HTTP/1.1\r\nHost: x\r\nX-Big: ${'b'.repeat(100_000)}\r\n\r\n`) },
    { label: '3000 headers', bytes: b(`GET /healthz/ready HTTP/1.1\r\nHost: x\r\n${Array.from({ length: 3000 }, (_, i) => `X-${i}: v`).join('\r\n')}\r\n\r\n`) },
    { label: 'NUL and bare CR in headers', bytes: b('GET /healthz/ready HTTP/1.1\r\nHost: x\0y\r\nX: a\rb\r\n\r\n') },
    { label: 'HTTP/9.9', bytes: b('GET /healthz/ready HTTP/9.9\r\n\r\n') },
    { label: 'absolute URL and ..', bytes: b('GET http://127.0.0.1:15000/../quitquitquit HTTP/1.1\r\nHost: x\r\n\r\n') },
    { label: 'request cut in the request line', bytes: b('GET /stats/promethe') },
    { label: 'request cut in the headers', bytes: b('GET /stats/prometheus HTTP/1.1\r\nHost: x\r\nAccept-Enc') },
    { label: 'h2c upgrade with a bad settings header', bytes: b('GET /healthz/ready HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: !!!!\r\n\r\n') },
    { label: 'HTTP/2 prior knowledge, then garbage', bytes: Buffer.concat([PREFACE, randomBytes(200)]) },
    { label: 'Accept-Encoding of 8 KB', bytes: b(`GET /stats/prometheus HTTP/1.1\r\nHost: x\r\nAccept-Encoding: ${'br;q=0.1, '.repeat(800)}\r\n\r\n`) },
  ];
}

/** A DNS query: id, RD, one question. */
export function dnsQuery(name: string, type = 1, id = Math.floor(Math.random() * 65536)): Buffer {
  const labels = name.split('.').filter(Boolean).map((l) => Buffer.concat([Buffer.from([Buffer.byteLength(l)]), Buffer.from(l)]));
  const h = Buffer.alloc(12);
  h.writeUInt16BE(id, 0);
  h.writeUInt16BE(0x0100, 2);
  h.writeUInt16BE(1, 4);
  const tail = Buffer.alloc(4);
  tail.writeUInt16BE(type, 0);
  tail.writeUInt16BE(1, 2);
  return Buffer.concat([h, ...labels, Buffer.from([0]), tail]);
}

function header(id: number, flags: number, qd: number, an = 0, ns = 0, ar = 0): Buffer {
  const h = Buffer.alloc(12);
  [id, flags, qd, an, ns, ar].forEach((v, i) => h.writeUInt16BE(v, i * 2));
  return h;
}

/** DNS packets with bad lengths, counts and compression pointers. */
export function badDns(): { label: string; bytes: Buffer }[] {
  const q = dnsQuery('web.test.local');
  const type = Buffer.from([0, 1, 0, 1]);
  return [
    { label: 'empty', bytes: Buffer.alloc(0) },
    { label: 'shorter than a header', bytes: randomBytes(7) },
    { label: 'header only, one question claimed', bytes: header(1, 0x0100, 1) },
    { label: '65535 questions claimed', bytes: Buffer.concat([header(2, 0x0100, 0xffff), q.subarray(12)]) },
    { label: 'label running past the end', bytes: Buffer.concat([header(3, 0x0100, 1), Buffer.from([63]), Buffer.from('abc')]) },
    { label: 'pointer to itself', bytes: Buffer.concat([header(4, 0x0100, 1), Buffer.from([0xc0, 12]), type]) },
    { label: 'pointer forward', bytes: Buffer.concat([header(5, 0x0100, 1), Buffer.from([0xc0, 40]), type, Buffer.alloc(30)]) },
    // The answer's name (at 32) points to 34, which points back to 32.
    { label: 'pointer loop in an answer', bytes: Buffer.concat([header(14, 0x0100, 1, 1), q.subarray(12), Buffer.from([0xc0, 34, 0xc0, 32]), type, Buffer.alloc(6)]) },
    { label: 'pointer past the end', bytes: Buffer.concat([header(6, 0x0100, 1), Buffer.from([0xff, 0xff]), type]) },
    { label: 'reserved label type 0x40', bytes: Buffer.concat([header(7, 0x0100, 1), Buffer.from([0x41, 0x61, 0]), type]) },
    { label: 'name of 300 bytes', bytes: Buffer.concat([header(8, 0x0100, 1), ...Array.from({ length: 5 }, () => Buffer.concat([Buffer.from([59]), Buffer.alloc(59, 0x61)])), Buffer.from([0]), type]) },
    { label: 'answer with RDLENGTH 65535', bytes: Buffer.concat([header(9, 0x0100, 1, 1), q.subarray(12), Buffer.from([0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0xff, 0xff, 1, 2, 3, 4])]) },
    { label: 'OPT asking for 65535-byte answers', bytes: Buffer.concat([header(10, 0x0100, 1, 0, 0, 1), q.subarray(12), Buffer.from([0, 0, 41, 0xff, 0xff, 0, 0, 0, 0, 0, 0])]) },
    { label: 'OPT with RDLENGTH past the end', bytes: Buffer.concat([header(11, 0x0100, 1, 0, 0, 1), q.subarray(12), Buffer.from([0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0x10, 0])]) },
    { label: 'a response (QR set)', bytes: Buffer.concat([header(12, 0x8180, 1), q.subarray(12)]) },
    { label: 'opcode UPDATE', bytes: Buffer.concat([header(13, 0x2800, 1), q.subarray(12)]) },
    { label: 'trailing garbage', bytes: Buffer.concat([q, randomBytes(50)]) },
    { label: 'ANY for a mesh name', bytes: dnsQuery('web.test.local', 255) },
    { label: 'AXFR', bytes: dnsQuery('test.local', 252) },
    { label: 'forwarded name (dnsmasq answers)', bytes: dnsQuery(`r${Math.random().toString(36).slice(2)}.test`) },
  ];
}

/** A valid query with a few random bytes changed. */
function mutate(b: Buffer): Buffer {
  const m = Buffer.from(b);
  for (let i = 0, n = 1 + Math.floor(Math.random() * 4); i < n; i++) m[Math.floor(Math.random() * m.length)] = Math.floor(Math.random() * 256);
  return m;
}

function dnsFrame(msg: Buffer, length?: number): Buffer {
  const h = Buffer.alloc(2);
  h.writeUInt16BE(length ?? msg.length);
  return Buffer.concat([h, msg]);
}

// ---------------------------------------------------------------------------------------------------------------
// The peer program: connections, attacks, load.

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const rand = (n: number) => Math.floor(Math.random() * n);

interface Tally {
  connections: number;
  refused: number;
  /** Connections on which the server said something back. */
  answered: number;
}

const held: { destroy(): void }[] = [];

/** RST for TCP (SO_LINGER 0); a Unix socket has no reset: closing it with unread data is the nearest thing. */
function reset(s: net.Socket): void {
  if (s.destroyed) return;
  if (s.remoteAddress) s.resetAndDestroy();
  else s.destroy();
}

/** Connects; resolves with the socket or undefined (refused/failed, counted). The socket never throws on error. */
function open(t: Target, tally: Tally): Promise<net.Socket | undefined> {
  return new Promise((resolve) => {
    const s = t.path ? net.connect({ path: t.path }) : net.connect({ port: t.port!, host: '127.0.0.1' });
    tally.connections++;
    s.on('error', () => undefined);
    s.once('connect', () => resolve(s));
    s.once('close', () => resolve(undefined));
    s.once('error', () => {
      tally.refused++;
      resolve(undefined);
    });
    s.setTimeout(5000, () => s.destroy());
  });
}

/** Writes `bytes`, then ends, resets or holds; resolves when the server closed or `waitMs` passed. */
async function send(t: Target, tally: Tally, bytes: Buffer, after: 'end' | 'reset' | 'wait' = 'end', waitMs = 1500): Promise<void> {
  const s = await open(t, tally);
  if (!s) return;
  let answered = false;
  s.on('data', () => (answered = true));
  const closed = new Promise<void>((r) => s.once('close', () => r()));
  s.write(bytes, () => undefined);
  if (after === 'end') s.end();
  if (after === 'reset') {
    await sleep(rand(20));
    reset(s);
  }
  await Promise.race([closed, sleep(waitMs)]);
  if (answered) tally.answered++;
  s.destroy();
}

async function pool<T>(items: T[], n: number, fn: (x: T) => Promise<void>): Promise<void> {
  let i = 0;
  await Promise.all(Array.from({ length: Math.min(n, items.length) }, async () => {
    while (i < items.length) await fn(items[i++]!);
  }));
}

function udpBlast(port: number, packets: Buffer[], tally: Tally, waitMs = 1000): Promise<void> {
  return new Promise((resolve) => {
    const s = dgram.createSocket('udp4');
    s.on('error', () => undefined);
    s.on('message', () => tally.answered++);
    s.bind(0, '127.0.0.1', async () => {
      for (let i = 0; i < packets.length; i++) {
        tally.connections++;
        s.send(packets[i]!, port, '127.0.0.1');
        if (i % 50 === 49) await sleep(2);
      }
      await sleep(waitMs);
      s.close();
      resolve();
    });
  });
}

/** An HTTP/2 session over the target's socket (gRPC framing done by hand on its streams). */
function h2session(t: Target, tally: Tally): Promise<{ session: http2.ClientHttp2Session; socket: net.Socket } | undefined> {
  return open(t, tally).then((socket) => {
    if (!socket) return undefined;
    const session = http2.connect('http://localhost', { createConnection: () => socket });
    session.on('error', () => undefined);
    return { session, socket };
  });
}

function grpcStream(session: http2.ClientHttp2Session, method: string, extra: http2.OutgoingHttpHeaders = {}): http2.ClientHttp2Stream {
  const st = session.request({ ':method': 'POST', ':path': method, 'content-type': 'application/grpc', te: 'trailers', ...extra });
  st.on('error', () => undefined);
  return st;
}

function requestFor(method: string, i: number, names: string[] = []): Buffer {
  const node = `sidecar~127.0.0.1~hostile-${i}.test~test.svc.cluster.local`;
  if (method === CA_CREATE) return pbBytes(1, '-----BEGIN CERTIFICATE REQUEST-----\ngarbage\n-----END CERTIFICATE REQUEST-----\n');
  const type = method.includes('Secret') ? SECRET_TYPE : CDS_TYPE;
  return method.endsWith('Delta') || method.includes('Delta') ? deltaRequest(node, type, names) : discoveryRequest(node, type, names);
}

/** Waits for a stream to end (or ms), then cancels it. Resolves true when the server answered anything. */
function settle(st: http2.ClientHttp2Stream, ms: number): Promise<boolean> {
  return new Promise((resolve) => {
    let answered = false;
    st.on('response', () => (answered = true));
    st.on('data', () => (answered = true));
    const done = () => {
      clearTimeout(timer);
      if (!st.destroyed) st.close(http2.constants.NGHTTP2_CANCEL);
      resolve(answered);
    };
    const timer = setTimeout(done, ms);
    st.once('close', done);
    st.resume();
  });
}

/** Well-framed gRPC calls whose messages are wrong. */
async function grpcBadMessages(t: Target, tally: Tally, only?: RegExp): Promise<void> {
  const c = await h2session(t, tally);
  if (!c) return;
  const calls: Promise<boolean>[] = [];
  const call = (label: string, m: string, headers: http2.OutgoingHttpHeaders, body?: Buffer, ms = 2000) => {
    if (only && !only.test(label)) return;
    const st = c.session.request({ ':method': 'POST', ':path': m, 'content-type': 'application/grpc', te: 'trailers', ...headers });
    st.on('error', () => undefined);
    st.end(body);
    calls.push(settle(st, ms));
  };
  for (const m of t.methods ?? []) {
    call('msg random protobuf', m, {}, grpcMessage(randomBytes(200)));
    call('msg 20 small ones', m, {}, Buffer.concat(Array.from({ length: 20 }, () => grpcMessage(randomBytes(rand(100))))));
    call('msg claims 2 GiB', m, {}, grpcMessage(randomBytes(10), { length: 0x7fffffff }));
    call('msg prefix cut', m, {}, Buffer.from([0, 0, 0]));
    call('msg compressed, no encoding', m, {}, grpcMessage(randomBytes(30), { compressed: true }));
    call('msg bad gzip', m, { 'grpc-encoding': 'gzip' }, grpcMessage(randomBytes(30), { compressed: true }));
    call('msg unknown encoding', m, { 'grpc-encoding': 'br' }, grpcMessage(randomBytes(30), { compressed: true }));
    // Over the 4 MiB gRPC servers take by default (the xDS proxy and the discovery server take more).
    call('msg of 8 MiB', m, {}, grpcMessage(randomBytes(8 << 20)));
    call('msg token of 30 KB', m, { authorization: `Bearer ${'t'.repeat(30_000)}` }, grpcMessage(requestFor(m, 0)));
    call('msg bad grpc-timeout', m, { 'grpc-timeout': 'garbage' }, grpcMessage(requestFor(m, 1)));
    // Valid framing, field types crossed: a varint where the node is, then a name of 100 KB.
    call('msg crossed field types', m, {}, grpcMessage(Buffer.concat([Buffer.from([0x10, 0xff, 0xff, 0xff, 0xff, 0x0f]), pbBytes(3, 'x'.repeat(100_000))])));
    call('msg wrong content-type', m, { 'content-type': 'text/plain' }, Buffer.from('hello'), 1000);
    call('msg GET', m, { ':method': 'GET' }, undefined, 1000);
  }
  call('msg unknown method', '/no.such.Service/Method', {}, grpcMessage(randomBytes(10)), 1000);
  const answers = await Promise.all(calls);
  if (answers.some(Boolean)) tally.answered++;
  c.session.destroy();
  c.socket.destroy();
}

export type Attack = 'random' | 'frames' | 'half-open' | 'reset-mid-write' | 'slow-reader' | 'many-streams' | 'storm' | 'scrape-flood' | 'rapid-reset';

/** One attack on one target; resolves with a tally. Held sockets stay open until release(). */
async function attack(kind: Attack, t: Target): Promise<Tally> {
  const tally: Tally = { connections: 0, refused: 0, answered: 0 };
  switch (kind) {
    case 'random': {
      if (t.udp) {
        await udpBlast(t.port!, Array.from({ length: 400 }, () => randomBytes(1 + rand(1400))), tally);
        break;
      }
      await pool(Array.from({ length: 16 }, (_, i) => i), 8, (i) => send(t, tally, randomBytes(1 + rand(i % 4 === 0 ? 256 : 65_536)), i % 2 ? 'end' : 'reset', 800));
      break;
    }
    case 'frames': {
      if (t.proto === 'dns') {
        const bad = badDns().map((c) => c.bytes);
        const fuzz = Array.from({ length: 300 }, () => mutate(dnsQuery(rand(2) ? 'web.test.local' : 'web')));
        if (t.udp) await udpBlast(t.port!, [...bad, ...fuzz], tally);
        else {
          await pool(bad, 8, (b) => send(t, tally, dnsFrame(b), 'end', 600));
          await send(t, tally, Buffer.concat(fuzz.map((b) => dnsFrame(b))), 'end', 1500);
          await send(t, tally, dnsFrame(randomBytes(10), 0xffff), 'end', 600);
          await send(t, tally, Buffer.concat(Array.from({ length: 200 }, () => dnsFrame(Buffer.alloc(0)))), 'end', 600);
          await send(t, tally, dnsFrame(dnsQuery('web.test.local'), 5), 'end', 600);
          // A length prefix split over two writes.
          const s = await open(t, tally);
          if (s) {
            const q = dnsFrame(dnsQuery('web.test.local'));
            s.write(q.subarray(0, 1));
            await sleep(50);
            s.end(q.subarray(1));
            await sleep(300);
            s.destroy();
          }
        }
      } else if (t.proto === 'http1') {
        await pool(badHttp1(), 6, (c) => send(t, tally, c.bytes, 'end', 1000));
        await pool(badH2('/x'), 6, (c) => send(t, tally, c.bytes, 'end', 600));
      } else if (t.proto === 'grpc') {
        const only = process.env.HOSTILE_CASES ? new RegExp(process.env.HOSTILE_CASES) : undefined;
        await pool(t.methods!.flatMap((m) => badH2(m)).filter((c) => !only || only.test(c.label)), 6, (c) => send(t, tally, c.bytes, 'end', 1000));
        await grpcBadMessages(t, tally, only);
      } else {
        await pool([randomBytes(10), Buffer.alloc(1 << 20), Buffer.from('GET / HTTP/1.1\r\n\r\n'), PREFACE], 4, (b) => send(t, tally, b, 'end', 500));
      }
      break;
    }
    case 'half-open': {
      if (t.udp) break;
      const prefix = t.proto === 'http1' ? Buffer.from('GET /healthz/ready HTTP/1.1\r\nHost') : t.proto === 'grpc' ? PREFACE : t.proto === 'dns' ? dnsFrame(dnsQuery('web.test.local')).subarray(0, 9) : Buffer.alloc(0);
      await pool(Array.from({ length: 40 }, (_, i) => i), 10, async (i) => {
        const s = await open(t, tally);
        if (!s) return;
        s.setTimeout(0);
        s.on('data', () => undefined);
        if (i % 3 !== 2) s.write(prefix);
        // A third half-closed after the prefix (FIN, still reading), the rest left open.
        if (i % 3 === 0) s.end();
        held.push(s);
      });
      break;
    }
    case 'reset-mid-write': {
      if (t.udp) break;
      const big = randomBytes(2 << 20);
      const bodies: Buffer[] = t.proto === 'http1'
        ? [Buffer.concat([Buffer.from(`PUT /healthz/ready HTTP/1.1\r\nHost: x\r\nContent-Length: ${big.length * 2}\r\n\r\n`), big])]
        : t.proto === 'grpc'
          ? [Buffer.concat([PREFACE, frame(T.SETTINGS, 0, 0), frame(T.HEADERS, END_HEADERS, 1, grpcHeaderBlock(t.methods![0]!)), ...Array.from({ length: 100 }, () => frame(T.DATA, 0, 1, big.subarray(0, 16_000)))])]
          : t.proto === 'dns'
            ? [Buffer.concat(Array.from({ length: 500 }, () => dnsFrame(dnsQuery('web.test.local'))))]
            : [big];
      await pool(Array.from({ length: 12 }, (_, i) => i), 6, async (i) => {
        const s = await open(t, tally);
        if (!s) return;
        s.write(bodies[0]!);
        await sleep(i % 4 === 0 ? 0 : rand(30));
        reset(s);
      });
      // A reset while the server writes its answer.
      if (t.proto === 'http1') {
        await pool(Array.from({ length: 12 }, (_, i) => i), 6, async () => {
          const s = await open(t, tally);
          if (!s) return;
          s.write(`GET ${t.bigPath} HTTP/1.1\r\nHost: x\r\n\r\n`);
          await new Promise<void>((r) => {
            s.once('data', () => r());
            setTimeout(r, 1500);
          });
          reset(s);
        });
      }
      if (t.proto === 'grpc') {
        await pool(Array.from({ length: 6 }, (_, i) => i), 3, async (i) => {
          const c = await h2session(t, tally);
          if (!c) return;
          for (const m of t.methods!) grpcStream(c.session, m).write(grpcMessage(requestFor(m, i, m.includes('Secret') ? ['ROOTCA', 'default'] : [])));
          await sleep(100 + rand(300));
          reset(c.socket);
          c.session.destroy();
        });
      }
      break;
    }
    case 'slow-reader': {
      if (t.udp) break;
      if (t.proto === 'http1') {
        await pool(Array.from({ length: 10 }, (_, i) => i), 5, async () => {
          const s = await open(t, tally);
          if (!s) return;
          s.setTimeout(0);
          s.pause();
          s.write(`GET ${t.bigPath} HTTP/1.1\r\nHost: x\r\n\r\n`.repeat(3));
          held.push(s);
        });
      } else if (t.proto === 'grpc') {
        for (let i = 0; i < 4; i++) {
          const c = await h2session(t, tally);
          if (!c) continue;
          c.socket.setTimeout(0);
          for (const m of t.methods!) {
            const st = grpcStream(c.session, m);
            st.pause();
            const names = m.includes('Secret') ? ['ROOTCA', 'default'] : m.includes('Delta') ? ['*'] : [];
            st.write(grpcMessage(requestFor(m, 100 + i, names)));
            if (m === ADS_SOTW) st.write(grpcMessage(discoveryRequest(`sidecar~127.0.0.1~hostile-${100 + i}.test~test.svc.cluster.local`, LDS_TYPE)));
          }
          c.socket.pause();
          held.push(c.session, c.socket);
        }
      } else if (t.proto === 'dns') {
        await pool(Array.from({ length: 4 }, (_, i) => i), 4, async () => {
          const s = await open(t, tally);
          if (!s) return;
          s.setTimeout(0);
          s.pause();
          s.write(Buffer.concat(Array.from({ length: 3000 }, () => dnsFrame(dnsQuery('web.test.local', 1, rand(65536))))));
          held.push(s);
        });
      } else {
        for (let i = 0; i < 20; i++) {
          const s = await open(t, tally);
          if (!s) continue;
          s.pause();
          held.push(s);
        }
      }
      break;
    }
    case 'many-streams': {
      if (t.proto === 'dns') {
        if (t.udp) await udpBlast(t.port!, Array.from({ length: 1500 }, (_, i) => dnsQuery(i % 3 ? 'web.test.local' : `web.test.local.test.svc.cluster.local`)), tally, 1500);
        else {
          await pool(Array.from({ length: 40 }, (_, i) => i), 20, async () => {
            const s = await open(t, tally);
            if (!s) return;
            s.on('data', () => undefined);
            s.end(Buffer.concat(Array.from({ length: 25 }, () => dnsFrame(dnsQuery('web.test.local')))));
            await new Promise<void>((r) => {
              s.once('close', () => r());
              setTimeout(r, 2000);
            });
            s.destroy();
          });
        }
      } else if (t.proto === 'http1') {
        const agent = new http.Agent({ keepAlive: true, maxSockets: 100 });
        await pool(Array.from({ length: 200 }, (_, i) => i), 100, (i) => new Promise<void>((r) => {
          tally.connections++;
          // A big page one time in ten: 400 scrapes at once is the scrape flood's round.
          const p = i % 10 === 0 ? t.bigPath : i % 2 ? '/healthz/ready' : '/no/such/path';
          const req = http.get(`http://127.0.0.1:${t.port}${p}`, { agent, timeout: 5000 }, (res) => {
            tally.answered++;
            res.resume();
            res.on('end', () => r());
            res.on('error', () => r());
          });
          req.on('timeout', () => req.destroy());
          req.on('error', () => r());
        }));
        agent.destroy();
      } else if (t.proto === 'grpc') {
        const sessions = await Promise.all(Array.from({ length: 2 }, () => h2session(t, tally)));
        const streams: Promise<boolean>[] = [];
        sessions.forEach((c, si) => {
          if (!c) return;
          for (let i = 0; i < 100; i++) {
            const m = t.methods![i % t.methods!.length]!;
            const st = grpcStream(c.session, m);
            st.write(grpcMessage(requestFor(m, si * 1000 + i, m.includes('Secret') ? ['ROOTCA'] : [])));
            streams.push(settle(st, 1500));
          }
        });
        if ((await Promise.all(streams)).some(Boolean)) tally.answered++;
        for (const c of sessions) {
          c?.session.destroy();
          c?.socket.destroy();
        }
      } else {
        await pool(Array.from({ length: 100 }, (_, i) => i), 100, async () => {
          const s = await open(t, tally);
          if (!s) return;
          s.on('data', () => undefined);
          await sleep(200);
          s.destroy();
        });
      }
      break;
    }
    case 'rapid-reset': {
      if (t.proto !== 'grpc') break;
      // 500 a method: grpc-js alone spends about a second on them on two loaded cores (nghttp2 answers more than
      // 1000 resets on one connection with GOAWAY). On the xDS socket each also opened an upstream connection
      // (test/hostile-peers.md, finding 2, fixed), which made this round fail on a loaded machine.
      await pool(t.methods!, 3, (m) => send(t, tally, rapidReset(m, 500), 'end', 1500));
      break;
    }
    case 'scrape-flood': {
      // Scrapes of the big page at once, 4 pipelined on each connection, never read (few enough that the answers fit
      // in the socket buffers, so every one is served): what any host that reaches the port can send. 1000 on the
      // agent's 15020, which can answer concurrent scrapes from one fetch of Envoy's stats; 400 on Envoy's 15090,
      // whose admin thread (which also answers the agent's readiness checks) serves each one.
      if (t.proto !== 'http1') break;
      await pool(Array.from({ length: t.port === 15020 ? 250 : 100 }, (_, i) => i), 25, async () => {
        const s = await open(t, tally);
        if (!s) return;
        s.setTimeout(0);
        s.pause();
        s.write(`GET ${t.bigPath} HTTP/1.1\r\nHost: x\r\n\r\n`.repeat(4));
        held.push(s);
      });
      break;
    }
    case 'storm': {
      if (t.udp) break;
      await pool(Array.from({ length: 400 }, (_, i) => i), 16, async (i) => {
        const s = await open(t, tally);
        if (!s) return;
        if (i % 2) reset(s);
        else s.end();
        s.destroy();
      });
      break;
    }
  }
  return tally;
}

/** SDS names that name files (a FIFO, a device, a directory) and thousands of names on one stream. */
async function sdsFileNames(t: Target, dir: string, count: number): Promise<Tally> {
  const tally: Tally = { connections: 0, refused: 0, answered: 0 };
  const c = await h2session(t, tally);
  if (!c) return tally;
  const names = [`file-root:${path.join(dir, 'fifo')}`, 'file-root:/dev/zero', `file-root:${dir}`, `file-cert:/dev/zero~${path.join(dir, 'fifo')}`,
    ...Array.from({ length: count }, (_, i) => `file-root:${path.join(dir, `missing-${i}.pem`)}`)];
  const st = grpcStream(c.session, SDS_SOTW);
  st.write(grpcMessage(discoveryRequest('sidecar~127.0.0.1~hostile-sds.test~test.svc.cluster.local', SECRET_TYPE, names)));
  const answered = await settle(st, 1500);
  if (answered) tally.answered++;
  c.session.destroy();
  c.socket.destroy();
  return tally;
}

/** CA calls with wrong tokens, no token, a garbage CSR, a CSR of 3 MB, 50 at once. */
async function caAbuse(t: Target): Promise<Tally> {
  const tally: Tally = { connections: 0, refused: 0, answered: 0 };
  const c = await h2session(t, tally);
  if (!c) return tally;
  const calls: Promise<boolean>[] = [];
  const cases: [http2.OutgoingHttpHeaders, Buffer][] = [
    [{}, pbBytes(1, 'garbage')],
    [{ authorization: 'Bearer wrong' }, pbBytes(1, 'garbage')],
    [{ authorization: 'Bearer client-token' }, pbBytes(1, 'garbage')],
    [{ authorization: 'Bearer client-token' }, pbBytes(1, `-----BEGIN CERTIFICATE REQUEST-----\n${randomBytes(3 << 20).toString('base64')}\n-----END CERTIFICATE REQUEST-----\n`)],
    [{ authorization: 'Bearer client-token' }, Buffer.concat([pbBytes(1, 'x'), Buffer.from([0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01])])],
    [{ authorization: 'Basic Y2xpZW50LXRva2Vu' }, pbBytes(1, 'garbage')],
    [{ authorization: `Bearer ${'\u00ff'.repeat(100)}` }, pbBytes(1, '')],
  ];
  for (let i = 0; i < 50; i++) cases.push([{ authorization: 'Bearer client-token' }, pbBytes(1, randomBytes(500).toString('latin1'))]);
  for (const [h, body] of cases) {
    const st = grpcStream(c.session, CA_CREATE, h);
    st.end(grpcMessage(body));
    calls.push(settle(st, 3000));
  }
  if ((await Promise.all(calls)).some(Boolean)) tally.answered++;
  c.session.destroy();
  c.socket.destroy();
  return tally;
}

/**
 * UDP datagrams to 127.0.0.1:port from source port 0, which no ordinary socket can send: a raw socket can (root, or
 * CAP_NET_RAW, which Docker gives every container by default). Node has no raw sockets; perl-base (Essential in
 * Debian, so on every host the suite runs on) has them.
 */
function udpFromPortZero(port: number, packets: string[]): string {
  const pl = [
    'use Socket;',
    'socket(my $s, PF_INET, SOCK_RAW, 17) or die "raw socket: $!";',
    'my $port = shift @ARGV;',
    'my $to = sockaddr_in(0, inet_aton("127.0.0.1"));',
    'for my $h (@ARGV) { my $p = pack("H*", $h); send($s, pack("nnnn", 0, $port, 8 + length($p), 0) . $p, 0, $to) or die "send: $!"; }',
    'print scalar(@ARGV), "\n";',
  ].join('\n');
  try {
    return execFileSync('perl', ['-e', pl, String(port), ...packets], { encoding: 'utf8', timeout: 10_000 }).trim();
  } catch (e) {
    throw new Error(`raw UDP from port 0 could not be sent: ${(e as Error).message}`);
  }
}

/**
 * An app whose gRPC health service misbehaves (the agent probes it for kubelet's /app-health/ paths): each call gets
 * the next answer of a list, a malformed grpc-message first.
 */
function hostileApp(port: number): Promise<number> {
  const answers: ((st: http2.ServerHttp2Stream) => void)[] = [
    (st) => trailers(st, { 'grpc-status': '14', 'grpc-message': '%E0%A4%A' }),
    (st) => trailers(st, { 'grpc-status': 'garbage' }),
    (st) => {
      st.respond({ ':status': 200, 'content-type': 'application/grpc', 'grpc-status': '0', 'grpc-message': '%%%' }, { endStream: true });
    },
    (st) => st.close(http2.constants.NGHTTP2_INTERNAL_ERROR),
    // OK with a serving status no enum has, and OK with a message whose length prefix claims 4 GiB.
    (st) => trailers(st, { 'grpc-status': '0' }, grpcMessage(Buffer.from([0x08, 0x05]))),
    (st) => trailers(st, { 'grpc-status': '0' }, grpcMessage(Buffer.from([0x08, 0x02]), { length: 0xffffffff })),
    (st) => {
      st.respond({ ':status': 200, 'content-type': 'application/grpc' });
      st.end(Buffer.alloc(200_000, 1));
    },
  ];
  let n = 0;
  const server = http2.createServer();
  server.on('stream', (st) => {
    st.on('error', () => undefined);
    answers[n++ % answers.length]!(st);
  });
  server.on('sessionError', () => undefined);
  held.push({ destroy: () => server.close() });
  // Its HTTP health page (port + 1): a Location that is no URL, a redirect loop, 20 MB, a header of 60 KB, a reset,
  // a status line of garbage, no answer at all.
  const bad: ((req: http.IncomingMessage, res: http.ServerResponse) => void)[] = [
    (_q, res) => res.writeHead(302, { location: 'http://[::1' }).end(),
    (q, res) => res.writeHead(302, { location: q.url + 'x' }).end(),
    (_q, res) => {
      res.writeHead(500);
      const chunk = Buffer.alloc(1 << 20, 0x61);
      let left = 20;
      const more = () => {
        while (left > 0 && res.write(chunk)) left--;
        if (left-- > 0) res.once('drain', more);
        else res.end();
      };
      res.on('error', () => undefined);
      more();
    },
    (_q, res) => res.writeHead(503, { 'x-big': 'b'.repeat(60_000) }).end(),
    (q) => reset(q.socket),
    (q) => q.socket.end('HTTP/1.1 abc garbage\r\n\r\n'),
    () => undefined,
  ];
  let m = 0;
  const web = http.createServer((req, res) => bad[m++ % bad.length]!(req, res));
  web.on('clientError', (_e, s) => s.destroy());
  held.push({ destroy: () => web.closeAllConnections() }, { destroy: () => web.close() });
  return Promise.all([
    new Promise<void>((r) => server.listen(port, '0.0.0.0', () => r())),
    new Promise<void>((r) => web.listen(port + 1, '0.0.0.0', () => r())),
  ]).then(() => port);
}

function trailers(st: http2.ServerHttp2Stream, t: http2.OutgoingHttpHeaders, body = grpcMessage(Buffer.from([8, 1]))): void {
  st.respond({ ':status': 200, 'content-type': 'application/grpc' }, { waitForTrailers: true });
  st.on('wantTrailers', () => st.sendTrailers(t));
  st.end(body);
}

function release(): number {
  const n = held.length;
  for (const h of held.splice(0)) h.destroy();
  return n;
}

// --- load and probes ---

interface LoadState {
  ok: number;
  failed: number;
  errors: string[];
  running: boolean;
  workers: Promise<void>[];
  agent: http.Agent;
}

let load: LoadState | undefined;

function startLoad(url: string, concurrency: number, pauseMs: number): void {
  const agent = new http.Agent({ keepAlive: true, maxSockets: concurrency });
  const st: LoadState = { ok: 0, failed: 0, errors: [], running: true, workers: [], agent };
  const one = () => new Promise<void>((resolve) => {
    const fail = (why: string) => {
      st.failed++;
      if (st.errors.length < 20) st.errors.push(`${new Date().toISOString()} ${why}`);
      resolve();
    };
    const req = http.get(url, { agent, timeout: 10_000 }, (res) => {
      let body = '';
      res.on('data', (d) => (body += d));
      res.on('end', () => {
        if (res.statusCode === 200 && body === 'ok') st.ok++;
        else fail(`HTTP ${res.statusCode}: ${body.slice(0, 200)}`);
        resolve();
      });
      res.on('error', (e) => fail(`response: ${e.message}`));
    });
    req.on('timeout', () => req.destroy(new Error('timeout after 10 s')));
    req.on('error', (e) => fail(`request: ${e.message}`));
  });
  for (let i = 0; i < concurrency; i++) {
    st.workers.push((async () => {
      while (st.running) {
        await one();
        await sleep(pauseMs);
      }
    })());
  }
  load = st;
}

function get(url: string, timeoutMs: number): Promise<{ status: number; body: string; ms: number }> {
  const t0 = Date.now();
  return new Promise((resolve) => {
    const req = http.get(url, { timeout: timeoutMs, agent: false }, (res) => {
      let body = '';
      res.on('data', (d) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body, ms: Date.now() - t0 }));
      res.on('error', (e) => resolve({ status: 0, body: e.message, ms: Date.now() - t0 }));
    });
    req.on('timeout', () => req.destroy(new Error(`no answer within ${timeoutMs} ms`)));
    req.on('error', (e) => resolve({ status: 0, body: e.message, ms: Date.now() - t0 }));
  });
}

// A prober as kubelet runs one (timeoutSeconds 1), more often than kubelet would (every 250 ms): the pod is unready
// after failureThreshold (3) failures in a row.
export interface ProbeStats {
  probes: number;
  failed: number;
  /** The longest run of failures in a row. */
  maxInARow: number;
  inARow: number;
  worstMs: number;
  lastOkAt: number;
  failures: string[];
}

let probe: (ProbeStats & { running: boolean; done?: Promise<void> }) | undefined;

function startProbe(url: string, periodMs: number, timeoutMs: number): void {
  const st: NonNullable<typeof probe> = { probes: 0, failed: 0, maxInARow: 0, inARow: 0, worstMs: 0, lastOkAt: 0, failures: [], running: true };
  probe = st;
  st.done = (async () => {
    while (st.running) {
      const t0 = Date.now();
      const r = await get(url, timeoutMs);
      st.probes++;
      st.worstMs = Math.max(st.worstMs, r.ms);
      if (r.status === 200 && r.ms <= timeoutMs) {
        st.inARow = 0;
        st.lastOkAt = Date.now();
      } else {
        st.failed++;
        st.maxInARow = Math.max(st.maxInARow, ++st.inARow);
        if (st.failures.length < 10) st.failures.push(`${new Date(t0).toISOString()} ${r.status} after ${r.ms} ms: ${r.body.trim().slice(0, 200)}`);
      }
      await sleep(Math.max(0, periodMs - (Date.now() - t0)));
    }
  })();
}

/** The prober's tally since the last take (a run of failures in progress carries over). */
function takeProbe(): ProbeStats | undefined {
  if (!probe) return undefined;
  const { running: _r, done: _d, ...out } = probe;
  Object.assign(probe, { probes: 0, failed: 0, maxInARow: probe.inARow, worstMs: 0, failures: [] });
  return { ...out, failures: [...out.failures] };
}

type Command =
  | { op: 'backend'; port: number }
  | { op: 'load'; url: string; concurrency: number; pauseMs: number }
  | { op: 'load-stats' }
  | { op: 'load-stop' }
  | { op: 'get'; url: string; timeoutMs: number }
  | { op: 'probe'; url: string; periodMs: number; timeoutMs: number }
  | { op: 'probe-stats' }
  | { op: 'probe-stop' }
  | { op: 'attack'; kind: Attack; targets: Target[]; oneByOne?: boolean }
  | { op: 'sds-files'; target: Target; dir: string; count: number }
  | { op: 'ca'; target: Target }
  | { op: 'udp-port-zero'; port: number; packets: string[] }
  | { op: 'hostile-app'; port: number }
  | { op: 'release' };

async function run(cmd: Command): Promise<unknown> {
  switch (cmd.op) {
    case 'backend': {
      const server = http.createServer((req, res) => {
        req.resume();
        res.end('ok');
      });
      await new Promise<void>((r) => server.listen(cmd.port, '127.0.0.1', () => r()));
      return true;
    }
    case 'load':
      startLoad(cmd.url, cmd.concurrency, cmd.pauseMs);
      return true;
    case 'load-stats':
      return load && { ok: load.ok, failed: load.failed, errors: load.errors };
    case 'load-stop': {
      if (!load) return undefined;
      load.running = false;
      await Promise.all(load.workers);
      load.agent.destroy();
      return { ok: load.ok, failed: load.failed, errors: load.errors };
    }
    case 'get':
      return get(cmd.url, cmd.timeoutMs);
    case 'probe':
      startProbe(cmd.url, cmd.periodMs, cmd.timeoutMs);
      return true;
    case 'probe-stats':
      return takeProbe();
    case 'probe-stop':
      if (probe) {
        probe.running = false;
        await probe.done;
      }
      return takeProbe();
    case 'attack': {
      const out: Record<string, Tally> = {};
      if (cmd.oneByOne) for (const t of cmd.targets) out[t.name] = await attack(cmd.kind, t);
      else await Promise.all(cmd.targets.map(async (t) => (out[t.name] = await attack(cmd.kind, t))));
      return out;
    }
    case 'sds-files':
      return sdsFileNames(cmd.target, cmd.dir, cmd.count);
    case 'ca':
      return caAbuse(cmd.target);
    case 'udp-port-zero':
      return udpFromPortZero(cmd.port, cmd.packets);
    case 'hostile-app':
      return hostileApp(cmd.port);
    case 'release':
      return release();
  }
}

function peerMain(): void {
  const rl = readline.createInterface({ input: process.stdin });
  rl.on('line', (line) => {
    const { id, cmd } = JSON.parse(line) as { id: number; cmd: Command };
    run(cmd).then(
      (value) => process.stdout.write(`${JSON.stringify({ id, value })}\n`),
      (e: Error) => process.stdout.write(`${JSON.stringify({ id, error: e.stack ?? e.message })}\n`),
    );
  });
  rl.on('close', () => process.exit(0));
}

if (require.main === module && process.argv[2] === 'peer') peerMain();

// ---------------------------------------------------------------------------------------------------------------
// The test's side: a peer process in the namespace, driven by calls.

export interface Peer {
  proc: ChildProcess;
  call<T = unknown>(cmd: Command, timeoutMs?: number): Promise<T>;
  stop(): Promise<void>;
}

export function startPeer(spawnIn: (cmd: string, args: string[]) => ChildProcess): Peer {
  const proc = spawnIn(process.execPath, ['--require', 'tsx/cjs', __filename, 'peer']);
  const waiting = new Map<number, { resolve(v: unknown): void; reject(e: Error): void }>();
  let next = 1;
  let err = '';
  proc.stderr!.on('data', (d) => (err = (err + d).slice(-4000)));
  const exited = new Promise<void>((r) => proc.once('exit', () => {
    for (const w of waiting.values()) w.reject(new Error(`peer exited: ${err}`));
    r();
  }));
  readline.createInterface({ input: proc.stdout! }).on('line', (line) => {
    const m = JSON.parse(line) as { id: number; value?: unknown; error?: string };
    const w = waiting.get(m.id);
    waiting.delete(m.id);
    if (m.error) w?.reject(new Error(m.error));
    else w?.resolve(m.value);
  });
  return {
    proc,
    call<T>(cmd: Command, timeoutMs = 30_000): Promise<T> {
      const id = next++;
      return new Promise<T>((resolve, reject) => {
        const timer = setTimeout(() => {
          waiting.delete(id);
          reject(new Error(`peer: ${cmd.op} took over ${timeoutMs} ms`));
        }, timeoutMs);
        waiting.set(id, {
          resolve: (v) => {
            clearTimeout(timer);
            resolve(v as T);
          },
          reject: (e) => {
            clearTimeout(timer);
            reject(e);
          },
        });
        proc.stdin!.write(`${JSON.stringify({ id, cmd })}\n`);
      });
    },
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.stdin!.end();
        const t = setTimeout(() => proc.kill('SIGKILL'), 3000);
        await exited;
        clearTimeout(t);
      }
    },
  };
}

/** Makes a FIFO (the SDS round names it; the agent must never block on it). */
export function mkfifo(p: string): void {
  // No mkfifo in Node's fs; mkfifo(1) is in coreutils.
  execFileSync('mkfifo', [p]);
  fs.chmodSync(p, 0o644);
}

// ---------------------------------------------------------------------------------------------------------------
// The "VM": a network namespace with dnsmasq as its resolver, the agent in `proxy --standalone` with DNS capture
// and the embedded CA, a backend behind Envoy's 8080 listener, and two peers (a client keeping requests flowing,
// and the attacker).

export const SERVICE = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: web, namespace: test }
spec:
  hosts: [web.test.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{ number: 8080, name: http, protocol: HTTP }]
  endpoints: [{ address: 127.0.0.1, ports: { http: 9081 } }]
---
# Never called: its mTLS cluster makes Envoy ask for the workload certificate at start (as a meshed sidecar does),
# so readiness does not depend on a peer's first SDS request.
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: peer, namespace: test }
spec:
  hosts: [peer.test.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{ number: 8081, name: http, protocol: HTTP }]
  endpoints: [{ address: 127.0.0.1, ports: { http: 9082 }, labels: { security.istio.io/tlsMode: istio }, serviceAccount: server }]
`;

export interface HostileVm {
  ns: Netns;
  dir: string;
  agent: ChildProcess;
  /** `pilot-agent discovery` on 127.0.0.1:15010. */
  discovery: ChildProcess;
  /** How `pilot-agent discovery` ended, once stop() has stopped it. */
  discoveryExit(): { code: number | null; signal: NodeJS.Signals | null } | undefined;
  /** What stop() found in configPath after the agent exited. */
  leftInConfigPath(): string[];
  /** The client: backend, load, probes. */
  client: Peer;
  attacker: Peer;
  targets: Target[];
  log(): string;
  status(p: string, timeoutMs?: number): Promise<{ status: number; body: string; ms: number }>;
  /** SIGTERM, then SIGKILL after `graceMs`; the exit. Everything the VM started is gone after it. */
  stop(graceMs?: number): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

export async function startHostileVm(): Promise<HostileVm> {
  ensureDnsTools();
  const fixture = await agentFixture({
    prefix: 'pa-hostile-',
    netns: { files: { 'resolv.conf': 'nameserver 127.0.0.1\nsearch test.svc.cluster.local\n' }, ip: '10.99.0.2/24' },
  });
  const ns = fixture.netns!;
  const tmp = fixture.dir;
  let dnsmasq: Dnsmasq | undefined;
  let spawned = false;
  let discovery: DiscoveryProcess | undefined;
  let discoveryResult: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  let left: string[] = [];
  const peers: Peer[] = [];
  const stop = async (graceMs = 15_000) => {
    let result: { code: number | null; signal: NodeJS.Signals | null } = { code: null, signal: null };
    if (spawned) {
      const { proc, exited } = fixture.agent;
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill('SIGTERM');
        const t = setTimeout(() => proc.kill('SIGKILL'), graceMs);
        result = await exited;
        clearTimeout(t);
      } else result = await exited;
    }
    if (discovery) {
      await discovery.stop();
      discoveryResult = { code: discovery.proc.exitCode, signal: discovery.proc.signalCode };
    }
    for (const p of peers) await p.stop();
    await dnsmasq?.stop();
    try {
      left = fs.readdirSync(path.join(tmp.path, 'proxy'));
    } catch {
      left = [];
    }
    await fixture.close();
    return result;
  };
  try {
    dnsmasq = await startDnsmasq([], { netns: ns, port: 53, listen: '127.0.0.1' });
    const config = path.join(tmp.path, 'mesh');
    fs.mkdirSync(path.join(config, 'ca', 'identities', 'test'), { recursive: true });
    fs.writeFileSync(path.join(config, 'ca', 'identities', 'test', 'client'), 'client-token\n', { mode: 0o600 });
    fs.mkdirSync(path.join(tmp.path, 'var/run/secrets/tokens'), { recursive: true });
    fs.writeFileSync(path.join(tmp.path, 'var/run/secrets/tokens/istio-token'), 'client-token');
    fs.writeFileSync(path.join(config, 'web.yaml'), SERVICE);
    fs.mkdirSync(path.join(tmp.path, 'files'));
    mkfifo(path.join(tmp.path, 'files', 'fifo'));
    const peerEnv = { PATH: process.env.PATH ?? '/usr/bin:/bin', ...(process.env.HOSTILE_CASES && { HOSTILE_CASES: process.env.HOSTILE_CASES }) };
    const spawnIn = (cmd: string, args: string[]) => ns.spawn(cmd, args, { cwd: REPO, stdio: ['pipe', 'pipe', 'pipe'], env: peerEnv });
    const client = startPeer(spawnIn);
    peers.push(client);
    const attacker = startPeer(spawnIn);
    peers.push(attacker);
    await client.call({ op: 'backend', port: 9081 });
    spawned = true; // start() spawns before it waits: from here on stop() ends the agent
    await fixture.start({
      args: ['proxy', 'sidecar', '--standalone', config],
      env: {
        POD_NAME: 'client-1', POD_NAMESPACE: 'test', SERVICE_ACCOUNT: 'client', INSTANCE_IP: '10.99.0.2', ISTIO_META_DNS_CAPTURE: 'true',
        // kubelet's probe of an app whose gRPC health service misbehaves (the round that starts it: hostileApp).
        ISTIO_KUBE_APP_PROBERS: JSON.stringify({
          '/app-health/app/readyz': { grpc: { port: 9083, service: '' }, timeoutSeconds: 1 },
          '/app-health/app/livez': { httpGet: { port: 9084, path: '/healthz' }, timeoutSeconds: 1 },
        }),
      },
      // A pipe the test reads late would block the agent's synchronous writes and make it look slow.
      logFile: 'agent.log',
      readyTimeoutMs: 60_000,
    });
    const status = (p: string, timeoutMs = 5000) => client.call<{ status: number; body: string; ms: number }>({ op: 'get', url: `http://127.0.0.1:15020${p}`, timeoutMs }, timeoutMs + 5000);
    // The discovery server as its own process on 127.0.0.1:15010, on the same config directory (and CA root).
    discovery = startDiscoveryProcess(config, '127.0.0.1:15010', { netns: ns, cwd: tmp.path });
    await discoveryListening(discovery);
    await waitFor('requests through Envoy', async () => (await client.call<{ body: string }>({ op: 'get', url: 'http://127.0.0.1:8080/', timeoutMs: 2000 })).body === 'ok', 20_000, 200);
    return {
      ns, dir: tmp.path, agent: fixture.proc, discovery: discovery.proc, client, attacker, targets: agentTargets(tmp.path),
      log: () => fixture.log(), status, stop, discoveryExit: () => discoveryResult, leftInConfigPath: () => left,
    };
  } catch (e) {
    await stop(2000);
    throw e;
  }
}
