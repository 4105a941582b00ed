// The Go agent's remaining CLI (issue 23): Istio's logging flags --log_target, --log_caller and
// --log_stacktrace_level (pkg/log/options.go) are honoured, by the agent's commands and istio-iptables, and
// `completion bash|zsh` prints a completion script (cobra's command), whose word lists match every command's --help.

import { execFile, execFileSync, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { configureLogging, resetLogging, scope } from '../lib/log';
import { agentBin } from './helpers/agent';
import { tempDir, waitFor } from './helpers/harness';

test.after.each(() => resetLogging());

function capture(): string[] {
  const lines: string[] = [];
  configureLogging({ write: (l) => lines.push(l), journal: false });
  return lines;
}

test('--log_caller: the listed scopes\' lines carry file:line after the scope, as zap\'s console encoder', () => {
  const lines = capture();
  configureLogging({ callers: 'xdsproxy' });
  scope('xdsproxy').info('with caller');
  scope('agent').info('without');
  assert.match(lines[0]!, /^\S+\tinfo\txdsproxy\tgo-knobs-cli\.test\.ts:\d+\twith caller$/);
  assert.match(lines[1]!, /^\S+\tinfo\tagent\twithout$/);
  configureLogging({ callers: 'all', json: true });
  scope('dns').warn('json');
  assert.match(JSON.parse(lines[2]!).caller, /^go-knobs-cli\.test\.ts:\d+$/);
});

test('--log_stacktrace_level: lines at and above the scope\'s level carry the stack on the following lines', () => {
  const lines = capture();
  configureLogging({ stacktraceLevel: 'default:error,sds:warn' });
  scope('agent').warn('no stack');
  scope('agent').error('stack');
  scope('sds').warn('stack too');
  assert.not.match(lines[0]!, /\n/);
  assert.match(lines[1]!, /\tstack\n\s*at .*go-knobs-cli\.test\.ts:\d+/);
  assert.match(lines[2]!, /\tstack too\n/);
  assert.throws(() => configureLogging({ stacktraceLevel: 'agent:loud' }), /unknown log level/);
});

test('--log_target: every target gets each line; a file is appended to and created 0600', () => {
  const dir = tempDir('pa-knobs-log-');
  try {
    const a = path.join(dir.path, 'a.log');
    fs.writeFileSync(a, 'earlier\n');
    const b = path.join(dir.path, 'b.log');
    configureLogging({ targets: [a, b], journal: false });
    scope('agent').info('to both');
    assert.match(fs.readFileSync(a, 'utf8'), /^earlier\n\S+\tinfo\tagent\tto both\n$/);
    assert.match(fs.readFileSync(b, 'utf8'), /\tto both\n$/);
    assert.is(fs.statSync(b).mode & 0o777, 0o600);
    assert.throws(() => configureLogging({ targets: [path.join(dir.path, 'no/such/dir/x.log')] }), /--log_target .*ENOENT/);
    scope('agent').info('still to both');
    assert.match(fs.readFileSync(b, 'utf8'), /still to both\n$/);
  } finally {
    resetLogging();
    dir.cleanup();
  }
});

test('the agent honours --log_target, --log_caller and --log_stacktrace_level (pilot-agent discovery)', async () => {
  const dir = tempDir('pa-knobs-cli-');
  const cfg = path.join(dir.path, 'config');
  fs.mkdirSync(cfg);
  const logFile = path.join(dir.path, 'agent.log');
  const p = spawn(agentBin(), ['discovery', '--config-dir', cfg, '--grpc-addr', `unix:${path.join(dir.path, 'd.sock')}`,
    '--log_target', logFile, '--log_target', 'stdout', '--log_caller', 'discovery', '--log_stacktrace_level', 'discovery:info'],
  { cwd: dir.path, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  p.stdout!.on('data', (c: Buffer) => (out += c));
  p.stderr!.on('data', (c: Buffer) => (err += c));
  const exited = new Promise((r) => p.once('exit', r));
  try {
    await waitFor('the listening line in the log file', () => fs.existsSync(logFile) && /listening/.test(fs.readFileSync(logFile, 'utf8')), 15_000);
    const line = fs.readFileSync(logFile, 'utf8').split('\n').find((l) => /listening/.test(l))!;
    assert.match(line, /^\S+\tinfo\tdiscovery\t[\w.-]+:\d+\tdiscovery server listening/);
    assert.match(fs.readFileSync(logFile, 'utf8'), /listening[^\n]*\n\s*at /, 'a stack under the info line');
    assert.is(fs.statSync(logFile).mode & 0o777, 0o600);
    await waitFor('the same lines on stdout', () => /discovery server listening/.test(out), 5000);
    assert.not.match(err, /discovery server listening/, 'stderr is no longer a target');
  } finally {
    p.kill('SIGTERM');
    await exited;
    dir.cleanup();
  }
});

function run(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(agentBin(), args, { timeout: 20_000 }, (e, stdout, stderr) => resolve({ code: e ? Number((e as { code?: number }).code ?? 1) : 0, stdout, stderr }));
  });
}

function bashComplete(script: string, line: string): string[] {
  const words = line.split(' ');
  const bash = `${script}\nCOMP_WORDS=(${words.map((w) => `'${w}'`).join(' ')}); COMP_CWORD=${words.length - 1}; _pilot_agent; printf '%s\\n' "\${COMPREPLY[@]}"`;
  return execFileSync('bash', ['--norc', '-c', bash], { encoding: 'utf8' }).split('\n').filter(Boolean);
}

test('completion bash: commands first, then the command\'s flags, in real bash', async () => {
  const r = await run(['completion', 'bash']);
  assert.is(r.code, 0, r.stderr);
  assert.match(r.stdout, /complete -o default -F _pilot_agent pilot-agent/);
  assert.equal(bashComplete(r.stdout, 'pilot-agent pro'), ['proxy']);
  assert.equal(bashComplete(r.stdout, 'pilot-agent proxy --log_t'), ['--log_target']);
  assert.equal(bashComplete(r.stdout, 'pilot-agent --log_as_json istio-iptables --dry'), ['--dry-run']);
  assert.equal(bashComplete(r.stdout, 'pilot-agent completion z'), ['zsh']);
  const zsh = await run(['completion', 'zsh']);
  assert.is(zsh.code, 0, zsh.stderr);
  assert.match(zsh.stdout, /^#compdef pilot-agent\n/);
  assert.match(zsh.stdout, /compdef _pilot_agent pilot-agent/);
  const fish = await run(['completion', 'fish']);
  assert.is(fish.code, 2);
  assert.match(fish.stderr, /Choices: "bash", "zsh"/);
});

test('completion lists exactly the flags each command\'s --help shows', async () => {
  const script = (await run(['completion', 'bash'])).stdout;
  const table = new Map([...script.matchAll(/^ {4}([\w-]+)\) list="([^"]*)"/gm)].map((m) => [m[1]!, m[2]!.split(' ')]));
  assert.equal(bashComplete(script, 'pilot-agent ').sort(), [...table.keys()].sort());
  for (const [cmd, words] of table) {
    if (cmd === 'completion') continue;
    const help = await run([cmd, '--help']);
    assert.is(help.code, 0, `${cmd} --help: ${help.stderr}`);
    const flags = new Set([...help.stdout.matchAll(/(?:^|\s|,)(--[\w-]+)/gm)].map((m) => m[1]!).filter((f) => f !== '--version'));
    assert.equal([...new Set(words)].sort(), [...flags].sort(), `${cmd}: completion vs --help`);
  }
});

test.run();
