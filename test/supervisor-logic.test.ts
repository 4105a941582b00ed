// The supervisor's decisions against a fake Envoy runtime: fast, deterministic, no processes.
// The same behaviours are shown against the real Envoy in supervisor-envoy.test.ts.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { EnvoyProcess, ExitStatus } from '../lib/envoy-process';
import {
  HOT_RESTART_EPOCH_STAT,
  Supervisor,
  WORKERS_STARTED_STAT,
  type DesiredConfig,
  type EnvoyRuntime,
  type LiveProbe,
  type SupervisorOptions,
} from '../lib/supervisor';
import { configureLogging, resetLogging } from '../lib/log';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

class FakeProc implements EnvoyProcess {
  private resolveExit!: (s: ExitStatus) => void;
  readonly exited = new Promise<ExitStatus>((r) => (this.resolveExit = r));
  alive = true;
  signals: string[] = [];
  constructor(readonly pid: number, readonly epoch: number, readonly baseId: number | undefined, readonly hash: string) {}
  kill(signal: NodeJS.Signals): void {
    this.signals.push(signal);
    if (signal === 'SIGKILL') this.exit({ code: null, signal });
  }
  exit(s: ExitStatus): void {
    if (!this.alive) return;
    this.alive = false;
    this.resolveExit(s);
  }
}

class FakeRuntime implements EnvoyRuntime {
  procs: FakeProc[] = [];
  files = new Set<string>();
  liveEpochs = new Set<number>();
  binVersion = '11.104';
  runningVersion = '11.104';
  cleared: number[] = [];
  drains: Array<{ inboundOnly: boolean }> = [];
  connections: number[] = [];
  removedShm: number[] = [];
  autoLive = true;
  private nextPid = 1000;

  failWrites = 0;
  writeBootstrap(epoch: number): string {
    if (this.failWrites > 0) {
      this.failWrites--;
      throw new Error('ENOSPC: no space left on device');
    }
    const f = `envoy-rev${epoch}.json`;
    this.files.add(f);
    return f;
  }
  removeBootstrap(file: string): void {
    this.files.delete(file);
  }
  async validate(cfg: DesiredConfig): Promise<string | undefined> {
    return cfg.bootstrap.invalid ? 'Unable to parse JSON as proto' : undefined;
  }
  async binaryHotRestartVersion(): Promise<string> {
    return this.binVersion;
  }
  spawn(epoch: number, cfg: DesiredConfig, _file: string, baseId: number | undefined): EnvoyProcess {
    const p = new FakeProc(this.nextPid++, epoch, baseId, cfg.hash);
    this.procs.push(p);
    if (cfg.bootstrap.crashOnStart) setTimeout(() => p.exit({ code: 1, signal: null }), 5);
    else if (cfg.bootstrap.hang) return p;
    else if (this.autoLive) setTimeout(() => this.liveEpochs.add(epoch), 5);
    return p;
  }
  failureReason: (proc?: EnvoyProcess) => string = () => 'cannot bind';
  async probe(): Promise<LiveProbe | undefined> {
    const alive = this.procs.filter((p) => p.alive && this.liveEpochs.has(p.epoch));
    if (!alive.length) return undefined;
    const top = alive.reduce((a, b) => (a.epoch > b.epoch ? a : b));
    return { epoch: top.epoch, state: 'LIVE', hotRestartVersion: this.runningVersion };
  }
  /** Envoy wrote its base id file, but the supervisor only looks after the epoch died (it failed that fast). */
  baseIdOnlyAfterExit = false;
  readBaseId(): number | undefined {
    const zero = this.procs.filter((p) => p.epoch === 0);
    if (this.baseIdOnlyAfterExit) return zero.some((p) => !p.alive) ? 42 : undefined;
    return zero.length ? 42 : undefined;
  }
  clearBaseId(): void {}
  isInitializing(): boolean | undefined {
    return false;
  }
  clearInitializing(baseId: number): boolean {
    this.cleared.push(baseId);
    return true;
  }
  removeShm(baseId: number): void {
    this.removedShm.push(baseId);
  }
  async drain(_a: unknown, inboundOnly: boolean): Promise<void> {
    this.drains.push({ inboundOnly });
  }
  async activeConnections(): Promise<number> {
    return this.connections.length ? this.connections.shift()! : 0;
  }
  alive(): FakeProc[] {
    return this.procs.filter((p) => p.alive);
  }
}

function cfg(hash: string, extra: Record<string, unknown> = {}): DesiredConfig {
  return { hash, bootstrap: { ...extra }, binaryPath: '/bin/envoy', admin: { host: '127.0.0.1', port: 1 }, inboundOnlyDrain: true };
}

function make(rt: FakeRuntime, o: Partial<SupervisorOptions> = {}): Supervisor {
  return new Supervisor({
    runtime: rt,
    validate: true,
    terminationDrainMs: 50,
    exitOnZeroActiveConnections: false,
    minimumDrainMs: 10,
    maximumDrainMs: 1000,
    probeIntervalMs: 2,
    connectionPollMs: 5,
    initialBackoffMs: 2,
    coldRestartDrainMs: 5,
    ...o,
  });
}

async function until(what: string, fn: () => boolean, ms = 3000): Promise<void> {
  const end = Date.now() + ms;
  while (!fn()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(2);
  }
}

test.before(() => configureLogging({ outputLevel: 'none' }));
test.after(() => resetLogging());

test('first config starts epoch 0 with a dynamic base id and becomes ready', async () => {
  const rt = new FakeRuntime();
  const s = make(rt);
  assert.not.ok(s.ready());
  s.setDesired(cfg('a'));
  await until('ready', () => s.ready());
  assert.is(rt.procs.length, 1);
  assert.is(rt.procs[0]!.epoch, 0);
  assert.is(rt.procs[0]!.baseId, undefined);
  s.setDesired(cfg('a'));
  await sleep(20);
  assert.is(rt.procs.length, 1, 'same config starts nothing');
  await s.shutdown(false, 'test');
});

test('a changed config hot-restarts into epoch latest+1 with the same base id, without killing the parent', async () => {
  const rt = new FakeRuntime();
  const s = make(rt);
  s.setDesired(cfg('a'));
  await until('epoch 0 live', () => s.ready());
  s.setDesired(cfg('b'));
  await until('epoch 1 live', () => (s.debugState().epochs as Array<{ epoch: number; state: string }>).some((e) => e.epoch === 1 && e.state === 'live'));
  assert.is(rt.procs[1]!.epoch, 1);
  assert.is(rt.procs[1]!.baseId, 42);
  assert.ok(rt.procs[0]!.alive, 'the agent does not kill the parent after a hot restart');
  assert.equal(rt.procs[0]!.signals, []);
  const states = (s.debugState().epochs as Array<{ state: string }>).map((e) => e.state);
  assert.equal(states, ['draining', 'live']);
  assert.ok(s.ready());
  // Envoy's child terminates the parent: a normal exit, nothing restarts.
  rt.procs[0]!.exit({ code: 0, signal: null });
  await sleep(20);
  assert.is(rt.procs.length, 2);
  await s.shutdown(false, 'test');
});

test('the next epoch waits until the starting one is live', async () => {
  const rt = new FakeRuntime();
  rt.autoLive = false;
  const s = make(rt);
  s.setDesired(cfg('a'));
  await sleep(10);
  s.setDesired(cfg('b'));
  await sleep(30);
  assert.is(rt.procs.length, 1, 'no epoch 1 while epoch 0 is starting');
  rt.liveEpochs.add(0);
  await until('epoch 1 spawned', () => rt.procs.length === 2);
  assert.is(rt.procs[1]!.epoch, 1);
  await s.shutdown(false, 'test');
});

test('a bootstrap Envoy rejects is never launched; the next change is', async () => {
  const rt = new FakeRuntime();
  const s = make(rt);
  s.setDesired(cfg('a'));
  await until('live', () => s.ready());
  s.setDesired(cfg('bad', { invalid: true }));
  await sleep(30);
  assert.is(rt.procs.length, 1);
  assert.match(String((s.debugState().lastFailure as { reason: string }).reason), /rejected/);
  assert.is(s.metrics().configs_rejected_total, 1);
  assert.is(rt.files.size, 1, 'the rejected bootstrap file is removed');
  s.setDesired(cfg('c'));
  await until('epoch 1 spawned', () => rt.procs.length === 2);
  assert.is(rt.procs[1]!.epoch, 1);
  await s.shutdown(false, 'test');
});

test('a child that dies before going live leaves the parent serving; retried until the budget is spent', async () => {
  const rt = new FakeRuntime();
  const s = make(rt);
  let ended = false;
  void s.done.then(() => (ended = true));
  s.setDesired(cfg('a'));
  await until('live', () => s.ready());
  s.setDesired(cfg('broken', { crashOnStart: true }));
  await until('budget spent', () => s.metrics().restart_budget_exhausted_total === 1, 10_000);
  assert.is(rt.procs.length, 1 + 11, 'first try plus ten retries');
  assert.ok(rt.procs[0]!.alive, 'parent never aborted');
  assert.equal(rt.procs[0]!.signals, []);
  assert.ok(rt.procs.slice(1).every((p) => p.epoch === 1), 'every retry is epoch 1 again');
  assert.is(rt.cleared.length, 11, 'INITIALIZING cleared after each dead child');
  assert.ok(s.ready());
  assert.not.ok(ended);
  assert.match(String((s.debugState().lastFailure as { reason: string }).reason), /budget spent/);
  await sleep(50);
  assert.is(rt.procs.length, 12, 'nothing more is tried until the next change');
  s.setDesired(cfg('good'));
  await until('epoch 1 live', () => rt.procs.length === 13 && s.newestLive()?.n === 1);
  await s.shutdown(false, 'test');
});

test('a live epoch that dies aborts the others and restarts at epoch 0 after the backoff', async () => {
  const rt = new FakeRuntime();
  const s = make(rt, { initialBackoffMs: 30 });
  s.setDesired(cfg('a'));
  await until('live', () => s.ready());
  s.setDesired(cfg('b'));
  await until('epoch 1 live', () => s.newestLive()?.n === 1);
  const t0 = Date.now();
  rt.procs[1]!.exit({ code: null, signal: 'SIGKILL' });
  await until('restart', () => rt.procs.length === 3);
  assert.ok(Date.now() - t0 >= 25, 'restart waits for the backoff');
  assert.equal(rt.procs[0]!.signals, ['SIGKILL'], 'the parent was aborted');
  assert.is(rt.procs[2]!.epoch, 0);
  assert.is(rt.procs[2]!.baseId, undefined, 'a cold start picks a new dynamic base id');
  await until('ready again', () => s.ready());
  assert.is(s.metrics().restart_budget_remaining, 9);
  await s.shutdown(false, 'test');
});

test('a serving Envoy that exits 0 without the agent asking is restarted, not taken as the end', async () => {
  const rt = new FakeRuntime();
  const s = make(rt);
  let ended = false;
  void s.done.then(() => (ended = true));
  s.setDesired(cfg('a'));
  await until('live', () => s.ready());
  rt.procs[0]!.exit({ code: 0, signal: null });
  await until('restarted', () => rt.procs.length === 2 && s.ready());
  assert.is(rt.procs[1]!.epoch, 0);
  assert.not.ok(ended);
  assert.is(s.metrics().restart_budget_remaining, 9);
  assert.match(String((s.debugState().lastFailure as { reason: string }).reason), /exited with code 0 without the agent asking/);
  await s.shutdown(false, 'test');
});

test('a new epoch that never goes live is aborted after the start timeout; the parent keeps serving', async () => {
  const rt = new FakeRuntime();
  const s = make(rt, { startTimeoutMs: 20 });
  s.setDesired(cfg('a'));
  await until('live', () => s.ready());
  s.setDesired(cfg('stuck', { hang: true }));
  await until('budget spent', () => s.metrics().restart_budget_exhausted_total === 1, 10_000);
  assert.ok(rt.procs[0]!.alive && s.ready(), 'parent still serving');
  assert.ok(rt.procs.slice(1).every((p) => !p.alive && p.signals.includes('SIGKILL')), 'each stuck child was killed');
  assert.is(rt.cleared.length, rt.procs.length - 1, 'and its INITIALIZING flag cleared');
  s.setDesired(cfg('good'));
  await until('good epoch live', () => s.newestLive()?.config.hash === 'good');
  await s.shutdown(false, 'test');
});

test('epoch 0 with nothing serving may wait for its config as long as it takes', async () => {
  const rt = new FakeRuntime();
  const s = make(rt, { startTimeoutMs: 10 });
  s.setDesired(cfg('boot', { hang: true }));
  await sleep(80);
  assert.ok(rt.procs[0]!.alive);
  assert.is(rt.procs.length, 1);
  await s.shutdown(false, 'test');
});

test('a draining parent that crashes does not take the live child down', async () => {
  const rt = new FakeRuntime();
  const s = make(rt);
  s.setDesired(cfg('a'));
  await until('live', () => s.ready());
  s.setDesired(cfg('b'));
  await until('epoch 1 live', () => s.newestLive()?.n === 1);
  rt.procs[0]!.exit({ code: null, signal: 'SIGSEGV' });
  await sleep(30);
  assert.ok(rt.procs[1]!.alive);
  assert.equal(rt.procs[1]!.signals, []);
  assert.is(rt.procs.length, 2, 'nothing restarted');
  assert.ok(s.ready());
  assert.is(s.metrics().restart_budget_remaining, 10);
  await s.shutdown(false, 'test');
});

test('a bootstrap that cannot be written is retried with backoff, not in a tight loop', async () => {
  const rt = new FakeRuntime();
  rt.failWrites = 3;
  const s = make(rt, { initialBackoffMs: 5 });
  s.setDesired(cfg('a'));
  await until('live after the disk recovered', () => s.ready());
  assert.is(rt.procs.length, 1);
  assert.is(s.metrics().restart_budget_remaining, 10, 'a full disk is not Envoy\'s failure: its budget is untouched');
  assert.match(String((s.debugState().lastFailure as { reason: string }).reason), /ENOSPC/);
  await s.shutdown(false, 'test');
});

test('a disk that stays full during a hot restart leaves a healthy Envoy its whole budget for its own crashes', async () => {
  const rt = new FakeRuntime();
  const s = make(rt, { initialBackoffMs: 1, healthyResetMs: 0 });
  let ended = false;
  void s.done.then(() => (ended = true));
  s.setDesired(cfg('a'));
  await until('live', () => s.ready());
  rt.failWrites = 1000;
  s.setDesired(cfg('b'));
  await until('launch retries given up', () => s.metrics().restart_budget_exhausted_total === 1, 10_000);
  assert.is(rt.failWrites, 1000 - 11);
  assert.ok(s.ready(), 'epoch 0 keeps serving');
  assert.is(s.metrics().restart_budget_remaining, 10);
  // The disk recovers; then the serving Envoy crashes: it is restarted (with the config that was wanted).
  rt.failWrites = 0;
  rt.procs[0]!.exit({ code: null, signal: 'SIGSEGV' });
  await until('restarted', () => rt.procs.length === 2 && s.ready());
  assert.not.ok(ended);
  assert.is(s.metrics().restart_budget_remaining, 9);
  await s.shutdown(false, 'test');
});

test('when the wanted config was given up on and the serving epoch dies, the last good config is restarted', async () => {
  const rt = new FakeRuntime();
  const s = make(rt, { initialBackoffMs: 1, healthyResetMs: 0 });
  s.setDesired(cfg('good'));
  await until('live', () => s.ready());
  s.setDesired(cfg('bad', { invalid: true }));
  await until('rejected', () => s.metrics().configs_rejected_total === 1);
  rt.procs[0]!.exit({ code: null, signal: 'SIGKILL' });
  await until('good config back', () => rt.procs.length === 2 && s.ready());
  assert.is(s.newestLive()?.config.hash, 'good');
  await sleep(20);
  assert.is(rt.procs.length, 2, 'the rejected config is not tried again');
  await s.shutdown(false, 'test');
});

test('an epoch that stays live for the healthy reset duration restores budget and backoff: crashes spread out never end the agent', async () => {
  const rt = new FakeRuntime();
  const s = make(rt, { initialBackoffMs: 1, healthyResetMs: 30 });
  let ended = false;
  void s.done.then(() => (ended = true));
  s.setDesired(cfg('a'));
  for (let crash = 1; crash <= 15; crash++) {
    await until(`live before crash ${crash}`, () => s.ready());
    await until('budget restored', () => s.metrics().restart_budget_remaining === 10);
    rt.alive()[0]!.exit({ code: null, signal: 'SIGKILL' });
    await until(`restart after crash ${crash}`, () => rt.procs.length === crash + 1);
    assert.is(s.metrics().restart_budget_remaining, 9, 'each crash after a recovery waits the first backoff only');
  }
  assert.not.ok(ended);
  assert.match(String((s.debugState().lastFailure as { reason: string }).reason), /exited abnormally/);
  await s.shutdown(false, 'test');
});

test('without a healthy period in between, crashes still spend the budget and end the agent', async () => {
  const rt = new FakeRuntime();
  const s = make(rt, { initialBackoffMs: 1, healthyResetMs: 60_000 });
  s.setDesired(cfg('a'));
  for (let crash = 1; crash <= 11; crash++) {
    await until(`live before crash ${crash}`, () => s.ready(), 10_000);
    rt.alive()[0]!.exit({ code: null, signal: 'SIGKILL' });
    await until(`reacted to crash ${crash}`, () => !s.ready());
  }
  assert.is((await s.done).code, 1);
});

test('a crash of an epoch that had been live for the reset duration restores the budget even if the timer could not', async () => {
  let clock = 1_000_000;
  const rt = new FakeRuntime();
  const s = make(rt, { initialBackoffMs: 1, healthyResetMs: 600_000, now: () => clock });
  s.setDesired(cfg('a'));
  for (let crash = 1; crash <= 3; crash++) {
    await until('live', () => s.ready());
    rt.alive()[0]!.exit({ code: null, signal: 'SIGKILL' });
    await until('restarted', () => rt.procs.length === crash + 1);
  }
  await until('live', () => s.ready());
  assert.is(s.metrics().restart_budget_remaining, 7);
  clock += 600_000;
  rt.alive()[0]!.exit({ code: null, signal: 'SIGKILL' });
  await until('restarted', () => rt.procs.length === 5);
  assert.is(s.metrics().restart_budget_remaining, 9);
  await s.shutdown(false, 'test');
});

test('a bootstrap that can never be written ends the agent with code 1 when nothing runs', async () => {
  const rt = new FakeRuntime();
  rt.failWrites = 1000;
  const s = make(rt, { initialBackoffMs: 1 });
  s.setDesired(cfg('a'));
  assert.is((await s.done).code, 1);
  assert.is(rt.failWrites, 1000 - 11, 'first try and ten retries, no more');
});

test('an Envoy that fails the same way twice before it ever went live is a start-up error: exit 1, no ten restarts', async () => {
  const rt = new FakeRuntime();
  const s = make(rt, { initialBackoffMs: 1 });
  s.setDesired(cfg('x', { crashOnStart: true }));
  const end = await s.done;
  assert.is(end.code, 1);
  assert.match(end.reason, /^Envoy cannot start: Envoy epoch 0 exited \(code 1\) before it ever went live: cannot bind/);
  assert.is(rt.procs.length, 2);
});

test('an epoch 0 that died before its base id was read still has its shared memory removed', async () => {
  const rt = new FakeRuntime();
  rt.baseIdOnlyAfterExit = true;
  const s = make(rt, { initialBackoffMs: 1 });
  s.setDesired(cfg('x', { crashOnStart: true }));
  await s.done;
  assert.is(rt.procs.length, 2);
  assert.equal(rt.removedShm, [42, 42], 'before the second epoch 0, and at the end');
});

test('the same failure is recognised through pids and the marker protobuf randomises in its debug strings', async () => {
  const rt = new FakeRuntime();
  const marks = ['debugproto', 'debugonly', 'debugstr'];
  rt.failureReason = () => `error \`cannot bind '127.0.0.1:80'\` (pid ${1000 + rt.procs.length}) initializing config 'goo.gle/${marks[rt.procs.length % 3]}`;
  const s = make(rt, { initialBackoffMs: 1 });
  s.setDesired(cfg('x', { crashOnStart: true }));
  assert.is((await s.done).code, 1);
  assert.is(rt.procs.length, 2);
});

test('first epochs that fail differently each time are retried until the budget is spent, then exit 1', async () => {
  const rt = new FakeRuntime();
  const words = ['alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta', 'eta', 'theta', 'iota', 'kappa', 'lambda', 'mu'];
  rt.failureReason = () => `crashed in ${words[rt.procs.length - 1]}`;
  const s = make(rt, { initialBackoffMs: 1 });
  s.setDesired(cfg('x', { crashOnStart: true }));
  const end = await s.done;
  assert.is(end.code, 1);
  assert.is(rt.procs.length, 11);
  assert.ok(rt.procs.every((p) => p.epoch === 0));
});

test('once an epoch has gone live, the same failure of a restarted epoch 0 is retried on the budget', async () => {
  const rt = new FakeRuntime();
  const s = make(rt, { initialBackoffMs: 1, healthyResetMs: 0 });
  s.setDesired(cfg('a'));
  await until('live', () => s.ready());
  rt.autoLive = false;
  const crash = (p: { exit(st: { code: number | null; signal: NodeJS.Signals | null }): void }) => p.exit({ code: 1, signal: null });
  crash(rt.procs[0]!);
  for (let i = 2; i <= 4; i++) {
    await until(`attempt ${i}`, () => rt.procs.length === i);
    crash(rt.procs[i - 1]!);
  }
  await until('attempt 5', () => rt.procs.length === 5);
  assert.is(s.metrics().restart_budget_remaining, 6);
  await s.shutdown(false, 'test');
});

test('a different hot restart version drains and cold-restarts at epoch 0', async () => {
  const rt = new FakeRuntime();
  const s = make(rt);
  s.setDesired(cfg('a'));
  await until('live', () => s.ready());
  rt.binVersion = '12.104';
  s.setDesired(cfg('upgrade'));
  await until('new epoch 0', () => rt.procs.length === 2 && s.ready());
  assert.is(rt.procs[1]!.epoch, 0);
  assert.is(rt.procs[1]!.baseId, undefined);
  assert.not.ok(rt.procs[0]!.alive);
  assert.is(rt.drains.length, 1);
  assert.is(s.metrics().cold_restarts_total, 1);
  await s.shutdown(false, 'test');
});

test('liveFromStats: the lone starting epoch goes live from its own stats; its hot restart version is asked for at the next restart', async () => {
  const rt = new FakeRuntime();
  rt.autoLive = false; // the probe loop never sees it live: only the stats do
  let initializing = true;
  rt.isInitializing = () => initializing;
  const s = make(rt);
  s.setDesired(cfg('a'));
  await until('spawned', () => rt.procs.length === 1);
  const stats = (epoch: number, workers: number) =>
    new Map([
      [HOT_RESTART_EPOCH_STAT, epoch],
      [WORKERS_STARTED_STAT, workers],
    ]);
  assert.equal(s.startingAlone()?.n, 0);
  s.liveFromStats(0, undefined); // Envoy did not answer
  s.liveFromStats(0, stats(0, 0)); // workers not started: still initialising
  s.liveFromStats(0, stats(1, 1)); // another epoch's admin
  s.liveFromStats(0, stats(0, 1)); // the shared memory still says INITIALIZING
  s.liveFromStats(1, stats(1, 1)); // no such epoch
  assert.not.ok(s.ready());
  initializing = false;
  s.liveFromStats(0, stats(0, 1));
  assert.ok(s.ready());
  assert.is(s.startingAlone(), undefined);
  // The next epoch's version check asks the live one (the probe) for its hot restart version, which differs here.
  rt.liveEpochs.add(0);
  rt.autoLive = true;
  rt.runningVersion = '10.104';
  s.setDesired(cfg('b'));
  await until('cold-restarted epoch 0', () => rt.procs.length === 2 && s.ready());
  assert.is(rt.procs[1]!.epoch, 0);
  assert.is(s.metrics().cold_restarts_total, 1);
  await s.shutdown(false, 'test');
});

test('liveFromStats leaves a starting epoch alone while an older one is alive (the admin may be the parent\'s)', async () => {
  const rt = new FakeRuntime();
  const s = make(rt);
  s.setDesired(cfg('a'));
  await until('live', () => s.ready());
  rt.autoLive = false;
  s.setDesired(cfg('b'));
  await until('epoch 1 spawned', () => rt.procs.length === 2);
  assert.is(s.startingAlone(), undefined);
  s.liveFromStats(1, new Map([[HOT_RESTART_EPOCH_STAT, 1], [WORKERS_STARTED_STAT, 1]]));
  assert.is(s.newestLive()?.n, 0, 'epoch 1 goes live only through the probe');
  await s.shutdown(false, 'test');
});

test('at most three epochs overlap', async () => {
  const rt = new FakeRuntime();
  const s = make(rt);
  for (const h of ['a', 'b', 'c', 'd']) {
    s.setDesired(cfg(h));
    await until(`${h} live`, () => s.newestLive()?.config.hash === h);
  }
  assert.equal(rt.procs.map((p) => p.epoch), [0, 1, 2, 3]);
  assert.equal(rt.procs[0]!.signals, ['SIGKILL'], 'epoch 0 killed when epoch 3 starts');
  assert.ok(rt.procs[1]!.alive && rt.procs[2]!.alive && rt.procs[3]!.alive);
  await s.shutdown(false, 'test');
});

test('graceful shutdown drains inbound, waits, kills every epoch; a second call kills at once', async () => {
  const rt = new FakeRuntime();
  const s = make(rt, { terminationDrainMs: 10_000 });
  s.setDesired(cfg('a'));
  await until('live', () => s.ready());
  const t0 = Date.now();
  const first = s.shutdown(true, 'SIGTERM');
  await sleep(30);
  assert.not.ok(s.ready(), 'readiness off during the drain');
  assert.equal(rt.drains, [{ inboundOnly: true }]);
  assert.ok(rt.procs[0]!.alive, 'still draining');
  const end = await s.shutdown(true, 'second SIGTERM');
  assert.is(end.code, 0);
  assert.is(await first, end);
  assert.ok(Date.now() - t0 < 5000, 'second signal did not wait for the drain');
  assert.equal(rt.alive(), []);
  assert.equal(rt.removedShm, [42]);
  assert.is(rt.files.size, 0, 'no bootstrap file left');
});

test('graceful shutdown ends as soon as Envoy exits by itself during the drain', async () => {
  const rt = new FakeRuntime();
  const s = make(rt, { terminationDrainMs: 60_000 });
  s.setDesired(cfg('a'));
  await until('live', () => s.ready());
  const t0 = Date.now();
  const end = s.shutdown(true, 'SIGTERM');
  await sleep(20);
  rt.procs[0]!.exit({ code: 0, signal: null });
  assert.is((await end).code, 0);
  assert.ok(Date.now() - t0 < 5000, 'did not wait for terminationDrainDuration');
});

test('shutdown with nothing live does not wait for a drain', async () => {
  const rt = new FakeRuntime();
  rt.autoLive = false;
  const s = make(rt, { terminationDrainMs: 60_000 });
  s.setDesired(cfg('a'));
  await sleep(10);
  const t0 = Date.now();
  assert.is((await s.shutdown(true, 'SIGTERM')).code, 0);
  assert.ok(Date.now() - t0 < 5000);
  assert.equal(rt.drains, []);
  assert.equal(rt.alive(), []);
});

test('after a drain on request (preStop), SIGTERM stops Envoy without draining again', async () => {
  const rt = new FakeRuntime();
  const s = make(rt, { terminationDrainMs: 60_000 });
  s.setDesired(cfg('a'));
  await until('live', () => s.ready());
  s.markDrained();
  const t0 = Date.now();
  assert.is((await s.shutdown(true, 'SIGTERM')).code, 0);
  assert.ok(Date.now() - t0 < 5000);
  assert.equal(rt.drains, [], 'no second drain');
});

test('exit on zero active connections ends the drain early', async () => {
  const rt = new FakeRuntime();
  const s = make(rt, { exitOnZeroActiveConnections: true, minimumDrainMs: 20, terminationDrainMs: 60_000, maximumDrainMs: 60_000 });
  s.setDesired(cfg('a'));
  await until('live', () => s.ready());
  rt.connections = [3, 2, 0];
  const t0 = Date.now();
  const end = await s.shutdown(true, 'SIGTERM');
  assert.is(end.code, 0);
  assert.ok(Date.now() - t0 < 5000);
  assert.is(rt.connections.length, 0, 'polled until zero');
});

test('the drain cap bounds exit-on-zero', async () => {
  const rt = new FakeRuntime();
  const s = make(rt, { exitOnZeroActiveConnections: true, minimumDrainMs: 5, maximumDrainMs: 60 });
  s.setDesired(cfg('a'));
  await until('live', () => s.ready());
  rt.connections = Array(10_000).fill(5);
  const end = await s.shutdown(true, 'SIGTERM');
  assert.is(end.code, 0);
  assert.ok(rt.connections.length > 9000, 'stopped polling at the cap');
});

test.run();
