// Runs the real agent executable (dist/pilot-agent, built by the test script) as a child process.

import { execFileSync, spawn, type ChildProcess, type StdioOptions } from 'node:child_process';
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

/**
 * Tests start agents through agentFixture() (./agent-fixture.ts), which calls this. `prefix`: a command that execs
 * the agent (`ip netns exec NAME`, `setpriv ...`), so that the pid is still the agent's. `logFile`: its stdout and
 * stderr go to that file instead of pipes, which log() reads (its last read once the file is gone).
 */
export function startAgent(args: string[], env: Record<string, string>, cwd: string, opts: { prefix?: string[]; logFile?: string } = {}): RunningAgent {
  const [file, ...pre] = [...(opts.prefix ?? []), agentBin()];
  const procEnv = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: process.env.HOME ?? '/', ...env };
  const logFile = opts.logFile;
  const fd = logFile === undefined ? undefined : fs.openSync(logFile, 'a');
  const stdio: StdioOptions = fd === undefined ? ['ignore', 'pipe', 'pipe'] : ['ignore', fd, fd];
  const proc = spawn(file!, [...pre, ...args], { cwd, env: procEnv, stdio });
  if (fd !== undefined) fs.closeSync(fd); // the child has its own
  let out = '';
  proc.stdout?.on('data', (c: Buffer) => (out += c.toString()));
  proc.stderr?.on('data', (c: Buffer) => (out += c.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) => proc.once('exit', (code, signal) => r({ code, signal })));
  return {
    proc,
    pid: proc.pid!,
    exited,
    log() {
      if (logFile !== undefined) {
        try {
          out = fs.readFileSync(logFile, 'utf8');
        } catch {
          // removed with its directory: the last read
        }
      }
      return out;
    },
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
      await exited;
      removeLeftShm(proc.pid!, env, cwd);
    },
  };
}

/**
 * An agent killed with SIGKILL cannot remove its Envoy's shared memory (its Envoys die with it): do what it
 * would have done, from the base id file in its configPath, so the suite leaves nothing in /dev/shm.
 */
function removeLeftShm(pid: number, env: Record<string, string>, cwd: string): void {
  let configPath: string;
  try {
    configPath = path.resolve(cwd, (JSON.parse(env.PROXY_CONFIG ?? '{}') as { configPath?: string }).configPath ?? './etc/istio/proxy');
  } catch {
    return;
  }
  let id: string;
  try {
    // Only when this agent held configPath (one that lost the claim to another agent owns nothing there).
    if (fs.readFileSync(path.join(configPath, 'agent.lock.pid'), 'utf8').trim() !== String(pid)) return;
    id = fs.readFileSync(path.join(configPath, 'envoy-base-id'), 'utf8').trim();
  } catch {
    return;
  }
  if (!/^\d+$/.test(id)) return;
  fs.rmSync(`/dev/shm/envoy_shared_memory_${Number(id) * 10}`, { force: true });
  fs.rmSync(`/dev/shm/pilot-agent-envoy-shm-owner_${Number(id) * 10}`, { force: true });
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
