// Envoy as the proxy's uid/gid (1337), which istio-iptables' owner rules exclude from capture: who decides,
// and the real agent running as root starting the real Envoy as 1337 through hot restarts.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';
import { envoyCredentials } from '../lib/envoy-process';
import type { IdLookup } from '../lib/os-users';
import { removeShm, shmPath } from '../lib/hot-restart-shm';
import { envoyBin, freePort, httpRequest, pidAlive, tempDir, waitFor } from './helpers/harness';
import { debugEpochs, startAgent, waitLiveEpoch } from './helpers/agent';
import { staticBootstrap } from './helpers/static-bootstrap';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { runIstioIptables } from '../lib/iptables-command';
import { agentBin } from './helpers/agent';
import { configureLogging, resetLogging } from '../lib/log';

const ids: IdLookup = {
  user: (n) => ({ 'istio-proxy': 1337 })[n],
  group: (n) => ({ 'istio-proxy': 1337, mesh: 2000 })[n],
  primaryGroup: (uid) => (uid === 1500 ? 1501 : undefined),
};

test('who runs Envoy: ENVOY_UID/ENVOY_GID when the agent is root, Istio\'s root + DNS on :53 rule, else the agent\'s own user', () => {
  assert.is(envoyCredentials({}, 0, ids), undefined, 'root, nothing asked: Envoy stays root');
  assert.equal(envoyCredentials({ ENVOY_UID: '1337' }, 0, ids), { uid: 1337, gid: 1337, reason: 'ENVOY_UID' });
  assert.equal(envoyCredentials({ ENVOY_UID: 'istio-proxy', ENVOY_GID: 'mesh' }, 0, ids), { uid: 1337, gid: 2000, reason: 'ENVOY_UID/ENVOY_GID' });
  assert.equal(envoyCredentials({ ENVOY_UID: '1500' }, 0, ids)?.gid, 1501, 'the user\'s primary group');
  assert.equal(envoyCredentials({ ENVOY_GID: '1337' }, 0, ids), { uid: undefined, gid: 1337, reason: 'ENVOY_GID' }, 'root with group 1337, as Istio\'s TPROXY sidecar');
  assert.equal(envoyCredentials({ DNS_PROXY_ADDR: '0.0.0.0:53' }, 0, ids)?.uid, 1337, 'Istio: root agent with DNS on :53');
  assert.is(envoyCredentials({ DNS_PROXY_ADDR: '0.0.0.0:53' }, 1337, ids), undefined, 'not root: no switch');
  assert.is(envoyCredentials({ DNS_PROXY_ADDR: 'localhost:15053' }, 0, ids), undefined);
  assert.is(envoyCredentials({ ENVOY_UID: '1337' }, 1337, ids), undefined, 'already that user');
  assert.throws(() => envoyCredentials({ ENVOY_UID: '1337' }, 1000, ids), /invalid ENVOY_UID \(from environment variable ENVOY_UID\): the agent runs as uid 1000, not root/);
  assert.throws(() => envoyCredentials({ ENVOY_UID: 'nobody-here' }, 0, ids), /invalid ENVOY_UID .*"nobody-here" is neither a number nor a known name/);
});

function ownerOf(pid: number): { uid: number; gid: number } {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const field = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+)`, 'm').exec(status)![1]);
  return { uid: field('Uid'), gid: field('Gid') };
}

test('the agent as root starts Envoy as 1337:1337 (ENVOY_UID/ENVOY_GID); it serves and hot-restarts as 1337', async () => {
  assert.is(process.getuid?.(), 0, 'this test runs as root, as CI does');
  const dir = tempDir('pa-envoy-user-');
  // Envoy, as 1337, reads its bootstrap under the agent's directory.
  fs.chmodSync(dir.path, 0o755);
  const ports = { admin: await freePort(), status: await freePort(), listen: await freePort() };
  const custom = path.join(dir.path, 'custom.json');
  const write = (body: string) => {
    fs.writeFileSync(custom + '.tmp', JSON.stringify(staticBootstrap(ports, body)));
    fs.renameSync(custom + '.tmp', custom);
  };
  write('v0');
  const configPath = path.join(dir.path, 'proxy');
  const agent = startAgent(['proxy', 'sidecar'], {
    PROXY_CONFIG: JSON.stringify({
      configPath,
      binaryPath: envoyBin(),
      customConfigFile: custom,
      statusPort: ports.status,
      proxyAdminPort: ports.admin,
      drainDuration: '1s',
      parentShutdownDuration: '2s',
      terminationDrainDuration: '1s',
    }),
    POD_NAME: 'user',
    POD_NAMESPACE: 'test',
    INSTANCE_IP: '127.0.0.1',
    ENVOY_STATUS_PORT: String(await freePort()),
    ENVOY_PROMETHEUS_PORT: String(await freePort()),
    FILE_DEBOUNCE_DURATION: '50ms',
    ENVOY_UID: '1337',
    ENVOY_GID: '1337',
  }, dir.path);
  const pids: number[] = [];
  let baseId: number | null = null;
  try {
    const first = await waitLiveEpoch(ports.status, 0, 30_000).catch((e: Error) => {
      throw new Error(`${e.message}\nagent log:\n${agent.log()}`);
    });
    pids.push(first.pid);
    assert.equal(ownerOf(first.pid), { uid: 1337, gid: 1337 });
    assert.match(agent.log(), /starting Envoy as uid 1337 gid 1337: ENVOY_UID\/ENVOY_GID/);
    assert.is((await httpRequest(`http://127.0.0.1:${ports.listen}/`)).body, 'v0');
    const bootstrapFile = fs.readdirSync(configPath).find((f) => /^envoy-rev/.test(f))!;
    const st = fs.statSync(path.join(configPath, bootstrapFile));
    assert.equal([st.uid, st.gid, st.mode & 0o777], [1337, 1337, 0o600], 'the bootstrap is Envoy\'s, and private');

    for (let i = 1; i <= 2; i++) {
      write(`v${i}`);
      const live = await waitLiveEpoch(ports.status, i, 30_000);
      pids.push(live.pid);
      assert.equal(ownerOf(live.pid), { uid: 1337, gid: 1337 }, `epoch ${i}`);
      await waitFor(`body v${i}`, async () => (await httpRequest(`http://127.0.0.1:${ports.listen}/`)).body === `v${i}`, 10_000);
    }
    await waitFor('only the newest epoch left', async () => {
      const d = await debugEpochs(ports.status);
      return d.epochs.length === 1 && d.epochs[0]!.epoch === 2;
    }, 15_000);
    baseId = (await debugEpochs(ports.status)).baseId;
    assert.ok(baseId !== null && fs.statSync(shmPath(baseId)).uid === 1337, 'Envoy\'s shared memory is its own');

    // A normal stop: Envoy (another user) is still ended by the agent, which removes its shared memory.
    agent.proc.kill('SIGTERM');
    const end = await agent.exited;
    assert.is(end.code, 0, agent.log());
    for (const pid of pids) assert.not.ok(pidAlive(pid), `Envoy ${pid} ended`);
    assert.not.ok(fs.existsSync(shmPath(baseId!)), 'shared memory removed');
  } finally {
    await agent.stop();
    if (baseId !== null) removeShm(baseId);
    for (const pid of pids) if (pidAlive(pid)) process.kill(pid, 'SIGKILL');
    dir.cleanup();
  }
});

test('Envoy as 1337 gets its config over the agent\'s xDS socket (standalone discovery) and routes traffic', async () => {
  const dir = tempDir('pa-envoy-user-xds-');
  fs.chmodSync(dir.path, 0o755);
  const backend = http.createServer((req, res) => {
    req.resume();
    res.end('from-backend');
  });
  await new Promise<void>((r) => backend.listen(0, '127.0.0.1', () => r()));
  const backendPort = (backend.address() as AddressInfo).port;
  const servicePort = await freePort();
  const status = await freePort();
  const cfgDir = path.join(dir.path, 'mesh');
  fs.mkdirSync(cfgDir);
  fs.writeFileSync(path.join(cfgDir, 'web.yaml'), `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: web, namespace: test }
spec:
  hosts: [web.test.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{ number: ${servicePort}, name: http, protocol: HTTP }]
  endpoints:
  - { address: 127.0.0.1, ports: { http: ${backendPort} } }
`);
  const agent = startAgent(['proxy', 'sidecar', '--standalone', cfgDir], {
    PROXY_CONFIG: JSON.stringify({ configPath: path.join(dir.path, 'proxy'), binaryPath: envoyBin(), statusPort: status, proxyAdminPort: await freePort(), drainDuration: '1s', parentShutdownDuration: '2s', terminationDrainDuration: '1s' }),
    POD_NAME: 'web-client', POD_NAMESPACE: 'test', INSTANCE_IP: '127.0.0.1',
    ENVOY_STATUS_PORT: String(await freePort()), ENVOY_PROMETHEUS_PORT: String(await freePort()),
    ENVOY_UID: '1337',
  }, dir.path);
  let baseId: number | null = null;
  let pid = 0;
  try {
    await waitFor('agent ready', async () => (await httpRequest(`http://127.0.0.1:${status}/healthz/ready`)).status === 200, 30_000)
      .catch((e: Error) => { throw new Error(`${e.message}\n${agent.log()}`); });
    const d = await debugEpochs(status);
    baseId = d.baseId;
    pid = d.epochs[0]!.pid;
    assert.equal(ownerOf(pid), { uid: 1337, gid: 1337 });
    const socket = fs.statSync(path.join(dir.path, 'proxy', 'XDS'));
    assert.equal([socket.uid, socket.gid], [1337, 1337], 'the xDS socket is handed to Envoy\'s user');
    await waitFor('routed through Envoy', async () => (await httpRequest(`http://127.0.0.1:${servicePort}/`)).body === 'from-backend', 15_000);
  } finally {
    await agent.stop();
    if (pid && pidAlive(pid)) process.kill(pid, 'SIGKILL');
    if (baseId !== null) removeShm(baseId);
    backend.close();
    dir.cleanup();
  }
});

/** GET url from inside a network namespace (a separate node process there); '' when it fails. */
function getIn(nsPath: string, url: string): string {
  const code = `require('http').get(${JSON.stringify(url)}, (r) => { let b = ''; r.on('data', (d) => (b += d)); r.on('end', () => process.stdout.write(r.statusCode + ' ' + b)); }).on('error', () => {}).setTimeout(3000, function () { this.destroy(); });`;
  return spawnSync('nsenter', [`--net=${nsPath}`, '--', process.execPath, '-e', code], { encoding: 'utf8', timeout: 10_000 }).stdout ?? '';
}

test('with the injector\'s capture rules, Envoy as 1337 reaches a remote backend directly; as root its upstream is captured to 15001', async () => {
  // Pod namespace (10.1.0.5) and a "remote host" namespace (10.1.0.6), joined by a veth pair.
  const pod = `ipt-user-pod-${process.pid}`;
  const remote = `ipt-user-remote-${process.pid}`;
  const ip = (...a: string[]) => execFileSync('ip', a, { stdio: ['ignore', 'pipe', 'pipe'] });
  const dir = tempDir('pa-envoy-capture-');
  fs.chmodSync(dir.path, 0o755);
  const children: ReturnType<typeof spawn>[] = [];
  ip('netns', 'add', pod);
  ip('netns', 'add', remote);
  try {
    ip('-n', pod, 'link', 'set', 'lo', 'up');
    ip('-n', remote, 'link', 'set', 'lo', 'up');
    ip('-n', pod, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', remote);
    ip('-n', pod, 'addr', 'add', '10.1.0.5/24', 'dev', 'eth0');
    ip('-n', remote, 'addr', 'add', '10.1.0.6/24', 'dev', 'eth0');
    ip('-n', pod, 'link', 'set', 'eth0', 'up');
    ip('-n', remote, 'link', 'set', 'eth0', 'up');
    const podPath = `/var/run/netns/${pod}`;
    try {
      configureLogging({ write: () => {} });
      const code = await runIstioIptables(['--network-namespace', podPath, '-p', '15001', '-z', '15006', '-u', '1337', '-m', 'REDIRECT', '-i', '*', '-x', '', '-b', '*', '-d', '15090,15021,15020']);
      assert.is(code, 0);
    } finally {
      resetLogging();
    }
    const backend = spawn('nsenter', [`--net=/var/run/netns/${remote}`, '--', process.execPath, '-e',
      "require('http').createServer((q, s) => s.end('from-remote')).listen(8080, '10.1.0.6')"], { stdio: 'ignore' });
    children.push(backend);
    await waitFor('remote backend', async () => getIn(`/var/run/netns/${remote}`, 'http://10.1.0.6:8080/') === '200 from-remote', 10_000);

    const ports = { admin: 15000, listen: 18080 };
    const bootstrap = staticBootstrap(ports, 'direct', { backendPort: 8080 });
    const text = JSON.stringify(bootstrap).replace(/"address":"127\.0\.0\.1","port_value":8080/, '"address":"10.1.0.6","port_value":8080');
    const runAgent = async (env: Record<string, string>) => {
      const custom = path.join(dir.path, 'custom.json');
      fs.writeFileSync(custom, text);
      const agent = spawn('nsenter', [`--net=${podPath}`, '--', agentBin(), 'proxy', 'sidecar'], {
        cwd: dir.path,
        env: {
          PATH: process.env.PATH, HOME: '/',
          PROXY_CONFIG: JSON.stringify({ configPath: path.join(dir.path, 'proxy'), binaryPath: envoyBin(), customConfigFile: custom, drainDuration: '1s', terminationDrainDuration: '1s' }),
          POD_NAME: 'capture', POD_NAMESPACE: 'test', INSTANCE_IP: '10.1.0.5',
          ...env,
        },
        stdio: 'ignore',
      });
      children.push(agent);
      await waitFor('agent ready', async () => getIn(podPath, 'http://127.0.0.1:15020/healthz/ready').startsWith('200'), 30_000);
      const body = getIn(podPath, `http://127.0.0.1:${ports.listen}/slow`);
      agent.kill('SIGTERM');
      await new Promise((r) => agent.once('exit', r));
      return body;
    };
    assert.is(await runAgent({ ENVOY_UID: '1337', ENVOY_GID: '1337' }), '200 from-remote', 'Envoy as 1337: its upstream connection is not captured');
    // As root, Envoy's own connection is an app connection: redirected to 15001, where nothing listens here.
    assert.match(await runAgent({}), /^503 /);
  } finally {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    ip('netns', 'del', pod);
    ip('netns', 'del', remote);
    dir.cleanup();
  }
});

test.run();
