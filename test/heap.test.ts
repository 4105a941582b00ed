// The V8 flags the agent sets on itself at run time (PILOT_AGENT_V8_FLAGS, beside the built-in execArgv) take effect.

import { spawnSync } from 'node:child_process';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { REPO } from './helpers/harness';

/** New space after churning through short-lived objects, in a fresh process that applied `flags` first. */
function newSpaceMiB(flags: string): number {
  const code = `
    const { applyV8Flags, collectStartupGarbage } = require(${JSON.stringify(path.join(REPO, 'lib/heap.ts'))});
    applyV8Flags(${JSON.stringify(flags)});
    let keep = [];
    for (let i = 0; i < 2e6; i++) { keep.push({ i, s: 'x' + i }); if (keep.length > 100000) keep = []; }
    collectStartupGarbage();
    const ns = require('v8').getHeapSpaceStatistics().find((s) => s.space_name === 'new_space');
    process.stdout.write(String(ns.space_size / 1048576));`;
  const r = spawnSync(process.execPath, ['--require', 'tsx/cjs', '-e', code], { cwd: REPO, encoding: 'utf8', env: { PATH: process.env.PATH ?? '' } });
  assert.is(r.status, 0, r.stderr);
  return Number(r.stdout);
}

test('--semi-space-growth-factor=1 set at run time keeps new space at a few MiB; V8 grows it to 32 MiB otherwise', () => {
  const withFlag = newSpaceMiB('--semi-space-growth-factor=1');
  const without = newSpaceMiB('');
  assert.ok(withFlag <= 4, `new space stays small with the flag: ${withFlag} MiB`);
  assert.ok(without >= 4 * withFlag, `without the flag new space grows under the same allocation: ${without} MiB`);
});

test.run();
