// The supervisor's state machine, row by row: each test drives a fake Envoy runtime (the process interface the
// supervisor takes) into a state, raises an event through the public API or the fake, and checks the transition
// the supervisor logged and what it visibly did. The last tests check that the table is complete and that every
// row of it was seen here. The behaviours themselves are in supervisor-logic.test.ts and, against the real
// Envoy, supervisor-envoy.test.ts.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { AdminAddress } from '../lib/envoy-admin';
import type { EnvoyProcess, ExitStatus } from '../lib/envoy-process';
import { configureLogging, resetLogging } from '../lib/log';
import {
  IGNORED, SUPERVISOR_EVENTS, SUPERVISOR_STATES, Supervisor, TRANSITIONS,
  type DesiredConfig, type EnvoyRuntime, type LiveProbe, type SupervisorEvent, type SupervisorOptions,
  type SupervisorState,
} from '../lib/supervisor';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Gate {
  promise: Promise<void>;
  open(): void;
}
function gate(): Gate {
  let open!: () => void;
  const promise = new Promise<void>((r) => (open = r));
  return { promise, open };
}

class FakeProc implements EnvoyProcess {
  private resolveExit!: (s: ExitStatus) => void;
  readonly exited = new Promise<ExitStatus>((r) => (this.resolveExit = r));
  alive = true;
  signals: string[] = [];
  constructor(readonly pid: number, readonly epoch: number, readonly hash: string, private readonly rt: FakeRuntime) {}
  kill(signal: NodeJS.Signals): void {
    this.signals.push(signal);
    // A stubborn process takes its time to die: the test ends it with exit().
    if (signal === 'SIGKILL' && !this.rt.stubborn) this.exit({ code: null, signal });
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
  drains: Array<{ inboundOnly: boolean }> = [];
  removedShm: number[] = [];
  failWrites = 0;
  failSpawn = false;
  stubborn = false;
  /** validate() waits for it while set. */
  validateGate: Gate | undefined;
  /** The admin port of this many is refused (a failed hot restart closed it); the next version check then waits. */
  adminGonePort: number | undefined;
  versionGate: Gate | undefined;
  private nextPid = 1000;

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
  async validate(): Promise<string | undefined> {
    if (this.validateGate) await this.validateGate.promise;
    return undefined;
  }
  async binaryHotRestartVersion(): Promise<string> {
    if (this.versionGate) await this.versionGate.promise;
    return this.binVersion;
  }
  spawn(epoch: number, cfg: DesiredConfig): EnvoyProcess {
    if (this.failSpawn) throw new Error('spawn envoy EAGAIN');
    const p = new FakeProc(this.nextPid++, epoch, cfg.hash, this);
    this.procs.push(p);
    if (cfg.bootstrap.crashOnStart) setTimeout(() => p.exit({ code: 1, signal: null }), 5);
    else setTimeout(() => this.liveEpochs.add(epoch), 5);
    return p;
  }
  failureReason(): string {
    return 'cannot bind';
  }
  async probe(admin: AdminAddress): Promise<LiveProbe | undefined> {
    if ('port' in admin && admin.port === this.adminGonePort) {
      this.versionGate ??= gate();
      throw Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' });
    }
    const alive = this.procs.filter((p) => p.alive && this.liveEpochs.has(p.epoch));
    if (!alive.length) return undefined;
    const top = alive.reduce((a, b) => (a.epoch > b.epoch ? a : b));
    return { epoch: top.epoch, state: 'LIVE', hotRestartVersion: this.runningVersion };
  }
  readBaseId(): number | undefined {
    return this.procs.some((p) => p.epoch === 0) ? 42 : undefined;
  }
  clearBaseId(): void {}
  isInitializing(): boolean | undefined {
    return false;
  }
  clearInitializing(): boolean {
    return true;
  }
  removeShm(baseId: number): void {
    this.removedShm.push(baseId);
  }
  async drain(_a: unknown, inboundOnly: boolean): Promise<void> {
    this.drains.push({ inboundOnly });
  }
  async activeConnections(): Promise<number> {
    return 0;
  }
  releaseAll(): void {
    for (const p of this.procs) p.exit({ code: null, signal: 'SIGKILL' });
  }
}

function cfg(hash: string, extra: Record<string, unknown> = {}, port = 1): DesiredConfig {
  const admin = { host: '127.0.0.1', port };
  return { hash, bootstrap: { ...extra }, binaryPath: '/bin/envoy', admin, inboundOnlyDrain: true };
}

function make(rt: FakeRuntime, o: Partial<SupervisorOptions> = {}): Supervisor {
  return new Supervisor({
    runtime: rt,
    validate: true,
    terminationDrainMs: 1000,
    exitOnZeroActiveConnections: false,
    minimumDrainMs: 10,
    maximumDrainMs: 1000,
    probeIntervalMs: 2,
    connectionPollMs: 5,
    initialBackoffMs: 60_000,
    coldRestartDrainMs: 5,
    healthyResetMs: 0,
    ...o,
  });
}

async function until(what: string, fn: () => boolean, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!fn()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(2);
  }
}

// The supervisor's debug log is the record of its transitions.
let lines: string[] = [];
const seenRows = new Set<string>();
type Step = [SupervisorState, SupervisorEvent, SupervisorState];

function steps(): Step[] {
  const out: Step[] = [];
  for (const l of lines) {
    const m = /\tstate (\S+) -> (\S+) on (\S+): /.exec(l);
    if (m) out.push([m[1] as SupervisorState, m[3] as SupervisorEvent, m[2] as SupervisorState]);
  }
  return out;
}
function ignored(): string[] {
  return lines.flatMap((l) => /\t(\S+ ignored in state \S+)$/.exec(l)?.[1] ?? []);
}
/** Asserts the rows were taken in this order (other transitions may come between them). */
function sawInOrder(...want: Step[]): void {
  const got = steps();
  let i = 0;
  for (const s of got) if (i < want.length && s.join(' ') === want[i]!.join(' ')) i++;
  const text = (xs: Step[]) => xs.map((x) => x.join(' ')).join(', ');
  assert.ok(i === want.length, `expected transitions ${text(want)}; got ${text(got)}`);
}
const nextRetry = (s: Supervisor) => s.debugState().nextRetry;
const lastFailure = (s: Supervisor) => String((s.debugState().lastFailure as { reason: string } | null)?.reason);

test.before.each(() => {
  lines = [];
  configureLogging({ outputLevel: 'none,supervisor:debug', journal: false, write: (l) => lines.push(l) });
});
test.after.each(() => {
  for (const [from, event, to] of steps()) {
    const row = TRANSITIONS[from][event];
    assert.ok(row !== IGNORED && row[0] === to, `logged transition ${from} ${event} ${to} is not in the table`);
    seenRows.add(`${from} ${event}`);
  }
  resetLogging();
});

/** A supervisor with epoch 0 of config `a` live: state running. */
async function running(rt: FakeRuntime, o: Partial<SupervisorOptions> = {}): Promise<Supervisor> {
  const s = make(rt, o);
  s.setDesired(cfg('a'));
  await until('epoch 0 live', () => s.ready());
  assert.is(s.state, 'running');
  return s;
}

/** Epoch 0 live, config b held in validation: state launching. */
interface Held {
  s: Supervisor;
  g: Gate;
}

async function launching(rt: FakeRuntime, o: Partial<SupervisorOptions> = {}): Promise<Held> {
  const s = await running(rt, o);
  const g = (rt.validateGate = gate());
  s.setDesired(cfg('b'));
  assert.is(s.state, 'launching');
  return { s, g };
}

/** Launching b while the serving epoch 0 crashed: a retry is due too. */
async function launchingBackoff(rt: FakeRuntime, o: Partial<SupervisorOptions> = {}): Promise<Held> {
  const r = await launching(rt, o);
  rt.procs[0]!.exit({ code: null, signal: 'SIGSEGV' });
  await until('launching-backoff', () => r.s.state === 'launching-backoff');
  return r;
}

// ---- idle ----

test('idle, desire -> running: the first config is launched and goes live', async () => {
  const rt = new FakeRuntime();
  const s = make(rt);
  assert.is(s.state, 'idle');
  s.setDesired(cfg('a'));
  await until('live', () => s.ready());
  sawInOrder(['idle', 'desire', 'running'], ['running', 'launch', 'launching'], ['launching', 'launched', 'running']);
  assert.equal(rt.procs.map((p) => [p.epoch, p.hash]), [[0, 'a']]);
  await s.shutdown(false, 'test');
});

test('idle, drained -> idle: remembered, so the later SIGTERM does not drain again', async () => {
  const rt = new FakeRuntime();
  const s = make(rt, { terminationDrainMs: 60_000 });
  s.markDrained();
  assert.is(s.state, 'idle');
  sawInOrder(['idle', 'drained', 'idle']);
  s.setDesired(cfg('a'));
  await until('live', () => s.ready());
  assert.is((await s.shutdown(true, 'SIGTERM')).code, 0);
  assert.equal(rt.drains, []);
  assert.ok(lines.some((l) => /already drained by POST \/drain/.test(l)));
});

test('idle, stop -> stopping -> ended (all-exited): a shutdown before any config ends at once with 0', async () => {
  const rt = new FakeRuntime();
  const s = make(rt);
  const end = await s.shutdown(true, 'SIGTERM');
  assert.equal(end, { code: 0, reason: 'shut down' });
  assert.is(s.state, 'ended');
  sawInOrder(['idle', 'stop', 'stopping'], ['stopping', 'all-exited', 'ended']);
  assert.equal(rt.procs, []);
});

// ---- running ----

test('running, desire -> running, then launch -> launching: a new config hot-restarts into epoch 1', async () => {
  const rt = new FakeRuntime();
  const s = await running(rt);
  s.setDesired(cfg('b'));
  await until('epoch 1 live', () => s.newestLive()?.n === 1);
  sawInOrder(['running', 'desire', 'running'], ['running', 'launch', 'launching'],
    ['launching', 'launched', 'running']);
  assert.equal(rt.procs.map((p) => [p.epoch, p.hash]), [[0, 'a'], [1, 'b']]);
  await s.shutdown(false, 'test');
});

test('running, retry -> backoff: a crash spends one retry and arms the timer; backoff, stop cancels it', async () => {
  const rt = new FakeRuntime();
  const s = await running(rt);
  rt.procs[0]!.exit({ code: null, signal: 'SIGSEGV' });
  await until('backoff', () => s.state === 'backoff');
  sawInOrder(['running', 'retry', 'backoff']);
  assert.is(s.metrics().restart_budget_remaining, 9);
  assert.type(nextRetry(s), 'string');
  assert.is((await s.shutdown(false, 'test')).code, 0);
  sawInOrder(['backoff', 'stop', 'stopping'], ['stopping', 'all-exited', 'ended']);
  assert.is(nextRetry(s), null, 'the retry is cancelled');
  assert.is(rt.procs.length, 1, 'nothing restarted');
});

test('running, give-up -> ended: a bootstrap never written ends with 1 once the budget is spent', async () => {
  const rt = new FakeRuntime();
  rt.failWrites = 1000;
  const s = make(rt, { initialBackoffMs: 1 });
  s.setDesired(cfg('a'));
  const end = await s.done;
  assert.equal(end, { code: 1, reason: 'restart budget spent with no Envoy running' });
  assert.is(s.state, 'ended');
  sawInOrder(['launching', 'launch-failed', 'running'], ['running', 'retry', 'backoff'],
    ['backoff', 'retry-due', 'running'], ['running', 'give-up', 'ended']);
  assert.is(nextRetry(s), null);
});

test('running, give-up -> ended: the same start-up failure twice ends with 1', async () => {
  const rt = new FakeRuntime();
  const s = make(rt, { initialBackoffMs: 1 });
  s.setDesired(cfg('x', { crashOnStart: true }));
  const end = await s.done;
  assert.is(end.code, 1);
  assert.match(end.reason, /^Envoy cannot start/);
  sawInOrder(['running', 'retry', 'backoff'], ['running', 'give-up', 'ended']);
  assert.is(rt.procs.length, 2);
});

test('running, drained -> running: the SIGTERM that follows stops without a drain (running, stop)', async () => {
  const rt = new FakeRuntime();
  const s = await running(rt, { terminationDrainMs: 60_000 });
  s.markDrained();
  assert.is(s.state, 'running');
  assert.is((await s.shutdown(true, 'SIGTERM')).code, 0);
  sawInOrder(['running', 'drained', 'running'], ['running', 'stop', 'stopping'], ['stopping', 'all-exited', 'ended']);
  assert.equal(rt.drains, []);
  assert.equal(rt.procs[0]!.signals, ['SIGKILL']);
});

test('running, drain -> draining: readiness off, the epoch drains; draining, stop: a second signal kills', async () => {
  const rt = new FakeRuntime();
  const s = await running(rt);
  const first = s.shutdown(true, 'SIGTERM');
  assert.is(s.state, 'draining');
  assert.not.ok(s.ready());
  await until('drain asked', () => rt.drains.length === 1);
  assert.equal(rt.drains, [{ inboundOnly: true }]);
  assert.ok(rt.procs[0]!.alive, 'still draining');
  const end = await s.shutdown(false, 'second SIGTERM');
  assert.is(await first, end);
  assert.is(end.code, 0);
  sawInOrder(['running', 'drain', 'draining'], ['draining', 'stop', 'stopping'], ['stopping', 'all-exited', 'ended']);
  assert.equal(rt.removedShm, [42]);
});

// ---- backoff ----

test('backoff, desire -> running: a new config starts at once, the retry is cancelled, the budget reset', async () => {
  const rt = new FakeRuntime();
  const s = await running(rt);
  rt.procs[0]!.exit({ code: null, signal: 'SIGSEGV' });
  await until('backoff', () => s.state === 'backoff');
  s.setDesired(cfg('b'));
  sawInOrder(['backoff', 'desire', 'running'], ['running', 'launch', 'launching']);
  assert.is(nextRetry(s), null);
  await until('b live', () => s.newestLive()?.config.hash === 'b');
  assert.equal(rt.procs.map((p) => [p.epoch, p.hash]), [[0, 'a'], [0, 'b']]);
  assert.is(s.metrics().restart_budget_remaining, 10);
  await s.shutdown(false, 'test');
});

test('backoff, retry-due -> running: when the timer fires the crashed config is started again', async () => {
  const rt = new FakeRuntime();
  const s = await running(rt, { initialBackoffMs: 20 });
  rt.procs[0]!.exit({ code: null, signal: 'SIGSEGV' });
  await until('backoff', () => s.state === 'backoff');
  await until('restarted', () => rt.procs.length === 2 && s.ready());
  sawInOrder(['running', 'retry', 'backoff'], ['backoff', 'retry-due', 'running'], ['running', 'launch', 'launching']);
  assert.is(rt.procs[1]!.epoch, 0);
  assert.is(nextRetry(s), null);
  await s.shutdown(false, 'test');
});

test('backoff, drained -> backoff; backoff, drain -> draining: the parent drains, the retry is cancelled', async () => {
  const rt = new FakeRuntime();
  const s = await running(rt);
  s.setDesired(cfg('broken', { crashOnStart: true }));
  await until('backoff', () => s.state === 'backoff');
  assert.ok(rt.procs[0]!.alive && s.ready(), 'epoch 0 still serving');
  s.markDrained();
  assert.is(s.state, 'backoff');
  sawInOrder(['running', 'retry', 'backoff'], ['backoff', 'drained', 'backoff']);
  // Drained on request: a graceful shutdown would not drain, so take the drain row on a second supervisor.
  const rt2 = new FakeRuntime();
  const s2 = await running(rt2);
  s2.setDesired(cfg('broken', { crashOnStart: true }));
  await until('backoff', () => s2.state === 'backoff');
  const first = s2.shutdown(true, 'SIGTERM');
  assert.is(s2.state, 'draining');
  assert.is(nextRetry(s2), null);
  await until('drain asked', () => rt2.drains.length === 1);
  sawInOrder(['backoff', 'drain', 'draining']);
  await s2.shutdown(false, 'second SIGTERM');
  await first;
  await s.shutdown(false, 'test');
  assert.equal(rt.drains, []);
});

// ---- launching ----

test('launching, desire -> launching: the config in validation is dropped, the newer one runs', async () => {
  const rt = new FakeRuntime();
  const { s, g } = await launching(rt);
  s.setDesired(cfg('c'));
  assert.is(s.state, 'launching');
  sawInOrder(['launching', 'desire', 'launching']);
  g.open();
  await until('c live', () => s.newestLive()?.config.hash === 'c');
  assert.equal(rt.procs.map((p) => p.hash), ['a', 'c'], 'b never spawned');
  sawInOrder(['launching', 'launched', 'running'], ['running', 'launch', 'launching'],
    ['launching', 'launched', 'running']);
  await s.shutdown(false, 'test');
});

test('launching, launch-failed -> running: a bootstrap write that fails is retried on the launch budget', async () => {
  const rt = new FakeRuntime();
  rt.failWrites = 1;
  const s = make(rt, { initialBackoffMs: 5 });
  s.setDesired(cfg('a'));
  await until('live', () => s.ready());
  sawInOrder(['running', 'launch', 'launching'], ['launching', 'launch-failed', 'running'],
    ['running', 'retry', 'backoff'], ['backoff', 'retry-due', 'running'], ['launching', 'launched', 'running']);
  assert.match(lastFailure(s), /could not start a new epoch: ENOSPC/);
  assert.is(s.metrics().restart_budget_remaining, 10, 'Envoy\'s budget untouched');
  await s.shutdown(false, 'test');
});

test('launching, retry -> launching-backoff; launching-backoff, launched -> backoff: the retry stays due', async () => {
  const rt = new FakeRuntime();
  const { s, g } = await launchingBackoff(rt);
  sawInOrder(['launching', 'retry', 'launching-backoff']);
  assert.type(nextRetry(s), 'string');
  assert.is(s.metrics().restart_budget_remaining, 9);
  g.open();
  await until('backoff', () => s.state === 'backoff');
  sawInOrder(['launching-backoff', 'launched', 'backoff']);
  assert.equal(rt.procs.map((p) => [p.epoch, p.hash]), [[0, 'a'], [1, 'b']]);
  assert.type(nextRetry(s), 'string', 'still due');
  await s.shutdown(false, 'test');
});

test('launching, drained -> launching; launching, drain -> draining: the launch stops, nothing spawns', async () => {
  const rt = new FakeRuntime();
  const { s, g } = await launching(rt);
  s.markDrained();
  assert.is(s.state, 'launching');
  sawInOrder(['launching', 'drained', 'launching']);
  await s.shutdown(false, 'test');
  const rt2 = new FakeRuntime();
  const r2 = await launching(rt2);
  const first = r2.s.shutdown(true, 'SIGTERM');
  assert.is(r2.s.state, 'draining');
  sawInOrder(['launching', 'drain', 'draining']);
  r2.g.open();
  g.open();
  await until('launch given up', () => ignored().includes('launched ignored in state draining'));
  await r2.s.shutdown(false, 'second SIGTERM');
  await first;
  assert.equal(rt2.procs.map((p) => p.hash), ['a'], 'b never spawned');
  assert.is(rt2.files.size, 0, 'its bootstrap removed');
});

test('launching, stop -> stopping: the launch in flight spawns nothing', async () => {
  const rt = new FakeRuntime();
  const { s, g } = await launching(rt);
  assert.is((await s.shutdown(false, 'test')).code, 0);
  sawInOrder(['launching', 'stop', 'stopping'], ['stopping', 'all-exited', 'ended']);
  g.open();
  await until('launch given up', () => ignored().includes('launched ignored in state ended'));
  assert.equal(rt.procs.map((p) => p.hash), ['a']);
});

test('launching, give-up -> ended: the serving epoch dies, budget spent, while its admin is restored', async () => {
  const rt = new FakeRuntime();
  const s = make(rt, { initialBackoffMs: 1 });
  s.setDesired(cfg('a'));
  await until('live', () => s.ready());
  // A failed hot restart closed epoch 0's admin port; the broken config's children crash until its budget is spent.
  rt.adminGonePort = 1;
  s.setDesired(cfg('broken', { crashOnStart: true }, 2));
  await until('admin restore launching', () => s.state === 'launching' && rt.versionGate !== undefined, 10_000);
  assert.is(s.debugState().rejectedConfigHash, 'broken');
  assert.is(s.metrics().restart_budget_remaining, 0);
  rt.procs[0]!.exit({ code: null, signal: 'SIGSEGV' });
  const end = await s.done;
  assert.equal(end, { code: 1, reason: 'restart budget spent with no Envoy running' });
  sawInOrder(['running', 'launch', 'launching'], ['launching', 'give-up', 'ended']);
  rt.versionGate!.open();
  await until('launch given up', () => ignored().includes('launched ignored in state ended'));
  assert.ok(rt.procs.every((p) => !p.alive));
});

// ---- launching-backoff ----

test('launching-backoff, desire -> launching: the retry is cancelled, the newest config runs', async () => {
  const rt = new FakeRuntime();
  const { s, g } = await launchingBackoff(rt);
  s.setDesired(cfg('c'));
  assert.is(s.state, 'launching');
  sawInOrder(['launching-backoff', 'desire', 'launching']);
  assert.is(nextRetry(s), null);
  g.open();
  await until('c live', () => s.newestLive()?.config.hash === 'c');
  assert.equal(rt.procs.map((p) => p.hash), ['a', 'c']);
  await s.shutdown(false, 'test');
});

test('launching-backoff, launch-failed -> backoff: the failure is recorded, the due retry covers it', async () => {
  const rt = new FakeRuntime();
  const { s, g } = await launchingBackoff(rt);
  rt.failSpawn = true;
  g.open();
  await until('backoff', () => s.state === 'backoff');
  sawInOrder(['launching-backoff', 'launch-failed', 'backoff']);
  assert.match(lastFailure(s), /could not start a new epoch: spawn envoy EAGAIN/);
  assert.type(nextRetry(s), 'string');
  await s.shutdown(false, 'test');
});

test('launching-backoff, cold-stopped -> launching: a cold restart cancels the retry its exits armed', async () => {
  const rt = new FakeRuntime();
  const s = await running(rt);
  rt.binVersion = '12.104';
  s.setDesired(cfg('upgrade'));
  await until('new epoch 0 live', () => rt.procs.length === 2 && s.ready());
  sawInOrder(['running', 'launch', 'launching'], ['launching', 'retry', 'launching-backoff'],
    ['launching-backoff', 'cold-stopped', 'launching'], ['launching', 'launched', 'running']);
  assert.equal(rt.procs.map((p) => [p.epoch, p.hash]), [[0, 'a'], [0, 'upgrade']]);
  assert.is(nextRetry(s), null);
  assert.is(s.metrics().cold_restarts_total, 1);
  await s.shutdown(false, 'test');
});

test('launching-backoff, retry-due -> launching: the timer fires during the launch, which then decides', async () => {
  const rt = new FakeRuntime();
  const { s, g } = await launchingBackoff(rt, { initialBackoffMs: 20 });
  await until('launching', () => s.state === 'launching');
  sawInOrder(['launching-backoff', 'retry-due', 'launching']);
  assert.is(nextRetry(s), null);
  g.open();
  await until('b live', () => s.newestLive()?.config.hash === 'b');
  sawInOrder(['launching', 'launched', 'running']);
  await s.shutdown(false, 'test');
});

test('launching-backoff, drained / drain / stop: remembered; a dying epoch drains; stop cancels', async () => {
  // drained, then stop.
  const rt = new FakeRuntime();
  const r = await launchingBackoff(rt);
  r.s.markDrained();
  assert.is(r.s.state, 'launching-backoff');
  assert.is((await r.s.shutdown(false, 'test')).code, 0);
  sawInOrder(['launching-backoff', 'drained', 'launching-backoff'], ['launching-backoff', 'stop', 'stopping']);
  assert.is(nextRetry(r.s), null);
  r.g.open();
  await until('launch given up', () => ignored().includes('launched ignored in state ended'));
  assert.equal(rt.procs.map((p) => p.hash), ['a']);

  // drain: epochs 0 and 1 live, c in validation, epoch 1 crashes: epoch 0 is aborted but takes its time to die.
  const rt2 = new FakeRuntime();
  const s2 = await running(rt2);
  s2.setDesired(cfg('b'));
  await until('epoch 1 live', () => s2.newestLive()?.n === 1);
  rt2.stubborn = true;
  const g2 = (rt2.validateGate = gate());
  s2.setDesired(cfg('c'));
  rt2.procs[1]!.exit({ code: null, signal: 'SIGSEGV' });
  await until('launching-backoff', () => s2.state === 'launching-backoff');
  assert.ok(rt2.procs[0]!.alive && rt2.procs[0]!.signals.includes('SIGKILL'));
  const first = s2.shutdown(true, 'SIGTERM');
  assert.is(s2.state, 'draining');
  sawInOrder(['launching-backoff', 'drain', 'draining']);
  assert.is(nextRetry(s2), null);
  await until('drain asked', () => rt2.drains.length === 1);
  g2.open();
  const second = s2.shutdown(false, 'second SIGTERM');
  assert.is(s2.state, 'stopping');
  rt2.releaseAll();
  assert.is((await second).code, 0);
  await first;
  assert.equal(rt2.procs.map((p) => p.hash), ['a', 'b'], 'c never spawned');
});

// ---- events a state does not take ----

test('an event a state does not take is a no-op, logged: in draining, in stopping, all in ended', async () => {
  const rt = new FakeRuntime();
  const s = await running(rt);
  const first = s.shutdown(true, 'SIGTERM');
  s.setDesired(cfg('b'));
  assert.is(s.state, 'draining');
  assert.ok(ignored().includes('desire ignored in state draining'));
  rt.stubborn = true;
  const second = s.shutdown(false, 'second SIGTERM');
  assert.is(s.state, 'stopping');
  s.markDrained();
  assert.ok(ignored().includes('drained ignored in state stopping'));
  assert.is(s.state, 'stopping');
  rt.releaseAll();
  const end = await second;
  assert.is(await first, end);
  const before = steps().length;
  s.setDesired(cfg('c'));
  s.markDrained();
  assert.is(await s.shutdown(true, 'third SIGTERM'), end, 'shutdown when ended only returns the end');
  assert.is(s.state, 'ended');
  assert.is(steps().length, before, 'no transition after ended');
  assert.ok(ignored().includes('desire ignored in state ended'));
  assert.ok(ignored().includes('drained ignored in state ended'));
  assert.equal(rt.procs.map((p) => p.hash), ['a'], 'nothing spawned');
});

// ---- the table itself ----

test('the table is complete: every state x event is a row or explicitly ignored, and nothing else', () => {
  assert.equal(Object.keys(TRANSITIONS).sort(), [...SUPERVISOR_STATES].sort());
  for (const state of SUPERVISOR_STATES) {
    assert.equal(Object.keys(TRANSITIONS[state]).sort(), [...SUPERVISOR_EVENTS].sort(), `events of ${state}`);
    for (const event of SUPERVISOR_EVENTS) {
      const row = TRANSITIONS[state][event];
      if (row === IGNORED) continue;
      assert.ok(SUPERVISOR_STATES.includes(row[0]), `${state} ${event} -> unknown state ${row[0]}`);
      assert.ok(row[1].length > 0, `${state} ${event} names its action`);
    }
  }
  assert.ok(SUPERVISOR_EVENTS.every((e) => TRANSITIONS.ended[e] === IGNORED), 'ended is final');
  // Every state is reachable from idle, and ended from every state.
  const reach = (from: SupervisorState): Set<SupervisorState> => {
    const seen = new Set<SupervisorState>([from]);
    for (const s of seen) for (const e of SUPERVISOR_EVENTS) {
      const row = TRANSITIONS[s][e];
      if (row !== IGNORED) seen.add(row[0]);
    }
    return seen;
  };
  assert.equal([...reach('idle')].sort(), [...SUPERVISOR_STATES].sort());
  for (const s of SUPERVISOR_STATES) assert.ok(reach(s).has('ended'), `${s} can end`);
});

test('every row of the table was taken by a test above', () => {
  const rows = SUPERVISOR_STATES.flatMap((s) =>
    SUPERVISOR_EVENTS.filter((e) => TRANSITIONS[s][e] !== IGNORED).map((e) => `${s} ${e}`));
  const missing = rows.filter((r) => !seenRows.has(r));
  assert.equal(missing, [], `rows no test took: ${missing.join(', ')}`);
});

test.run();
