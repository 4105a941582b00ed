// HTTP app probes' connections, as the Go agent makes them (pilot/cmd/pilot-agent/status/server.go):
// - ISTIO_ENABLE_HTTP2_PROBING (default on): HTTPS probes offer ALPN h2,http/1.1 and speak HTTP/2 to an app that
//   picks it; off: no ALPN, HTTP/1.1 only. Plain HTTP stays HTTP/1.1 (no h2c).
// - ENABLE_PROBE_KEEPALIVE_CONNECTIONS (default off): a new connection per probe (`Connection: close`, an HTTP/2
//   connection for one request); on: one kept connection per probe path; a kept HTTP/2 one is PINGed when nothing
//   was read from it for a while (Go's ReadIdleTimeout 30 s, PingTimeout 15 s; shortened here) and dropped when the
//   peer stops answering.
// Real apps: an h2-only TLS server (node:http2, allowHTTP1 false), an HTTP/1.1-only TLS server, a plain HTTP one and
// an h2c-only one; connections are counted on the servers' side.

import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as http2 from 'node:http2';
import * as https from 'node:https';
import type * as net from 'node:net';
import * as path from 'node:path';
import type * as tls from 'node:tls';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { AppProbes, appProbeConnections, parseAppProbers } from '../lib/app-probe';
import { AgentError } from '../lib/errors';
import { configureLogging, resetLogging } from '../lib/log';
import { tempDir, type TempDir, waitFor } from './helpers/harness';

interface Seen {
  version: string;
  authority?: string;
  connection?: string;
  userAgent?: string;
  remote?: string;
  path: string;
}

interface Apps {
  h2: http2.Http2SecureServer;
  h1: https.Server;
  plain: http.Server;
  h2c: http2.Http2Server;
  ports: { h2: number; h1: number; plain: number; h2c: number };
  seen: { h2: Seen[]; h1: Seen[]; plain: Seen[]; h2c: Seen[] };
  connections: { h2: number; h1: number; plain: number };
  /** ALPN lists the HTTP/1.1-only server was offered, one per TLS connection that offered any. */
  offered: string[][];
  h2Sessions: Set<http2.ServerHttp2Session>;
  /** PINGs the h2-only app received. */
  h2Pings: { n: number };
}

const STATUS_PORT = 15020;
const listen = (s: net.Server): Promise<number> => new Promise((r) => s.listen(0, '127.0.0.1', () => r((s.address() as net.AddressInfo).port)));

function selfSigned(dir: string): { key: string; cert: string } {
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-subj', '/CN=app',
    '-days', '1', '-keyout', path.join(dir, 'key.pem'), '-out', path.join(dir, 'cert.pem')], { stdio: 'ignore' });
  return { key: fs.readFileSync(path.join(dir, 'key.pem'), 'utf8'), cert: fs.readFileSync(path.join(dir, 'cert.pem'), 'utf8') };
}

function answer(p: string, reply: (status: number, body: string, headers?: Record<string, string>) => void): void {
  if (p === '/ok') return reply(200, 'fine');
  if (p === '/hop') return reply(302, '', { location: '/ok' });
  if (p === '/teapot') return reply(418, 'x'.repeat(50_000));
  reply(404, '');
}

async function startApps(dir: TempDir): Promise<Apps> {
  const tlsFiles = selfSigned(dir.path);
  const seen: Apps['seen'] = { h2: [], h1: [], plain: [], h2c: [] };
  const connections = { h2: 0, h1: 0, plain: 0 };
  const offered: string[][] = [];
  const h2Sessions = new Set<http2.ServerHttp2Session>();
  const h2Pings = { n: 0 };
  const h1Handler = (into: Seen[]) => (req: http.IncomingMessage, res: http.ServerResponse) => {
    const p = new URL(req.url ?? '/', 'http://x').pathname;
    into.push({ version: req.httpVersion, authority: req.headers.host, connection: req.headers.connection, userAgent: req.headers['user-agent'], remote: req.socket.remoteAddress, path: p });
    answer(p, (status, body, headers) => res.writeHead(status, headers).end(body));
  };
  const h2Handler = (into: Seen[]) => (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => {
    const p = new URL(req.url ?? '/', 'http://x').pathname;
    into.push({ version: req.httpVersion, authority: req.authority, userAgent: req.headers['user-agent'], remote: req.socket.remoteAddress, path: p });
    answer(p, (status, body, headers) => res.writeHead(status, headers).end(body));
  };
  const h2 = http2.createSecureServer({ ...tlsFiles, allowHTTP1: false }, h2Handler(seen.h2));
  h2.on('secureConnection', () => connections.h2++);
  // A client that did not negotiate h2 gets its connection closed (Node would otherwise answer HTTP/1.0 403).
  h2.on('unknownProtocol', (s: tls.TLSSocket) => s.destroy());
  h2.on('session', (s) => {
    h2Sessions.add(s);
    s.on('close', () => h2Sessions.delete(s));
    s.on('ping', () => h2Pings.n++);
  });
  const h1 = https.createServer({
    ...tlsFiles,
    // Records what the client offered; picks http/1.1 or nothing (this app has no HTTP/2).
    ALPNCallback: ({ protocols }: { protocols: string[] }) => {
      offered.push(protocols);
      return protocols.includes('http/1.1') ? 'http/1.1' : undefined;
    },
  } as https.ServerOptions, h1Handler(seen.h1));
  h1.on('secureConnection', () => connections.h1++);
  const plain = http.createServer(h1Handler(seen.plain));
  plain.on('connection', () => connections.plain++);
  const h2c = http2.createServer(h2Handler(seen.h2c));
  const ports = { h2: await listen(h2), h1: await listen(h1), plain: await listen(plain), h2c: await listen(h2c) };
  return { h2, h1, plain, h2c, ports, seen, connections, offered, h2Sessions, h2Pings };
}

function probers(ports: Apps['ports']): string {
  const get = (scheme: string, port: number, p = '/ok') => ({ httpGet: { path: p, port, scheme }, timeoutSeconds: 3 });
  return JSON.stringify({
    '/app-health/h2/readyz': get('HTTPS', ports.h2),
    '/app-health/h2hop/readyz': get('HTTPS', ports.h2, '/hop'),
    '/app-health/h2teapot/readyz': get('HTTPS', ports.h2, '/teapot'),
    '/app-health/h1/readyz': get('HTTPS', ports.h1),
    '/app-health/plain/readyz': get('HTTP', ports.plain),
    '/app-health/h2c/readyz': get('HTTP', ports.h2c),
  });
}

let dir: TempDir;
let apps: Apps;
const logs: string[] = [];

test.before(async () => {
  configureLogging({ write: (l) => logs.push(l) });
  dir = tempDir('pa-probe-h2-');
  apps = await startApps(dir);
});

test.after(async () => {
  for (const s of apps.h2Sessions) s.destroy();
  for (const s of [apps.h2, apps.h1, apps.plain, apps.h2c] as net.Server[]) {
    (s as http.Server).closeAllConnections?.();
    await new Promise<void>((r) => s.close(() => r()));
  }
  dir.cleanup();
  resetLogging();
});

/** AppProbes as agent.ts builds them from the environment, with kubelet's request. */
async function withProbes(env: Record<string, string>, fn: (probe: (p: string) => Promise<{ status: number; body: string }>) => Promise<void>): Promise<void> {
  const e = { ISTIO_KUBE_APP_PROBERS: probers(apps.ports), ...env };
  const probes = new AppProbes({ probers: parseAppProbers(e), destination: '127.0.0.1', connections: appProbeConnections(e), statusPort: STATUS_PORT });
  await probes.start();
  const probe = async (p: string) => {
    const req = { url: p, headers: { host: `10.1.2.3:${STATUS_PORT}` }, rawHeaders: ['Host', `10.1.2.3:${STATUS_PORT}`, 'User-Agent', 'kube-probe/1.31'] };
    const r = await probes.handle(req as unknown as http.IncomingMessage);
    return { status: r.status, body: String(r.body ?? '') };
  };
  try {
    await fn(probe);
  } finally {
    await probes.close();
  }
}

test('the defaults are Go\'s: HTTP/2 probing on, keepalive off; a bad value names the variable', () => {
  assert.equal(appProbeConnections({}), { http2: true, keepAlive: false });
  assert.equal(appProbeConnections({ ISTIO_ENABLE_HTTP2_PROBING: 'false', ENABLE_PROBE_KEEPALIVE_CONNECTIONS: 'true' }), { http2: false, keepAlive: true });
  try {
    appProbeConnections({ ENABLE_PROBE_KEEPALIVE_CONNECTIONS: 'sometimes' });
    assert.unreachable('accepted');
  } catch (e) {
    assert.instance(e, AgentError);
    assert.match((e as Error).message, /ENABLE_PROBE_KEEPALIVE_CONNECTIONS/);
  }
});

test('HTTPS probe to an h2-only app speaks HTTP/2 (ALPN h2), the Host as :authority with the app\'s port, from 127.0.0.6', async () => {
  await withProbes({}, async (probe) => {
    const r = await probe('/app-health/h2/readyz');
    assert.is(r.status, 200);
    assert.is(r.body, 'fine');
    const s = apps.seen.h2.at(-1)!;
    assert.is(s.version, '2.0');
    assert.is(s.authority, `10.1.2.3:${apps.ports.h2}`);
    assert.is(s.userAgent, 'kube-probe/1.31');
    assert.is(s.remote, '127.0.0.6');
  });
});

test('HTTPS probe to an HTTP/1.1-only app offers h2 and http/1.1, then speaks HTTP/1.1', async () => {
  await withProbes({}, async (probe) => {
    const before = apps.offered.length;
    const r = await probe('/app-health/h1/readyz');
    assert.is(r.status, 200);
    assert.is(r.body, 'fine');
    assert.equal(apps.offered.slice(before), [['h2', 'http/1.1']]);
    assert.is(apps.seen.h1.at(-1)!.version, '1.1');
  });
});

test('over HTTP/2 a same-host redirect is followed and the app\'s 418 keeps at most 10 KB of its body', async () => {
  await withProbes({}, async (probe) => {
    const n = apps.seen.h2.length;
    const hop = await probe('/app-health/h2hop/readyz');
    assert.is(hop.status, 200);
    assert.is(hop.body, 'fine');
    assert.equal(apps.seen.h2.slice(n).map((s) => `${s.version} ${s.path}`), ['2.0 /hop', '2.0 /ok']);
    const t = await probe('/app-health/h2teapot/readyz');
    assert.is(t.status, 418);
    assert.is(t.body.length, 10 * 1024);
  });
});

test('plain HTTP probes stay HTTP/1.1 with HTTP/2 probing on: an h2c-only app fails', async () => {
  await withProbes({}, async (probe) => {
    assert.is((await probe('/app-health/plain/readyz')).status, 200);
    assert.is(apps.seen.plain.at(-1)!.version, '1.1');
    assert.is((await probe('/app-health/h2c/readyz')).status, 500);
    assert.is(apps.seen.h2c.length, 0, 'the h2c app never saw a request');
  });
});

test('ISTIO_ENABLE_HTTP2_PROBING=false: no ALPN is offered, the h2-only app fails, the HTTP/1.1 app answers', async () => {
  await withProbes({ ISTIO_ENABLE_HTTP2_PROBING: 'false' }, async (probe) => {
    const offered = apps.offered.length;
    const seenH2 = apps.seen.h2.length;
    const r = await probe('/app-health/h2/readyz');
    assert.is(r.status, 500);
    assert.is(apps.seen.h2.length, seenH2);
    const ok = await probe('/app-health/h1/readyz');
    assert.is(ok.status, 200);
    assert.is(apps.seen.h1.at(-1)!.version, '1.1');
    assert.is(apps.offered.length, offered, 'the HTTP/1.1 app was offered no ALPN list');
  });
});

test('keepalive off (default): every probe its own connection, HTTP/1.1 with Connection: close, HTTP/2 for one request', async () => {
  await withProbes({}, async (probe) => {
    const c0 = { ...apps.connections };
    const [p0, h0] = [apps.seen.plain.length, apps.seen.h1.length];
    for (let i = 0; i < 3; i++) {
      assert.is((await probe('/app-health/plain/readyz')).status, 200);
      assert.is((await probe('/app-health/h1/readyz')).status, 200);
      assert.is((await probe('/app-health/h2/readyz')).status, 200);
    }
    assert.equal({ plain: apps.connections.plain - c0.plain, h1: apps.connections.h1 - c0.h1, h2: apps.connections.h2 - c0.h2 }, { plain: 3, h1: 3, h2: 3 });
    assert.equal([...apps.seen.plain.slice(p0), ...apps.seen.h1.slice(h0)].map((s) => s.connection), Array(6).fill('close'));
  });
});

test('ENABLE_PROBE_KEEPALIVE_CONNECTIONS=true: the probes of a path reuse one connection (HTTP/1.1 plain and TLS, HTTP/2)', async () => {
  await withProbes({ ENABLE_PROBE_KEEPALIVE_CONNECTIONS: 'true' }, async (probe) => {
    const c0 = { ...apps.connections };
    const [p0, h0] = [apps.seen.plain.length, apps.seen.h1.length];
    for (let i = 0; i < 3; i++) {
      assert.is((await probe('/app-health/plain/readyz')).status, 200);
      assert.is((await probe('/app-health/h1/readyz')).status, 200);
      assert.is((await probe('/app-health/h2/readyz')).status, 200);
    }
    assert.equal({ plain: apps.connections.plain - c0.plain, h1: apps.connections.h1 - c0.h1, h2: apps.connections.h2 - c0.h2 }, { plain: 1, h1: 1, h2: 1 });
    assert.equal([...apps.seen.plain.slice(p0), ...apps.seen.h1.slice(h0)].map((s) => s.connection), Array(6).fill('keep-alive'));
    assert.ok(apps.seen.h2.slice(-3).every((s) => s.version === '2.0'));

    // The app closes the kept connections: the next probes open new ones and still pass.
    apps.plain.closeIdleConnections();
    apps.h1.closeIdleConnections();
    for (const s of apps.h2Sessions) s.close();
    await new Promise((r) => setTimeout(r, 100));
    assert.is((await probe('/app-health/plain/readyz')).status, 200);
    assert.is((await probe('/app-health/h1/readyz')).status, 200);
    assert.is((await probe('/app-health/h2/readyz')).status, 200);
    assert.equal({ plain: apps.connections.plain - c0.plain, h1: apps.connections.h1 - c0.h1, h2: apps.connections.h2 - c0.h2 }, { plain: 2, h1: 2, h2: 2 });
  });
});

test('keepalive on: a kept connection the app closed unannounced (no FIN seen yet) costs a retry, not a failed probe', async () => {
  await withProbes({ ENABLE_PROBE_KEEPALIVE_CONNECTIONS: 'true' }, async (probe) => {
    assert.is((await probe('/app-health/plain/readyz')).status, 200);
    // Closing and probing in the same tick: the probe goes out on the kept socket before its close is read.
    apps.plain.closeIdleConnections();
    const r = await probe('/app-health/plain/readyz');
    assert.is(r.status, 200, r.body);
  });
});

/** A TCP relay to `port` whose connections can be frozen: nothing goes either way, and what the client sends is
 * swallowed, so its close is still seen (a peer that went away without a FIN, as a paused or partitioned app). */
async function relay(port: number): Promise<{ port: number; opened: number; closedByClient: number; freeze(): void; close(): Promise<void> }> {
  const pairs = new Set<[net.Socket, net.Socket]>();
  const r = {
    port: 0, opened: 0, closedByClient: 0,
    freeze() {
      for (const [c, up] of pairs) {
        c.unpipe(up);
        up.unpipe(c);
        up.destroy();
        c.on('data', () => undefined).resume();
      }
    },
    async close() {
      for (const [c, up] of pairs) (c.destroy(), up.destroy());
      await new Promise<void>((res) => srv.close(() => res()));
    },
  };
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const netMod = require('node:net') as typeof net;
  const srv = netMod.createServer((c) => {
    r.opened++;
    const up = netMod.connect(port, '127.0.0.1');
    const pair: [net.Socket, net.Socket] = [c, up];
    pairs.add(pair);
    c.pipe(up);
    up.pipe(c);
    c.on('error', () => undefined);
    up.on('error', () => undefined);
    c.on('close', () => (r.closedByClient++, pairs.delete(pair), up.destroy()));
  });
  r.port = await listen(srv);
  return r;
}

test('keepalive on: a kept HTTP/2 connection is PINGed when idle; one whose peer stops answering is dropped and the next probe opens a new one', async () => {
  const rl = await relay(apps.ports.h2);
  const e = {
    ISTIO_KUBE_APP_PROBERS: JSON.stringify({ '/app-health/relayed/readyz': { httpGet: { path: '/ok', port: rl.port, scheme: 'HTTPS' }, timeoutSeconds: 2 } }),
    ENABLE_PROBE_KEEPALIVE_CONNECTIONS: 'true',
  };
  // Go's 30 s / 15 s, shortened through the options (no variable sets them).
  const connections = { ...appProbeConnections(e), h2Health: { readIdleMs: 150, pingTimeoutMs: 300 } };
  const probes = new AppProbes({ probers: parseAppProbers(e), destination: '127.0.0.1', connections, statusPort: STATUS_PORT });
  await probes.start();
  const probe = async () => {
    const req = { url: '/app-health/relayed/readyz', headers: { host: `10.1.2.3:${STATUS_PORT}` }, rawHeaders: ['Host', `10.1.2.3:${STATUS_PORT}`] };
    const r = await probes.handle(req as unknown as http.IncomingMessage);
    return { status: r.status, body: String(r.body ?? '') };
  };
  try {
    assert.is((await probe()).status, 200);
    const pings0 = apps.h2Pings.n;
    // Idle but answering: PINGed, and kept.
    await waitFor('PINGs on the idle kept connection', () => apps.h2Pings.n - pings0 >= 2, 3000);
    assert.is((await probe()).status, 200);
    assert.equal([rl.opened, rl.closedByClient], [1, 0], 'one connection, kept through the PINGs');

    rl.freeze();
    await waitFor('the prober to drop the connection whose PING went unanswered', () => rl.closedByClient === 1, 3000);
    const t0 = Date.now();
    const r = await probe();
    assert.is(r.status, 200, r.body);
    assert.ok(Date.now() - t0 < 1500, 'answered on a new connection, not after timing out on the dead one');
    assert.is(rl.opened, 2);
  } finally {
    await probes.close();
    await rl.close();
  }
});

test.run();
