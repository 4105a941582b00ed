// Agent-level tests start the agent through agentFixture() (test/helpers/agent-fixture.ts), so that each one's
// set-up is a few lines and every one cleans up the same way (agent, Envoys, shared memory, temp dir, namespace).
// This fails when a test file starts a long-running dist/pilot-agent another way: startAgent() directly, or an
// async spawn of the agent binary. One-shot runs (execFile, spawnSync: `version`, `request`, a bad flag) are fine.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { execFileSync } from 'node:child_process';
import { agentFixture, FIXED_PORTS } from './helpers/agent-fixture';
import { pidAlive } from './helpers/harness';

const TEST = __dirname;

/** Files that may start the agent themselves, and why. */
const ALLOWED: Record<string, string> = {
  'helpers/agent.ts': 'startAgent() itself',
  'helpers/agent-fixture.ts': 'the helper',
  'iptables.test.ts': 'runs istio-iptables (one-shot) and validation servers as uids inside namespaces',
  // The discovery server alone (no Envoy, no status port): test/helpers/discovery-process.ts.
  'helpers/discovery-process.ts': '`pilot-agent discovery`, not the agent',
  'go-knobs-cli.test.ts': '`pilot-agent discovery` with extra flags',
  'standalone-tracing.test.ts': '`pilot-agent discovery` beside an agent from agentFixture()',
};

function files(dir: string): string[] {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) return e.name === 'fixtures' || e.name === 'golden' ? [] : files(p);
    return /\.(ts|js)$/.test(e.name) ? [p] : [];
  });
}

/** What in `text` starts a long-running agent other than through agentFixture(), if anything. */
function startsAgent(text: string): string | undefined {
  const code = text.replace(/\/\*[\s\S]*?\*\//g, '').replace(/^\s*\/\/.*$/gm, '');
  if (/\bstartAgent\(/.test(code)) return 'calls startAgent()';
  const namesBinary = /\bagentBin\(\)|\bAGENT_BIN\b|dist\/pilot-agent/.test(code);
  // An async spawn whose line names the binary (or `bin`, the variable tests keep it in); a one-shot run of it
  // (execFile, spawnSync, Netns.run for istio-iptables) beside spawns of other programs is fine.
  const spawnsIt = code.split('\n').some((l) => /(^|[^.\w])spawn\(|\.spawn\(|\bspawnIn\(/.test(l) &&
    /\bagentBin\(\)|\bAGENT_BIN\b|dist\/pilot-agent|[([,]\s*bin\s*[,)\]]/.test(l));
  if (namesBinary && spawnsIt) return 'spawns the agent binary';
  return undefined;
}

test('agent-level tests start the agent through agentFixture(), except the allowed files', () => {
  const offenders: string[] = [];
  for (const f of files(TEST)) {
    const rel = path.relative(TEST, f);
    if (rel === 'test-helper-usage.test.ts' || ALLOWED[rel]) continue;
    const why = startsAgent(fs.readFileSync(f, 'utf8'));
    if (why) offenders.push(`${rel}: ${why}`);
  }
  const hint = 'use agentFixture() from test/helpers/agent-fixture.ts (or allow the file here, saying why)';
  assert.equal(offenders, [], `${hint}:\n${offenders.join('\n')}`);
});

test('every allowed file exists and still starts the agent itself (an allowance no longer needed is removed)', () => {
  for (const rel of Object.keys(ALLOWED)) {
    const f = path.join(TEST, rel);
    assert.ok(fs.existsSync(f), `${rel} is allowed but does not exist`);
    const why = startsAgent(fs.readFileSync(f, 'utf8'));
    assert.ok(why, `${rel} no longer starts the agent itself: remove it from ALLOWED`);
  }
});

test('the check sees the ways a test could start the agent', () => {
  assert.ok(startsAgent("const a = startAgent(['proxy'], {}, dir);"));
  assert.ok(startsAgent("const p = spawn(agentBin(), ['proxy', 'sidecar']);"));
  assert.ok(startsAgent("const p = ns.spawn(AGENT_BIN, ['proxy']);"));
  assert.not.ok(startsAgent("execFile(agentBin(), ['version'], cb);"));
  assert.not.ok(startsAgent("spawnSync(agentBin(), ['request', 'GET', 'stats']);"));
  assert.not.ok(startsAgent('// startAgent( in a comment'));
  assert.not.ok(startsAgent("await agent.start({ args: ['proxy', 'sidecar'] });"));
});

test('agentFixture in its own namespace: fixed ports, ready; close() leaves no process, dir or netns', async () => {
  const agent = await agentFixture({ prefix: 'pa-fixture-ns-', netns: true });
  const ns = agent.netns!.name;
  let envoys: number[] = [];
  try {
    assert.equal(agent.ports, { ...FIXED_PORTS });
    const mesh = path.join(agent.dir.path, 'mesh');
    fs.mkdirSync(mesh);
    await agent.start({ args: ['proxy', 'sidecar', '--standalone', mesh] });
    type Epochs = { epochs: { pid: number; state: string }[] };
    const epochs = JSON.parse((await agent.status('/debug/epochs')).body) as Epochs;
    envoys = epochs.epochs.map((e) => e.pid);
    assert.ok(envoys.length > 0 && epochs.epochs.some((e) => e.state === 'live'), JSON.stringify(epochs));
    assert.is((await agent.status('/healthz/ready')).status, 200);
  } finally {
    await agent.close();
  }
  assert.not.ok(pidAlive(agent.pid), 'the agent is gone');
  for (const pid of envoys) assert.not.ok(pidAlive(pid), `its Envoy ${pid} is gone`);
  assert.not.ok(fs.existsSync(agent.dir.path), 'its temp dir is gone');
  const names = execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' }).split('\n').map((l) => l.split(' ')[0]);
  assert.not.ok(names.includes(ns), 'its namespace is gone');
  assert.not.ok(fs.existsSync(path.join('/etc/netns', ns)));
});

test.run();
