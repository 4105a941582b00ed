// Runs the real agent executable (dist/pilot-agent, built by the test script) as a child process.

import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { REPO, httpRequest, waitFor } from './harness';

export const AGENT_BIN = path.join(REPO, 'dist', 'pilot-agent');

/** Builds dist/pilot-agent unless the test script already did. */
export function agentBin(): string {
  if (!fs.existsSync(AGENT_BIN)) execFileSync('bash', [path.join(REPO, 'scripts/build.sh')], { stdio: 'inherit' });
  return AGENT_BIN;
}

export interface RunningAgent {
  proc: ChildProcess;
  pid: number;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  log(): string;
  /** Kills the agent if still running and waits for it. */
  stop(): Promise<void>;
}

export function startAgent(args: string[], env: Record<string, string>, cwd: string): RunningAgent {
  const proc = spawn(agentBin(), args, { cwd, env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: process.env.HOME ?? '/', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  proc.stdout!.on('data', (c: Buffer) => (out += c.toString()));
  proc.stderr!.on('data', (c: Buffer) => (out += c.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) => proc.once('exit', (code, signal) => r({ code, signal })));
  return {
    proc,
    pid: proc.pid!,
    exited,
    log: () => out,
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
      await exited;
    },
  };
}

export interface EpochInfo {
  epoch: number;
  pid: number;
  state: string;
}

export async function debugEpochs(statusPort: number): Promise<{ epochs: EpochInfo[]; lastFailure: { reason: string } | null; restartBudgetLeft: number; baseId: number | null }> {
  const r = await httpRequest(`http://127.0.0.1:${statusPort}/debug/epochs`);
  return JSON.parse(r.body);
}

export async function waitLiveEpoch(statusPort: number, epoch: number, timeoutMs = 20_000): Promise<EpochInfo> {
  return waitFor(`epoch ${epoch} live`, async () => (await debugEpochs(statusPort)).epochs.find((e) => e.epoch === epoch && e.state === 'live'), timeoutMs);
}
