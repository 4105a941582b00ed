// examples/systemd/pilot-agent.service: what the agent receives after systemd has parsed the unit. systemd splits
// Environment= into assignments and removes quotes anywhere in them (systemd.exec(5); extract_first_word with
// EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE), after expanding specifiers (systemd.unit(5)); that is reproduced here, and
// the unit is checked with systemd-analyze verify where it is installed. (Running it under a real systemd is the
// packaging issue's test.)

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { buildConfig } from '../lib/config';
import { REPO, tempDir } from './helpers/harness';

const UNIT = path.join(REPO, 'examples/systemd/pilot-agent.service');

/** Specifiers used in the example (systemd.unit(5)); %% is a literal %. */
function expandSpecifiers(s: string): string {
  return s.replace(/%(.)/g, (_m, c: string) => ({ '%': '%', H: 'vm-1', S: '/var/lib', n: 'pilot-agent.service' } as Record<string, string>)[c] ?? `%${c}`);
}

const C_ESCAPES: Record<string, string> = { n: '\n', t: '\t', r: '\r', '\\': '\\', '"': '"', "'": "'", ' ': ' ', s: ' ' };

/** Splits one Environment= value into assignments as systemd does: whitespace separates, quotes group and vanish. */
export function systemdWords(value: string): string[] {
  const words: string[] = [];
  let cur: string | undefined;
  let quote: '"' | "'" | undefined;
  for (let i = 0; i < value.length; i++) {
    const c = value[i]!;
    if (c === '\\' && quote !== "'") {
      const n = value[++i] ?? '';
      cur = (cur ?? '') + (C_ESCAPES[n] ?? n);
    } else if (quote) {
      if (c === quote) quote = undefined;
      else cur = (cur ?? '') + c;
    } else if (c === '"' || c === "'") {
      quote = c;
      cur ??= '';
    } else if (/\s/.test(c)) {
      if (cur !== undefined) words.push(cur);
      cur = undefined;
    } else cur = (cur ?? '') + c;
  }
  if (quote) throw new Error(`unbalanced ${quote} in ${value}`);
  if (cur !== undefined) words.push(cur);
  return words;
}

function serviceSection(text: string): Map<string, string[]> {
  const out = new Map<string, string[]>();
  let section = '';
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line || line.startsWith('#') || line.startsWith(';')) continue;
    const m = /^\[(.+)\]$/.exec(line);
    if (m) section = m[1]!;
    else if (section === 'Service') {
      const eq = line.indexOf('=');
      const k = line.slice(0, eq);
      out.set(k, [...(out.get(k) ?? []), line.slice(eq + 1)]);
    }
  }
  return out;
}

/** The environment the agent gets from the unit's Environment= lines. */
function unitEnvironment(text: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const v of serviceSection(text).get('Environment') ?? []) {
    for (const w of systemdWords(expandSpecifiers(v))) {
      const eq = w.indexOf('=');
      assert.ok(eq > 0, `"${w}" is not NAME=value`);
      env[w.slice(0, eq)] = w.slice(eq + 1);
    }
  }
  return env;
}

test('systemd quoting, as documented: quotes group words and are removed wherever they are', () => {
  assert.equal(systemdWords('"VAR1=word1 word2" VAR2=word3 "VAR3=$word 5 6"'), ['VAR1=word1 word2', 'VAR2=word3', 'VAR3=$word 5 6']);
  assert.equal(systemdWords('A={"x":"y"}'), ['A={x:y}']);
  assert.equal(systemdWords("B='{\"x\": 1}'"), ['B={"x": 1}']);
});

test('the unit\'s PROXY_CONFIG, as systemd hands it over, is the config it was written to be', () => {
  const env = unitEnvironment(fs.readFileSync(UNIT, 'utf8'));
  assert.is(env.POD_NAME, 'vm-1');
  const cfg = buildConfig({ flags: {}, env, readFile: () => undefined });
  assert.is(cfg.proxy.binaryPath, '/usr/local/bin/envoy');
  assert.is(cfg.proxy.terminationDrainDuration, 20_000);
  assert.is(cfg.sources.binaryPath, 'environment variable PROXY_CONFIG');
});

test('the old JSON form of the unit is what broke: systemd strips its quotes and the agent refuses the rest', () => {
  const env = unitEnvironment('[Service]\nEnvironment=PROXY_CONFIG={"binaryPath":"/usr/local/bin/envoy","terminationDrainDuration":"20s"}\n');
  assert.is(env.PROXY_CONFIG, '{binaryPath:/usr/local/bin/envoy,terminationDrainDuration:20s}');
  assert.throws(() => buildConfig({ flags: {}, env, readFile: () => undefined }), /PROXY_CONFIG/);
});

test('the working directory exists before anything runs: StateDirectory= creates it', () => {
  const s = serviceSection(fs.readFileSync(UNIT, 'utf8'));
  assert.equal(s.get('StateDirectory'), ['pilot-agent']);
  assert.equal(s.get('WorkingDirectory'), ['%S/pilot-agent'], 'the state directory, which systemd creates before the start');
  for (const pre of s.get('ExecStartPre') ?? []) assert.not.match(pre, /pilot-agent/, 'no step that needs the directory before it exists');
});

test('systemd-analyze verify accepts the unit (with ExecStart pointing at a program that exists here)', () => {
  const which = spawnSync('sh', ['-c', 'command -v systemd-analyze'], { encoding: 'utf8' });
  if (which.status !== 0) {
    console.log('systemd-analyze is not installed: the unit was checked by the tests above only');
    return;
  }
  const dir = tempDir('pa-unit-');
  try {
    const unit = path.join(dir.path, 'pilot-agent.service');
    fs.writeFileSync(unit, fs.readFileSync(UNIT, 'utf8').replace('/usr/local/bin/pilot-agent', process.execPath));
    execFileSync('systemd-analyze', ['verify', unit], { stdio: ['ignore', 'pipe', 'pipe'], cwd: dir.path });
  } catch (e) {
    assert.unreachable(`systemd-analyze verify: ${(e as { stderr?: Buffer }).stderr?.toString() ?? (e as Error).message}`);
  } finally {
    dir.cleanup();
  }
});

test.run();
