// One agent per configPath: the lock itself (in-process), then two real agents on one directory.

import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { execFile } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { claimConfigPath, LOCK_PID, LOCK_SOCKET } from '../lib/config-path-lock';
import { configureLogging, resetLogging } from '../lib/log';
import { debugEpochs, waitLiveEpoch, type RunningAgent } from './helpers/agent';
import { agentFixture, type AgentFixture } from './helpers/agent-fixture';
import { envoyShm, freePort, httpRequest, pidAlive, sleep, tempDir, waitFor } from './helpers/harness';
import { staticBootstrap } from './helpers/static-bootstrap';

/** A socket file nobody listens on, as a killed agent leaves it. */
async function staleSocket(file: string): Promise<void> {
  const tmp = `${file}.live`;
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(tmp, () => r()));
  fs.renameSync(tmp, file); // closing unlinks `tmp`, which no longer exists: `file` stays behind
  await new Promise<void>((r) => s.close(() => r()));
}

const lock = suite('config path lock');
lock.before(() => configureLogging({ outputLevel: 'none' }));
lock.after(() => resetLogging());

lock('a held configPath refuses a second claim naming the holder\'s pid; release frees it and leaves nothing', async () => {
  const dir = tempDir('pa-lock-');
  try {
    const held = await claimConfigPath(dir.path);
    assert.equal(fs.readdirSync(dir.path).sort(), [LOCK_PID, LOCK_SOCKET]);
    assert.is(fs.readFileSync(path.join(dir.path, LOCK_PID), 'utf8').trim(), String(process.pid));
    try {
      await claimConfigPath(dir.path);
      assert.unreachable('second claim succeeded');
    } catch (e) {
      assert.match((e as Error).message, new RegExp(`configPath ${dir.path} is in use: another pilot-agent \\(pid ${process.pid}\\) holds its lock`));
    }
    held.release();
    held.release();
    assert.equal(fs.readdirSync(dir.path), []);
    (await claimConfigPath(dir.path)).release();
  } finally {
    dir.cleanup();
  }
});

lock('a lock left by a dead agent is replaced, and a stale pid file does not name the wrong agent', async () => {
  const dir = tempDir('pa-lock-');
  try {
    await staleSocket(path.join(dir.path, LOCK_SOCKET));
    fs.writeFileSync(path.join(dir.path, LOCK_PID), '999999\n');
    const held = await claimConfigPath(dir.path);
    assert.is(fs.readFileSync(path.join(dir.path, LOCK_PID), 'utf8').trim(), String(process.pid));
    held.release();
  } finally {
    dir.cleanup();
  }
});

lock('ten agents starting at once over a dead agent\'s lock: exactly one wins', async () => {
  const dir = tempDir('pa-lock-');
  try {
    for (let round = 0; round < 5; round++) {
      await staleSocket(path.join(dir.path, LOCK_SOCKET));
      const results = await Promise.allSettled(Array.from({ length: 10 }, () => claimConfigPath(dir.path)));
      const won = results.filter((r): r is PromiseFulfilledResult<{ release(): void }> => r.status === 'fulfilled');
      assert.is(won.length, 1, `round ${round}: ${results.map((r) => (r.status === 'rejected' ? (r.reason as Error).message : 'won')).join('; ')}`);
      for (const r of results) if (r.status === 'rejected') assert.match((r.reason as Error).message, /is in use: another pilot-agent \(pid \d+\)/);
      won[0]!.value.release();
      assert.equal(fs.readdirSync(dir.path), []);
    }
  } finally {
    dir.cleanup();
  }
});

lock('a file that is not a socket is never deleted', async () => {
  const dir = tempDir('pa-lock-');
  try {
    fs.writeFileSync(path.join(dir.path, LOCK_SOCKET), 'precious');
    await claimConfigPath(dir.path).then(() => assert.unreachable(), (e: Error) => assert.match(e.message, /exists and is not a socket/));
    assert.is(fs.readFileSync(path.join(dir.path, LOCK_SOCKET), 'utf8'), 'precious');
  } finally {
    dir.cleanup();
  }
});

lock.run();

// ---------------------------------------------------------------------------------------------------------

const agents = suite('two agents, one configPath');

agents('a second agent on the same configPath exits 1 naming the first one\'s pid and touches nothing of it; the first still hot-restarts', async () => {
  const dir = tempDir('pa-two-');
  const ports = { admin: await freePort(), status: await freePort(), listen: await freePort() };
  const custom = path.join(dir.path, 'custom.json');
  fs.writeFileSync(custom, JSON.stringify(staticBootstrap(ports, 'first')));
  const proxyDir = path.join(dir.path, 'proxy');
  // The same config twice, as a second copy of a unit or a mistyped script would start it: one fixture a run, all
  // on this temp dir and these ports.
  const fixturePorts = { status: ports.status, admin: ports.admin, envoyStatus: await freePort(), prometheus: await freePort() };
  const fixtures: AgentFixture[] = [];
  const started: RunningAgent[] = [];
  const envoyPids = new Set<number>();
  const run = async () => {
    const f = await agentFixture({ dir, ports: fixturePorts });
    fixtures.push(f);
    const a = await f.start({ proxyConfig: { configPath: proxyDir, customConfigFile: custom }, env: { POD_NAME: 'two' }, ready: 'none' });
    started.push(a);
    return a;
  };
  try {
    const first = await run();
    const live = await waitLiveEpoch(ports.status, 0, 30_000).catch((e: Error) => { throw new Error(`${e.message}\n${first.log()}`); });
    envoyPids.add(live.pid);
    const baseId = (await debugEpochs(ports.status)).baseId!;
    const before = fs.readdirSync(proxyDir).sort();
    assert.ok(before.includes('envoy-base-id') && before.includes('envoy-rev0.json'), before.join(' '));
    const shm = `envoy_shared_memory_${baseId * 10}`;
    assert.ok(envoyShm().includes(shm));

    const second = await run();
    const exit = await waitFor('second agent exit', () => second.exited, 20_000);
    assert.is(exit.code, 1, second.log());
    assert.match(second.log(), new RegExp(`configPath ${proxyDir} is in use: another pilot-agent \\(pid ${first.pid}\\)`));
    assert.is(second.log().trim().split('\n').length, 1, `one line: ${second.log()}`);

    assert.equal(fs.readdirSync(proxyDir).sort(), before, 'nothing of the first agent was removed');
    assert.ok(envoyShm().includes(shm), 'its shared memory is still there');
    // The proof that matters: the first agent's Envoy can still be hot-restarted.
    first.proc.kill('SIGHUP');
    const next = await waitLiveEpoch(ports.status, 1, 30_000).catch((e: Error) => { throw new Error(`${e.message}\n${first.log()}`); });
    envoyPids.add(next.pid);
    assert.is((await httpRequest(`http://127.0.0.1:${ports.listen}/`)).body, 'first');
    assert.not.match(first.log(), /cannot open shared memory|still initializing/);

    // A killed agent's lock does not stand in the way of the next one.
    first.proc.kill('SIGKILL');
    await first.exited;
    await waitFor('its Envoys gone', () => [...envoyPids].every((p) => !pidAlive(p)), 30_000).catch((e: Error) => {
      const left = [...envoyPids].filter(pidAlive).map((p) => `${p}: ${fs.readFileSync(`/proc/${p}/status`, 'utf8').split('\n').slice(0, 3).join(' ')}`);
      throw new Error(`${e.message}: ${left.join('; ')}\n${first.log().slice(-2000)}`);
    });
    const third = await run();
    const again = await waitLiveEpoch(ports.status, 0, 30_000).catch((e: Error) => { throw new Error(`${e.message}\n${third.log()}`); });
    envoyPids.add(again.pid);
    assert.match(third.log(), /removed the lock of an agent that is gone/);
    third.proc.kill('SIGTERM');
    assert.is((await waitFor('third agent exit', () => third.exited, 20_000)).code, 0);
    assert.equal(fs.readdirSync(proxyDir), [], 'a clean exit leaves configPath empty');
  } finally {
    for (const a of started) await a.stop();
    for (const p of envoyPids) if (pidAlive(p)) process.kill(p, 'SIGKILL');
    for (const f of fixtures) await f.close();
    dir.cleanup();
  }
});

agents.run();

// ---------------------------------------------------------------------------------------------------------

const hostile = suite('the lock socket and a hostile peer');

/** Run as nobody: connect/close storms on argv[1], some connections sending junk, some held open unread. */
const STORM = `
const net = require('net');
const sock = process.argv[1];
const stats = { connected: 0, errors: 0 };
const one = (i) => new Promise((resolve) => {
  const c = net.connect(sock);
  c.on('error', () => { stats.errors++; resolve(); });
  c.on('connect', () => {
    stats.connected++;
    if (i % 3 === 0) c.destroy();
    else if (i % 3 === 1) { c.write(Buffer.alloc(4096, i)); c.destroy(); }
    else c.end();
    resolve();
  });
});
(async () => {
  const held = [];
  for (let i = 0; i < 40; i++) { const c = net.connect(sock); c.on('error', () => {}); c.pause(); held.push(c); }
  for (let round = 0; round < 30; round++) await Promise.all(Array.from({ length: 20 }, (_, i) => one(round * 20 + i)));
  await new Promise((r) => setTimeout(r, 1500));
  for (const c of held) c.destroy();
  process.stdout.write(JSON.stringify(stats));
})();
`;

hostile('600 connect/close cycles on agent.lock.sock from another uid (junk, early closes, unread connections): the agent and its Envoy live on, and the lock stays held', async () => {
  const fixture = await agentFixture({ prefix: 'pa-lock-storm-', mode: 0o755 });
  const { dir } = fixture;
  const ports = { admin: fixture.ports.admin, status: fixture.ports.status, listen: await freePort() };
  const custom = path.join(dir.path, 'custom.json');
  fs.writeFileSync(custom, JSON.stringify(staticBootstrap(ports, 'held')));
  const proxyDir = path.join(dir.path, 'proxy');
  // umask 0: the lock socket is connectable by every uid, the case where any local user is a peer. The agent is
  // spawned before start() first waits, so the umask is restored right after.
  const umask = process.umask(0);
  let starting: Promise<RunningAgent>;
  try {
    starting = fixture.start({ proxyConfig: { configPath: proxyDir, customConfigFile: custom }, env: { POD_NAME: 'storm' }, ready: 'none' });
  } finally {
    process.umask(umask);
  }
  const agent = await starting;
  try {
    const live = await waitLiveEpoch(ports.status, 0, 30_000).catch((e: Error) => { throw new Error(`${e.message}\n${agent.log()}`); });
    const sock = path.join(proxyDir, LOCK_SOCKET);
    const storm = new Promise<{ code: number; out: string }>((resolve) => {
      execFile('setpriv', ['--reuid', '65534', '--regid', '65534', '--clear-groups', process.execPath, '-e', STORM, sock], { timeout: 60_000 },
        (err, stdout, stderr) => resolve({ code: err ? 1 : 0, out: `${stdout}${stderr}` }));
    });
    // Another agent probing during the storm (its unread connections fill the probe slots) still finds it held.
    await sleep(300);
    await claimConfigPath(proxyDir).then((l) => { l.release(); assert.unreachable('claimed a held configPath'); },
      (e: Error) => assert.match(e.message, new RegExp(`configPath ${proxyDir} is in use: another pilot-agent \\(pid ${agent.pid}\\)`)));
    const r = await storm;
    assert.is(r.code, 0, r.out);
    await sleep(500);
    assert.is(agent.proc.exitCode, null, `the agent is alive:\n${agent.log().slice(-3000)}`);
    assert.is(agent.proc.signalCode, null);
    const stats = JSON.parse(r.out) as { connected: number; errors: number };
    assert.ok(stats.connected >= 500, `the storm reached the socket: ${r.out}`);
    assert.equal((await debugEpochs(ports.status)).epochs.map((e) => [e.pid, e.state]), [[live.pid, 'live']], 'the same Envoy');
    assert.is((await httpRequest(`http://127.0.0.1:${ports.listen}/`)).body, 'held');
    assert.is((await httpRequest(`http://127.0.0.1:${ports.status}/healthz/ready`)).status, 200);
    await claimConfigPath(proxyDir).then((l) => { l.release(); assert.unreachable('claimed a held configPath'); },
      (e: Error) => assert.match(e.message, new RegExp(`configPath ${proxyDir} is in use: another pilot-agent \\(pid ${agent.pid}\\) holds its lock`)));
    agent.proc.kill('SIGTERM');
    assert.is((await waitFor('agent exit', () => agent.exited, 20_000)).code, 0, agent.log());
  } finally {
    await agent.stop();
    await fixture.close();
  }
});

hostile.run();
