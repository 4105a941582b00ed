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
import { freePort, httpRequest, pidAlive, waitFor } from './helpers/harness';
import { debugEpochs, waitLiveEpoch } from './helpers/agent';
import { agentFixture } from './helpers/agent-fixture';
import { createNetns, type Netns } from './helpers/netns';
import { staticBootstrap } from './helpers/static-bootstrap';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { runIstioIptables } from '../lib/iptables-command';
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
  // Envoy, as 1337, reads its bootstrap under the agent's directory.
  const agent = await agentFixture({ prefix: 'pa-envoy-user-', mode: 0o755 });
  const ports = { admin: agent.ports.admin, status: agent.ports.status, listen: await freePort() };
  const custom = path.join(agent.dir.path, 'custom.json');
  const write = (body: string) => {
    fs.writeFileSync(custom + '.tmp', JSON.stringify(staticBootstrap(ports, body)));
    fs.renameSync(custom + '.tmp', custom);
  };
  write('v0');
  const configPath = path.join(agent.dir.path, 'proxy');
  const pids: number[] = [];
  let baseId: number | null = null;
  try {
    await agent.start({
      proxyConfig: { customConfigFile: custom },
      env: { POD_NAME: 'user', FILE_DEBOUNCE_DURATION: '50ms', ENVOY_UID: '1337', ENVOY_GID: '1337' },
      ready: 'live',
    });
    const first = await waitLiveEpoch(ports.status, 0);
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
    await agent.close();
    // The test ended the agent itself: an Envoy or shared memory that outlived it is not close()'s to find.
    if (baseId !== null) removeShm(baseId);
    for (const pid of pids) if (pidAlive(pid)) process.kill(pid, 'SIGKILL');
  }
});

test('Envoy as 1337 gets its config over the agent\'s xDS socket (standalone discovery) and routes traffic', async () => {
  const agent = await agentFixture({ prefix: 'pa-envoy-user-xds-', mode: 0o755 });
  const backend = http.createServer((req, res) => {
    req.resume();
    res.end('from-backend');
  });
  await new Promise<void>((r) => backend.listen(0, '127.0.0.1', () => r()));
  const backendPort = (backend.address() as AddressInfo).port;
  const servicePort = await freePort();
  const status = agent.ports.status;
  const cfgDir = path.join(agent.dir.path, 'mesh');
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
  try {
    await agent.start({ args: ['proxy', 'sidecar', '--standalone', cfgDir], env: { POD_NAME: 'web-client', ENVOY_UID: '1337' } });
    const d = await debugEpochs(status);
    const pid = d.epochs[0]!.pid;
    assert.equal(ownerOf(pid), { uid: 1337, gid: 1337 });
    const socket = fs.statSync(path.join(agent.dir.path, 'proxy', 'XDS'));
    assert.equal([socket.uid, socket.gid], [1337, 1337], 'the xDS socket is handed to Envoy\'s user');
    await waitFor('routed through Envoy', async () => (await httpRequest(`http://127.0.0.1:${servicePort}/`)).body === 'from-backend', 15_000);
  } finally {
    await agent.close();
    backend.close();
  }
});

/** GET url from inside a network namespace (a separate node process there); '' when it fails. */
function getIn(nsPath: string, url: string): string {
  const code = `require('http').get(${JSON.stringify(url)}, (r) => { let b = ''; r.on('data', (d) => (b += d)); r.on('end', () => process.stdout.write(r.statusCode + ' ' + b)); }).on('error', () => {}).setTimeout(3000, function () { this.destroy(); });`;
  return spawnSync('nsenter', [`--net=${nsPath}`, '--', process.execPath, '-e', code], { encoding: 'utf8', timeout: 10_000 }).stdout ?? '';
}

test('with the injector\'s capture rules, Envoy as 1337 reaches a remote backend directly; as root its upstream is captured to 15001', async () => {
  // Pod namespace (10.1.0.5) and a "remote host" namespace (10.1.0.6), joined by a veth pair.
  const ip = (...a: string[]) => execFileSync('ip', a, { stdio: ['ignore', 'pipe', 'pipe'] });
  const made: Netns[] = [];
  const children: ReturnType<typeof spawn>[] = [];
  try {
    const podNs = createNetns('ipt-user-pod');
    made.push(podNs);
    const remoteNs = createNetns('ipt-user-rem');
    made.push(remoteNs);
    const [pod, remote] = [podNs.name, remoteNs.name];
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
      const agent = await agentFixture({ prefix: 'pa-envoy-capture-', mode: 0o755, netns: podNs });
      try {
        const custom = path.join(agent.dir.path, 'custom.json');
        fs.writeFileSync(custom, text);
        await agent.start({
          proxyConfig: { customConfigFile: custom, parentShutdownDuration: undefined },
          env: { HOME: '/', POD_NAME: 'capture', INSTANCE_IP: '10.1.0.5', ...env },
        });
        return getIn(podPath, `http://127.0.0.1:${ports.listen}/slow`);
      } finally {
        await agent.close();
      }
    };
    assert.is(await runAgent({ ENVOY_UID: '1337', ENVOY_GID: '1337' }), '200 from-remote', 'Envoy as 1337: its upstream connection is not captured');
    // As root, Envoy's own connection is an app connection: redirected to 15001, where nothing listens here.
    assert.match(await runAgent({}), /^503 /);
  } finally {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    for (const ns of made) ns.remove();
  }
});

test.run();
