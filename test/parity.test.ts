// Drop-in parity with the Go pilot-agent, without Go: this agent runs on every input set of
// test/helpers/parity.ts (its own network/mount/PID namespace, a fake Envoy that copies its bootstrap) and its
// bootstrap and Envoy command line are compared with the Go agent's goldens (test/golden/parity, made by
// scripts/parity.sh). Any difference not explained in test/golden/parity/allow.json fails. Then Istio's own
// stock bootstrap template, rendered by this agent, must give the same bootstrap as the built-in generator.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import { buildConfig } from '../lib/config';
import { buildNodeIdentity, type HostAddress } from '../lib/node-identity';
import { buildBootstrap } from '../lib/bootstrap';
import { resolveBootstrap } from '../lib/bootstrap-loader';
import {
  INPUT_SETS, ISTIO_TEMPLATE, allowedBy, compareRuns, formatDifference, jsonDiff, loadAllowList, normalise, ourAgentCommand, readGolden,
  runAgent, type AgentRun, type Allowed, type InputSet,
} from './helpers/parity';

const allow = loadAllowList();
const used = new Set<Allowed>();

async function inBatches<T, R>(items: T[], size: number, fn: (x: T) => Promise<R>): Promise<R[]> {
  const out: R[] = [];
  for (let i = 0; i < items.length; i += size) out.push(...(await Promise.all(items.slice(i, i + size).map(fn))));
  return out;
}

let runs: Map<string, AgentRun> | undefined;
async function ourRuns(): Promise<Map<string, AgentRun>> {
  runs ??= new Map(await inBatches(INPUT_SETS, 2, async (s) => [s.name, await runAgent(ourAgentCommand(), s)] as const));
  return runs;
}

for (const set of INPUT_SETS) {
  test(`${set.name}: same bootstrap and Envoy flags as the Go agent, but for the listed intended differences`, async () => {
    const ours = (await ourRuns()).get(set.name)!;
    const unexplained: string[] = [];
    for (const d of compareRuns(readGolden(set.name), ours)) {
      const a = allowedBy(allow, set.name, d);
      if (a) used.add(a);
      else unexplained.push(formatDifference(d));
    }
    assert.equal(unexplained, [], `${set.name} (${set.what}) differs from the Go agent:\n  ${unexplained.join('\n  ')}`);
  });
}

test('every allow-list entry explains a difference that still exists', () => {
  assert.equal(allow.filter((a) => !used.has(a)).map((a) => a.path), []);
});

// ---- Istio's stock template ----

/**
 * The set's config and node identity, in process, with the addresses its namespace gives the agent; with
 * `template`, Istio's template is picked as proxy images do (ISTIO_BOOTSTRAP).
 */
function resolveInProcess(set: InputSet, template?: string) {
  const files: Record<string, string> = {};
  for (const [k, v] of Object.entries(set.files ?? {})) files[`./${k}`] = v;
  const env = { ...set.env };
  if (template) {
    files[template] = fs.readFileSync(ISTIO_TEMPLATE, 'utf8');
    env.ISTIO_BOOTSTRAP = template;
  }
  const read = (f: string) => files[f];
  const hosts: HostAddress[] = [];
  if (set.ipv4) hosts.push({ address: set.ipv4, family: 'IPv4', internal: false });
  if (set.ipv6) hosts.push({ address: set.ipv6, family: 'IPv6', internal: false });
  const cfg = buildConfig({ flags: { proxyType: set.args[1] }, env, readFile: read });
  const node = buildNodeIdentity(cfg, env, hosts, '1.0.0-test');
  return { cfg, node, read };
}

for (const set of INPUT_SETS.filter((s) => !s.args.includes('--templateFile'))) {
  test(`${set.name}: Istio's stock template rendered by this agent equals the built-in bootstrap`, () => {
    const builtIn = resolveInProcess(set);
    const viaTemplate = resolveInProcess(set, './var/lib/istio/envoy/envoy_bootstrap_tmpl.json');
    const rendered = resolveBootstrap(viaTemplate.cfg, viaTemplate.node, viaTemplate.read).bootstrap;
    const diffs = jsonDiff(normalise(buildBootstrap(builtIn)), normalise(rendered)).map(formatDifference);
    assert.equal(diffs, [], `built-in vs Istio's template:\n  ${diffs.join('\n  ')}`);
  });
}

test.run();
