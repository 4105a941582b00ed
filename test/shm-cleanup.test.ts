// Envoy's hot-restart shared memory never outlives the agent that owns it: not when the agent is killed with
// SIGKILL and its configPath is never used again (the next agent on the host removes it, having proved that
// agent gone), and not when it exits normally.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { debugEpochs, type RunningAgent } from './helpers/agent';
import { type AgentFixture, agentFixture } from './helpers/agent-fixture';
import { freePort, pidAlive, waitFor } from './helpers/harness';
import { staticBootstrap } from './helpers/static-bootstrap';

const segment = (id: number) => `/dev/shm/envoy_shared_memory_${id * 10}`;
const owner = (id: number) => `/dev/shm/pilot-agent-envoy-shm-owner_${id * 10}`;

/** An agent with its own temp dir (so another configPath) and a static bootstrap; `started` gets it first. */
async function agentIn(started: AgentFixture[], name: string): Promise<{ agent: RunningAgent; status: number; configPath: string }> {
  const fixture = await agentFixture({ prefix: `pa-shm-${name}-` });
  started.push(fixture);
  const ports = { admin: fixture.ports.admin, status: fixture.ports.status, listen: await freePort() };
  const custom = path.join(fixture.dir.path, `${name}.json`);
  fs.writeFileSync(custom, JSON.stringify(staticBootstrap(ports, name)));
  const configPath = path.join(fixture.dir.path, name);
  await fixture.start({ proxyConfig: { configPath, customConfigFile: custom }, env: { POD_NAME: name }, ready: 'live' });
  return { agent: fixture.agent, status: ports.status, configPath };
}

test('a killed agent\'s shared memory is removed by the next agent on the host, even with another configPath; a clean exit leaves none', async () => {
  const started: AgentFixture[] = [];
  const ids: number[] = [];
  try {
    const a = await agentIn(started, 'a');
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

    const b = await agentIn(started, 'b');
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
    for (const s of started) await s.close();
  }
  for (const id of ids) assert.not.ok(fs.existsSync(segment(id)) || fs.existsSync(owner(id)), `nothing left for base id ${id}`);
});

test.run();
