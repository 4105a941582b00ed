// Issue 20 item 11: ENVOY_ADMIN_MODE=uds puts Envoy's admin API (/quitquitquit, /config_dump, /runtime_modify) on
// a 0600 Unix socket in a 0700 directory owned by Envoy's user, instead of a loopback port every local uid (and, in
// a pod, the app) can reach. The real agent runs the real Envoy; the attacker is uid 65534 (setpriv). Everything
// the agent does through the admin keeps working: readiness, the 15021 and 15090 listeners (their clusters follow
// the socket), the merged /stats/prometheus, hot restart, the drain on SIGTERM, `pilot-agent request`.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { adminSocketUnreachable, hasCapability } from '../lib/envoy-process';
import { agentBin, debugEpochs, waitLiveEpoch, type RunningAgent } from './helpers/agent';
import { agentFixture } from './helpers/agent-fixture';
import { staticBootstrap } from './helpers/static-bootstrap';
import { envoyBin, freePort, httpRequest, pidAlive, tempDir, waitFor, type TempDir } from './helpers/harness';

const NOBODY = 65534;

interface Setup {
  dir: TempDir;
  agent: RunningAgent;
  env: Record<string, string>;
  configPath: string;
  socket: string;
  ports: { status: number; admin: number; prom: number; ready: number };
  cleanup(): Promise<void>;
}

/** A standalone agent (generated bootstrap, embedded discovery) with ENVOY_ADMIN_MODE=uds, ready. */
async function startUdsAgent(extraEnv: Record<string, string | undefined> = {}, extraArgs: string[] = []): Promise<Setup> {
  // Other users may walk down to configPath: only the admin socket's own directory and mode may stop them.
  const fixture = await agentFixture({ prefix: 'pa-admin-uds-', mode: 0o755 });
  const { dir } = fixture;
  const mesh = path.join(dir.path, 'mesh');
  fs.mkdirSync(mesh, { mode: 0o755 });
  const configPath = path.join(dir.path, 'proxy');
  const ports = { status: fixture.ports.status, admin: fixture.ports.admin, prom: fixture.ports.prometheus, ready: fixture.ports.envoyStatus };
  const cleanup = () => fixture.close();
  try {
    await fixture.start({
      args: ['proxy', 'sidecar', '--standalone', mesh, ...extraArgs],
      env: { POD_NAME: 'admin', ENVOY_RESTART_INITIAL_BACKOFF: '100ms', ENVOY_ADMIN_MODE: 'uds', ...extraEnv },
    });
  } catch (e) {
    await cleanup();
    throw e;
  }
  fs.chmodSync(configPath, 0o755);
  return { dir, agent: fixture.agent, env: fixture.env, configPath, socket: path.join(configPath, 'admin', 'envoy-admin.sock'), ports, cleanup };
}

/** What connecting to a Unix socket gives: 'connected' or the error code. */
function connectUnix(socket: string): Promise<string> {
  return new Promise((resolve) => {
    const s = net.connect(socket);
    s.on('connect', () => {
      s.destroy();
      resolve('connected');
    });
    s.on('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
  });
}

/** The same, as another user: a fresh node process under setpriv. */
function connectUnixAs(uid: number, socket: string): string {
  const script = `require('net').connect(${JSON.stringify(socket)}).on('connect', function () { console.log('connected'); this.destroy(); }).on('error', (e) => console.log(e.code))`;
  const r = spawnSync('setpriv', ['--reuid', String(uid), '--regid', String(uid), '--clear-groups', process.execPath, '-e', script], { encoding: 'utf8', timeout: 10_000 });
  return (r.stdout || r.stderr).trim();
}

/** What a TCP connection to a loopback port gives. */
function connectTcp(port: number): Promise<string> {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    s.on('connect', () => {
      s.destroy();
      resolve('connected');
    });
    s.on('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
  });
}

/** An HTTP request over the admin socket, as the agent (root). */
function overSocket(socket: string, method: string, p: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = (require('node:http') as typeof import('node:http')).request({ socketPath: socket, method, path: p, agent: false, timeout: 5000 }, (res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

function request(s: Setup, args: string[], uid?: number): { code: number | null; out: string; err: string } {
  const cmd = uid === undefined ? [agentBin(), 'request', ...args] : ['setpriv', '--reuid', String(uid), '--regid', String(uid), '--clear-groups', agentBin(), 'request', ...args];
  const r = spawnSync(cmd[0]!, cmd.slice(1), { cwd: s.dir.path, env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...s.env }, encoding: 'utf8', timeout: 20_000 });
  return { code: r.status, out: r.stdout, err: r.stderr };
}

async function servesThroughListeners(s: Setup, what: string): Promise<void> {
  assert.is((await httpRequest(`http://127.0.0.1:${s.ports.ready}/healthz/ready`)).status, 200, `${what}: Envoy's readiness listener`);
  const prom = await httpRequest(`http://127.0.0.1:${s.ports.prom}/stats/prometheus`);
  assert.is(prom.status, 200, `${what}: Envoy's Prometheus listener`);
  assert.match(prom.body, /^# TYPE envoy_server_live gauge$/m, `${what}: 15090 serves Envoy's stats through the socket`);
  const merged = await httpRequest(`http://127.0.0.1:${s.ports.status}/stats/prometheus`);
  assert.is(merged.status, 200);
  assert.match(merged.body, /^envoy_server_live(\{\})? 1$/m, `${what}: the agent's merged /stats/prometheus has Envoy's stats`);
  assert.match(merged.body, /^istio_agent_/m);
}

test('ENVOY_ADMIN_MODE=uds: no admin port, a 0600 socket uid 65534 cannot connect to; probes, stats, hot restart, request and the drain work', async () => {
  assert.is(process.getuid?.(), 0, 'this test runs as root, as CI does');
  const s = await startUdsAgent();
  try {
    // The admin is on the socket, and only there.
    const st = fs.lstatSync(s.socket);
    assert.ok(st.isSocket(), `${s.socket} is a socket`);
    assert.is(st.mode & 0o777, 0o600, 'the socket is 0600');
    const dirSt = fs.statSync(path.dirname(s.socket));
    assert.equal([dirSt.uid, dirSt.mode & 0o777], [0, 0o700], 'its directory is the agent\'s (Envoy\'s user) and 0700');
    assert.is(await connectTcp(s.ports.admin), 'ECONNREFUSED', 'nothing listens on proxyAdminPort');
    assert.is((await overSocket(s.socket, 'GET', '/ready')).status, 200, 'the agent reaches Envoy\'s admin');

    // Another uid cannot reach it: not the directory, and not the socket itself were the directory open.
    assert.is(connectUnixAs(NOBODY, s.socket), 'EACCES', 'uid 65534 is refused');
    fs.chmodSync(path.dirname(s.socket), 0o755);
    assert.is(connectUnixAs(NOBODY, s.socket), 'EACCES', 'the socket\'s own 0600 refuses too');
    fs.chmodSync(path.dirname(s.socket), 0o700);
    const asNobody = request(s, ['GET', 'server_info'], NOBODY);
    assert.is(asNobody.code, 1, `pilot-agent request as uid 65534: ${asNobody.out}${asNobody.err}`);
    assert.match(asNobody.err, /EACCES/);
    assert.not.match(asNobody.out, /"state"/);

    // Envoy's 15021 and 15090 listeners (their clusters point at the socket) and the merged stats.
    await servesThroughListeners(s, 'epoch 0');

    // `pilot-agent request` as root goes to the socket.
    const info = request(s, ['GET', 'server_info']);
    assert.is(info.code, 0, info.err);
    assert.is(JSON.parse(info.out).state, 'LIVE');

    // A hot restart: the new epoch takes the socket over.
    s.agent.proc.kill('SIGHUP');
    const e1 = await waitLiveEpoch(s.ports.status, 1, 30_000).catch((e: Error) => {
      throw new Error(`${e.message}\nagent log:\n${s.agent.log()}`);
    });
    await waitFor('epoch 0 gone', async () => (await debugEpochs(s.ports.status)).epochs.length === 1, 15_000);
    const after = request(s, ['GET', 'server_info']);
    assert.is(after.code, 0, after.err);
    assert.is(JSON.parse(after.out).command_line_options.restart_epoch, 1, 'the socket answers as epoch 1');
    assert.is(fs.lstatSync(s.socket).mode & 0o777, 0o600, 'still 0600 after the hot restart');
    assert.is(connectUnixAs(NOBODY, s.socket), 'EACCES');
    await waitFor('agent ready on epoch 1', async () => (await httpRequest(`http://127.0.0.1:${s.ports.status}/healthz/ready`)).status === 200, 10_000);
    await servesThroughListeners(s, 'epoch 1');
    assert.is(await connectTcp(s.ports.admin), 'ECONNREFUSED');

    // SIGTERM drains Envoy through the socket, and the socket goes with the agent.
    s.agent.proc.kill('SIGTERM');
    const end = await waitFor('agent exit', () => s.agent.exited, 20_000);
    assert.is(end.code, 0, s.agent.log());
    assert.match(s.agent.log(), /asked epoch 1 to drain its listeners/);
    assert.not.match(s.agent.log(), /could not drain/);
    assert.not.ok(pidAlive(e1.pid), 'Envoy ended');
    assert.not.ok(fs.existsSync(path.dirname(s.socket)), 'the admin socket and its directory are removed');
  } finally {
    await s.cleanup();
  }
});

test('ENVOY_ADMIN_MODE=uds with Envoy as uid 1337 (ENVOY_UID): the socket and its directory are 1337\'s, the root agent still reaches it, 65534 does not', async () => {
  const s = await startUdsAgent({ ENVOY_UID: '1337', ENVOY_GID: '1337' });
  try {
    const pid = (await debugEpochs(s.ports.status)).epochs[0]!.pid;
    assert.match(fs.readFileSync(`/proc/${pid}/status`, 'utf8'), /^Uid:\s+1337\s/m, 'Envoy runs as 1337');
    const dirSt = fs.statSync(path.dirname(s.socket));
    assert.equal([dirSt.uid, dirSt.mode & 0o777], [1337, 0o700], 'the directory is Envoy\'s, so Envoy can create the socket, and 0700');
    const st = fs.lstatSync(s.socket);
    assert.equal([st.isSocket(), st.uid, st.mode & 0o777], [true, 1337, 0o600], 'the socket is Envoy\'s and 0600');
    assert.is(await connectUnix(s.socket), 'connected', 'the agent (root) connects');
    assert.is(connectUnixAs(NOBODY, s.socket), 'EACCES', 'uid 65534 is refused');
    assert.is(await connectTcp(s.ports.admin), 'ECONNREFUSED');
    // Envoy (1337) reaches its own admin through the socket for the 15090 listener; the agent for readiness and stats.
    await servesThroughListeners(s, 'Envoy as 1337');
    const info = request(s, ['GET', 'server_info']);
    assert.is(info.code, 0, info.err);
    assert.is(JSON.parse(info.out).state, 'LIVE');
    s.agent.proc.kill('SIGHUP');
    await waitLiveEpoch(s.ports.status, 1, 30_000).catch((e: Error) => {
      throw new Error(`${e.message}\nagent log:\n${s.agent.log()}`);
    });
    await waitFor('epoch 0 gone', async () => (await debugEpochs(s.ports.status)).epochs.length === 1, 15_000);
    assert.is(fs.lstatSync(s.socket).uid, 1337, 'epoch 1 (as 1337) rebound the socket');
    await servesThroughListeners(s, 'epoch 1 as 1337');
    // The native sidecar's preStop hook (`pilot-agent request --debug-port=15020 POST drain`): the agent drains
    // Envoy through the socket.
    const drain = await httpRequest(`http://127.0.0.1:${s.ports.status}/drain`, { method: 'POST' });
    assert.is(drain.status, 200, `POST /drain (answered 200 only when Envoy's /drain_listeners did): ${drain.body}`);
  } finally {
    await s.cleanup();
  }
});

test('ENVOY_ADMIN_MODE=uds with Istio\'s stock bootstrap template (ISTIO_BOOTSTRAP): its admin and prometheus_stats move to the socket', async () => {
  const s = await startUdsAgent({ ISTIO_BOOTSTRAP: path.join(__dirname, 'fixtures', 'istio', 'envoy_bootstrap.json') });
  try {
    const rev = JSON.parse(fs.readFileSync(path.join(s.configPath, 'envoy-rev0.json'), 'utf8'));
    assert.equal(rev.admin.address, { pipe: { path: s.socket, mode: 0o600 } }, 'the template was used, its admin moved');
    assert.is(fs.lstatSync(s.socket).mode & 0o777, 0o600);
    assert.is(await connectTcp(s.ports.admin), 'ECONNREFUSED');
    assert.is(connectUnixAs(NOBODY, s.socket), 'EACCES');
    await servesThroughListeners(s, 'Istio\'s template');
  } finally {
    await s.cleanup();
  }
});

test('ENVOY_ADMIN_MODE=uds, custom bootstrap: a hot-restart child that fails after taking the admin socket leaves the parent serving, and the agent restores the admin', async () => {
  const agent = await agentFixture({ prefix: 'pa-admin-uds-restore-' });
  const { dir } = agent;
  const blocker = net.createServer();
  const blocked = await freePort();
  await new Promise<void>((r) => blocker.listen(blocked, '127.0.0.1', () => r()));
  const ports = { admin: agent.ports.admin, status: agent.ports.status, listen: await freePort() };
  const custom = path.join(dir.path, 'custom.json');
  const write = (b: Record<string, unknown>) => {
    fs.writeFileSync(custom + '.tmp', JSON.stringify(b));
    fs.renameSync(custom + '.tmp', custom);
  };
  write(staticBootstrap(ports, 'v0'));
  const configPath = path.join(dir.path, 'proxy');
  const socket = path.join(configPath, 'admin', 'envoy-admin.sock');
  try {
    await agent.start({
      proxyConfig: { configPath, customConfigFile: custom },
      env: { POD_NAME: 'restore', FILE_DEBOUNCE_DURATION: '50ms', ENVOY_RESTART_INITIAL_BACKOFF: '5ms', ENVOY_ADMIN_MODE: 'uds' },
    });
    assert.is((await overSocket(socket, 'GET', '/ready')).status, 200, 'the custom bootstrap\'s admin is on the socket');
    assert.is(await connectTcp(ports.admin), 'ECONNREFUSED');
    // Valid, but cannot bind at run time: each child takes the admin socket over from epoch 0, then exits.
    write(staticBootstrap(ports, 'broken', { extraListenPort: blocked }));
    await waitFor('budget spent', async () => /budget spent/.test((await debugEpochs(ports.status)).lastFailure?.reason ?? ''), 60_000);
    await waitLiveEpoch(ports.status, 1, 20_000).catch((e: Error) => {
      throw new Error(`${e.message}\nagent log:\n${agent.log()}`);
    });
    await waitFor('admin answers again', async () => (await overSocket(socket, 'GET', '/ready').catch(() => ({ status: 0 }))).status === 200, 10_000);
    assert.match(agent.log(), /serves without its admin port/);
    assert.is((await httpRequest(`http://127.0.0.1:${ports.status}/healthz/ready`)).status, 200);
    assert.is((await httpRequest(`http://127.0.0.1:${ports.listen}/`)).body, 'v0', 'the last good config serves');
    assert.is(fs.lstatSync(socket).mode & 0o777, 0o600);
  } finally {
    blocker.close();
    await agent.close();
  }
});

test('ENVOY_ADMIN_MODE=uds, Envoy as another uid: an agent without CAP_DAC_OVERRIDE could not reach the socket, and says so before starting', async () => {
  const c = { uid: 1337, gid: 1337, reason: 'ENVOY_UID' };
  assert.is(adminSocketUnreachable(c, 0, () => true), undefined, 'root with CAP_DAC_OVERRIDE connects');
  assert.is(adminSocketUnreachable(undefined, 0, () => false), undefined, 'Envoy as the agent\'s own uid: its socket');
  assert.is(adminSocketUnreachable({ gid: 1337, reason: 'ENVOY_GID' }, 0, () => false), undefined, 'only the group changes: still root\'s socket');
  assert.match(adminSocketUnreachable(c, 0, () => false) ?? '', /Envoy runs as uid 1337 \(ENVOY_UID\).*CAP_DAC_OVERRIDE/);
  assert.ok(hasCapability(1, () => 'CapEff:\t0000000000000002\n'));
  assert.not.ok(hasCapability(1, () => 'CapEff:\t00000000a80425fd\n'), 'Docker\'s default set minus dac_override');

  // The real agent, as root with dac_override dropped from its bounding set (so from its effective set).
  const dir = tempDir('pa-admin-uds-nodac-');
  try {
    const configPath = path.join(dir.path, 'proxy');
    const env = {
      PATH: process.env.PATH ?? '/usr/bin:/bin',
      PROXY_CONFIG: JSON.stringify({ configPath, binaryPath: envoyBin(), statusPort: await freePort(), proxyAdminPort: await freePort() }),
      ENVOY_STATUS_PORT: String(await freePort()), ENVOY_PROMETHEUS_PORT: String(await freePort()),
      POD_NAME: 'nodac', POD_NAMESPACE: 'test', INSTANCE_IP: '127.0.0.1', ENVOY_ADMIN_MODE: 'uds', ENVOY_UID: '1337',
    };
    const r = spawnSync('setpriv', ['--bounding-set', '-dac_override', agentBin(), 'proxy', 'sidecar'], { cwd: dir.path, env, encoding: 'utf8', timeout: 20_000 });
    assert.is(r.status, 1, r.stderr);
    assert.match(r.stderr, /error: invalid ENVOY_ADMIN_MODE \(from environment variable ENVOY_ADMIN_MODE\): Envoy runs as uid 1337 .*CAP_DAC_OVERRIDE/);
    assert.not.ok(fs.existsSync(path.join(configPath, 'admin')), 'nothing was started');
  } finally {
    dir.cleanup();
  }
});

test('ENVOY_ADMIN_MODE unset: the admin stays on loopback proxyAdminPort, as in Istio; set later (mesh config proxyMetadata), a hot restart moves it to the socket', async () => {
  const meshConfig = path.join(fs.mkdtempSync(path.join(require('node:os').tmpdir(), 'pa-admin-mesh-')), 'mesh.yaml');
  fs.writeFileSync(meshConfig, 'defaultConfig:\n  proxyMetadata: {}\n');
  const s = await startUdsAgent({ ENVOY_ADMIN_MODE: undefined }, ['--meshConfig', meshConfig]);
  try {
    assert.is(await connectTcp(s.ports.admin), 'connected');
    assert.not.ok(fs.existsSync(path.dirname(s.socket)), 'no socket directory');
    fs.writeFileSync(meshConfig + '.tmp', 'defaultConfig:\n  proxyMetadata:\n    ENVOY_ADMIN_MODE: uds\n');
    fs.renameSync(meshConfig + '.tmp', meshConfig);
    await waitLiveEpoch(s.ports.status, 1, 30_000).catch((e: Error) => {
      throw new Error(`${e.message}\nagent log:\n${s.agent.log()}`);
    });
    await waitFor('epoch 0 gone', async () => (await debugEpochs(s.ports.status)).epochs.length === 1, 15_000);
    assert.is(fs.lstatSync(s.socket).mode & 0o777, 0o600);
    assert.is(await connectTcp(s.ports.admin), 'ECONNREFUSED', 'the TCP admin went with epoch 0');
    assert.is(connectUnixAs(NOBODY, s.socket), 'EACCES');
    await waitFor('agent ready on epoch 1', async () => (await httpRequest(`http://127.0.0.1:${s.ports.status}/healthz/ready`)).status === 200, 10_000);
    await servesThroughListeners(s, 'after the switch');
  } finally {
    await s.cleanup();
    fs.rmSync(path.dirname(meshConfig), { recursive: true, force: true });
  }
});

test.run();
