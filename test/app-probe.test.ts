// App probes through a real StatusServer against real local apps: HTTP (codes, redirects, slow, TLS, huge body,
// reset), TCP (open, closed) and gRPC health (a real grpc-js server), as kubelet would call them.

import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as https from 'node:https';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import * as protobuf from 'protobufjs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { AppProbes, appProbeDestination, parseAppProbers } from '../lib/app-probe';
import { AgentError } from '../lib/errors';
import { configureLogging, resetLogging } from '../lib/log';
import { StatusServer } from '../lib/status-server';
import { httpRequest, tempDir, type TempDir } from './helpers/harness';

interface App {
  http: http.Server;
  https: https.Server;
  closedPort: number;
  grpc: grpc.Server;
  grpcPort: number;
  seen: Array<{ path: string; remote: string; headers: http.IncomingHttpHeaders }>;
  bigBodyClosed: Promise<void>;
}

const listen = (s: net.Server): Promise<number> => new Promise((r) => s.listen(0, '127.0.0.1', () => r((s.address() as net.AddressInfo).port)));

function healthService(statuses: Record<string, number>): { def: grpc.ServiceDefinition; impl: grpc.UntypedServiceImplementation } {
  const root = protobuf.Root.fromJSON({
    nested: {
      HealthCheckRequest: { fields: { service: { type: 'string', id: 1 } } },
      HealthCheckResponse: { fields: { status: { type: 'int32', id: 1 } } },
    },
  });
  const Req = root.lookupType('HealthCheckRequest');
  const Res = root.lookupType('HealthCheckResponse');
  const def: grpc.ServiceDefinition = {
    Check: {
      path: '/grpc.health.v1.Health/Check', requestStream: false, responseStream: false,
      requestSerialize: (m: object) => Buffer.from(Req.encode(Req.fromObject(m)).finish()),
      requestDeserialize: (b: Buffer) => Req.toObject(Req.decode(b), { defaults: true }),
      responseSerialize: (m: object) => Buffer.from(Res.encode(Res.fromObject(m)).finish()),
      responseDeserialize: (b: Buffer) => Res.toObject(Res.decode(b)),
    },
  };
  const impl = {
    Check: (call: grpc.ServerUnaryCall<{ service: string }, unknown>, cb: grpc.sendUnaryData<unknown>) => {
      const st = statuses[call.request.service];
      if (st === undefined) return cb({ code: grpc.status.NOT_FOUND, details: 'unknown service' });
      cb(null, { status: st });
    },
  };
  return { def, impl };
}

function selfSigned(dir: string): { key: string; cert: string } {
  execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=app', '-days', '1',
    '-keyout', path.join(dir, 'key.pem'), '-out', path.join(dir, 'cert.pem')], { stdio: 'ignore' });
  return { key: fs.readFileSync(path.join(dir, 'key.pem'), 'utf8'), cert: fs.readFileSync(path.join(dir, 'cert.pem'), 'utf8') };
}

async function startApp(dir: TempDir): Promise<{ app: App; ports: Record<string, number> }> {
  const seen: App['seen'] = [];
  let bigClosed!: () => void;
  const bigBodyClosed = new Promise<void>((r) => (bigClosed = r));
  const handler = (req: http.IncomingMessage, res: http.ServerResponse) => {
    const url = new URL(req.url ?? '/', 'http://x');
    seen.push({ path: url.pathname, remote: req.socket.remoteAddress ?? '', headers: req.headers });
    const p = url.pathname;
    if (p === '/ok') return res.end('fine');
    if (p === '/created') return res.writeHead(201).end('made');
    if (p === '/fail') return res.writeHead(500).end('broken');
    if (p === '/teapot') return res.writeHead(418).end('x'.repeat(50_000));
    if (p === '/hop') return res.writeHead(302, { location: '/ok' }).end();
    if (p === '/offhost') return res.writeHead(302, { location: 'http://elsewhere.invalid/' }).end();
    if (p === '/loop') return res.writeHead(302, { location: '/loop' }).end();
    if (p === '/to-fail') return res.writeHead(307, { location: '/fail' }).end();
    if (p === '/slow') return void setTimeout(() => res.end('late'), 5000).unref();
    if (p === '/reset') return req.socket.destroy();
    if (p === '/big') {
      // 100 MB, written as fast as the probe reads: the probe must stop reading and drop the connection.
      let sent = 0;
      const chunk = Buffer.alloc(64 * 1024, 'a');
      res.writeHead(200, { 'content-length': String(100 * 1024 * 1024) });
      res.on('close', () => bigClosed());
      const pump = () => {
        while (sent < 100 * 1024 * 1024) {
          sent += chunk.length;
          if (!res.write(chunk)) return void res.once('drain', pump);
        }
        res.end();
      };
      return pump();
    }
    res.writeHead(404).end();
  };
  const h = http.createServer(handler);
  const s = https.createServer(selfSigned(dir.path), handler);
  const closedSrv = net.createServer();
  const ports = { http: await listen(h), https: await listen(s), closed: await listen(closedSrv) };
  await new Promise<void>((r) => closedSrv.close(() => r()));
  const g = new grpc.Server();
  const svc = healthService({ '': 1, up: 1, down: 2 });
  g.addService(svc.def, svc.impl);
  const grpcPort = await new Promise<number>((res, rej) => g.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (e, p) => (e ? rej(e) : res(p))));
  return { app: { http: h, https: s, closedPort: ports.closed, grpc: g, grpcPort, seen, bigBodyClosed }, ports: { ...ports, grpc: grpcPort } };
}

function probers(ports: Record<string, number>): string {
  const get = (p: string, extra: object = {}) => ({ httpGet: { path: p, port: ports.http, scheme: 'HTTP', ...extra }, timeoutSeconds: 1 });
  return JSON.stringify({
    '/app-health/web/readyz': get('/ok', { httpHeaders: [{ name: 'X-Probe', value: 'ready' }] }),
    '/app-health/web/livez': get('/fail'),
    '/app-health/web/startupz': get('/created'),
    '/app-lifecycle/web/prestopz': get('/ok'),
    '/app-health/teapot/readyz': get('/teapot'),
    '/app-health/hop/readyz': get('/hop'),
    '/app-health/offhost/readyz': get('/offhost'),
    '/app-health/loop/readyz': get('/loop'),
    '/app-health/tofail/readyz': get('/to-fail'),
    '/app-health/slow/readyz': get('/slow'),
    '/app-health/reset/readyz': get('/reset'),
    '/app-health/big/readyz': get('/big'),
    '/app-health/tls/readyz': { httpGet: { path: '/ok', port: ports.https, scheme: 'HTTPS' }, timeoutSeconds: 2 },
    '/app-health/tcp/livez': { tcpSocket: { port: ports.http }, timeoutSeconds: 1 },
    '/app-health/tcpclosed/livez': { tcpSocket: { port: ports.closed }, timeoutSeconds: 1 },
    '/app-health/grpc/readyz': { grpc: { port: ports.grpc }, timeoutSeconds: 1 },
    '/app-health/grpcup/readyz': { grpc: { port: ports.grpc, service: 'up' }, timeoutSeconds: 1 },
    '/app-health/grpcdown/readyz': { grpc: { port: ports.grpc, service: 'down' }, timeoutSeconds: 1 },
    '/app-health/grpcnone/readyz': { grpc: { port: ports.grpc, service: 'nope' }, timeoutSeconds: 1 },
    '/app-health/grpcclosed/readyz': { grpc: { port: ports.closed }, timeoutSeconds: 1 },
    '/app-health/grpconhttp/readyz': { grpc: { port: ports.http }, timeoutSeconds: 1 },
  });
}

const logs: string[] = [];
let dir: TempDir;
let app: App;
let status: StatusServer;
let probes: AppProbes;
let base: string;

test.before(async () => {
  configureLogging({ write: (l) => logs.push(l) });
  dir = tempDir('pa-probe-');
  const started = await startApp(dir);
  app = started.app;
  const env = { ISTIO_KUBE_APP_PROBERS: probers(started.ports), INSTANCE_IP: '127.0.0.1' };
  status = new StatusServer({ port: 0, host: '127.0.0.1' });
  await status.start();
  probes = new AppProbes({ probers: parseAppProbers(env), destination: appProbeDestination(env), statusPort: status.port });
  for (const r of probes.routes()) status.route(r.method, r.path, r.handler, { localOnly: r.localOnly });
  await probes.start();
  base = `http://127.0.0.1:${status.port}`;
});

test.after(async () => {
  await probes.close();
  await status.close();
  await new Promise<void>((r) => app.http.close(() => r()));
  app.http.closeAllConnections();
  await new Promise<void>((r) => app.https.close(() => r()));
  app.https.closeAllConnections();
  app.grpc.forceShutdown();
  dir.cleanup();
  resetLogging();
});

const probe = (p: string, headers?: Record<string, string>) => httpRequest(base + p, { headers, timeoutMs: 10_000 });

test('HTTP probe: 200 from the app answers 200 with its body, sent from 127.0.0.6 with kubelet headers and the probe headers', async () => {
  const r = await probe('/app-health/web/readyz', { 'user-agent': 'kube-probe/1.30', 'x-kubelet': 'yes', host: `10.1.2.3:${status.port}` });
  assert.is(r.status, 200);
  assert.is(r.body, 'fine');
  const s = app.seen.filter((x) => x.path === '/ok').pop()!;
  assert.is(s.remote, '127.0.0.6');
  assert.is(s.headers.host, `10.1.2.3:${(app.http.address() as net.AddressInfo).port}`, 'the Host keeps its name, with the app\'s port');
  assert.is(s.headers['user-agent'], 'kube-probe/1.30');
  assert.is(s.headers['x-kubelet'], 'yes');
  assert.is(s.headers['x-probe'], 'ready');
});

test('HTTP probe: the app\'s own codes pass through (500 and 418 with at most 10 KB of body; 201 stays 201)', async () => {
  const r = await probe('/app-health/web/livez');
  assert.is(r.status, 500);
  assert.is(r.body, 'broken');
  const t = await probe('/app-health/teapot/readyz');
  assert.is(t.status, 418);
  assert.is(t.body.length, 10 * 1024);
  assert.is((await probe('/app-health/web/startupz')).status, 201);
  assert.is((await probe('/app-lifecycle/web/prestopz')).status, 200, 'lifecycle hooks are served the same way');
  assert.ok(logs.some((l) => l.includes('app probe /app-health/web/livez failed: app answered 500')));
});

test('HTTP probe: a same-host redirect is followed, an off-host one is a success, a loop fails after 10', async () => {
  const before = app.seen.length;
  const hop = await probe('/app-health/hop/readyz');
  assert.is(hop.status, 200);
  assert.is(hop.body, 'fine');
  assert.equal(app.seen.slice(before).map((x) => x.path), ['/hop', '/ok']);
  assert.is((await probe('/app-health/offhost/readyz')).status, 200);
  assert.is((await probe('/app-health/tofail/readyz')).status, 500);
  const n = app.seen.length;
  const loop = await probe('/app-health/loop/readyz');
  assert.is(loop.status, 500);
  assert.match(loop.body, /stopped after 10 redirects/);
  assert.is(app.seen.length - n, 11);
});

test('HTTP probe: a slow app gets its timeout, a reset connection fails, a 100 MB body is cut at 10 KB', async () => {
  const slow = await probe('/app-health/slow/readyz');
  assert.is(slow.status, 500);
  assert.match(slow.body, /timed out after 1000 ms/);
  const reset = await probe('/app-health/reset/readyz');
  assert.is(reset.status, 500);
  assert.match(reset.body, /socket hang up|ECONNRESET/);
  const big = await probe('/app-health/big/readyz');
  assert.is(big.status, 200);
  assert.is(big.body.length, 10 * 1024);
  await app.bigBodyClosed; // the probe dropped the connection instead of reading 100 MB
});

test('HTTPS probe: the app\'s self-signed certificate is not verified', async () => {
  const r = await probe('/app-health/tls/readyz');
  assert.is(r.status, 200);
  assert.is(r.body, 'fine');
});

test('TCP probe: an open port answers 200, a closed one 500', async () => {
  assert.is((await probe('/app-health/tcp/livez')).status, 200);
  const c = await probe('/app-health/tcpclosed/livez');
  assert.is(c.status, 500);
  assert.match(c.body, /ECONNREFUSED/);
});

test('gRPC probe: SERVING answers 200; NOT_SERVING, an unknown service, a closed port and a non-gRPC port answer 500', async () => {
  assert.is((await probe('/app-health/grpc/readyz')).status, 200);
  assert.is((await probe('/app-health/grpcup/readyz')).status, 200);
  const down = await probe('/app-health/grpcdown/readyz');
  assert.is(down.status, 500);
  assert.match(down.body, /NOT_SERVING/);
  const none = await probe('/app-health/grpcnone/readyz');
  assert.is(none.status, 500);
  assert.match(none.body, /gRPC status 5: unknown service/);
  assert.is((await probe('/app-health/grpcclosed/readyz')).status, 500);
  assert.is((await probe('/app-health/grpconhttp/readyz')).status, 500);
});

test('a probe to the pod IP (a non-loopback address of this host) also comes from 127.0.0.6', async () => {
  const podIp = Object.values(os.networkInterfaces()).flat().find((i) => i && i.family === 'IPv4' && !i.internal)?.address;
  assert.ok(podIp, 'this test needs a non-loopback IPv4 address');
  const app2 = http.createServer((req, res) => res.end(req.socket.remoteAddress));
  const port = await new Promise<number>((r) => app2.listen(0, '0.0.0.0', () => r((app2.address() as net.AddressInfo).port)));
  const env = { ISTIO_KUBE_APP_PROBERS: JSON.stringify({ '/app-health/pod/readyz': { httpGet: { path: '/', port } }, '/app-health/pod/livez': { tcpSocket: { port } } }), INSTANCE_IP: podIp! };
  const p = new AppProbes({ probers: parseAppProbers(env), destination: appProbeDestination(env), statusPort: 0 });
  const s = new StatusServer({ port: 0, host: '127.0.0.1' });
  for (const r of p.routes()) s.route(r.method, r.path, r.handler);
  await s.start();
  try {
    const r = await httpRequest(`http://127.0.0.1:${s.port}/app-health/pod/readyz`);
    assert.is(r.status, 200);
    assert.is(r.body, '127.0.0.6');
    assert.is((await httpRequest(`http://127.0.0.1:${s.port}/app-health/pod/livez`)).status, 200);
  } finally {
    await p.close();
    await s.close();
    app2.closeAllConnections();
    await new Promise<void>((r) => app2.close(() => r()));
  }
});

test('REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION sends probes to localhost (127.0.0.1, still from 127.0.0.6)', async () => {
  const env = { REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION: 'true', INSTANCE_IP: '10.9.9.9', ISTIO_KUBE_APP_PROBERS: JSON.stringify({ '/app-health/l/readyz': { httpGet: { path: '/ok', port: (app.http.address() as net.AddressInfo).port } } }) };
  assert.is(appProbeDestination(env), 'localhost');
  const p = new AppProbes({ probers: parseAppProbers(env), destination: appProbeDestination(env), statusPort: 0 });
  const before = app.seen.length;
  const r = await p.handle({ url: '/app-health/l/readyz', headers: {}, rawHeaders: [] } as unknown as http.IncomingMessage);
  assert.is(r.status, 200);
  assert.is(app.seen[before]!.remote, '127.0.0.6');
  await p.close();
});

test('an unknown probe path answers 400, other paths 404', async () => {
  assert.is((await probe('/app-health/other/readyz')).status, 400);
  assert.is((await probe('/nothing')).status, 404);
});

test('bad ISTIO_KUBE_APP_PROBERS is a CONFIG_INVALID error naming the variable', () => {
  const bad = (v: string, re: RegExp) => {
    try {
      parseAppProbers({ ISTIO_KUBE_APP_PROBERS: v });
      assert.unreachable(`accepted ${v}`);
    } catch (e) {
      assert.instance(e, AgentError);
      assert.is((e as AgentError).code, 'CONFIG_INVALID');
      assert.match((e as Error).message, /ISTIO_KUBE_APP_PROBERS/);
      assert.match((e as Error).message, re);
    }
  };
  bad('{not json', /not JSON/);
  bad('[]', /JSON object/);
  bad('{"/app-health/a/readyz":{}}', /exactly one of httpGet, tcpSocket or grpc/);
  bad('{"/healthz":{"tcpSocket":{"port":1}}}', /is not \/app-health/);
  bad('{"/app-health/a/readyz":{"httpGet":{"port":"http"}}}', /port must be a port number/);
  assert.is(parseAppProbers({}).size, 0);
  assert.is(parseAppProbers({ ISTIO_KUBE_APP_PROBERS: '{"/app-health/a/livez":{"tcpSocket":{"port":80}}}' }).get('/app-health/a/livez')!.timeoutSeconds, 1);
});

test.run();
