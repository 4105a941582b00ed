// Runs the Go pilot-agent and this one on every input set of test/helpers/parity.ts with a fake Envoy, writes the
// Go agent's bootstrap and Envoy command line as goldens (test/golden/parity/<set>.json), and prints a semantic
// diff per set: every difference is either in test/golden/parity/allow.json (with why it is intended) or
// reported as unexplained, which fails the run. Started by scripts/parity.sh; usage:
//   npx tsx scripts/parity.ts GO_AGENT [set-name-filter]

import * as fs from 'node:fs';
import {
  INPUT_SETS, allowedBy, compareRuns, formatDifference, goldenFile, loadAllowList, ourAgentCommand, runAgent, type AgentRun, type InputSet,
} from '../test/helpers/parity';

async function main(): Promise<number> {
  const [goAgent, filter] = process.argv.slice(2);
  if (!goAgent) {
    process.stderr.write('usage: parity.ts GO_AGENT [set-name-filter]\n');
    return 2;
  }
  const allow = loadAllowList();
  const used = new Set<unknown>();
  let unexplained = 0;
  const sets = INPUT_SETS.filter((s) => !filter || s.name.includes(filter));
  for (const set of sets) {
    const [go, ours] = await Promise.all([runAgent([goAgent], set, { goAgent: true }), runAgent(ourAgentCommand(), set)]);
    writeGolden(set, go);
    const diffs = compareRuns(go, ours);
    process.stdout.write(`== ${set.name}: ${set.what}\n`);
    for (const d of diffs) {
      const a = allowedBy(allow, set.name, d);
      if (a) used.add(a);
      else unexplained++;
      process.stdout.write(`  ${a ? 'allowed  ' : 'UNEXPLAINED'} ${formatDifference(d)}${a ? `\n             why: ${a.why}` : ''}\n`);
    }
    if (diffs.length === 0) process.stdout.write('  no differences\n');
  }
  if (!filter) for (const a of allow) if (!used.has(a)) process.stdout.write(`note: allow-list entry matched nothing: ${a.path}\n`);
  process.stdout.write(`${sets.length} input sets, ${unexplained} unexplained differences\n`);
  return unexplained === 0 ? 0 : 1;
}

function writeGolden(set: InputSet, run: AgentRun): void {
  fs.writeFileSync(goldenFile(set.name), JSON.stringify({ set: set.name, what: set.what, envoyArgs: run.envoyArgs, bootstrap: run.bootstrap }, null, 2) + '\n');
}

main().then(
  (code) => process.exit(code),
  (err) => {
    process.stderr.write(`${(err as Error).stack ?? err}\n`);
    process.exit(2);
  },
);
