// The supervisor against the real Envoy, through the real agent executable. A static custom bootstrap
// (a direct_response listener, and a route to a slow loopback backend) keeps these tests independent of xDS.

import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as net from 'node:net';
import * as path from 'node:path';
import { envoyBin, envoyShm, freePort, httpRequest, pidAlive, sleep, tempDir, waitFor, type TempDir } from './helpers/harness';
import { startLoad } from './helpers/load';
import { spawnSync } from 'node:child_process';
import { agentBin, debugEpochs, waitLiveEpoch, type RunningAgent } from './helpers/agent';
import { agentFixture } from './helpers/agent-fixture';
import { staticBootstrap } from './helpers/static-bootstrap';

interface Ports {
  admin: number;
  status: number;
  listen: number;
  slow: number;
}

interface Setup {
  dir: TempDir;
  ports: Ports;
  custom: string;
  agent: RunningAgent;
  write(b: Record<string, unknown>): void;
  cleanup(): Promise<void>;
}

async function setUp(opts: { env?: Record<string, string>; proxyConfig?: Record<string, unknown>; body?: string; backendPort?: number; binaryPath?: string; statusPort?: number } = {}): Promise<Setup> {
  const fixture = await agentFixture({ prefix: 'pa-sup-', ports: opts.statusPort ? { status: opts.statusPort } : {} });
  const { dir } = fixture;
  const ports: Ports = { admin: fixture.ports.admin, status: fixture.ports.status, listen: await freePort(), slow: opts.backendPort ?? 0 };
  const custom = path.join(dir.path, 'custom.json');
  const write = (b: Record<string, unknown>) => {
    // Replace atomically, as config management tools do.
    fs.writeFileSync(custom + '.tmp', JSON.stringify(b));
    fs.renameSync(custom + '.tmp', custom);
  };
  write(staticBootstrap(ports, opts.body ?? 'v0', { backendPort: opts.backendPort }));
  // SIGKILL at once, as before: these tests leave agents mid-restart. close() kills only this agent's own Envoys
  // (another agent may answer on a fixed port if this one failed to bind it).
  const cleanup = () => fixture.close(0);
  try {
    await fixture.start({
      proxyConfig: {
        ...(opts.binaryPath ? { binaryPath: opts.binaryPath } : {}),
        customConfigFile: custom,
        terminationDrainDuration: '2s',
        ...opts.proxyConfig,
      },
      env: { POD_NAME: 'sup', FILE_DEBOUNCE_DURATION: '50ms', ...opts.env },
      readyTimeoutMs: 20_000,
    });
  } catch (e) {
    await cleanup();
    throw e;
  }
  return { dir, ports, custom, agent: fixture.agent, write, cleanup };
}

const listenerBody = async (port: number) => (await httpRequest(`http://127.0.0.1:${port}/`)).body;

// ---------------------------------------------------------------------------------------------------------

const hot = suite('hot restart');

hot('hot restart under load drops no request', async () => {
  const s = await setUp();
  try {
    const load = startLoad({ url: `http://127.0.0.1:${s.ports.listen}/`, concurrency: 4, maxDurationMs: 120_000 });
    // And new connections all the time: they land on the listen socket while it is handed from epoch to epoch.
    const fresh = startLoad({ url: `http://127.0.0.1:${s.ports.listen}/`, concurrency: 2, keepAlive: false, maxDurationMs: 120_000 });
    const seen: number[] = [0];
    for (let i = 1; i <= 10; i++) {
      if (i % 2) s.write(staticBootstrap(s.ports, `v${i}`));
      else s.agent.proc.kill('SIGHUP');
      const live = await waitLiveEpoch(s.ports.status, i);
      seen.push(live.epoch);
      if (i % 2) await waitFor(`body v${i}`, async () => (await listenerBody(s.ports.listen)) === `v${i}`, 5000);
      await sleep(150);
    }
    const r = await load.stop();
    const f = await fresh.stop();
    assert.is(r.failed, 0, `failed requests: ${r.errors.join('; ')}`);
    assert.is(f.failed, 0, `failed requests on new connections: ${f.errors.join('; ')}`);
    assert.ok(r.ok > 200 && f.ok > 100, `load ran (${r.ok} and ${f.ok} ok)`);
    assert.equal(seen, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 'each epoch exactly one above the last');
    // Old epochs end once the parent-shutdown time (2 s) has passed.
    await waitFor('only the newest epoch left', async () => {
      const d = await debugEpochs(s.ports.status);
      return d.epochs.length === 1 && d.epochs[0]!.epoch === 10;
    }, 10_000);
    assert.is(await listenerBody(s.ports.listen), 'v9');
  } finally {
    await s.cleanup();
  }
});

hot('a broken new config keeps the old epoch serving; the budget is spent and reported; a fix goes live', async () => {
  // A port held by another program: the bootstrap is valid, but the new epoch cannot bind it and exits.
  const blocker = net.createServer();
  const blocked = await freePort();
  await new Promise<void>((r) => blocker.listen(blocked, '127.0.0.1', () => r()));
  const s = await setUp({ env: { ENVOY_RESTART_INITIAL_BACKOFF: '5ms' } });
  try {
    const load = startLoad({ url: `http://127.0.0.1:${s.ports.listen}/`, concurrency: 3, maxDurationMs: 120_000 });
    // First a bootstrap Envoy's validation rejects: never launched.
    s.write(staticBootstrap(s.ports, 'x', { invalid: true }));
    await waitFor('rejection reported', async () => /rejected/.test((await debugEpochs(s.ports.status)).lastFailure?.reason ?? ''), 15_000);
    // Then one that passes validation but fails at run time.
    s.write(staticBootstrap(s.ports, 'broken', { extraListenPort: blocked }));
    await waitFor('budget spent', async () => /budget spent/.test((await debugEpochs(s.ports.status)).lastFailure?.reason ?? ''), 60_000);
    // Each failed child asked epoch 0 to close its admin listener (Envoy's hot restart protocol), so epoch 0 serves
    // without one; the agent brings it back by starting the last good config once more as a new epoch.
    await waitLiveEpoch(s.ports.status, 1, 20_000);
    await waitFor('admin answers again', async () => (await httpRequest(`http://127.0.0.1:${s.ports.admin}/ready`).catch(() => ({ status: 0 }))).status === 200, 10_000);
    assert.match(s.agent.log(), /serves without its admin port/);
    const d = await debugEpochs(s.ports.status);
    assert.is(d.restartBudgetLeft, 0);
    { const rr = await httpRequest(`http://127.0.0.1:${s.ports.status}/healthz/ready`); assert.is(rr.status, 200, rr.body); }
    const metrics = (await httpRequest(`http://127.0.0.1:${s.ports.status}/stats/prometheus`)).body;
    assert.match(metrics, /istio_agent_envoy_restart_budget_exhausted_total 1/);
    assert.match(metrics, /istio_agent_envoy_configs_rejected_total 1/);
    assert.is(await listenerBody(s.ports.listen), 'v0');
    // A good config after all that still hot-restarts: the agent cleared the flag the dead children left.
    s.write(staticBootstrap(s.ports, 'fixed'));
    await waitLiveEpoch(s.ports.status, 2, 20_000);
    await waitFor('fixed body', async () => (await listenerBody(s.ports.listen)) === 'fixed', 5000);
    const r = await load.stop();
    assert.is(r.failed, 0, `failed requests: ${r.errors.join('; ')}`);
    assert.match(s.agent.log(), /before it went live/);
  } finally {
    await s.cleanup();
    blocker.close();
  }
});

hot('an unreadable config file while running is logged with its name, and the last good config stays', async () => {
  const s = await setUp();
  try {
    fs.writeFileSync(s.custom, '{"admin": {"address": ');
    await waitFor('error logged', () => /new config not applied, keeping the last good one: .*custom\.json/.test(s.agent.log()), 5000);
    await sleep(300);
    assert.equal((await debugEpochs(s.ports.status)).epochs.map((e) => [e.epoch, e.state]), [[0, 'live']]);
    assert.is(await listenerBody(s.ports.listen), 'v0');
    { const rr = await httpRequest(`http://127.0.0.1:${s.ports.status}/healthz/ready`); assert.is(rr.status, 200, rr.body); }
  } finally {
    await s.cleanup();
  }
});

hot('a draining parent killed mid-handover leaves the new epoch serving', async () => {
  const s = await setUp({ proxyConfig: { drainDuration: '4s', parentShutdownDuration: '8s' } });
  try {
    const parent = await waitLiveEpoch(s.ports.status, 0);
    s.agent.proc.kill('SIGHUP');
    const child = await waitLiveEpoch(s.ports.status, 1);
    process.kill(parent.pid, 'SIGKILL');
    await waitFor('parent gone', () => !pidAlive(parent.pid), 5000);
    await sleep(500);
    const d = await debugEpochs(s.ports.status);
    assert.equal(d.epochs.map((e) => [e.epoch, e.pid, e.state]), [[1, child.pid, 'live']]);
    assert.is(d.restartBudgetLeft, 10, 'nothing was restarted');
    assert.is(await listenerBody(s.ports.listen), 'v0');
  } finally {
    await s.cleanup();
  }
});

hot('killing the live Envoy leads to a new epoch after the backoff', async () => {
  const s = await setUp();
  try {
    const first = await waitLiveEpoch(s.ports.status, 0);
    process.kill(first.pid, 'SIGKILL');
    const again = await waitFor('a new epoch 0', async () => {
      const d = await debugEpochs(s.ports.status);
      return d.epochs.find((e) => e.epoch === 0 && e.state === 'live' && e.pid !== first.pid);
    }, 20_000);
    assert.ok(again.pid !== first.pid);
    assert.is(await listenerBody(s.ports.listen), 'v0');
    assert.is((await debugEpochs(s.ports.status)).restartBudgetLeft, 9);
    assert.match(s.agent.log(), /restarting in 200 ms/);
    // `pilot-agent wait` against the agent's own readiness endpoint.
    const wait = spawnSync(agentBin(), ['wait', `--url=http://127.0.0.1:${s.ports.status}/healthz/ready`, '--timeoutSeconds=10'], { encoding: 'utf8' });
    assert.is(wait.status, 0, wait.stderr);
  } finally {
    await s.cleanup();
  }
});

hot('twelve kill -9s of the live Envoy, each after it stayed live for the reset duration: the agent always recovers at the first backoff', async () => {
  const s = await setUp({ env: { ENVOY_HEALTHY_RESET_DURATION: '1s' } });
  try {
    const outages: number[] = [];
    let live = await waitLiveEpoch(s.ports.status, 0);
    for (let crash = 1; crash <= 12; crash++) {
      await waitFor('budget restored', async () => (await debugEpochs(s.ports.status)).restartBudgetLeft === 10, 15_000);
      const t0 = Date.now();
      process.kill(live.pid, 'SIGKILL');
      const dead = live.pid;
      live = await waitFor(`a new live epoch after crash ${crash}`, async () => {
        const d = await debugEpochs(s.ports.status);
        return d.epochs.find((e) => e.state === 'live' && e.pid !== dead);
      }, 30_000).catch((e: Error) => { throw new Error(`${e.message}\n${s.agent.log().slice(-3000)}`); });
      outages.push(Date.now() - t0);
      assert.is(s.agent.proc.exitCode, null, `the agent is still running after crash ${crash}`);
    }
    console.log(`outages after each kill -9 (ms): ${outages.join(' ')}`);
    const restarts = s.agent.log().match(/restarting in \d+ ms/g) ?? [];
    assert.is(restarts.length, 12);
    assert.ok(restarts.every((r) => r === 'restarting in 200 ms'), `every restart at the first backoff: ${restarts.join(', ')}`);
    assert.is(await listenerBody(s.ports.listen), 'v0');
  } finally {
    await s.cleanup();
  }
});

hot('killing the agent takes Envoy with it', async () => {
  const s = await setUp();
  try {
    const live = await waitLiveEpoch(s.ports.status, 0);
    s.agent.proc.kill('SIGKILL');
    await s.agent.exited;
    await waitFor('Envoy gone', () => !pidAlive(live.pid), 10_000);
  } finally {
    await s.cleanup();
  }
});

hot('a binary with another hot restart version gets a drain-then-cold restart', async () => {
  const dir = tempDir('pa-bin-');
  const wrapper = path.join(dir.path, 'envoy');
  const writeWrapper = (version: string) => {
    fs.writeFileSync(wrapper + '.tmp', `#!/bin/sh\nif [ "$1" = "--hot-restart-version" ]; then echo ${version}; exit 0; fi\nexec ${envoyBin()} "$@"\n`, { mode: 0o755 });
    fs.renameSync(wrapper + '.tmp', wrapper);
  };
  writeWrapper('11.104');
  const s = await setUp({ binaryPath: wrapper, proxyConfig: { terminationDrainDuration: '1s' } });
  try {
    const first = await waitLiveEpoch(s.ports.status, 0);
    const base = (await debugEpochs(s.ports.status)).baseId;
    writeWrapper('12.999'); // an "upgrade in place" whose shared memory layout differs
    const again = await waitFor('cold-restarted epoch 0', async () => {
      const d = await debugEpochs(s.ports.status);
      return d.epochs.find((e) => e.epoch === 0 && e.state === 'live' && e.pid !== first.pid);
    }, 30_000);
    assert.ok(again);
    assert.ok((await debugEpochs(s.ports.status)).baseId !== base, 'a new base id');
    assert.match(s.agent.log(), /cannot hand over sockets, so draining and cold-restarting/);
    assert.is(await listenerBody(s.ports.listen), 'v0');
  } finally {
    await s.cleanup();
    dir.cleanup();
  }
});

hot('a touch without a change restarts nothing; a binary replaced in place hot-restarts', async () => {
  const dir = tempDir('pa-touch-');
  const bin = path.join(dir.path, 'envoy');
  fs.copyFileSync(envoyBin(), bin);
  fs.chmodSync(bin, 0o755);
  const s = await setUp({ binaryPath: bin });
  try {
    const now = new Date();
    fs.utimesSync(s.custom, now, now);
    s.write(JSON.parse(fs.readFileSync(s.custom, 'utf8')));
    await sleep(600);
    assert.equal((await debugEpochs(s.ports.status)).epochs.map((e) => e.epoch), [0], 'no new epoch for an unchanged file');
    fs.copyFileSync(envoyBin(), bin + '.new');
    fs.chmodSync(bin + '.new', 0o755);
    fs.renameSync(bin + '.new', bin);
    await waitLiveEpoch(s.ports.status, 1);
  } finally {
    await s.cleanup();
    dir.cleanup();
  }
});

hot('a change to a file the bootstrap reads (as certificates are) hot-restarts Envoy', async () => {
  const s = await setUp();
  try {
    // The response body comes from a DataSource `filename`, just as TLS certificates and keys do.
    const bodyFile = path.join(s.dir.path, 'body.txt');
    fs.writeFileSync(bodyFile, 'from-file-1');
    const b = staticBootstrap(s.ports, 'unused') as { static_resources: { listeners: Array<{ filter_chains: Array<{ filters: Array<{ typed_config: { route_config: { virtual_hosts: Array<{ routes: Array<{ direct_response: { body: unknown } }> }> } } }> }> }> } };
    b.static_resources.listeners[0]!.filter_chains[0]!.filters[0]!.typed_config.route_config.virtual_hosts[0]!.routes[0]!.direct_response.body = { filename: bodyFile };
    s.write(b as unknown as Record<string, unknown>);
    await waitLiveEpoch(s.ports.status, 1);
    assert.is(await listenerBody(s.ports.listen), 'from-file-1');
    fs.writeFileSync(bodyFile + '.tmp', 'from-file-2');
    fs.renameSync(bodyFile + '.tmp', bodyFile);
    await waitLiveEpoch(s.ports.status, 2);
    await waitFor('new body', async () => (await listenerBody(s.ports.listen)) === 'from-file-2', 5000);
  } finally {
    await s.cleanup();
  }
});

hot('readiness follows Envoy after the first success: a stopped Envoy is not ready, and ready again when it runs', async () => {
  const s = await setUp();
  let pid = 0;
  try {
    const ready = async () => httpRequest(`http://127.0.0.1:${s.ports.status}/healthz/ready`);
    await waitFor('ready', async () => (await ready()).status === 200, 20_000);
    pid = (await waitLiveEpoch(s.ports.status, 0)).pid;
    process.kill(pid, 'SIGSTOP');
    const r = await waitFor('not ready while stopped', async () => { const x = await ready(); return x.status === 503 ? x : undefined; }, 10_000);
    assert.match(r.body, /Envoy does not answer on its admin port/);
    process.kill(pid, 'SIGCONT');
    pid = 0;
    await waitFor('ready again', async () => (await ready()).status === 200, 10_000);
  } finally {
    if (pid) process.kill(pid, 'SIGCONT');
    await s.cleanup();
  }
});

hot.run();

// ---------------------------------------------------------------------------------------------------------

const term = suite('shutdown');

function slowBackend(delayMs: number): Promise<{ server: http.Server; port: number }> {
  const server = http.createServer((_req, res) => setTimeout(() => res.end('slow done'), delayMs));
  return new Promise((r) => server.listen(0, '127.0.0.1', () => r({ server, port: (server.address() as net.AddressInfo).port })));
}

term('SIGTERM under load: in-flight requests complete, Envoy is gone by the drain deadline, exit 0, nothing left behind', async () => {
  const backend = await slowBackend(800);
  const s = await setUp({ backendPort: backend.port, proxyConfig: { terminationDrainDuration: '2s' } });
  try {
    const live = await waitLiveEpoch(s.ports.status, 0);
    const baseId = (await debugEpochs(s.ports.status)).baseId;
    const inflight = Array.from({ length: 5 }, () => httpRequest(`http://127.0.0.1:${s.ports.listen}/slow`, { timeoutMs: 10_000 }));
    await sleep(200);
    const t0 = Date.now();
    s.agent.proc.kill('SIGTERM');
    const results = await Promise.all(inflight);
    assert.equal(results.map((r) => r.status), [200, 200, 200, 200, 200], 'in-flight requests completed');
    assert.ok(results.every((r) => r.body === 'slow done'));
    const exit = await s.agent.exited;
    const took = Date.now() - t0;
    assert.is(exit.code, 0);
    assert.ok(took < 2000 + 3000, `agent ended ${took} ms after SIGTERM (drain 2 s + margin)`);
    assert.not.ok(pidAlive(live.pid), 'Envoy gone');
    const proxyDir = path.join(s.dir.path, 'proxy');
    assert.equal(fs.readdirSync(proxyDir), [], 'no bootstrap or base id file left');
    assert.not.ok(envoyShm().includes(`envoy_shared_memory_${baseId! * 10}`), 'shared memory removed');
    assert.match(s.agent.log(), /asked epoch 0 to drain its listeners/);
  } finally {
    await s.cleanup();
    backend.server.close();
  }
});

term('exit on zero active connections waits while a connection is open and ends as soon as it closes', async () => {
  const s = await setUp({ env: { EXIT_ON_ZERO_ACTIVE_CONNECTIONS: 'true', MINIMUM_DRAIN_DURATION: '1s' }, proxyConfig: { terminationDrainDuration: '60s' } });
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  try {
    // One idle keep-alive connection stays open on Envoy's listener.
    assert.is((await httpRequest(`http://127.0.0.1:${s.ports.listen}/`, { agent })).status, 200);
    s.agent.proc.kill('SIGTERM');
    await sleep(2500);
    assert.is(s.agent.proc.exitCode, null, 'still draining: a downstream connection is active');
    const t0 = Date.now();
    agent.destroy();
    const exit = await waitFor('agent exit', () => s.agent.exited, 10_000);
    assert.is(exit.code, 0);
    assert.ok(Date.now() - t0 < 5000, 'ended soon after the last connection closed, long before terminationDrainDuration (60 s)');
    assert.match(s.agent.log(), /no active downstream connections left/);
  } finally {
    agent.destroy();
    await s.cleanup();
  }
});

term('a second SIGTERM during the drain kills at once', async () => {
  const s = await setUp({ proxyConfig: { terminationDrainDuration: '60s' } });
  try {
    s.agent.proc.kill('SIGTERM');
    await sleep(300);
    s.agent.proc.kill('SIGTERM');
    const exit = await waitFor('agent exit', () => s.agent.exited, 10_000);
    assert.is(exit.code, 0);
  } finally {
    await s.cleanup();
  }
});

term('pilot-agent request on the status port: GET /debug/epochs, POST drain (preStop), then SIGTERM stops at once', async () => {
  // `request` only talks to Istio's well-known ports, so this test uses the real status port 15020.
  const s = await setUp({ statusPort: 15020, proxyConfig: { terminationDrainDuration: '60s' } });
  const request = (...args: string[]) => spawnSync(agentBin(), ['request', ...args, '--debug-port', '15020'], { encoding: 'utf8' });
  try {
    const epochs = request('GET', '/debug/epochs');
    assert.is(epochs.status, 0, epochs.stderr);
    assert.is(JSON.parse(epochs.stdout).epochs[0].epoch, 0);
    const drain = request('POST', 'drain');
    assert.is(drain.status, 0, drain.stderr);
    assert.is(drain.stdout, 'OK\n');
    await sleep(1500); // longer than the drain time (1 s)
    const live = (await debugEpochs(s.ports.status)).epochs[0]!;
    assert.ok(pidAlive(live.pid), 'a preStop drain leaves Envoy running (skip_exit) until the agent is told to stop');
    assert.is(s.agent.proc.exitCode, null, s.agent.log());
    // Kubernetes then sends SIGTERM: already drained, so the agent stops at once instead of draining 60 s.
    s.agent.proc.kill('SIGTERM');
    const exit = await waitFor('agent exit', () => s.agent.exited, 10_000);
    assert.is(exit.code, 0);
    assert.match(s.agent.log(), /already drained by POST \/drain/);
  } finally {
    await s.cleanup();
  }
});

term('/quitquitquit from localhost ends the agent at once', async () => {
  const s = await setUp({ proxyConfig: { terminationDrainDuration: '60s' } });
  try {
    const r = await httpRequest(`http://127.0.0.1:${s.ports.status}/quitquitquit`, { method: 'POST' });
    assert.is(r.status, 200);
    const exit = await waitFor('agent exit', () => s.agent.exited, 10_000);
    assert.is(exit.code, 0);
    assert.is((await httpRequest(`http://127.0.0.1:${s.ports.listen}/`).catch((e: Error) => ({ status: 0, body: e.message }))).status, 0, 'Envoy is gone');
  } finally {
    await s.cleanup();
  }
});

term.run();
