// Running the iptables binaries for istio-iptables: the backend chosen as Istio's command chooses it (legacy
// when it already holds rules, else nft, else the plain binary), iptables-save / iptables-restore, and putting
// the previous tables back after a failed restore. With a network namespace path, every command runs there.

import { spawn } from 'node:child_process';
import { AgentError, errorMessage } from './errors';
import type { Env } from './env';
import { scope } from './log';
import { cleanupTables, parseSave, renderRestore } from './iptables-rules';

const log = scope('iptables');

export interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

export class Runner {
  constructor(
    private readonly env: Env,
    private readonly netns: string,
  ) {}

  run(bin: string, args: readonly string[], stdin?: string): Promise<RunResult> {
    const [cmd, argv] = this.netns ? ['nsenter', [`--net=${this.netns}`, '--', bin, ...args]] : [bin, [...args]];
    return new Promise((resolve) => {
      const child = spawn(cmd, argv, { env: this.env as NodeJS.ProcessEnv, stdio: ['pipe', 'pipe', 'pipe'] });
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
      child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
      child.stdin.on('error', () => {});
      child.once('error', (err) => resolve({ code: 127, stdout, stderr: `${bin}: ${err.message}` }));
      child.once('close', (code) => resolve({ code: code ?? 1, stdout, stderr: stderr.trim() }));
      child.stdin.end(stdin ?? '');
    });
  }
}

export interface Backend {
  /** iptables, iptables-nft, ip6tables-legacy, ... */
  bin: string;
  save: string;
  restore: string;
  legacy: boolean;
  /** Extra arguments of writing commands (legacy's lock wait). */
  wait: string[];
}

export function binaries(family: 4 | 6, variant: '' | 'legacy' | 'nft'): Backend {
  const base = family === 4 ? 'iptables' : 'ip6tables';
  const bin = variant ? `${base}-${variant}` : base;
  return { bin, save: `${bin}-save`, restore: `${bin}-restore`, legacy: variant === 'legacy', wait: [] };
}

/** A usable backend: its save binary runs and a no-op rule can be added to (and removed from) the nat table. */
async function probe(r: Runner, b: Backend): Promise<{ backend?: Backend; dump: string; problem?: string }> {
  const dump = await r.run(b.save, []);
  if (dump.code !== 0) return { dump: '', problem: `${b.save}: ${dump.stderr || `exit ${dump.code}`}` };
  const ver = await r.run(b.save, ['--version']);
  const nft = ver.stdout.includes('nf_tables');
  const m = /v(\d+)\.(\d+)\.(\d+)/.exec(ver.stdout);
  const atLeast162 = m ? Number(m[1]) * 10000 + Number(m[2]) * 100 + Number(m[3]) >= 10602 : false;
  const backend: Backend = { ...b, legacy: !nft, wait: !nft && atLeast162 ? ['--wait=30'] : [] };
  // Protocol 255 is reserved: the rule never matches anything.
  const test = ['-t', 'nat', '-A', 'INPUT', '-p', '255', '-j', 'RETURN', ...backend.wait];
  const add = await r.run(b.bin, test);
  if (add.code !== 0 || add.stderr.includes('does not exist')) {
    return {
      dump: dump.stdout,
      problem: `${b.bin} cannot be used (no kernel support for its nat table?): ${add.stderr || `exit ${add.code}`}`,
    };
  }
  test[2] = '-D';
  await r.run(b.bin, test);
  return { backend, dump: dump.stdout };
}

/**
 * Istio's choice: legacy when it already holds rules in this namespace, else nft, else the plain binary.
 * Unlike Istio's, empty legacy tables (which its own probe leaves behind) do not count as rules, so a second run
 * does not switch backends.
 */
export async function detectBackend(r: Runner, family: 4 | 6, force: '' | 'legacy' | 'nft'): Promise<Backend> {
  const problems: string[] = [];
  const tryOne = async (variant: '' | 'legacy' | 'nft') => {
    const p = await probe(r, binaries(family, variant));
    if (p.problem) problems.push(p.problem);
    return p.backend;
  };
  if (force) {
    const b = await tryOne(force);
    if (b) return b;
  } else {
    const legacy = binaries(family, 'legacy');
    const dump = await r.run(legacy.save, []);
    if (dump.code === 0 && /^-A /m.test(dump.stdout)) {
      const b = await tryOne('legacy');
      if (b) return b;
    }
    const b = (await tryOne('nft')) ?? (await tryOne(''));
    if (b) return b;
  }
  const base = family === 4 ? 'iptables' : 'ip6tables';
  throw new AgentError(
    'IO',
    `no usable ${base} binary (tried ${force ? `${base}-${force}` : `${base}-legacy, ${base}-nft, ${base}`}; install the iptables package): ${problems.join('; ')}`,
  );
}

export async function save(r: Runner, b: Backend): Promise<string> {
  const res = await r.run(b.save, []);
  if (res.code !== 0) throw new AgentError('IO', `${b.save} failed: ${res.stderr || `exit ${res.code}`}`);
  return res.stdout;
}

export async function restore(r: Runner, b: Backend, text: string, noflush: boolean): Promise<void> {
  const res = await r.run(b.restore, [...(noflush ? ['--noflush'] : []), ...b.wait], text);
  if (res.code !== 0) throw new AgentError('IO', `${b.restore} failed: ${res.stderr || `exit ${res.code}`}`);
}

/** Puts the tables back as the dump had them; Istio chains in tables the dump lacked are removed. */
export async function rollback(r: Runner, b: Backend, before: string): Promise<void> {
  try {
    const now = parseSave(await save(r, b));
    const had = new Set(parseSave(before).keys());
    const extra = new Map([...cleanupTables(now)].filter(([t]) => !had.has(t)));
    if (extra.size > 0) await restore(r, b, renderRestore(extra), true);
    if (had.size > 0) await restore(r, b, before, false);
  } catch (e) {
    log.error(`could not restore the previous ${b.save} state: ${errorMessage(e)}`);
  }
}
