// The real `pilot-agent discovery` as a child process, and peers of it run as any uid (./discovery-attacker.ts),
// for the discovery server's security tests.

import { type ChildProcess, execFile, spawn, type SpawnOptions } from 'node:child_process';
import * as path from 'node:path';
import type { AdsAttack, AttackResult, CaAttack } from './discovery-attacker';
import { agentBin } from './agent';
import { waitFor } from './harness';
import type { Netns } from './netns';

export interface DiscoveryProcess {
  proc: ChildProcess;
  /** Its stdout and stderr so far. */
  out(): string;
  /** Resolves with the exit code once it has exited. */
  exited: Promise<number | null>;
  stop(): Promise<void>;
}

/** `netns`: inside that namespace (the pid is still the server's: ip execs it); `env`: added to the test's environment. */
export function startDiscoveryProcess(
  configDir: string,
  addr: string,
  opts: { netns?: Netns; cwd?: string; env?: Record<string, string> } = {},
): DiscoveryProcess {
  const args = ['discovery', '--config-dir', configDir, '--grpc-addr', addr];
  const o: SpawnOptions = { cwd: opts.cwd, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...opts.env } };
  const proc = opts.netns ? opts.netns.spawn(agentBin(), args, o) : spawn(agentBin(), args, o);
  let out = '';
  proc.stdout!.on('data', (c: Buffer) => (out += c.toString()));
  proc.stderr!.on('data', (c: Buffer) => (out += c.toString()));
  const exited = new Promise<number | null>((r) => proc.once('exit', (code) => r(code)));
  return {
    proc,
    out: () => out,
    exited,
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGTERM');
      const t = setTimeout(() => proc.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(t);
    },
  };
}

/** Waits until it listens; its log in the error if it does not. */
export async function discoveryListening(d: DiscoveryProcess): Promise<void> {
  await waitFor('the discovery server', () => d.out().includes('discovery server listening') || d.proc.exitCode !== null, 20_000);
  if (!d.out().includes('discovery server listening')) throw new Error(`the discovery server did not start:\n${d.out()}`);
}

const ATTACKER = path.join(__dirname, 'discovery-attacker.ts');

/** Runs the peer as `uid` (its gid the same, no supplementary groups); root runs it unchanged. */
export function attack(uid: number, a: AdsAttack | CaAttack): Promise<AttackResult> {
  const node = [process.execPath, '--import', 'tsx', ATTACKER, JSON.stringify(a)];
  const [file, ...args] = uid === 0 ? node : ['setpriv', `--reuid=${uid}`, `--regid=${uid}`, '--clear-groups', ...node];
  return new Promise((resolve, reject) => {
    // No tsx cache: a peer run as another uid would leave its own cache directory behind in /tmp.
    const env = { ...process.env, TSX_DISABLE_CACHE: '1' };
    execFile(file!, args, { cwd: path.join(__dirname, '..', '..'), env, timeout: 60_000 }, (err, stdout, stderr) => {
      const line = stdout.trim().split('\n').pop() ?? '';
      try {
        const r = JSON.parse(line) as AttackResult & { error?: string };
        if (r.error) return reject(new Error(`the peer failed: ${r.error}\n${stderr}`));
        resolve(r);
      } catch {
        reject(new Error(`the peer printed no result (${err?.message ?? 'exit 0'}):\n${stdout}\n${stderr}`));
      }
    });
  });
}
