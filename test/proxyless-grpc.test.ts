// A standalone proxyless mesh with no Envoy anywhere: `pilot-agent proxy --standalone DIR` with DISABLE_ENVOY=true
// writes the gRPC bootstrap; a real @grpc/grpc-js-xds client (its own process, GRPC_XDS_BOOTSTRAP pointing at that
// file) dials `xds:///echo.test.svc.cluster.local:7070` and reaches real gRPC servers, routed by a VirtualService
// (a header match to subset v2, a 50/50 weight split, the rest to v1) through the agent's xDS proxy and the
// embedded discovery server's grpc generator. The same through a short name (`xds:///echo:7070`), through a remote
// (plaintext) control plane instead of standalone mode, and with mTLS from the embedded CA to xDS servers.

import { type ChildProcess, execFile, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { DiscoveryServer } from '../lib/discovery/index';
import { configureLogging, resetLogging } from '../lib/log';
import { type AgentFixture, agentFixture } from './helpers/agent-fixture';
import { freePort, httpRequest, REPO, tempDir, type TempDir, waitFor } from './helpers/harness';

const HOST = 'echo.test.svc.cluster.local';
const PORT = 7070;
const CLIENT = path.join(REPO, 'test', 'helpers', 'grpc-xds-client.ts');
const SERVER = path.join(REPO, 'test', 'helpers', 'grpc-xds-server.ts');

const id = (b: Buffer) => b;
const ECHO = { Who: { path: '/test.Echo/Who', requestStream: false, responseStream: false, requestSerialize: id, requestDeserialize: id, responseSerialize: id, responseDeserialize: id } };

/** A plain gRPC server on 127.0.0.1 that answers its name. */
async function backend(name: string): Promise<{ port: number; stop(): void }> {
  const server = new grpc.Server();
  server.addService(ECHO, { Who: (_call: unknown, cb: (e: null, r: Buffer) => void) => cb(null, Buffer.from(name)) });
  const port = await new Promise<number>((resolve, reject) => server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
  return { port, stop: () => server.forceShutdown() };
}

function meshConfig(dir: string, v1: number, v2: number): void {
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'mesh.yaml'), `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: echo, namespace: test}
spec:
  hosts: [${HOST}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {number: ${PORT}, name: grpc, protocol: GRPC}
  endpoints:
  - {address: 127.0.0.1, ports: {grpc: ${v1}}, labels: {version: v1}}
  - {address: 127.0.0.1, ports: {grpc: ${v2}}, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: test}
spec:
  host: ${HOST}
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: test}
spec:
  hosts: [${HOST}]
  http:
  - match: [{headers: {x-version: {exact: v2}}}]
    route: [{destination: {host: ${HOST}, subset: v2}}]
  - match: [{headers: {x-split: {exact: "yes"}}}]
    route:
    - {destination: {host: ${HOST}, subset: v1}, weight: 50}
    - {destination: {host: ${HOST}, subset: v2}, weight: 50}
  - route: [{destination: {host: ${HOST}, subset: v1}}]
`);
}

function runClient(bootstrap: string, args: Record<string, unknown>): Promise<string[]> {
  return new Promise((resolve, reject) => {
    execFile(process.execPath, ['--import', 'tsx', CLIENT, JSON.stringify(args)], {
      cwd: REPO, env: { PATH: process.env.PATH, GRPC_XDS_BOOTSTRAP: bootstrap, TSX_DISABLE_CACHE: '1' }, timeout: 60_000,
    }, (err, stdout, stderr) => {
      if (err) return reject(new Error(`client failed: ${err.message}\n${stderr}`));
      resolve((JSON.parse(stdout.trim().split('\n').pop()!) as { answers: string[] }).answers);
    });
  });
}

/** `cfgDir`: standalone mode; a `host:port` instead: that plaintext control plane. */
async function proxylessAgent(dir: TempDir, cfgDir: string, who = { pod: 'client-1', sa: 'client' }, extra: Record<string, string> = {}): Promise<{ agent: AgentFixture; status: number; bootstrap: string }> {
  const remote = !cfgDir.startsWith('/');
  const agent = await agentFixture({ dir });
  const none = { proxyAdminPort: undefined, drainDuration: undefined, parentShutdownDuration: undefined, terminationDrainDuration: undefined };
  await agent.start({
    args: ['proxy', 'sidecar', ...(remote ? [] : ['--standalone', cfgDir])],
    proxyConfig: { binaryPath: '/nonexistent/envoy', ...none, ...(remote && { discoveryAddress: cfgDir, controlPlaneAuthPolicy: 'NONE' }) },
    env: {
      DISABLE_ENVOY: 'true', POD_NAME: who.pod, SERVICE_ACCOUNT: who.sa,
      ENVOY_STATUS_PORT: undefined, ENVOY_PROMETHEUS_PORT: undefined, ...extra,
    },
  }).catch(async (e: Error) => {
    await agent.close();
    throw e;
  });
  return { agent, status: agent.ports.status, bootstrap: path.join(dir.path, 'etc/istio/proxy/grpc-bootstrap.json') };
}

/** SIGTERM and its exit; then agentFixture's cleanup, also when it did not exit in time. */
async function stopAgent(agent: AgentFixture | undefined): Promise<{ code: number | null; log: string } | undefined> {
  if (!agent) return undefined;
  try {
    agent.proc.kill('SIGTERM');
    const exit = await waitFor('agent exit', () => agent.exited, 15_000);
    await agent.stop();
    return { code: exit.code, log: agent.log() };
  } finally {
    await agent.close();
  }
}

test('proxyless: a grpc-js-xds client routes by a VirtualService through a DISABLE_ENVOY standalone agent (no Envoy)', async () => {
  const dir = tempDir('pa-proxyless-grpc-');
  const v1 = await backend('v1');
  const v2 = await backend('v2');
  let agent: AgentFixture | undefined;
  try {
    const cfgDir = path.join(dir.path, 'mesh');
    meshConfig(cfgDir, v1.port, v2.port);
    const a = await proxylessAgent(dir, cfgDir);
    agent = a.agent;
    const none = Array.from({ length: 6 }, () => ({}));
    const header = Array.from({ length: 4 }, () => ({ 'x-version': 'v2' }));
    const split = Array.from({ length: 40 }, () => ({ 'x-split': 'yes' }));
    const answers = await runClient(a.bootstrap, { target: `${HOST}:${PORT}`, calls: [...none, ...header, ...split] });
    assert.equal(answers.slice(0, 6), Array(6).fill('v1'), `default route to v1: ${answers.slice(0, 6)}\n${agent.log().slice(-3000)}`);
    assert.equal(answers.slice(6, 10), Array(4).fill('v2'), 'x-version: v2 to subset v2');
    const spl = answers.slice(10);
    assert.ok(spl.every((x) => x === 'v1' || x === 'v2'), `every split call answered: ${spl.join(',')}`);
    assert.ok(spl.includes('v1') && spl.includes('v2'), `the 50/50 split reaches both: ${spl.join(',')}`);
    // A short name, expanded in the client's namespace as istiod does.
    assert.equal(await runClient(a.bootstrap, { target: `echo:${PORT}`, calls: [{ 'x-version': 'v2' }, {}] }), ['v2', 'v1']);
    // The xDS proxy served the gRPC library's streams (one per client process).
    const xds = JSON.parse((await httpRequest(`http://127.0.0.1:${a.status}/debug/xds`)).body);
    assert.ok(Array.isArray(xds.streams));
  } finally {
    v1.stop();
    v2.stop();
    const end = await stopAgent(agent);
    dir.cleanup();
    if (end) assert.is(end.code, 0, end.log.slice(-2000));
  }
});

test('proxyless with a remote control plane: the xDS proxy forwards the gRPC library\'s streams (node GENERATOR=grpc) upstream', async () => {
  const dir = tempDir('pa-proxyless-grpc-');
  const v1 = await backend('v1');
  const v2 = await backend('v2');
  const cfgDir = path.join(dir.path, 'mesh');
  meshConfig(cfgDir, v1.port, v2.port);
  // The control plane's own log says which nodes connected: once the client process has exited, its stream is
  // closed and status() no longer lists it.
  const cpLog: string[] = [];
  configureLogging({ write: (line: string) => void cpLog.push(line) });
  const cp = new DiscoveryServer({ configDir: cfgDir, listen: '127.0.0.1:0', debounceMs: 10 });
  let agent: AgentFixture | undefined;
  try {
    await cp.start();
    const a = await proxylessAgent(dir, cp.address);
    agent = a.agent;
    assert.equal(await runClient(a.bootstrap, { target: `${HOST}:${PORT}`, calls: [{}, { 'x-version': 'v2' }] }), ['v1', 'v2']);
    const connected = cpLog.filter((l) => l.includes('proxy connected'));
    assert.ok(connected.some((l) => l.includes('client-1.test')), `the control plane saw the client node: ${connected.join('\n')}`);
  } finally {
    v1.stop();
    v2.stop();
    const end = await stopAgent(agent);
    await cp.close();
    resetLogging();
    dir.cleanup();
    if (end) assert.is(end.code, 0, end.log.slice(-2000));
  }
});

/** A workload's own directory: its token for the embedded CA at ./var/run/secrets/tokens/istio-token. */
function workloadDir(token: string): TempDir {
  const d = tempDir('pa-proxyless-wl-');
  fs.mkdirSync(path.join(d.path, 'var/run/secrets/tokens'), { recursive: true });
  fs.writeFileSync(path.join(d.path, 'var/run/secrets/tokens/istio-token'), token);
  return d;
}

test('proxyless mTLS: certificates from the embedded CA via OUTPUT_CERTS, xDS servers STRICT, the client checks the server identity', async () => {
  const mesh = tempDir('pa-proxyless-mesh-');
  const cfgDir = path.join(mesh.path, 'mesh');
  const srvDir = workloadDir('echo-token');
  const cliDir = workloadDir('client-token');
  const [p1, p2] = [await freePort(), await freePort()];
  meshConfig(cfgDir, p1, p2);
  fs.appendFileSync(path.join(cfgDir, 'mesh.yaml'), `---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: test}
spec: {mtls: {mode: STRICT}}
`);
  // ISTIO_MUTUAL for the client side (istiod's grpc generator does no auto-mTLS) and the servers' service account.
  const yaml = fs.readFileSync(path.join(cfgDir, 'mesh.yaml'), 'utf8')
    .replace('  subsets:\n', '  trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}\n  subsets:\n')
    .replace(`{grpc: ${p1}}, labels: {version: v1}}`, `{grpc: ${p1}}, labels: {version: v1}, serviceAccount: echo}`)
    .replace(`{grpc: ${p2}}, labels: {version: v2}}`, `{grpc: ${p2}}, labels: {version: v2}, serviceAccount: echo}`);
  fs.writeFileSync(path.join(cfgDir, 'mesh.yaml'), yaml);
  fs.mkdirSync(path.join(cfgDir, 'ca', 'identities', 'test'), { recursive: true });
  fs.writeFileSync(path.join(cfgDir, 'ca', 'identities', 'test', 'echo'), 'echo-token\n', { mode: 0o600 });
  fs.writeFileSync(path.join(cfgDir, 'ca', 'identities', 'test', 'client'), 'client-token\n', { mode: 0o600 });
  let srvAgent: AgentFixture | undefined;
  let cliAgent: AgentFixture | undefined;
  let servers: ChildProcess | undefined;
  try {
    // The server's agent first: its CA creates the root both agents then share.
    const s = await proxylessAgent(srvDir, cfgDir, { pod: 'echo-1', sa: 'echo' }, { OUTPUT_CERTS: path.join(srvDir.path, 'certs') });
    srvAgent = s.agent;
    const c = await proxylessAgent(cliDir, cfgDir, { pod: 'client-1', sa: 'client' }, { OUTPUT_CERTS: path.join(cliDir.path, 'certs') });
    cliAgent = c.agent;
    servers = spawn(process.execPath, ['--import', 'tsx', SERVER, JSON.stringify({ servers: [{ port: p1, name: 'v1' }, { port: p2, name: 'v2' }] })], {
      cwd: REPO, env: { PATH: process.env.PATH, GRPC_XDS_BOOTSTRAP: s.bootstrap, TSX_DISABLE_CACHE: '1', ...(process.env.GRPC_TRACE && { GRPC_TRACE: process.env.GRPC_TRACE, GRPC_VERBOSITY: 'DEBUG' }) }, stdio: ['ignore', 'pipe', 'pipe'],
    });
    let srvOut = '';
    servers.stdout!.on('data', (b: Buffer) => (srvOut += b));
    servers.stderr!.on('data', (b: Buffer) => (srvOut += b));
    await waitFor('xDS servers bound', () => srvOut.includes('bound'), 30_000).catch((e: Error) => { throw new Error(`${e.message}\n${srvOut}`); });
    const target = { target: `${HOST}:${PORT}`, xdsCreds: true, deadlineMs: 3000 };
    // The servers serve once their inbound listeners arrive.
    await waitFor('an mTLS answer', async () => !(await runClient(c.bootstrap, { ...target, calls: [{}] }))[0]!.startsWith('error'), 30_000, 500)
      .catch(async (e: Error) => { throw new Error(`${e.message}: ${(await runClient(c.bootstrap, { ...target, calls: [{}] }))[0]}\n${srvOut}`); });
    const answers = await runClient(c.bootstrap, { ...target, calls: [{}, { 'x-version': 'v2' }] });
    assert.equal(answers, ['v1 ssl URI:spiffe://cluster.local/ns/test/sa/client', 'v2 ssl URI:spiffe://cluster.local/ns/test/sa/client']);
    // A client that does not use the bootstrap's certificates cannot reach a STRICT server.
    const plain = await runClient(c.bootstrap, { target: `${HOST}:${PORT}`, calls: [{}], deadlineMs: 3000 });
    assert.match(plain[0]!, /^error: /);
  } finally {
    servers?.kill('SIGTERM');
    const ends = [await stopAgent(cliAgent), await stopAgent(srvAgent)];
    for (const d of [mesh, srvDir, cliDir]) d.cleanup();
    for (const e of ends) if (e) assert.is(e.code, 0, e.log.slice(-2000));
  }
});

test.run();
