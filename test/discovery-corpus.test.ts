// The differential corpus: each test/discovery-corpus/<case>/ holds Istio YAML (config.yaml) and the requests to
// send with the answers istiod's configuration gives (requests.yaml, which names the Istio commit or run the
// expectation comes from). Every case runs against a real Envoy fed by the embedded discovery server.
//
// Placeholders, replaced in both files: {{backend.NAME}} is the port of backend NAME, {{port.service}} a free
// port for the service (the sidecar's listener), {{port.gateway}} and {{port.gateway2}} free ports for Gateway servers,
// {{port.extra}} one more (a second service's port). In requests.yaml, {{vip.HOST}} is HOST's address in the name table.
// TLS cases list `certs` (made at run time by the tests' CA, none committed): {{b64.cert.NAME}} and {{b64.key.NAME}} are
// the PEM certificate and key in base64 (a Secret's `data`), {{path.cert.NAME}} and {{path.key.NAME}} their files.

import * as fs from 'node:fs';
import { X509Certificate } from 'node:crypto';
import * as http from 'node:http';
import * as https from 'node:https';
import * as net from 'node:net';
import * as path from 'node:path';
import * as tls from 'node:tls';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { parse } from 'yaml';
import { DiscoveryServer } from '../lib/discovery/index';
import { readMeshTracing } from '../lib/discovery/mesh-tracing';
import { buildNameTable } from '../lib/discovery/gen-nametable';
import { startEnvoy, type TestEnvoy } from './helpers/discovery-envoy';
import { freePort, httpRequest, type HttpResult, REPO, sleep, tempDir, waitFor } from './helpers/harness';
import { type CertSpec, makeCerts, type TestCert } from './helpers/test-certs';

const CORPUS = path.join(REPO, 'test/discovery-corpus');

interface BackendSpec {
  /** Every Nth request this backend gets (counted across all of them) is answered 503. */
  failEvery?: number;
  /** Answer after this long. */
  delayMs?: number;
  /** A TCP server that writes its name and closes, instead of HTTP. */
  tcp?: boolean;
  /** HTTPS with this certificate (of `certs`) instead of plain HTTP. */
  tls?: string;
  /** With `tls`: require a client certificate issued by this CA (of `certs`). */
  clientCa?: string;
}

interface Expect {
  status?: number;
  /** The backend that answered (its body). */
  backend?: string;
  bodyMatches?: string;
  /** Response headers the client must see (lowercase names), and ones it must not. */
  headers?: Record<string, string>;
  absentHeaders?: string[];
  /** Request headers the backend must have seen, and ones it must not have. */
  backendHeaders?: Record<string, string>;
  backendAbsentHeaders?: string[];
  /** Over `repeat` requests: how many got each status. */
  statuses?: Record<string, number>;
  /** Over `repeat` requests: at least this many got each status. */
  statusesAtLeast?: Record<string, number>;
  /** Over `repeat` requests: every answer came from one backend. */
  sameBackend?: boolean;
  /** Requests each backend received by the end of this step (mirrors are counted, eventually). */
  backendRequests?: Record<string, number>;
  /** The answer took at least this long. */
  minMs?: number;
  /** Over `repeat` requests: exactly these backends answered. */
  backendsSeen?: string[];
  /** The connection or TLS handshake fails (no HTTP answer at all), optionally with a matching error. */
  fails?: boolean;
  errorMatches?: string;
  /** The certificate (of `certs`) the TLS server presented to the client. */
  peerCert?: string;
  /** Envoy counters (admin /stats) after this step, at least these values. */
  envoyStatsAtLeast?: Record<string, number>;
}

interface RequestSpec {
  name: string;
  listener?: 'service' | 'gateway' | 'gateway2';
  /** HTTPS: the SNI to send, the CA (of `certs`) to trust, and the client certificate to present. */
  tls?: { sni?: string; ca: string; cert?: string; maxVersion?: tls.SecureVersion; ciphers?: string };
  /** Before this request, config.yaml is replaced by this file of the case (placeholders filled). */
  edit?: string;
  /** After `edit`: the server must report issues matching these (the set is refused, the last good one stays). */
  editIssues?: string[];
  /** Retry for a while until the expectation holds (a change still on its way to Envoy). */
  eventually?: boolean;
  method?: string;
  path?: string;
  headers?: Record<string, string>;
  repeat?: number;
  /** A TCP connection (the answer is what the backend wrote) instead of an HTTP request. */
  tcp?: boolean;
  /** Send the `repeat` requests at once instead of one after the other. */
  parallel?: boolean;
  expect: Expect;
}

interface CaseSpec {
  /** Where the expected answers come from (an Istio commit and file, or an istiod run). */
  source: string;
  proxy: 'sidecar' | 'router';
  /** The proxy's labels (default: none for a sidecar, istio: ingressgateway for a router). */
  labels?: Record<string, string>;
  /** More node metadata (DNS_CAPTURE, ...). */
  metadata?: Record<string, string>;
  backends?: Record<string, BackendSpec>;
  mesh?: { outboundTrafficPolicy?: 'ALLOW_ANY' | 'REGISTRY_ONLY' };
  /** Test certificates to make (see test/helpers/test-certs.ts). */
  certs?: Record<string, CertSpec>;
  /** meshConfig as in the mesh file, for the fields read from it (tracing). */
  meshConfig?: Record<string, unknown>;
  /** The config must be rejected at start, with messages matching these regular expressions. */
  rejected?: string[];
  requests?: RequestSpec[];
}

interface Backend {
  requests: number;
  port: number;
  close(): Promise<void>;
}

async function startBackend(name: string, spec: BackendSpec, certs: Record<string, TestCert>): Promise<Backend> {
  const handler = (req: http.IncomingMessage, res: http.ServerResponse) => {
    b.requests++;
    const n = b.requests;
    req.resume();
    const answer = () => {
      res.setHeader('x-backend', name);
      res.setHeader('x-seen-headers', JSON.stringify(req.headers));
      res.setHeader('x-seen-method', req.method ?? '');
      if (spec.failEvery && n % spec.failEvery === 0) {
        res.statusCode = 503;
        res.end(`${name} failing`);
      } else res.end(name);
    };
    if (spec.delayMs) setTimeout(answer, spec.delayMs);
    else answer();
  };
  const tlsCert = spec.tls ? certs[spec.tls] : undefined;
  if (spec.tls && !tlsCert) throw new Error(`backend ${name}: unknown certificate ${spec.tls}`);
  const clientCa = spec.clientCa ? { requestCert: true, rejectUnauthorized: true, ca: certs[spec.clientCa]!.cert } : {};
  const server = tlsCert ? https.createServer({ cert: tlsCert.cert, key: tlsCert.key, ...clientCa }, handler) : spec.tcp ? net.createServer((c) => {
    b.requests++;
    c.on('error', () => undefined); // Envoy may reset a connection the test has finished with
    c.end(name);
  }) : http.createServer(handler);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const b: Backend = {
    requests: 0,
    port: (server.address() as net.AddressInfo).port,
    close: () => new Promise<void>((r) => {
      if (server instanceof http.Server || server instanceof https.Server) server.closeAllConnections();
      server.close(() => r());
    }),
  };
  return b;
}

function fill(text: string, vars: Record<string, number | string>): string {
  return text.replace(/\{\{([a-z0-9.-]+)\}\}/g, (m, k: string) => {
    if (k.startsWith('vip.')) return m; // filled in once the server runs
    if (!(k in vars)) throw new Error(`unknown placeholder ${m}`);
    return String(vars[k]);
  });
}

async function runCase(dirName: string): Promise<void> {
  const caseDir = path.join(CORPUS, dirName);
  const rawSpec = fs.readFileSync(path.join(caseDir, 'requests.yaml'), 'utf8');
  const pre = parse(rawSpec.replace(/\{\{[a-z0-9.-]+\}\}/g, '0')) as CaseSpec; // placeholders are filled in below
  assert.ok(pre.source, `${dirName}/requests.yaml names its source`);
  const dir = tempDir('pa-corpus-');
  const backends: Record<string, Backend> = {};
  let server: DiscoveryServer | undefined;
  let envoy: TestEnvoy | undefined;
  try {
    const vars: Record<string, number | string> = {
      'port.service': await freePort(), 'port.gateway': await freePort(), 'port.gateway2': await freePort(), 'port.extra': await freePort(),
    };
    const certs = pre.certs ? await makeCerts(dir.path, pre.certs) : {};
    for (const [name, c] of Object.entries(certs)) {
      vars[`b64.cert.${name}`] = Buffer.from(c.cert).toString('base64');
      vars[`b64.key.${name}`] = Buffer.from(c.key).toString('base64');
      vars[`path.cert.${name}`] = c.certPath;
      vars[`path.key.${name}`] = c.keyPath;
    }
    for (const [name, b] of Object.entries(pre.backends ?? {})) {
      backends[name] = await startBackend(name, b ?? {}, certs);
      vars[`backend.${name}`] = backends[name]!.port;
    }
    const spec = parse(fill(rawSpec, vars)) as CaseSpec;
    const configDir = path.join(dir.path, 'config');
    fs.mkdirSync(configDir);
    fs.writeFileSync(path.join(configDir, 'config.yaml'), fill(fs.readFileSync(path.join(caseDir, 'config.yaml'), 'utf8'), vars));
    const mesh = { ...spec.mesh, ...(spec.meshConfig && { tracing: readMeshTracing(spec.meshConfig, `${dirName}/requests.yaml meshConfig`) }) };
    // The test plays the agent of `proxy --standalone`: its Envoy presents the in-process token, so a gateway gets
    // its Secrets' keys as the real agent's does.
    server = new DiscoveryServer({ configDir, listen: `unix:${path.join(dir.path, 'xds.sock')}`, mesh, inProcess: { namespace: 'test', serviceAccount: 'default' } });
    if (spec.rejected) {
      const err = await server.start().then(() => undefined, (e: Error) => e);
      assert.ok(err, `${dirName}: the config is rejected`);
      for (const re of spec.rejected) assert.match(err!.message, new RegExp(re), `${dirName}: rejection names the problem`);
      return;
    }
    await server.start();
    const s = server;
    envoy = await startEnvoy({
      xdsAddress: s.address,
      nodeId: `${spec.proxy}~127.0.0.1~${spec.proxy}-0.test~test.svc.cluster.local`,
      labels: spec.labels ?? (spec.proxy === 'router' ? { istio: 'ingressgateway' } : {}),
      ...(spec.metadata && { metadata: spec.metadata }),
      xdsToken: s.inProcessToken,
    });
    await waitFor(`${dirName}: Envoy to ack every resource type`, () => {
      const st = s.status();
      const c = st.connections[0];
      // CDS, EDS, LDS (and RDS when there is an HTTP listener, which then binds only once it has its routes).
      return !!c && c.subscriptions.length >= 3 && c.subscriptions.every((x) => x.acked === st.version);
    });
    // {{vip.HOST}}: the host's address in the name table (its auto-allocated VIP), known once the server runs.
    const table = buildNameTable(s.pushContext).table;
    const requests = JSON.parse(JSON.stringify(spec.requests ?? []).replace(/\{\{vip\.([a-z0-9.-]+)\}\}/g, (_, h: string) => table[h]?.ips[0] ?? `no-vip-for-${h}`)) as RequestSpec[];
    for (const r of requests) {
      if (r.edit) await applyEdit(dirName, s, path.join(configDir, 'config.yaml'), fill(fs.readFileSync(path.join(caseDir, r.edit), 'utf8'), vars), r.editIssues);
      await runRequest(dirName, r, vars, backends, certs, envoy.adminPort);
    }
    assert.equal(s.status().nacks, [], `${dirName}: no NACK`);
  } finally {
    await envoy?.stop();
    await server?.close();
    await Promise.all(Object.values(backends).map((b) => b.close()));
    dir.cleanup();
  }
}

/** Replaces the config and waits until the server has either pushed it or reported the expected issues. */
async function applyEdit(dirName: string, s: DiscoveryServer, file: string, text: string, issues: string[] | undefined): Promise<void> {
  const before = s.status().version;
  fs.writeFileSync(`${file}.tmp`, text);
  fs.renameSync(`${file}.tmp`, file);
  await s.reload();
  if (issues) {
    await waitFor(`${dirName}: the edit to be refused`, () => issues.every((re) => s.status().issues.some((i) => new RegExp(re).test(i))));
    assert.is(s.status().version, before, `${dirName}: a refused edit pushes nothing`);
  } else {
    await waitFor(`${dirName}: the edit to be pushed and acked`, () => {
      const st = s.status();
      return st.version !== before && st.connections[0]?.subscriptions.some((x) => x.acked === st.version);
    });
  }
}

type Vars = Record<string, number | string>;

async function runRequest(dirName: string, r: RequestSpec, vars: Vars, backends: Record<string, Backend>, certs: Record<string, TestCert>, adminPort: number): Promise<void> {
  if (!r.eventually) return checkRequest(dirName, r, vars, backends, certs, adminPort);
  let last: unknown;
  for (const deadline = Date.now() + 15_000; Date.now() < deadline; await sleep(200)) {
    try {
      return await checkRequest(dirName, r, vars, backends, certs, adminPort);
    } catch (e) {
      last = e;
    }
  }
  throw last;
}

async function checkRequest(dirName: string, r: RequestSpec, vars: Vars, backends: Record<string, Backend>, certs: Record<string, TestCert>, adminPort: number): Promise<void> {
  const what = `${dirName}: ${r.name}`;
  const port = Number(vars[`port.${r.listener ?? 'service'}`]);
  const url = `http://127.0.0.1:${port}${r.path ?? '/'}`;
  const attempt = () => (r.tcp ? tcpExchange(port, r.tls && tlsOptions(r.tls, certs))
    : r.tls ? tlsRequest(port, r, certs)
    : httpRequest(url, { method: r.method, headers: r.headers, timeoutMs: 10_000 }));
  const send = (): Promise<HttpResult & { error?: string; peerFingerprint?: string }> => (r.expect.fails ? attempt().then((x) => x, (e: Error) => ({ status: 0, body: '', headers: {}, error: e.message })) : attempt());
  // The listener can lag the ack by a moment: wait until it accepts a connection.
  await waitFor(`${what}: listener ${port}`, () => new Promise<boolean>((resolve) => {
    const c = net.connect(port, '127.0.0.1', () => {
      c.destroy();
      resolve(true);
    });
    c.on('error', () => resolve(false));
  }));
  // On a TCP listener the probe is proxied to a backend too: count from zero only once it has landed there.
  if (r.tcp && !r.tls) await waitFor(`${what}: the probe to reach a backend`, () => Object.values(backends).some((b) => b.requests > 0));
  for (const b of Object.values(backends)) b.requests = 0;
  const e = r.expect;
  const results: (HttpResult & { error?: string; peerFingerprint?: string })[] = [];
  let elapsed = 0;
  if (r.parallel) results.push(...await Promise.all(Array.from({ length: r.repeat ?? 1 }, () => send())));
  else {
    for (let i = 0; i < (r.repeat ?? 1); i++) {
      const t0 = Date.now();
      results.push(await send());
      elapsed = Date.now() - t0;
    }
  }
  const first = results[0]!;
  if (e.fails !== undefined) {
    assert.is(first.error !== undefined, e.fails, `${what}: the connection fails (got ${first.error ?? `status ${first.status}`})`);
    if (e.errorMatches) assert.match(first.error ?? '', new RegExp(e.errorMatches), `${what}: error`);
  }
  if (e.peerCert !== undefined) {
    assert.is(first.peerFingerprint, new X509Certificate(certs[e.peerCert]!.cert).fingerprint256, `${what}: the server presented ${e.peerCert}`);
  }
  const seen = () => JSON.parse(String(first.headers['x-seen-headers'] ?? '{}')) as Record<string, string>;
  if (e.status !== undefined) assert.is(first.status, e.status, `${what}: status (body ${first.body.slice(0, 200)})`);
  if (e.backend !== undefined) assert.is(first.body, e.backend, `${what}: backend`);
  if (e.bodyMatches !== undefined) assert.match(first.body, new RegExp(e.bodyMatches), `${what}: body`);
  for (const [k, v] of Object.entries(e.headers ?? {})) assert.is(first.headers[k], v, `${what}: response header ${k}`);
  for (const k of e.absentHeaders ?? []) assert.is(first.headers[k], undefined, `${what}: no response header ${k}`);
  for (const [k, v] of Object.entries(e.backendHeaders ?? {})) assert.is(seen()[k], v, `${what}: header ${k} at the backend`);
  for (const k of e.backendAbsentHeaders ?? []) assert.is(seen()[k], undefined, `${what}: no header ${k} at the backend`);
  if (e.statuses) {
    const counts: Record<string, number> = {};
    for (const x of results) counts[x.status] = (counts[x.status] ?? 0) + 1;
    assert.equal(counts, e.statuses, `${what}: statuses over ${results.length} requests`);
  }
  if (e.backendsSeen) assert.equal([...new Set(results.map((x) => x.body))].sort(), [...e.backendsSeen].sort(), `${what}: backends that answered`);
  if (e.statusesAtLeast) {
    for (const [code, n] of Object.entries(e.statusesAtLeast)) {
      const got = results.filter((x) => String(x.status) === code).length;
      assert.ok(got >= n, `${what}: ${got} x ${code} of ${results.length}, expected at least ${n}`);
    }
  }
  if (e.sameBackend) assert.equal(new Set(results.map((x) => x.body)).size, 1, `${what}: one backend answered every request`);
  if (e.minMs !== undefined) assert.ok(elapsed >= e.minMs, `${what}: took ${elapsed} ms, expected at least ${e.minMs}`);
  for (const [name, n] of Object.entries(e.envoyStatsAtLeast ?? {})) {
    const body = (await httpRequest(`http://127.0.0.1:${adminPort}/stats?filter=${encodeURIComponent(`^${name.replace(/[.]/g, '\\.')}$`)}`)).body;
    const got = Number(/: (\d+)/.exec(body)?.[1] ?? -1);
    assert.ok(got >= n, `${what}: Envoy stat ${name} is ${got}, expected at least ${n} (${body.trim() || 'absent'})`);
  }
  if (e.backendRequests) {
    const want = e.backendRequests;
    const counts = () => Object.fromEntries(Object.keys(want).map((k) => [k, backends[k]!.requests]));
    // Mirrored requests are sent asynchronously; give them a moment before comparing.
    await waitFor(`${what}: backend request counts ${JSON.stringify(want)}`, () => JSON.stringify(counts()) === JSON.stringify(want), 5_000).catch(() => undefined);
    await sleep(100);
    assert.equal(counts(), want, `${what}: requests per backend`);
  }
}

/** An HTTPS request with the SNI, trusted CA and client certificate the step names; remembers the server's certificate. */
function tlsRequest(port: number, r: RequestSpec, certs: Record<string, TestCert>): Promise<HttpResult & { peerFingerprint?: string }> {
  return new Promise((resolve, reject) => {
    const req = https.request({
      host: '127.0.0.1', port, path: r.path ?? '/', method: r.method ?? 'GET', headers: r.headers, agent: false, timeout: 10_000,
      ...tlsOptions(r.tls!, certs),
    }, (res) => {
      const peer = (res.socket as tls.TLSSocket).getPeerCertificate();
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8'), headers: res.headers, peerFingerprint: peer.fingerprint256 }));
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error(`TLS request to ${port} timed out`)));
    req.on('error', reject);
    req.end();
  });
}

function tlsOptions(t: NonNullable<RequestSpec['tls']>, certs: Record<string, TestCert>): tls.ConnectionOptions {
  const cert = (n: string) => {
    if (!certs[n]) throw new Error(`unknown certificate ${n}`);
    return certs[n]!;
  };
  return {
    servername: t.sni, ca: cert(t.ca).cert, ...(t.cert ? { cert: cert(t.cert).cert, key: cert(t.cert).key } : {}),
    ...(t.maxVersion ? { maxVersion: t.maxVersion } : {}), ...(t.ciphers ? { ciphers: t.ciphers } : {}),
  };
}

/** Connects (over TLS when given options), reads until the peer closes: the body is what it wrote. */
function tcpExchange(port: number, tlsOpts?: tls.ConnectionOptions): Promise<HttpResult> {
  return new Promise((resolve, reject) => {
    const c = tlsOpts ? tls.connect({ ...tlsOpts, host: '127.0.0.1', port }) : net.connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    c.setTimeout(10_000, () => c.destroy(new Error(`TCP exchange on ${port} timed out`)));
    c.on('data', (d: Buffer) => chunks.push(d));
    c.on('end', () => {
      c.destroy();
      resolve({ status: 0, body: Buffer.concat(chunks).toString('utf8'), headers: {} });
    });
    c.on('error', reject);
  });
}

for (const name of fs.readdirSync(CORPUS).sort()) {
  if (!fs.statSync(path.join(CORPUS, name)).isDirectory()) continue;
  test(`corpus case ${name} routes as istiod`, () => runCase(name));
}

test.run();
