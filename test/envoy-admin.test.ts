// The admin requests readiness makes, against the real Envoy: statValues() (several stats in one request) while
// Envoy initialises, and the agent's readiness, which answers probes that arrive together from one look at Envoy's
// admin.

import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { adminRequest, serverInfo, statValues, type AdminAddress } from '../lib/envoy-admin';
import { HOT_RESTART_EPOCH_STAT, LIVE_STATS, WORKERS_STARTED_STAT } from '../lib/supervisor';
import { agentFixture } from './helpers/agent-fixture';
import { envoyBin, freePort, httpRequest, tempDir, waitFor } from './helpers/harness';
import { adsBootstrap } from './helpers/ads-bootstrap';

/** One Envoy started directly (no agent); stop() kills it and removes its base id's shared memory. */
function startEnvoy(bootstrap: Record<string, unknown>, dir: string, baseId: number): { stop(): Promise<void> } {
  const file = path.join(dir, 'envoy.json');
  fs.writeFileSync(file, JSON.stringify(bootstrap));
  const proc = spawn(envoyBin(), ['-c', file, '--base-id', String(baseId), '-l', 'error', '--concurrency', '1'], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let err = '';
  proc.stderr!.on('data', (d) => (err += d));
  const exited = new Promise<void>((r) => proc.once('exit', () => r()));
  return {
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
      await exited;
      fs.rmSync(`/dev/shm/envoy_shared_memory_${baseId * 10}`, { force: true });
      if (err.trim()) process.stderr.write(`envoy: ${err.slice(-500)}\n`);
    },
  };
}

const baseIdFor = () => 20_000 + Math.floor(Math.random() * 20_000);

test('statValues while Envoy awaits CDS: the counter is 0, a stat Envoy lacks is absent, names match exactly; Envoy\'s server.state gauge cannot tell LIVE', async () => {
  const dir = tempDir('pa-admin-');
  const baseId = baseIdFor();
  const port = await freePort();
  const admin: AdminAddress = { host: '127.0.0.1', port };
  // CDS from an ADS server that takes the connection and never answers (a refused one would count as a failed
  // fetch and let Envoy go live), with no initial fetch timeout: Envoy stays initialising.
  const held: net.Socket[] = [];
  const silent = net.createServer((c) => held.push(c.on('error', () => undefined)));
  await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
  const b = adsBootstrap({ nodeId: 'admin-test', adminPort: port, delta: false, xdsAddress: `127.0.0.1:${(silent.address() as net.AddressInfo).port}` });
  const e = startEnvoy(b, dir.path, baseId);
  try {
    const ready = await waitFor('admin answers', () => adminRequest(admin, 'GET', '/ready').catch(() => undefined), 15_000, 20);
    assert.equal([ready.status, ready.body.trim()], [503, 'PRE_INITIALIZING']);
    const v = await statValues(admin, ['server.state', 'cluster_manager.cds.update_success', 'no.such.stat', ...LIVE_STATS]);
    assert.ok(v);
    assert.is(v.get('cluster_manager.cds.update_success') ?? 0, 0);
    assert.not.ok(v.has('no.such.stat'));
    // The gauge reads 0 (LIVE) while /ready says PRE_INITIALIZING (it is not kept current while Envoy starts): the
    // liveness of a starting Envoy comes from /ready, /server_info or workers_started, never from it.
    assert.is(v.get('server.state'), 0);
    assert.is(v.get(WORKERS_STARTED_STAT), 0);
    assert.is(v.get(HOT_RESTART_EPOCH_STAT), 0);
    // The names are matched exactly: a '.' is not "any character".
    const none = await statValues(admin, ['server_state', 'server.stat']);
    assert.is(none?.size, 0);
  } finally {
    await e.stop();
    for (const c of held) c.destroy();
    await new Promise((r) => silent.close(r));
    dir.cleanup();
  }
});

test('workers_started turns 1 only once Envoy is LIVE (what Supervisor.liveFromStats relies on), with its epoch beside it', async () => {
  const dir = tempDir('pa-admin-live-');
  const baseId = baseIdFor();
  const port = await freePort();
  const admin: AdminAddress = { host: '127.0.0.1', port };
  // Nothing to wait for: Envoy goes from PRE_INITIALIZING to LIVE on its own, and each look is taken while it does.
  const e = startEnvoy({ admin: { address: { socket_address: { address: '127.0.0.1', port_value: port } } }, static_resources: {} }, dir.path, baseId);
  try {
    const looks: Array<{ workers: number | undefined; ready: number }> = [];
    await waitFor(
      'workers started',
      async () => {
        const v = await statValues(admin, LIVE_STATS).catch(() => undefined);
        if (!v) return false;
        const r = await adminRequest(admin, 'GET', '/ready');
        looks.push({ workers: v.get(WORKERS_STARTED_STAT), ready: r.status });
        if (v.get(WORKERS_STARTED_STAT) !== 1) return false;
        assert.is(v.get(HOT_RESTART_EPOCH_STAT), 0);
        return true;
      },
      15_000,
      1,
    );
    // Every look that saw the workers started saw /ready 200 right after it.
    for (const l of looks) if (l.workers === 1) assert.is(l.ready, 200, JSON.stringify(looks));
    assert.is((await serverInfo(admin)).state, 'LIVE');
  } finally {
    await e.stop();
    dir.cleanup();
  }
});

test('the agent: 30 readiness probes at once are answered from one look at Envoy\'s admin, not one each', async () => {
  const fixture = await agentFixture({ prefix: 'pa-admin-agent-' });
  const mesh = path.join(fixture.dir.path, 'mesh');
  fs.mkdirSync(mesh);
  let counter: net.Server | undefined;
  try {
    // The admin on its Unix socket (Istio's bootstrap keeps no admin stats to count with): once the agent is
    // ready, a relay that counts connections takes the socket's name and passes each one to Envoy's socket, moved.
    await fixture.start({ args: ['proxy', 'sidecar', '--standalone', mesh], env: { POD_NAME: 'ready', ENVOY_ADMIN_MODE: 'uds' } });
    const socket = path.join(fixture.dir.path, 'proxy', 'admin', 'envoy-admin.sock');
    const moved = `${socket}.envoy`;
    fs.renameSync(socket, moved);
    let connections = 0;
    counter = net.createServer((c) => {
      connections++;
      const up = net.connect(moved);
      c.pipe(up).pipe(c);
      c.on('error', () => up.destroy());
      up.on('error', () => c.destroy());
    });
    await new Promise<void>((r) => counter!.listen(socket, r));
    const probe = () => httpRequest(`http://127.0.0.1:${fixture.ports.status}/healthz/ready`);
    assert.is((await probe()).status, 200);
    assert.is(connections, 1, 'one probe: one admin request');
    connections = 0;
    const answers = await Promise.all(Array.from({ length: 30 }, probe));
    assert.equal(answers.map((a) => a.status), Array(30).fill(200));
    // Probes that arrive after a look ended start the next one, so a few looks, never one per probe.
    assert.ok(connections >= 1 && connections <= 5, `${connections} admin requests for 30 probes`);
  } catch (e) {
    fixture.withLog(e as Error);
  } finally {
    await new Promise((r) => (counter ? counter.close(r) : r(undefined)));
    await fixture.close();
  }
});

test.run();
