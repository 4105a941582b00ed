// What a packaging test needs to run podman on this machine kind (see test/packaging.test.ts's header and the
// containers-and-systemd reference): the tools, a podman configuration and storage of its own in a temp dir under
// /var/tmp, removed afterwards (and after a run that was killed), and the bookworm + systemd images.

import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';

export const MIN = 60_000;

export interface Result {
  code: number;
  out: string;
  err: string;
}

export interface Podman {
  /** This run's directory (podman config, storage, scratch). */
  work: string;
  env: NodeJS.ProcessEnv;
  /** Runs a command to completion; throws with its output unless it exits 0 (or `ok` accepts the code). */
  run(cmd: string, args: string[], o?: RunOptions): Result;
  podman(args: string[], o?: RunOptions): Result;
  /** A command inside a running container. */
  inC(c: string, args: string[], o?: RunOptions): Result;
  sh(c: string, script: string, o?: RunOptions): Result;
  /** Removes this run's containers, images, storage and directory. */
  cleanUp(): void;
}

export interface RunOptions {
  timeoutMs?: number;
  ok?: (code: number) => boolean;
  input?: string;
}

function runWith(env: NodeJS.ProcessEnv, cmd: string, args: string[], o: RunOptions = {}): Result {
  const r = spawnSync(cmd, args, { env, encoding: 'utf8', timeout: o.timeoutMs ?? 3 * MIN, killSignal: 'SIGKILL', maxBuffer: 64 * 1024 * 1024, input: o.input });
  const res = { code: r.status ?? -1, out: r.stdout ?? '', err: r.stderr ?? '' };
  const ok = o.ok ?? ((c: number) => c === 0);
  if (r.error || !ok(res.code)) {
    const why = r.error ? r.error.message : `exit code ${res.code}${r.signal ? ` (signal ${r.signal})` : ''}`;
    throw new Error(`${cmd} ${args.join(' ')}: ${why}\n--- stdout (tail)\n${res.out.slice(-3000)}\n--- stderr (tail)\n${res.err.slice(-3000)}`);
  }
  return res;
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

export async function until<T>(what: string, fn: () => T | undefined | false, timeoutMs: number, diag: () => string = () => ''): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = fn();
      if (v) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${(last as Error).message}` : ''}\n${diag()}`);
    await sleep(250);
  }
}

/** debootstrap, podman and runc (apt-get when missing); root only. */
export function installTools(): void {
  if (process.getuid?.() !== 0) throw new Error('packaging tests need root (rootful podman, apt-get, debootstrap); CI runs them as root');
  const missing = ['debootstrap', 'podman', 'runc'].filter((t) => spawnSync('sh', ['-c', `command -v ${t}`]).status !== 0);
  if (missing.length === 0) return;
  const apt = ['-o', 'DPkg::Lock::Timeout=600', '-q'];
  runWith(process.env, 'apt-get', [...apt, 'update'], { timeoutMs: 15 * MIN });
  runWith(process.env, 'apt-get', [...apt, 'install', '-y', ...missing], { timeoutMs: 20 * MIN });
}

function cleanDir(dir: string, e: NodeJS.ProcessEnv): void {
  if (fs.existsSync(path.join(dir, 'storage.conf'))) {
    // Not `podman system reset`: it also clears state shared with other podman users (a concurrent build).
    spawnSync('podman', ['rm', '-a', '-f', '-t', '0'], { env: e, timeout: 2 * MIN });
    spawnSync('podman', ['rmi', '-a', '-f'], { env: e, timeout: 5 * MIN });
  }
  spawnSync('sh', ['-c', `grep -o " ${dir}/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l`], { timeout: MIN });
  fs.rmSync(dir, { recursive: true, force: true });
}

const confEnv = (dir: string): NodeJS.ProcessEnv => ({
  ...process.env, CONTAINERS_CONF: path.join(dir, 'containers.conf'), CONTAINERS_STORAGE_CONF: path.join(dir, 'storage.conf'),
});

/** Removes what a run that was killed left behind in /var/tmp/pa-packaging-* (its pid is gone). */
export function cleanStaleRuns(): void {
  for (const name of fs.readdirSync('/var/tmp').filter((n) => n.startsWith('pa-packaging-'))) {
    const dir = path.join('/var/tmp', name);
    let pid = 0;
    try {
      pid = Number(fs.readFileSync(path.join(dir, 'pid'), 'utf8').trim() || 0) || 0;
    } catch {
      /* no pid file: judged by age */
    }
    if (pid > 0) {
      try {
        process.kill(pid, 0);
        continue; // still running (another worktree's run)
      } catch {
        /* gone: clean up after it */
      }
    } else if (Date.now() - fs.statSync(dir).mtimeMs < 60 * MIN) continue;
    console.log(`packaging tests: removing what an earlier run (pid ${pid}) left in ${dir}`);
    cleanDir(dir, confEnv(dir));
  }
}

/** podman's configuration and storage in a fresh temp dir (the settings that work here). */
export function newPodman(extraEnv: NodeJS.ProcessEnv = {}): Podman {
  const work = fs.mkdtempSync(path.join('/var/tmp', 'pa-packaging-'));
  fs.writeFileSync(path.join(work, 'pid'), `${process.pid}\n`);
  const nofile = runWith(process.env, 'sh', ['-c', 'ulimit -Hn']).out.trim();
  fs.writeFileSync(path.join(work, 'containers.conf'), [
    '[containers]', 'netns = "host"', 'log_driver = "k8s-file"', `default_ulimits = ["nofile=${nofile}:${nofile}", "nproc=32768:32768"]`,
    '[engine]', 'cgroup_manager = "cgroupfs"', 'events_logger = "file"', 'runtime = "runc"', '',
  ].join('\n'));
  fs.writeFileSync(path.join(work, 'storage.conf'), ['[storage]', 'driver = "overlay"', `graphroot = "${work}/storage"`, `runroot = "${work}/run"`, ''].join('\n'));
  fs.mkdirSync(path.join(work, 'tmp'));
  // TMPDIR: podman build's scratch space, in this run's dir too.
  const env = { ...confEnv(work), TMPDIR: path.join(work, 'tmp'), ...extraEnv };
  const run = (cmd: string, args: string[], o?: RunOptions) => runWith(env, cmd, args, o);
  const podman = (args: string[], o?: RunOptions) => run('podman', args, o);
  const inC = (c: string, args: string[], o?: RunOptions) => podman(['exec', c, ...args], o);
  return { work, env, run, podman, inC, sh: (c, script, o) => inC(c, ['sh', '-c', script], o), cleanUp: () => cleanDir(work, env) };
}
