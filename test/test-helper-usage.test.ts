// Agent-level tests start the agent through agentFixture() (test/helpers/agent-fixture.ts), so that each one's
// set-up is a few lines and every one cleans up the same way (agent, Envoys, shared memory, temp dir, namespace).
// This fails when a test file starts a long-running dist/pilot-agent another way: startAgent() directly, or an
// async spawn of the agent binary. One-shot runs (execFile, spawnSync: `version`, `request`, a bad flag) are fine.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as path from 'node:path';

const TEST = __dirname;

/** Files that may start the agent themselves, and why. */
const ALLOWED: Record<string, string> = {
  'helpers/agent.ts': 'startAgent() itself',
  'helpers/agent-fixture.ts': 'the helper',
  // Their own topologies: veth pairs between namespaces, nsenter with a uid, iptables programmed first.
  'capture-agent.test.ts': 'two namespaces joined by a veth pair, iptables capture, the agent and apps as uids',
  'dns-agent.test.ts': 'a namespace with dnsmasq and an optional istio-iptables run before the agent',
  'helpers/hostile.ts': 'a namespace with dnsmasq, a discovery process and hostile peers beside the agent',
  'security-model.test.ts': 'two namespaces joined by a veth pair, peers as other uids',
  'standalone-sidecars.test.ts': 'two sidecars in two namespaces joined by a veth pair',
  'iptables.test.ts': 'runs istio-iptables (one-shot) and validation servers as uids inside namespaces',
  // The discovery server alone (no Envoy, no status port): test/helpers/discovery-process.ts.
  'helpers/discovery-process.ts': '`pilot-agent discovery`, not the agent',
  'go-knobs-cli.test.ts': '`pilot-agent discovery` with extra flags',
  'standalone-tracing.test.ts': '`pilot-agent discovery` beside an agent from agentFixture()',
  'demo-script.test.ts': 'runs the demo script, which starts the agent as a user would',
  // Not migrated yet (issue 25): they still call startAgent() with their own set-up.
  'cli.test.ts': 'not migrated yet',
  'config-path-lock.test.ts': 'not migrated yet (two agents on one configPath)',
  'envoy-user.test.ts': 'not migrated yet (an agent inside a namespace through nsenter)',
  'proxyless-grpc.test.ts': 'not migrated yet',
  'security-admin-socket.test.ts': 'not migrated yet',
  'supervisor-envoy.test.ts': 'not migrated yet (its own setUp())',
  'vm-health-agent.test.ts': 'not migrated yet (a discovery process and the agent)',
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
  if (namesBinary && /(^|[^.\w])spawn\(|\.spawn\(|\bspawnIn\(/m.test(code)) return 'spawns the agent binary';
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
  assert.equal(offenders, [], `use agentFixture() from test/helpers/agent-fixture.ts (or allow the file here, saying why):\n${offenders.join('\n')}`);
});

test('every allowed file exists and still starts the agent itself (an allowance that is no longer needed is removed)', () => {
  for (const rel of Object.keys(ALLOWED)) {
    const f = path.join(TEST, rel);
    assert.ok(fs.existsSync(f), `${rel} is allowed but does not exist`);
    assert.ok(startsAgent(fs.readFileSync(f, 'utf8')), `${rel} no longer starts the agent itself: remove it from ALLOWED`);
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

test.run();
