// Envoy's hot-restart shared memory never outlives the agent that owns it: not when the agent is killed with
// SIGKILL and its configPath is never used again (the next agent on the host removes it, having proved that
// agent gone), and not when it exits normally.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { debugEpochs, startAgent, waitLiveEpoch, type RunningAgent } from './helpers/agent';
import { envoyBin, freePort, pidAlive, tempDir, waitFor, type TempDir } from './helpers/harness';
import { staticBootstrap } from './helpers/static-bootstrap';

const segment = (id: number) => `/dev/shm/envoy_shared_memory_${id * 10}`;
const owner = (id: number) => `/dev/shm/pilot-agent-envoy-shm-owner_${id * 10}`;

async function agentIn(dir: TempDir, name: string): Promise<{ agent: RunningAgent; status: number; configPath: string }> {
  const ports = { admin: await freePort(), status: await freePort(), listen: await freePort() };
  const custom = path.join(dir.path, `${name}.json`);
  fs.writeFileSync(custom, JSON.stringify(staticBootstrap(ports, name)));
  const configPath = path.join(dir.path, name);
  const agent = startAgent(['proxy', 'sidecar'], {
    PROXY_CONFIG: JSON.stringify({ configPath, binaryPath: envoyBin(), customConfigFile: custom, statusPort: ports.status, proxyAdminPort: ports.admin, drainDuration: '1s', parentShutdownDuration: '2s', terminationDrainDuration: '1s' }),
    POD_NAME: name, POD_NAMESPACE: 'test', INSTANCE_IP: '127.0.0.1',
    ENVOY_STATUS_PORT: String(await freePort()), ENVOY_PROMETHEUS_PORT: String(await freePort()),
  }, dir.path);
  await waitLiveEpoch(ports.status, 0, 30_000).catch((e: Error) => { throw new Error(`${e.message}\n${agent.log()}`); });
  return { agent, status: ports.status, configPath };
}

test('a killed agent\'s shared memory is removed by the next agent on the host, even with another configPath; a clean exit leaves none', async () => {
  const dir = tempDir('pa-shm-');
  const started: RunningAgent[] = [];
  const ids: number[] = [];
  try {
    const a = await agentIn(dir, 'a');
    started.push(a.agent);
    const d = await debugEpochs(a.status);
    const idA = d.baseId!;
    ids.push(idA);
    const envoyA = d.epochs[0]!.pid;
    assert.ok(fs.existsSync(segment(idA)) && fs.existsSync(owner(idA)), 'the agent records which segment is its own');
    assert.equal(JSON.parse(fs.readFileSync(owner(idA), 'utf8')), { configPath: a.configPath, pid: a.agent.pid });

    a.agent.proc.kill('SIGKILL');
    await a.agent.exited;
    await waitFor('its Envoy gone', () => !pidAlive(envoyA), 10_000);
    fs.rmSync(a.configPath, { recursive: true, force: true }); // that configPath is never used again
    assert.ok(fs.existsSync(segment(idA)), 'nobody removed it yet');

    const b = await agentIn(dir, 'b');
    started.push(b.agent);
    const idB = (await debugEpochs(b.status)).baseId!;
    ids.push(idB);
    assert.not.ok(fs.existsSync(segment(idA)), 'the gone agent\'s segment was removed');
    assert.not.ok(fs.existsSync(owner(idA)));
    assert.match(b.agent.log(), new RegExp(`removed the shared memory of base id ${idA}, left by a pilot-agent that is gone`));
    assert.ok(fs.existsSync(segment(idB)), 'a live agent\'s segment is never touched');

    b.agent.proc.kill('SIGTERM');
    assert.is((await waitFor('b exit', () => b.agent.exited, 20_000)).code, 0);
    assert.not.ok(fs.existsSync(segment(idB)) || fs.existsSync(owner(idB)), 'a clean exit removes its segment and its record');
  } finally {
    for (const s of started) await s.stop();
    dir.cleanup();
  }
  for (const id of ids) assert.not.ok(fs.existsSync(segment(id)) || fs.existsSync(owner(id)), `nothing left for base id ${id}`);
});

test.run();
