// A network namespace for one test (a "VM" of its own: loopback up, fixed ports free, its own /etc/resolv.conf via
// `ip netns exec`, which bind-mounts /etc/netns/<name>/* over /etc). Removed, with its /etc/netns entry, by remove().

import { type ChildProcess, execFile, execFileSync, spawn, type SpawnOptions } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';

export interface Netns {
  name: string;
  /** Spawns `cmd args` inside the namespace (the returned process is the command itself: ip execs it). */
  spawn(cmd: string, args: string[], opts?: SpawnOptions): ChildProcess;
  /** Runs a command inside the namespace; resolves with its stdout (and never rejects). */
  run(cmd: string, args: string[], timeoutMs?: number): Promise<{ code: number; stdout: string; stderr: string }>;
  remove(): void;
}

/** `ip`: an IPv4 address (CIDR) beside 127.0.0.1, as a VM has one (libc's getaddrinfo asks DNS for A records only then). */
export function createNetns(prefix: string, files: Record<string, string> = {}, ip?: string): Netns {
  const name = `${prefix}${process.pid}${Math.floor(Math.random() * 1e6)}`.slice(0, 15);
  const etc = path.join('/etc/netns', name);
  execFileSync('ip', ['netns', 'add', name]);
  const remove = () => {
    try {
      execFileSync('ip', ['netns', 'del', name], { stdio: 'ignore' });
    } catch {
      // already gone
    }
    fs.rmSync(etc, { recursive: true, force: true });
  };
  try {
    execFileSync('ip', ['-n', name, 'link', 'set', 'lo', 'up']);
    // On lo: containers often lack the dummy and veth drivers; glibc ignores only 127/8 addresses.
    if (ip) execFileSync('ip', ['-n', name, 'addr', 'add', ip, 'dev', 'lo']);
    if (Object.keys(files).length) {
      fs.mkdirSync(etc, { recursive: true });
      for (const [f, text] of Object.entries(files)) fs.writeFileSync(path.join(etc, f), text);
    }
  } catch (e) {
    remove();
    throw e;
  }
  return {
    name,
    spawn: (cmd, args, opts = {}) => spawn('ip', ['netns', 'exec', name, cmd, ...args], opts),
    run: (cmd, args, timeoutMs = 30_000) => new Promise((resolve) => {
      execFile('ip', ['netns', 'exec', name, cmd, ...args], { timeout: timeoutMs }, (err, stdout, stderr) => {
        resolve({ code: err ? (typeof err.code === 'number' ? err.code : 1) : 0, stdout: String(stdout), stderr: String(stderr) });
      });
    }),
    remove,
  };
}
