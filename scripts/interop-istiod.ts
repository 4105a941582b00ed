// Interop with a real istiod (pilot-discovery built by scripts/interop-istiod-build.sh), with no Kubernetes: istiod
// and a JWKS server in one network namespace (the "hub"), each workload in a namespace of its own joined to the hub
// by a veth pair (the hub routes between them). Sidecars capture with this agent's istio-iptables and run the real
// Envoy; istiod is their xDS server and CA (JWT_RULE authenticates each agent's RS256 token). Started by
// scripts/interop-istiod.sh; usage:
//   npx tsx scripts/interop-istiod.ts CACHE_DIR [--bench [ROUNDS]] [--logs DIR]
// Checks (default): certificates from istiod (SPIFFE ids seen by the peers), A -> B over mTLS, plaintext to B
// refused under STRICT, 15021 ready, mixed pairs with the Go agent both ways, istiod's xDS for the client the same
// for both agents, and a proxyless gRPC client (DISABLE_ENVOY agent, @grpc/grpc-js-xds) routed by a VirtualService
// through istiod's grpc generator, and over mTLS to a proxyless xDS server under STRICT.
// --bench: start -> 15021 ready, start -> first mTLS request and the agent's own CPU, this agent and the Go agent
// alternately as the client against the same istiod and server sidecar; medians.
// --logs DIR keeps every process's output. The same file, run with a mode word first
// (`jwks`, `root`, `probe`, `backend`), is the helper process started inside a namespace.

import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as os from 'node:os';
import * as path from 'node:path';
import type * as Grpc from '@grpc/grpc-js';

const REPO = path.resolve(__dirname, '..');
const AGENT = path.join(REPO, 'dist', 'pilot-agent');
// INTEROP_TS_ARGS: more arguments for this agent only, space-separated (e.g. --log_output_level=default:debug).
const TS_ARGS = (process.env.INTEROP_TS_ARGS ?? '').split(' ').filter(Boolean);
const ENVOY = process.env.ENVOY_BIN ?? path.join(REPO, '.cache', 'envoy-1.40.0', 'envoy', '_bin', 'envoy');
const JWKS_PORT = 9999;
const ISSUER = `http://127.0.0.1:${JWKS_PORT}`;
const ISTIOD_SAN = 'istiod.istio-system.svc';
const TRUST = 'spiffe://cluster.local';
const SERVER_VIP = '240.240.0.10';
const SERVER_HOST = 'server.shop.svc.cluster.local';
const GRPC_HOST = 'echo.grpc.svc.cluster.local';
const GRPC_TLS_HOST = 'echo-tls.grpcs.svc.cluster.local';
/** Workload namespaces: index n is joined to the hub as 10.88.n.2 (the hub is 10.88.n.1 on that link). */
const LINKS = { a: 1, b: 2, p: 3 } as const;
type Side = keyof typeof LINKS;
const ip = (side: Side) => `10.88.${LINKS[side]}.2`;
const hubIp = (side: Side) => `10.88.${LINKS[side]}.1`;

// ---------------------------------------------------------------------------------------------------------------
// Helper modes, run inside a namespace.

/** Serves the JWKS istiod's JWT_RULE points at. */
function jwksMode(file: string): void {
  const body = fs.readFileSync(file);
  http.createServer((_q, s) => s.end(body)).listen(JWKS_PORT, '127.0.0.1', () => process.stdout.write('listening\n'));
}

/** One CreateCertificate call, not verifying istiod (no root is known yet): prints the chain's last element. */
async function rootMode(a: { address: string; token: string }): Promise<void> {
  const grpc = await import('@grpc/grpc-js');
  const { generateKeyAndCsr } = await import('../lib/csr');
  const { csrPem } = await generateKeyAndCsr({ identity: `${TRUST}/ns/shop/sa/client`, algorithm: { kind: 'ECDSA' } });
  const verify = { rejectUnauthorized: false, checkServerIdentity: () => undefined };
  const creds = grpc.credentials.createSsl(null, null, null, verify);
  const client = new grpc.Client(a.address, creds);
  const md = new grpc.Metadata();
  md.set('authorization', `Bearer ${a.token}`);
  md.set('clusterid', 'Kubernetes');
  // IstioCertificateRequest { string csr = 1; int64 validity_duration = 2; }
  const req = Buffer.concat([pbField(1, Buffer.from(csrPem)), Buffer.from([0x10]), varint(3600)]);
  const res = await new Promise<Buffer>((resolve, reject) => client.makeUnaryRequest(
    '/istio.v1.auth.IstioCertificateService/CreateCertificate', (b: Buffer) => b, (b: Buffer) => b, req, md,
    { deadline: Date.now() + 10_000 }, (e, r) => (e ? reject(e) : resolve(r!))));
  client.close();
  // IstioCertificateResponse { repeated string cert_chain = 1; }
  const chain = pbStrings(res, 1);
  if (!chain.length) throw new Error('CreateCertificate returned no chain');
  process.stdout.write(chain[chain.length - 1]!.trim() + '\n');
  process.exit(0);
}

function varint(n: number): Buffer {
  const out: number[] = [];
  while (n > 0x7f) {
    out.push((n & 0x7f) | 0x80);
    n = Math.floor(n / 128);
  }
  out.push(n);
  return Buffer.from(out);
}

function pbField(field: number, bytes: Buffer): Buffer {
  return Buffer.concat([varint((field << 3) | 2), varint(bytes.length), bytes]);
}

function pbStrings(buf: Buffer, want: number): string[] {
  const out: string[] = [];
  let i = 0;
  const read = () => {
    let n = 0;
    let mul = 1;
    for (;;) {
      const b = buf[i++]!;
      n += (b & 0x7f) * mul;
      mul *= 128;
      if (b < 0x80) return n;
    }
  };
  while (i < buf.length) {
    const tag = read();
    const wire = tag & 7;
    if (wire === 0) read();
    else if (wire === 2) {
      const len = read();
      if (tag >> 3 === want) out.push(buf.subarray(i, i + len).toString('utf8'));
      i += len;
    } else throw new Error(`unexpected protobuf wire type ${wire}`);
  }
  return out;
}

/**
 * Polls 15021 readiness and a request through the capture to the server's VIP every 10 ms; prints, as JSON, the
 * wall-clock time of the first success of each (and the answer), then exits. Started before the agent it watches.
 */
async function probeMode(a: { timeoutMs: number }): Promise<void> {
  const get = (url: string, host?: string) => new Promise<{ status: number; body: string } | undefined>((resolve) => {
    const q = http.get(url, { headers: host ? { host } : {}, timeout: 1000, agent: false }, (r) => {
      let body = '';
      r.on('data', (d) => (body += d));
      r.on('end', () => resolve({ status: r.statusCode ?? 0, body }));
      r.on('error', () => resolve(undefined));
    });
    q.on('error', () => resolve(undefined));
    q.on('timeout', () => q.destroy());
  });
  const deadline = Date.now() + a.timeoutMs;
  let ready: number | undefined;
  let mtls: { at: number; body: string } | undefined;
  process.stdout.write('polling\n');
  const loop = async (what: 'ready' | 'mtls') => {
    while (Date.now() < deadline) {
      if (what === 'ready') {
        const r = await get('http://127.0.0.1:15021/healthz/ready');
        if (r?.status === 200) return void (ready = Date.now());
      } else {
        const r = await get(`http://${SERVER_VIP}:8080/`, SERVER_HOST);
        if (r?.status === 200) return void (mtls = { at: Date.now(), body: r.body });
      }
      await new Promise((res) => setTimeout(res, 10));
    }
  };
  await Promise.all([loop('ready'), loop('mtls')]);
  process.stdout.write(JSON.stringify({ ready, mtls: mtls?.at, body: mtls?.body }) + '\n');
  process.exit(0);
}

/** Plain gRPC servers answering /test.Echo/Who with their name (the proxyless client's backends). */
async function backendMode(a: { servers: { address: string; name: string }[]; xds?: boolean }): Promise<void> {
  const grpc = await import('@grpc/grpc-js');
  const xds = await import('@grpc/grpc-js-xds');
  // An xDS server (GRPC_XDS_BOOTSTRAP set): its transport is what the control plane's inbound listener says.
  if (a.xds) xds.register();
  const id = (b: Buffer) => b;
  const echo = { Who: { path: '/test.Echo/Who', requestStream: false, responseStream: false,
    requestSerialize: id, requestDeserialize: id, responseSerialize: id, responseDeserialize: id } };
  for (const s of a.servers) {
    const server = a.xds ? new xds.XdsServer() : new grpc.Server();
    server.addService(echo, { Who: (call: Grpc.ServerUnaryCall<Buffer, Buffer>, cb: Grpc.sendUnaryData<Buffer>) => {
      const auth = call.getAuthContext();
      const peer = auth.sslPeerCertificate?.subjectaltname ?? '-';
      cb(null, Buffer.from(a.xds ? `${s.name} ${auth.transportSecurityType ?? 'insecure'} ${peer}` : s.name));
    } });
    const insecure = grpc.ServerCredentials.createInsecure();
    const creds = a.xds ? new xds.XdsServerCredentials(insecure) : insecure;
    await new Promise<void>((resolve, reject) => server.bindAsync(s.address, creds,
      (e) => (e ? reject(e) : resolve())));
  }
  process.stdout.write('bound\n');
}

// ---------------------------------------------------------------------------------------------------------------
// The run.

interface Proc {
  name: string;
  proc: ChildProcess;
  out(): string;
  exited: Promise<number | null>;
}

const procs: Proc[] = [];
const namespaces: string[] = [];
let tmp = '';
const id = crypto.randomBytes(3).toString('hex');
const nsName = (what: string) => `pai-${what}-${id}`;

function log(line: string): void {
  process.stdout.write(`${new Date().toISOString().slice(11, 23)} ${line}\n`);
}

function sh(cmd: string, args: string[]): string {
  return execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

interface SpawnOpts {
  cwd?: string;
  env?: Record<string, string>;
}

function spawnIn(name: string, ns: string, cmd: string, args: string[], o: SpawnOpts = {}): Proc {
  const proc = spawn('ip', ['netns', 'exec', ns, cmd, ...args], {
    cwd: o.cwd ?? REPO, stdio: ['ignore', 'pipe', 'pipe'],
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: '/root', ...o.env },
  });
  let out = '';
  proc.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  proc.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((r) => proc.once('exit', (c) => r(c)));
  const p = { name, proc, out: () => out, exited };
  procs.push(p);
  return p;
}

/** This file again, in `mode`, inside `ns`. */
function helper(name: string, ns: string, mode: string, arg: unknown): Proc {
  return spawnIn(name, ns, process.execPath, ['--import', 'tsx', __filename, mode, JSON.stringify(arg)]);
}

async function waitFor<T>(what: string, fn: () => Promise<T | undefined | false> | T | undefined | false, ms = 30_000,
  every = 200): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, every));
  }
}

const waitLine = (p: Proc, line: string, ms = 30_000) => waitFor(`${p.name} to print "${line}"`, () => {
  if (p.proc.exitCode !== null) throw new Error(`${p.name} exited with ${p.proc.exitCode}:\n${p.out().slice(-3000)}`);
  return p.out().includes(line);
}, ms, 50);

function forget(p: Proc): void {
  const i = procs.indexOf(p);
  if (i >= 0) procs.splice(i, 1);
}

/** --logs DIR: every process's output is kept there when it ends. */
let logDir = '';
let logSeq = 0;

async function stop(p: Proc, ms = 15_000): Promise<number | null> {
  if (p.proc.exitCode === null && p.proc.signalCode === null) {
    p.proc.kill('SIGTERM');
    const t = setTimeout(() => p.proc.kill('SIGKILL'), ms);
    await p.exited;
    clearTimeout(t);
  }
  if (logDir) {
    const name = `${String(++logSeq).padStart(2, '0')}-${p.name.replace(/\W+/g, '-')}.log`;
    fs.writeFileSync(path.join(logDir, name), p.out());
  }
  forget(p);
  return p.proc.exitCode;
}

async function cleanup(): Promise<void> {
  for (const p of [...procs].reverse()) await stop(p).catch(() => undefined);
  for (const ns of namespaces) {
    // Anything still in a namespace (an Envoy whose agent was killed) was started by this run.
    const pids = (() => { try { return sh('ip', ['netns', 'pids', ns]); } catch { return ''; } })();
    for (const pid of pids.split('\n').filter(Boolean)) {
      try {
        process.kill(Number(pid), 'SIGKILL');
      } catch {
        // gone
      }
    }
    try { sh('ip', ['netns', 'del', ns]); } catch { /* gone */ }
  }
  namespaces.length = 0;
  if (tmp) {
    removeLeftShm();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

/**
 * An agent of this run that did not end by itself (killed with its parent) cannot remove its Envoy's shared
 * memory: remove what an owner file under this run's directory names, once that owner is gone.
 */
function removeLeftShm(): void {
  for (const f of fs.readdirSync('/dev/shm').filter((n) => /^pilot-agent-envoy-shm-owner_\d+$/.test(n))) {
    try {
      const text = fs.readFileSync(path.join('/dev/shm', f), 'utf8');
      const owner = JSON.parse(text) as { configPath?: string; pid?: unknown };
      if (!owner.configPath?.startsWith(tmp + path.sep)) continue;
      try {
        process.kill(Number(owner.pid), 0);
        continue;
      } catch {
        // the owner is gone
      }
      const n = f.slice(f.lastIndexOf('_') + 1);
      fs.rmSync(path.join('/dev/shm', `envoy_shared_memory_${n}`), { force: true });
      fs.rmSync(path.join('/dev/shm', f), { force: true });
    } catch {
      // not ours or already gone
    }
  }
}

function topology(): void {
  const hub = nsName('hub');
  for (const n of [hub, ...Object.keys(LINKS).map(nsName)]) {
    sh('ip', ['netns', 'add', n]);
    namespaces.push(n);
    sh('ip', ['-n', n, 'link', 'set', 'lo', 'up']);
  }
  sh('ip', ['netns', 'exec', hub, 'sysctl', '-qw', 'net.ipv4.ip_forward=1']);
  for (const side of Object.keys(LINKS) as Side[]) {
    const ns = nsName(side);
    sh('ip', ['-n', hub, 'link', 'add', `to-${side}`, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns]);
    sh('ip', ['-n', hub, 'addr', 'add', `${hubIp(side)}/24`, 'dev', `to-${side}`]);
    sh('ip', ['-n', hub, 'link', 'set', `to-${side}`, 'up']);
    sh('ip', ['-n', ns, 'addr', 'add', `${ip(side)}/24`, 'dev', 'eth0']);
    sh('ip', ['-n', ns, 'link', 'set', 'eth0', 'up']);
    // The kernel needs a route to the VIP (and to the other workloads) before the capture rule runs.
    sh('ip', ['-n', ns, 'route', 'add', 'default', 'via', hubIp(side)]);
  }
}

function b64url(x: Buffer | string): string {
  return Buffer.from(x).toString('base64url');
}

/** An RS256 JWT for system:serviceaccount:<ns>:<sa>, as JWT_RULE expects. */
function token(key: crypto.KeyObject, ns: string, sa: string): string {
  const now = Math.floor(Date.now() / 1000);
  const head = b64url(JSON.stringify({ alg: 'RS256', kid: 'interop', typ: 'JWT' }));
  const body = b64url(JSON.stringify({ iss: ISSUER, aud: ['istio-ca'], sub: `system:serviceaccount:${ns}:${sa}`,
    iat: now, nbf: now - 60, exp: now + 24 * 3600 }));
  return `${head}.${body}.${b64url(crypto.sign('sha256', Buffer.from(`${head}.${body}`), key))}`;
}

function meshConfigYaml(): string {
  return `# shop: the sidecars (STRICT); grpc: the proxyless client and its backends (plaintext)
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: server, namespace: shop}
spec:
  hosts: [${SERVER_HOST}]
  addresses: [${SERVER_VIP}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 8080, name: http, protocol: HTTP, targetPort: 9080}]
  workloadSelector: {labels: {app: server}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: server-b, namespace: shop}
spec:
  address: ${ip('b')}
  labels: {app: server, security.istio.io/tlsMode: istio}
  serviceAccount: server
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: shop}
spec: {mtls: {mode: STRICT}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: echo, namespace: grpc}
spec:
  hosts: [${GRPC_HOST}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 7070, name: grpc, protocol: GRPC}]
  endpoints:
  - {address: ${ip('p')}, ports: {grpc: 7071}, labels: {version: v1}}
  - {address: ${ip('p')}, ports: {grpc: 7072}, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: grpc}
spec:
  host: ${GRPC_HOST}
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: grpc}
spec:
  hosts: [${GRPC_HOST}]
  http:
  - match: [{headers: {x-version: {exact: v2}}}]
    route: [{destination: {host: ${GRPC_HOST}, subset: v2}}]
  - route: [{destination: {host: ${GRPC_HOST}, subset: v1}}]
---
# grpcs: a proxyless xDS server behind STRICT, called with ISTIO_MUTUAL (istiod's grpc generator does no auto-mTLS)
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: echo-tls, namespace: grpcs}
spec:
  hosts: [${GRPC_TLS_HOST}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 7070, name: grpc, protocol: GRPC}]
  endpoints:
  - {address: ${ip('p')}, ports: {grpc: 7073}, labels: {security.istio.io/tlsMode: istio}, serviceAccount: echo}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo-tls, namespace: grpcs}
spec:
  host: ${GRPC_TLS_HOST}
  trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: grpcs}
spec: {mtls: {mode: STRICT}}
`;
}

interface Ctx {
  cache: string;
  key: crypto.KeyObject;
  root: string;
  istiod: Proc;
}

async function startIstiod(cache: string): Promise<Ctx> {
  const hub = nsName('hub');
  const { privateKey, publicKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
  const jwk = { ...publicKey.export({ format: 'jwk' }), kid: 'interop', alg: 'RS256', use: 'sig' };
  const dir = path.join(tmp, 'istiod');
  fs.mkdirSync(path.join(dir, 'config'), { recursive: true });
  fs.writeFileSync(path.join(dir, 'jwks.json'), JSON.stringify({ keys: [jwk] }));
  fs.writeFileSync(path.join(dir, 'config', 'mesh.yaml'), meshConfigYaml());
  fs.writeFileSync(path.join(dir, 'meshconfig.yaml'), `trustDomain: cluster.local
defaultConfig:
  discoveryAddress: ${ISTIOD_SAN}:15012
`);
  await waitLine(helper('jwks', hub, 'jwks', path.join(dir, 'jwks.json')), 'listening');
  const t0 = Date.now();
  const istiod = spawnIn('istiod', hub, path.join(cache, 'bin', 'pilot-discovery'), ['discovery', '--registries=',
    `--configDir=${path.join(dir, 'config')}`, `--meshConfig=${path.join(dir, 'meshconfig.yaml')}`,
    '--clusterID=Kubernetes'], {
    cwd: dir,
    env: {
      POD_NAMESPACE: 'istio-system', PILOT_ENABLE_METADATA_EXCHANGE: 'false', PILOT_ENABLE_ALPN_FILTER: 'false',
      JWT_RULE: JSON.stringify({ issuer: ISSUER, jwks_uri: `${ISSUER}/jwks`, audiences: ['istio-ca'] }),
    },
  });
  // (8080 /ready also waits for the sidecar injector and config validation webhooks, which need Kubernetes.)
  await waitFor('istiod serving (15014 /debug/syncz)', async () => {
    if (istiod.proc.exitCode !== null) {
      throw new Error(`istiod exited with ${istiod.proc.exitCode}:\n${istiod.out().slice(-4000)}`);
    }
    try {
      return sh('ip', ['netns', 'exec', hub, 'curl', '-s', '-o', '/dev/null', '-w', '%{http_code}', '-m', '1',
        'http://127.0.0.1:15014/debug/syncz']) === '200';
    } catch {
      return false;
    }
  }, 60_000, 200);
  log(`istiod serving in ${Date.now() - t0} ms`);
  // The root of trust: istiod's in-memory self-signed CA, from one unverified CreateCertificate call.
  const r = helper('root', hub, 'root', { address: '127.0.0.1:15012', token: token(privateKey, 'shop', 'client') });
  const code = await r.exited;
  forget(r);
  const pem = r.out().match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/)?.[0];
  if (code !== 0 || !pem) throw new Error(`fetching istiod's root failed (exit ${code}):\n${r.out()}`);
  const root = path.join(tmp, 'root-cert.pem');
  fs.writeFileSync(root, pem + '\n');
  log(`istiod's root: ${new crypto.X509Certificate(pem).subject.replace(/\n/g, ', ')}`);
  return { cache, key: privateKey, root, istiod };
}

type Kind = 'ts' | 'go';

interface Agent {
  kind: Kind;
  side: Side;
  p: Proc;
  spawnedAt: number;
  dir: string;
  /** Start -> first 200 from 15021, once seen. */
  readyMs?: number;
}

let agentSeq = 0;

/** A sidecar (or, with `proxyless`, a DISABLE_ENVOY agent) in `side`'s namespace, as gid 1337 (not captured). */
function startAgent(c: Ctx, kind: Kind, side: Side, who: { ns: string; sa: string }, proxyless = false,
  proxyConfig: Record<string, unknown> = {}): Agent {
  const dir = path.join(tmp, `${side}-${kind}-${++agentSeq}`);
  fs.mkdirSync(path.join(dir, 'var/run/secrets/tokens'), { recursive: true });
  fs.writeFileSync(path.join(dir, 'var/run/secrets/tokens/istio-token'), token(c.key, who.ns, who.sa));
  if (kind === 'go') {
    fs.mkdirSync(path.join(dir, 'var/lib/istio/envoy'), { recursive: true });
    fs.copyFileSync(path.join(c.cache, 'envoy_bootstrap_tmpl.json'),
      path.join(dir, 'var/lib/istio/envoy/envoy_bootstrap_tmpl.json'));
  }
  fs.chmodSync(dir, 0o755);
  fs.mkdirSync(path.join(dir, 'proxy'));
  fs.chownSync(path.join(dir, 'proxy'), 1337, 1337);
  const env: Record<string, string> = {
    PROXY_CONFIG: JSON.stringify({
      configPath: path.join(dir, 'proxy'), binaryPath: proxyless ? '/nonexistent/envoy' : ENVOY,
      discoveryAddress: `${hubIp(side)}:15012`, drainDuration: '1s', terminationDrainDuration: '1s', ...proxyConfig,
    }),
    // The same pod name for both agents on a side: istiod's config for them can be compared as it is.
    POD_NAME: `${who.sa}-${side}`, POD_NAMESPACE: who.ns, SERVICE_ACCOUNT: who.sa, INSTANCE_IP: ip(side),
    ISTIOD_SAN, XDS_ROOT_CA: c.root, CA_ROOT_CA: c.root, ISTIO_META_CLUSTER_ID: 'Kubernetes',
    ...(kind === 'ts' && { ENVOY_UID: '1337', ENVOY_GID: '1337' }),
    // The Go agent probes cloud metadata servers (169.254.169.254) for up to 5 s unless told the platform; this
    // agent does no such detection, and an unreachable metadata address here cost the Go agent ~2 s at random.
    ...(kind === 'go' && { CLOUD_PLATFORM: 'none' }),
    // Proxyless: the certificate from istiod into files for gRPC's file_watcher provider.
    ...(proxyless && { DISABLE_ENVOY: 'true', OUTPUT_CERTS: path.join(dir, 'certs') }),
  };
  const bin = kind === 'ts' ? AGENT : path.join(c.cache, 'bin', 'pilot-agent');
  const spawnedAt = Date.now();
  const p = spawnIn(`${kind} agent in ${side}`, nsName(side), 'setpriv',
    ['--regid=1337', '--clear-groups', bin, 'proxy', 'sidecar', ...(kind === 'ts' ? TS_ARGS : [])], { cwd: dir, env });
  return { kind, side, p, spawnedAt, dir };
}

function capture(side: Side): void {
  sh('ip', ['netns', 'exec', nsName(side), AGENT, 'istio-iptables', '-p', '15001', '-z', '15006', '-u', '1337', '-m',
    'REDIRECT', '-i', '*', '-x', '', '-b', '*', '-d', '15090,15021,15020']);
}

/** curl inside a namespace: [exit code, body, http code]. */
function curl(side: Side | 'hub', args: string[]): [number, string] {
  try {
    return [0, sh('ip', ['netns', 'exec', nsName(side), 'curl', '-sS', '-m', '5', ...args])];
  } catch (e) {
    const x = e as { status?: number; stdout?: string; stderr?: string };
    return [x.status ?? 1, `${x.stdout ?? ''}${x.stderr ?? ''}`];
  }
}

async function waitReady(a: Agent, ms = 60_000): Promise<number> {
  if (a.readyMs !== undefined) return a.readyMs;
  await waitFor(`the ${a.kind} agent in ${a.side} ready on 15021`, () => {
    if (a.p.proc.exitCode !== null) throw new Error(`${a.p.name} exited with ${a.p.proc.exitCode}`);
    return curl(a.side, ['-o', '/dev/null', '-w', '%{http_code}', 'http://127.0.0.1:15021/healthz/ready'])[1] === '200';
  }, ms, 100).catch((e: Error) => { throw new Error(`${e.message}\n${a.p.out().slice(-4000)}`); });
  a.readyMs = Date.now() - a.spawnedAt;
  return a.readyMs;
}

/** The SPIFFE ids of the workload certificate Envoy holds (admin /certs). */
function envoyCertIds(side: Side): string[] {
  const [code, body] = curl(side, ['http://127.0.0.1:15000/certs']);
  if (code !== 0) return [];
  const certs = JSON.parse(body) as { certificates: { cert_chain?: { subject_alt_names?: { uri?: string }[] }[] }[] };
  return [...new Set(certs.certificates.flatMap((c) => c.cert_chain ?? []).flatMap((x) => x.subject_alt_names ?? [])
    .map((s) => s.uri).filter((u): u is string => !!u))];
}

interface Result {
  name: string;
  ok: boolean;
  detail: string;
}
const results: Result[] = [];

function check(name: string, ok: boolean, detail = ''): boolean {
  results.push({ name, ok, detail });
  log(`${ok ? 'PASS' : 'FAIL'} ${name}${detail ? `: ${detail}` : ''}`);
  return ok;
}

const CLIENT_ID = `${TRUST}/ns/shop/sa/client`;
const SERVER_ID = `${TRUST}/ns/shop/sa/server`;

/** One pair: A (client) -> B (server app behind its sidecar) over mTLS; plaintext to B refused. */
async function checkPair(client: Agent, server: Agent): Promise<void> {
  const label = `${client.kind} -> ${server.kind}`;
  try {
    const [ra, rb] = await Promise.all([waitReady(client), waitReady(server)]);
    check(`${label}: both sidecars ready on 15021`, true,
      `A ${ra} ms after its start, B ${rb} ms (polled every 100 ms)`);
  } catch (e) {
    check(`${label}: both sidecars ready on 15021`, false, (e as Error).message);
    return;
  }
  const via = () => curl('a', ['-H', `host: ${SERVER_HOST}`, `http://${SERVER_VIP}:8080/`]);
  const first = await waitFor('a request through both sidecars', () => {
    const r = via();
    return r[0] === 0 && r[1].includes('By=') ? r : undefined;
  }, 30_000, 200).catch(() => via());
  const xfcc = first[1];
  check(`${label}: A -> B over mTLS, the server app sees both istiod-issued SPIFFE ids in XFCC`,
    xfcc.includes(`By=${SERVER_ID}`) && xfcc.includes(`URI=${CLIENT_ID}`), xfcc.trim().slice(0, 300));
  let ok = 0;
  for (let i = 0; i < 20; i++) if (via()[1].includes(`URI=${CLIENT_ID}`)) ok++;
  check(`${label}: 20 more requests`, ok === 20, `${ok}/20 over mTLS`);
  const [ida, idb] = [envoyCertIds('a'), envoyCertIds('b')];
  check(`${label}: Envoy's workload certificates (admin /certs)`, ida.includes(CLIENT_ID) && idb.includes(SERVER_ID),
    `A ${ida.join(',') || '?'}; B ${idb.join(',') || '?'}`);
  const plain = curl('hub', ['-o', '/dev/null', '-w', '%{http_code}', `http://${ip('b')}:9080/`]);
  check(`${label}: plaintext from outside the mesh to B refused (STRICT)`,
    plain[0] !== 0 && !plain[1].startsWith('200'), `curl exit ${plain[0]} ${plain[1].trim().split('\n').pop()}`);
}

/** What istiod generated for a connected proxy (`<pod>.<namespace>`), without fields that change on every push. */
function configDump(proxy: string): unknown {
  const [code, body] = curl('hub', [`http://127.0.0.1:15014/debug/config_dump?proxyID=${proxy}`]);
  if (code !== 0) return undefined;
  try {
    return JSON.parse(body, (k, v) => {
      if (k === 'last_updated' || k === 'version_info' || k === 'lastUpdated' || k === 'versionInfo') return undefined;
      // Resource lists come in istiod's map order, which changes between pushes: order them by name.
      if (/^(dynamic|static)/.test(k) && Array.isArray(v)) {
        return [...v].sort((x, y) => resName(x).localeCompare(resName(y)));
      }
      return v;
    });
  } catch {
    return undefined;
  }
}

/** `N listeners, N clusters, ...` in a config dump. */
function resources(dump: unknown): string {
  const configs = (dump as { configs?: Record<string, unknown>[] }).configs ?? [];
  const count = (key: string) => configs.reduce((n, c) => n + (Array.isArray(c[key]) ? c[key].length : 0), 0);
  return `${count('dynamicListeners')} listeners, ${count('dynamicActiveClusters')} clusters, ` +
    `${count('dynamicRouteConfigs')} route configs`;
}

function resName(r: unknown): string {
  const e = r as { name?: string; activeState?: { listener?: { name?: string } }; cluster?: { name?: string };
    routeConfig?: { name?: string } };
  return e.name ?? e.activeState?.listener?.name ?? e.cluster?.name ?? e.routeConfig?.name ?? JSON.stringify(r);
}

/** Paths where two JSON values differ (arrays by index). */
function differences(x: unknown, y: unknown, at = ''): string[] {
  if (typeof x !== typeof y || Array.isArray(x) !== Array.isArray(y) || x === null || y === null ||
    typeof x !== 'object') {
    return JSON.stringify(x) === JSON.stringify(y) ? [] : [`${at || '/'}: ${clip(x)} vs ${clip(y)}`];
  }
  const o = x as Record<string, unknown>;
  const p = y as Record<string, unknown>;
  return [...new Set([...Object.keys(o), ...Object.keys(p)])].flatMap((k) => differences(o[k], p[k], `${at}/${k}`));
}

const clip = (v: unknown) => (JSON.stringify(v) ?? 'undefined').slice(0, 80);

const APP = `require('http').createServer((q, s) => { q.resume(); s.end(String(q.headers['x-forwarded-client-cert'] ||
  'no xfcc')); }).listen(9080, '0.0.0.0', () => console.log('listening'));`;

async function checks(c: Ctx): Promise<void> {
  await waitLine(spawnIn('server app', nsName('b'), 'setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups',
    process.execPath, '-e', APP]), 'listening');
  const cli = { ns: 'shop', sa: 'client' };
  const srv = { ns: 'shop', sa: 'server' };
  let a = startAgent(c, 'ts', 'a', cli);
  let b = startAgent(c, 'ts', 'b', srv);
  await checkPair(a, b);
  const tsDump = configDump('client-a.shop');
  // Mixed: the Go agent as the client, then as the server.
  await stop(a.p);
  a = startAgent(c, 'go', 'a', cli);
  await checkPair(a, b);
  const goDump = configDump('client-a.shop');
  const diffs = differences(tsDump, goDump);
  check('istiod generated the same xDS for this agent as for the Go agent (its /debug/config_dump of the client)',
    tsDump !== undefined && goDump !== undefined && diffs.length === 0,
    tsDump === undefined || goDump === undefined ? 'no config dump' : `${diffs.length} differing fields in ` +
      `${resources(tsDump)}` + (diffs.length ? `: ${diffs.slice(0, 8).join('; ')}` : ''));
  await stop(a.p);
  await stop(b.p);
  a = startAgent(c, 'ts', 'a', cli);
  b = startAgent(c, 'go', 'b', srv);
  await checkPair(a, b);
  const code = await stop(a.p);
  check('this agent ends with exit 0 on SIGTERM', code === 0, `exit ${code}`);
  await stop(b.p);
  await proxyless(c);
}

/** A DISABLE_ENVOY agent in namespace P, a grpc-js-xds client through it, routed by istiod's VirtualService. */
async function proxyless(c: Ctx): Promise<void> {
  await waitLine(helper('gRPC backends', nsName('p'), 'backend', {
    servers: [{ address: `${ip('p')}:7071`, name: 'v1' }, { address: `${ip('p')}:7072`, name: 'v2' }],
  }), 'bound');
  const a = startAgent(c, 'ts', 'p', { ns: 'grpc', sa: 'client' }, true);
  try {
    await waitFor('the proxyless agent ready on 15020', () => {
      if (a.p.proc.exitCode !== null) throw new Error(`exited with ${a.p.proc.exitCode}`);
      return curl('p', ['-o', '/dev/null', '-w', '%{http_code}', 'http://127.0.0.1:15020/healthz/ready'])[1] === '200';
    }, 60_000, 200);
    check('proxyless: DISABLE_ENVOY agent ready (certificates from istiod for gRPC\'s file_watcher)', true,
      `${Date.now() - a.spawnedAt} ms after start`);
  } catch (e) {
    check('proxyless: DISABLE_ENVOY agent ready', false, `${(e as Error).message}\n${a.p.out().slice(-3000)}`);
    return;
  }
  const certFile = path.join(a.dir, 'certs', 'cert-chain.pem');
  const leaf = fs.existsSync(certFile) ? new crypto.X509Certificate(fs.readFileSync(certFile)) : undefined;
  const rootPem = fs.readFileSync(c.root);
  check('proxyless: the certificate files hold an istiod-signed grpc/client identity',
    !!leaf && leaf.subjectAltName === `URI:${TRUST}/ns/grpc/sa/client` &&
    leaf.verify(new crypto.X509Certificate(rootPem).publicKey), leaf?.subjectAltName ?? `no ${certFile}`);
  const bootstrap = path.join(a.dir, 'etc/istio/proxy/grpc-bootstrap.json');
  const calls = [{}, {}, { 'x-version': 'v2' }, { 'x-version': 'v2' }, {}];
  const client = spawnIn('grpc-xds client', nsName('p'), process.execPath, ['--import', 'tsx',
    path.join(REPO, 'test/helpers/grpc-xds-client.ts'), JSON.stringify({ target: `${GRPC_HOST}:7070`, calls })],
  { env: { GRPC_XDS_BOOTSTRAP: bootstrap } });
  const timeout = new Promise<'timeout'>((r) => setTimeout(() => r('timeout'), 60_000).unref());
  const code = await Promise.race([client.exited, timeout]);
  if (code === 'timeout') await stop(client);
  else forget(client);
  const line = client.out().trim().split('\n').pop() ?? '';
  let answers: string[] = [];
  try {
    answers = (JSON.parse(line) as { answers: string[] }).answers;
  } catch {
    // reported below
  }
  check('proxyless: @grpc/grpc-js-xds routed by the VirtualService (default -> v1, x-version: v2 -> v2) via istiod',
    JSON.stringify(answers) === JSON.stringify(['v1', 'v1', 'v2', 'v2', 'v1']),
    answers.length ? answers.join(',') : `client exit ${code}: ${client.out().slice(-1500)}`);
  const node = JSON.parse(fs.readFileSync(bootstrap, 'utf8')).node as { id: string; metadata: { GENERATOR?: string } };
  const pod = node.id.split('~')[2]!;
  const pushed = new RegExp(`(\\w+): PUSH request for node:${pod.replace('.', '\\.')} `, 'g');
  const pushes = [...c.istiod.out().matchAll(pushed)].map((m) => m[1]);
  check('proxyless: istiod\'s grpc generator served the node (bootstrap GENERATOR=grpc; LDS, RDS, CDS, EDS pushed)',
    node.metadata.GENERATOR === 'grpc' && ['LDS', 'RDS', 'CDS', 'EDS'].every((t) => pushes.includes(t)),
    `GENERATOR=${node.metadata.GENERATOR}, pushes to ${pod}: ${[...new Set(pushes)].join(',')}`);
  await proxylessMtls(c, bootstrap);
  const exit = await stop(a.p);
  check('proxyless: agent exits 0 on SIGTERM', exit === 0, `exit ${exit}`);
}

/** The grpc-js-xds client in P (`bootstrap`: its agent's): the answers, or why there are none. */
async function grpcClient(bootstrap: string, args: Record<string, unknown>): Promise<string[] | string> {
  const client = spawnIn('grpc-xds client', nsName('p'), process.execPath, ['--import', 'tsx',
    path.join(REPO, 'test/helpers/grpc-xds-client.ts'), JSON.stringify(args)],
  { env: { GRPC_XDS_BOOTSTRAP: bootstrap } });
  const timeout = new Promise<'timeout'>((r) => setTimeout(() => r('timeout'), 60_000).unref());
  const code = await Promise.race([client.exited, timeout]);
  if (code === 'timeout') await stop(client);
  else forget(client);
  try {
    return (JSON.parse(client.out().trim().split('\n').pop() ?? '') as { answers: string[] }).answers;
  } catch {
    return `client exit ${code}: ${client.out().slice(-1500)}`;
  }
}

/** A second DISABLE_ENVOY agent (grpcs/echo) with a grpc-js-xds XdsServer behind STRICT; the client over mTLS. */
async function proxylessMtls(c: Ctx, clientBootstrap: string): Promise<void> {
  const srv = startAgent(c, 'ts', 'p', { ns: 'grpcs', sa: 'echo' }, true, { statusPort: 15120 });
  try {
    await waitFor('the xDS server\'s agent ready on 15120', () => {
      if (srv.p.proc.exitCode !== null) throw new Error(`exited with ${srv.p.proc.exitCode}`);
      return curl('p', ['-o', '/dev/null', '-w', '%{http_code}', 'http://127.0.0.1:15120/healthz/ready'])[1] === '200';
    }, 60_000, 200);
  } catch (e) {
    check('proxyless mTLS: the xDS server\'s agent ready', false,
      `${(e as Error).message}\n${srv.p.out().slice(-3000)}`);
    return;
  }
  const server = spawnIn('gRPC xDS server', nsName('p'), process.execPath, ['--import', 'tsx', __filename, 'backend',
    JSON.stringify({ servers: [{ address: `${ip('p')}:7073`, name: 'tls' }], xds: true })],
  { env: { GRPC_XDS_BOOTSTRAP: path.join(srv.dir, 'etc/istio/proxy/grpc-bootstrap.json') } });
  await waitLine(server, 'bound');
  const target = `${GRPC_TLS_HOST}:7070`;
  const mtls = await grpcClient(clientBootstrap, { target, calls: [{}, {}], xdsCreds: true });
  const want = `tls ssl URI:${TRUST}/ns/grpc/sa/client`;
  check('proxyless mTLS: grpc-js-xds client -> xDS server with certificates from istiod (server sees the client id)',
    Array.isArray(mtls) && mtls.every((x) => x === want), Array.isArray(mtls) ? mtls.join(', ') : mtls);
  const plain = await grpcClient(clientBootstrap, { target, calls: [{}], deadlineMs: 5000 });
  check('proxyless mTLS: a plaintext client is refused by the STRICT xDS server',
    Array.isArray(plain) && plain.length === 1 && plain[0]!.startsWith('error:'),
    Array.isArray(plain) ? plain[0] : plain);
  await stop(server);
  await stop(srv.p);
}

/** utime + stime of a process, in ms (CLK_TCK 100 on Linux). */
function cpuMs(pid: number): number {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    // After "(comm) ": state is [0], utime [11], stime [12].
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) * 10;
  } catch {
    return NaN;
  }
}

function median(xs: number[]): number {
  const s = [...xs].sort((x, y) => x - y);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

/** Rounds of: the client agent (this one, then the Go one) started cold against the same istiod and server. */
async function bench(c: Ctx, rounds: number): Promise<void> {
  await waitLine(spawnIn('server app', nsName('b'), 'setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups',
    process.execPath, '-e', APP]), 'listening');
  const server = startAgent(c, 'ts', 'b', { ns: 'shop', sa: 'server' });
  await waitReady(server);
  const figures: Record<Kind, { ready: number[]; mtls: number[]; cpu: number[] }> = {
    ts: { ready: [], mtls: [], cpu: [] }, go: { ready: [], mtls: [], cpu: [] },
  };
  // One unmeasured round each first: page cache and istiod's first push for a new proxy are not start-up.
  for (let r = 0; r <= rounds; r++) {
    for (const kind of ['ts', 'go'] as Kind[]) {
      const probe = helper('probe', nsName('a'), 'probe', { timeoutMs: 60_000 });
      await waitLine(probe, 'polling');
      const a = startAgent(c, kind, 'a', { ns: 'shop', sa: 'client' });
      await probe.exited;
      // Just after both answered: the agent's own CPU (not Envoy's) so far, which the load average moves far less.
      const cpu = cpuMs(a.p.proc.pid!);
      forget(probe);
      const out = JSON.parse(probe.out().trim().split('\n').pop()!) as { ready?: number; mtls?: number; body?: string };
      await stop(a.p);
      if (!out.ready || !out.mtls || !out.body?.includes(`URI=${CLIENT_ID}`)) {
        check(`bench round ${r} (${kind})`, false, `${JSON.stringify(out)}\n${a.p.out().slice(-3000)}`);
        continue;
      }
      const [ready, mtls] = [out.ready - a.spawnedAt, out.mtls - a.spawnedAt];
      log(`round ${r}${r === 0 ? ' (warm-up, not counted)' : ''} ${kind === 'ts' ? 'this agent' : 'Go agent  '}: ` +
        `ready ${ready} ms, first mTLS request ${mtls} ms, agent CPU ${cpu} ms`);
      if (r > 0) {
        figures[kind].ready.push(ready);
        figures[kind].mtls.push(mtls);
        figures[kind].cpu.push(cpu);
      }
    }
  }
  await stop(server.p);
  const [t, g] = [figures.ts, figures.go];
  if (t.ready.length && g.ready.length) {
    const row = (what: string, x: number[], y: number[]) =>
      `  ${what.padEnd(28)} ${String(median(x)).padStart(8)} ms ${String(median(y)).padStart(8)} ms ` +
      `${(median(x) / median(y)).toFixed(2).padStart(7)}x`;
    const load = `${os.cpus().length} cores, load average ${os.loadavg()[0]!.toFixed(1)}`;
    process.stdout.write(`\nstart-up against istiod, medians of ${t.ready.length} (same run, same istiod, ` +
      `same server sidecar; ${load}: compare the ratio)\n` +
      `  ${''.padEnd(28)} ${'this agent'.padStart(11)} ${'Go agent'.padStart(11)} ${'ratio'.padStart(8)}\n` +
      `${row('start -> 15021 ready', t.ready, g.ready)}\n${row('start -> first mTLS request', t.mtls, g.mtls)}\n` +
      `${row('agent CPU until then', t.cpu, g.cpu)}\n`);
    check('bench: every round measured', t.ready.length === rounds && g.ready.length === rounds);
  }
}

async function main(): Promise<number> {
  const [cache, ...rest] = process.argv.slice(2);
  if (!cache || !fs.existsSync(path.join(cache, 'bin', 'pilot-discovery'))) {
    process.stderr.write('usage: interop-istiod.ts CACHE_DIR [--bench [ROUNDS]] (CACHE_DIR/bin/pilot-discovery)\n');
    return 2;
  }
  const logsAt = rest.indexOf('--logs');
  if (logsAt >= 0) {
    logDir = path.resolve(rest[logsAt + 1] ?? '');
    fs.mkdirSync(logDir, { recursive: true });
  }
  const benchAt = rest.indexOf('--bench');
  const rounds = benchAt >= 0 ? Number(rest[benchAt + 1] ?? 3) : 0;
  if (benchAt >= 0 && !(Number.isInteger(rounds) && rounds >= 1)) {
    process.stderr.write(`--bench ROUNDS must be a positive integer, got ${rest[benchAt + 1]}\n`);
    return 2;
  }
  for (const [what, f] of [['this agent', AGENT], ['Envoy (ENVOY_BIN)', ENVOY]]) {
    if (!fs.existsSync(f!)) {
      process.stderr.write(`${what} not found at ${f}\n`);
      return 2;
    }
  }
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'pa-interop-istiod-'));
  fs.chmodSync(tmp, 0o755);
  // Ctrl-C reaches the whole process group (and npx/tsx relay it again): clean up once, ignore the repeats.
  let ending = false;
  const onSignal = () => {
    if (ending) return;
    ending = true;
    void cleanup().finally(() => process.exit(130));
  };
  process.on('SIGINT', onSignal).on('SIGTERM', onSignal);
  try {
    topology();
    for (const side of ['a', 'b'] as Side[]) capture(side);
    const c = await startIstiod(cache);
    if (benchAt >= 0) await bench(c, rounds);
    else await checks(c);
  } catch (e) {
    check('run', false, (e as Error).stack ?? String(e));
  } finally {
    const istiodLog = procs.find((p) => p.name === 'istiod')?.out() ?? '';
    if (results.some((r) => !r.ok)) process.stdout.write(`\n--- istiod log (tail)\n${istiodLog.slice(-3000)}\n`);
    await cleanup();
  }
  const failed = results.filter((r) => !r.ok);
  const passed = results.length - failed.length;
  process.stdout.write(`\n${failed.length ? 'FAIL' : 'PASS'}: ${passed}/${results.length} checks passed\n`);
  for (const r of failed) process.stdout.write(`  FAILED ${r.name}\n`);
  return failed.length ? 1 : 0;
}

function die(e: unknown): void {
  process.stderr.write(`${(e as Error).stack ?? e}\n`);
  process.exit(1);
}

const [mode, arg] = process.argv.slice(2);
if (mode === 'jwks') jwksMode(JSON.parse(arg!) as string);
else if (mode === 'root') rootMode(JSON.parse(arg!)).catch(die);
else if (mode === 'probe') probeMode(JSON.parse(arg!)).catch(die);
else if (mode === 'backend') backendMode(JSON.parse(arg!)).catch(die);
else main().then((code) => process.exit(code), (e) => { process.stderr.write(`${e}\n`); process.exit(2); });
