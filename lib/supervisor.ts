// The epoch supervisor: keeps Envoy running with the desired config, hot-restarting it over Envoy's own protocol.
//
// Model (after Istio's 2019 epoch agent): a desired config and a current config. setDesired() resets the restart
// budget and reconciles; reconcile() starts epoch latest+1 only when desired differs from current. Each epoch
// has its own state (starting | live | draining | exited) and an abort (SIGKILL to its process group).
//
// Beyond that design, a hot restart here is made safe:
//  - a new bootstrap is checked with `envoy --mode validate` first; one Envoy rejects is never launched;
//  - epoch N+1 starts only once N is live (workers started, its INITIALIZING flag cleared), and at most three
//    epochs overlap (anything older than N-2 is killed);
//  - a child that exits before it went live does not take the serving parent down: its INITIALIZING flag is
//    cleared and the config is retried with backoff; when the budget is spent, the last good epoch keeps serving
//    and the failure is reported;
//  - a binary whose --hot-restart-version differs from the running epoch's gets a drain-then-cold restart;
//  - a draining parent that dies does not abort the live child (the seed aborts every other epoch on any
//    abnormal exit; that stays so only for an epoch that was serving).
//
// Every way the supervisor ends (`done` resolves; agent.ts exits with the code), the rows into `ended` below:
//  1. shutdown(graceful) after SIGTERM/SIGINT: drain, wait, SIGKILL every epoch -> 0
//  2. shutdown(immediate): /quitquitquit, a second SIGTERM -> SIGKILL every epoch -> 0
//  3. the restart budget is spent with no Envoy running -> 1
//  4. before any epoch ever went live, epoch 0 failed twice the same way (exit status and reason): Envoy cannot
//     start (a binary that exits at once, a port taken), a start-up error -> 1, not ten restarts over minutes
// Nothing else ends it. In particular a serving Envoy that exits by itself, even with code 0 (someone POSTed
// its admin /quitquitquit), is a failure: restarted after the backoff, spending the budget. Istio's agent
// exits 0 there; a supervisor whose job is to keep Envoy up must not, or `Restart=on-failure` leaves no proxy.
//
// The supervisor's own lifecycle is one state value and the table below (consul-dataplane's Envoy proxy is the
// model): every change goes through fire(), which looks the event up, logs the transition at debug and returns
// whether it applied; the caller does the row's action only then. An event a state does not take is a no-op
// (logged at debug), so every public method is a no-op where it does not apply.
//   idle               no desired config yet
//   running            nothing in flight: reconcile() may start the next epoch
//   backoff            a retry is due when the backoff timer fires
//   launching          the next epoch is being prepared (bootstrap, validation, hot restart version check, a cold
//                      restart's drain and stop) and spawned; one launch at a time
//   launching-backoff  the same, and an epoch exited meanwhile: a retry is due as well
//   draining           graceful shutdown: the serving epoch drains, the supervisor waits
//   stopping           every epoch got SIGKILL; waiting for their exits
//   ended              `done` resolved
// The backoff timer exists exactly in backoff and launching-backoff: fire() clears it on the way to any other state.
// Events: desire (setDesired with a new hash), launch (reconcile starts the target), launched / launch-failed (the
// launch resolved / threw), cold-stopped (a cold restart's epochs are gone), retry (a failure with budget left),
// retry-due (the backoff timer fired), drained (markDrained: POST /drain), drain / stop (shutdown; stop also when a
// drain wait ends or a second signal comes), all-exited (no epoch left), give-up (exit paths 3 and 4).

import { scope } from './log';
import type { AdminAddress } from './envoy-admin';
import type { EnvoyProcess, ExitStatus } from './envoy-process';

export const SUPERVISOR_STATES = [
  'idle',
  'running',
  'backoff',
  'launching',
  'launching-backoff',
  'draining',
  'stopping',
  'ended',
] as const;
export type SupervisorState = (typeof SUPERVISOR_STATES)[number];
export const SUPERVISOR_EVENTS = [
  'desire',
  'launch',
  'launched',
  'launch-failed',
  'cold-stopped',
  'retry',
  'retry-due',
  'drained',
  'drain',
  'stop',
  'all-exited',
  'give-up',
] as const;
export type SupervisorEvent = (typeof SUPERVISOR_EVENTS)[number];
/** A row: the next state, and what the caller does once fire() accepted the event. */
export type Transition = readonly [to: SupervisorState, action: string];
/** A state that does not take an event: a no-op, logged at debug. */
export const IGNORED = '-';

const _ = IGNORED;
/** state x event -> next state + action. Complete by type: every cell is a row or IGNORED. */
export const TRANSITIONS: {
  readonly [S in SupervisorState]: { readonly [E in SupervisorEvent]: Transition | typeof IGNORED };
} = {
  idle: {
    desire: ['running', 'adopt the config (budgets reset), reconcile'],
    drained: ['idle', 'remember: the shutdown that follows need not drain'],
    stop: ['stopping', 'nothing to kill: end at once'],
    launch: _,
    launched: _,
    'launch-failed': _,
    'cold-stopped': _,
    retry: _,
    'retry-due': _,
    drain: _,
    'all-exited': _,
    'give-up': _,
  },
  running: {
    desire: ['running', 'adopt the config (budgets reset, rejection cleared), reconcile'],
    launch: ['launching', 'write, validate and spawn the target as the next epoch'],
    retry: ['backoff', 'spend one retry of the budget, arm the backoff timer'],
    'give-up': ['ended', 'drop the base id, end with code 1'],
    drained: ['running', 'remember: the shutdown that follows need not drain'],
    drain: ['draining', 'readiness off, drain the serving epoch, wait'],
    stop: ['stopping', 'SIGKILL every epoch'],
    launched: _,
    'launch-failed': _,
    'cold-stopped': _,
    'retry-due': _,
    'all-exited': _,
  },
  backoff: {
    desire: ['running', 'adopt the config (the retry is cancelled), reconcile'],
    'retry-due': ['running', 'reconcile'],
    drained: ['backoff', 'remember: the shutdown that follows need not drain'],
    drain: ['draining', 'cancel the retry, readiness off, drain the serving epoch, wait'],
    stop: ['stopping', 'cancel the retry, SIGKILL every epoch'],
    // retry: one is already due. give-up needs a retry asked for (none is, until this one is due) or a first
    // epoch failing twice (with nothing ever live at most one epoch runs, and it has just failed).
    launch: _,
    launched: _,
    'launch-failed': _,
    'cold-stopped': _,
    retry: _,
    'all-exited': _,
    'give-up': _,
  },
  launching: {
    desire: ['launching', 'adopt the config; the launch drops a config no longer wanted, reconcile follows it'],
    launched: ['running', 'reconcile'],
    'launch-failed': ['running', 'record the failure, then a retry on the launch budget'],
    retry: ['launching-backoff', 'spend one retry of the budget, arm the backoff timer; the launch goes on'],
    'give-up': ['ended', 'drop the base id, end with code 1 (the launch stops at its next step)'],
    drained: ['launching', 'remember: the shutdown that follows need not drain'],
    drain: ['draining', 'readiness off, drain the serving epoch, wait (the launch stops at its next step)'],
    stop: ['stopping', 'SIGKILL every epoch (the launch stops at its next step)'],
    // cold-stopped: no retry is due, so nothing to cancel.
    launch: _,
    'cold-stopped': _,
    'retry-due': _,
    'all-exited': _,
  },
  'launching-backoff': {
    desire: ['launching', 'adopt the config (the retry is cancelled); reconcile follows the launch'],
    launched: ['backoff', 'none: the retry is still due'],
    'launch-failed': ['backoff', 'record the failure; the retry already due covers it'],
    'cold-stopped': ['launching', "cancel the retry the stopped epochs' exits armed: this restart is deliberate"],
    'retry-due': ['launching', 'none: reconcile follows the launch'],
    drained: ['launching-backoff', 'remember: the shutdown that follows need not drain'],
    drain: ['draining', 'cancel the retry, readiness off, drain the serving epoch, wait'],
    stop: ['stopping', 'cancel the retry, SIGKILL every epoch'],
    // retry, give-up: as in backoff.
    launch: _,
    retry: _,
    'all-exited': _,
    'give-up': _,
  },
  draining: {
    stop: ['stopping', 'SIGKILL every epoch (the drain wait ends)'],
    // all-exited: the drain wait wakes on its own promise, then stops.
    desire: _,
    launch: _,
    launched: _,
    'launch-failed': _,
    'cold-stopped': _,
    retry: _,
    'retry-due': _,
    drained: _,
    drain: _,
    'all-exited': _,
    'give-up': _,
  },
  stopping: {
    'all-exited': ['ended', 'drop the base id, end with code 0'],
    desire: _,
    launch: _,
    launched: _,
    'launch-failed': _,
    'cold-stopped': _,
    retry: _,
    'retry-due': _,
    drained: _,
    drain: _,
    stop: _,
    'give-up': _,
  },
  ended: {
    desire: _,
    launch: _,
    launched: _,
    'launch-failed': _,
    'cold-stopped': _,
    retry: _,
    'retry-due': _,
    drained: _,
    drain: _,
    stop: _,
    'all-exited': _,
    'give-up': _,
  },
};

/** The states in which the backoff timer runs. */
const RETRY_DUE: ReadonlySet<SupervisorState> = new Set(['backoff', 'launching-backoff']);
const SHUTTING_DOWN: ReadonlySet<SupervisorState> = new Set(['draining', 'stopping', 'ended']);

const log = scope('supervisor');

export const RESTART_BUDGET = 10;
export const INITIAL_BACKOFF_MS = 200;
export const HEALTHY_RESET_MS = 60_000;
/** The stats liveFromStats reads: a readiness check asks for them beside its own. */
export const HOT_RESTART_EPOCH_STAT = 'server.hot_restart_epoch';
export const WORKERS_STARTED_STAT = 'listener_manager.workers_started';
export const LIVE_STATS = [HOT_RESTART_EPOCH_STAT, WORKERS_STARTED_STAT];

/** Everything that feeds one epoch. Two configs with the same hash are the same Envoy. */
export interface DesiredConfig {
  hash: string;
  bootstrap: Record<string, unknown>;
  binaryPath: string;
  admin: AdminAddress;
  /** Drain only inbound listeners on shutdown (sidecars). */
  inboundOnlyDrain: boolean;
  /** Already accepted by `envoy --mode validate` (the agent checks the first config before it starts). */
  validated?: boolean;
}

export type EpochState = 'starting' | 'live' | 'draining' | 'exited';

export interface LiveProbe {
  epoch: number;
  state: string;
  hotRestartVersion: string;
}

/** Every effect the supervisor has on the world, so its logic can run against a fake. */
export interface EnvoyRuntime {
  /** Writes envoy-rev<epoch>.json and returns its path. */
  writeBootstrap(epoch: number, cfg: DesiredConfig): string;
  removeBootstrap(file: string): void;
  /** undefined when Envoy accepts the file, else why not. */
  validate(cfg: DesiredConfig, file: string): Promise<string | undefined>;
  binaryHotRestartVersion(binary: string): Promise<string>;
  /** baseId undefined: epoch 0 with a dynamic base id. */
  spawn(epoch: number, cfg: DesiredConfig, file: string, baseId: number | undefined): EnvoyProcess;
  /** Why a process failed, from its output (may be empty). */
  failureReason(proc: EnvoyProcess): string;
  probe(admin: AdminAddress): Promise<LiveProbe | undefined>;
  /** The dynamic base id Envoy chose at epoch 0, once it has written it. */
  readBaseId(): number | undefined;
  clearBaseId(): void;
  isInitializing(baseId: number): boolean | undefined;
  clearInitializing(baseId: number): boolean;
  removeShm(baseId: number): void;
  drain(admin: AdminAddress, inboundOnly: boolean): Promise<void>;
  activeConnections(admin: AdminAddress): Promise<number>;
}

export interface SupervisorOptions {
  runtime: EnvoyRuntime;
  validate: boolean;
  terminationDrainMs: number;
  exitOnZeroActiveConnections: boolean;
  minimumDrainMs: number;
  maximumDrainMs: number;
  /** How often a starting epoch is probed. */
  probeIntervalMs?: number;
  /** Poll interval for active connections during an exit-on-zero drain. */
  connectionPollMs?: number;
  /** Drain wait before a cold restart (hot restart version changed). */
  coldRestartDrainMs?: number;
  /** A new epoch not live after this long, while an older one serves, is aborted and retried (0: never). */
  startTimeoutMs?: number;
  /** First retry delay; the n-th retry waits this x 2^n (default 200 ms, as Istio's agent did). */
  initialBackoffMs?: number;
  /** An epoch live this long restores the restart budget and backoff (default 1 min; 0: never). */
  healthyResetMs?: number;
  now?: () => number;
}

interface Epoch {
  n: number;
  /** The live check in flight, if any (the probe loop and readiness requests share it). */
  liveCheck?: Promise<void>;
  config: DesiredConfig;
  proc: EnvoyProcess;
  file: string;
  state: EpochState;
  startedAt: number;
  liveAt?: number;
  aborted: boolean;
  /** Killed by the agent because it did not go live in time: a failure, not an abort. */
  timedOut?: boolean;
  baseId?: number;
  /** From /server_info when the live check saw it; undefined when the epoch went live from its stats. */
  hotRestartVersion?: string;
}

export interface Failure {
  time: string;
  epoch?: number;
  configHash: string;
  reason: string;
}

export interface SupervisorMetrics {
  epochs_started_total: number;
  epochs_live_total: number;
  epoch_failures_total: number;
  configs_rejected_total: number;
  restart_budget_exhausted_total: number;
  cold_restarts_total: number;
}

export interface SupervisorEnd {
  code: number;
  reason: string;
}

export class Supervisor {
  private stateValue: SupervisorState = 'idle';
  private desired: DesiredConfig | undefined;
  private current: DesiredConfig | undefined;
  private readonly epochs = new Map<number, Epoch>();
  private budget = RESTART_BUDGET;
  /** Retries of launches that failed before Envoy ran (bootstrap write, spawn): not Envoy's budget. */
  private launchBudget = RESTART_BUDGET;
  /** The backoff timer, while the state is backoff or launching-backoff, and when it fires. */
  private retryTimer: NodeJS.Timeout | undefined;
  private retryAt: number | undefined;
  /** The desired config given up on (Envoy rejected it, or its budget is spent) until the next one. */
  private rejectedHash: string | undefined;
  private lastGood: DesiredConfig | undefined;
  /** How the first epoch failed, while nothing has gone live yet. */
  private startFailure: string | undefined;
  /**
   * Once per desired config: the last good config, relaunched to restore an admin port a failed hot-restart child
   * closed ('untried' until then, 'given-up' once its budget is spent).
   */
  private adminRestore: DesiredConfig | 'untried' | 'given-up' = 'untried';
  /** POST /drain drained Envoy (a preStop hook): the shutdown that follows need not drain again. */
  private drainedOnRequest = false;
  private baseId: number | undefined;
  private lastFailure: Failure | undefined;
  private readonly metricsData: SupervisorMetrics = {
    epochs_started_total: 0,
    epochs_live_total: 0,
    epoch_failures_total: 0,
    configs_rejected_total: 0,
    restart_budget_exhausted_total: 0,
    cold_restarts_total: 0,
  };
  private endResolve!: (end: SupervisorEnd) => void;
  /** Resolves once the supervisor is finished and every Envoy is gone. */
  readonly done: Promise<SupervisorEnd>;
  private readonly liveListeners: Array<(epoch: number) => void> = [];
  private readonly failedStartListeners: Array<(epoch: number, config: DesiredConfig) => void> = [];
  private readonly now: () => number;

  constructor(private readonly opts: SupervisorOptions) {
    this.now = opts.now ?? Date.now;
    this.done = new Promise((r) => (this.endResolve = r));
  }

  /** The supervisor's own state (see the table at the top). */
  get state(): SupervisorState {
    return this.stateValue;
  }

  private can(event: SupervisorEvent): boolean {
    return TRANSITIONS[this.stateValue][event] !== IGNORED;
  }

  /** The one way the state changes: looks the event up in the table, logs it; false when the state ignores it. */
  private fire(event: SupervisorEvent): boolean {
    const from = this.stateValue;
    const row = TRANSITIONS[from][event];
    if (row === IGNORED) {
      log.debug(`${event} ignored in state ${from}`);
      return false;
    }
    const [to, action] = row;
    this.stateValue = to;
    if (!RETRY_DUE.has(to) && this.retryTimer) {
      clearTimeout(this.retryTimer);
      this.retryTimer = undefined;
      this.retryAt = undefined;
    }
    log.debug(`state ${from} -> ${to} on ${event}: ${action}`);
    return true;
  }

  private shuttingDown(): boolean {
    return SHUTTING_DOWN.has(this.stateValue);
  }

  /** A new desired config: resets the budget and reconciles (a no-op when nothing changed or shutting down). */
  setDesired(cfg: DesiredConfig): void {
    if (this.desired?.hash === cfg.hash) return;
    if (!this.fire('desire')) return;
    log.info(`new desired config ${short(cfg.hash)}`);
    this.desired = cfg;
    this.budget = RESTART_BUDGET;
    this.launchBudget = RESTART_BUDGET;
    this.adminRestore = 'untried';
    this.rejectedHash = undefined;
    this.reconcile();
  }

  /** Envoy's listeners were drained on request (a preStop hook): the shutdown that follows need not drain again. */
  markDrained(): void {
    if (this.fire('drained')) this.drainedOnRequest = true;
  }

  onLive(fn: (epoch: number) => void): void {
    this.liveListeners.push(fn);
  }

  /** An epoch exited by itself before it went live (it is retried with backoff as usual). */
  onFailedStart(fn: (epoch: number, config: DesiredConfig) => void): void {
    this.failedStartListeners.push(fn);
  }

  /** Ready: the newest epoch that went live is still live, and the agent is not shutting down. */
  ready(): boolean {
    if (this.shuttingDown()) return false;
    const live = [...this.epochs.values()].filter((e) => e.liveAt !== undefined);
    if (live.length === 0) return false;
    return live.reduce((a, b) => (a.n > b.n ? a : b)).state === 'live';
  }

  /** The admin address of the newest live epoch (the one holding Envoy's admin port). */
  liveAdmin(): AdminAddress | undefined {
    return this.newestLive()?.config.admin;
  }

  /** The newest epoch that is starting (spawned, not yet live), if any. */
  newestStarting(): { n: number; config: DesiredConfig } | undefined {
    return this.newest('starting');
  }

  newestLive(): { n: number; config: DesiredConfig } | undefined {
    return this.newest('live');
  }

  private newest(state: EpochState): Epoch | undefined {
    let best: Epoch | undefined;
    for (const e of this.epochs.values()) if (e.state === state && (!best || e.n > best.n)) best = e;
    return best;
  }

  metrics(): SupervisorMetrics & { restart_budget_remaining: number; epochs_running: number } {
    return { ...this.metricsData, restart_budget_remaining: this.budget, epochs_running: this.epochs.size };
  }

  debugState(): Record<string, unknown> {
    return {
      epochs: [...this.epochs.values()]
        .sort((a, b) => a.n - b.n)
        .map((e) => ({
          epoch: e.n,
          pid: e.proc.pid,
          state: e.state,
          configHash: e.config.hash,
          startTime: new Date(e.startedAt).toISOString(),
          liveTime: e.liveAt === undefined ? null : new Date(e.liveAt).toISOString(),
          baseId: e.baseId ?? null,
        })),
      desiredConfigHash: this.desired?.hash ?? null,
      currentConfigHash: this.current?.hash ?? null,
      rejectedConfigHash: this.rejectedHash ?? null,
      restartBudgetLeft: this.budget,
      nextRetry: this.retryAt === undefined ? null : new Date(this.retryAt).toISOString(),
      baseId: this.baseId ?? null,
      lastFailure: this.lastFailure ?? null,
      shuttingDown: this.shuttingDown(),
    };
  }

  // ---- reconcile and launch ----

  /**
   * What should run: the desired config; once that was given up on (rejected, or its budget spent) and nothing
   * runs any more (the epoch serving the old config died), the last config that went live.
   */
  private target(): DesiredConfig | undefined {
    const want = this.desired;
    if (!want || this.rejectedHash !== want.hash) return want;
    if (this.epochs.size === 0) return this.lastGood;
    return typeof this.adminRestore === 'object' ? this.adminRestore : undefined;
  }

  /** Starts the target as the next epoch when it is not running; only in state running (the table's launch). */
  private reconcile(): void {
    if (!this.can('launch')) return;
    const want = this.target();
    if (!want || this.current?.hash === want.hash) return;
    const starting = [...this.epochs.values()].find((e) => e.state === 'starting');
    if (starting) {
      log.debug(`epoch ${starting.n} is still starting; the next epoch waits until it is live`);
      return;
    }
    this.fire('launch');
    this.launch(want).then(
      () => {
        this.fire('launched');
        this.reconcile();
      },
      (err: Error) => {
        // Writing the bootstrap or spawning failed (disk full, binary gone): retry with backoff, never in a loop,
        // and on a budget of its own, so a full disk does not leave a healthy Envoy none for its own crashes.
        this.fire('launch-failed');
        this.recordFailure(undefined, want.hash, `could not start a new epoch: ${err.message}`);
        this.scheduleRetry('launch');
      },
    );
  }

  private latestEpoch(): number {
    let max = -1;
    for (const n of this.epochs.keys()) max = Math.max(max, n);
    return max;
  }

  private async launch(cfg: DesiredConfig): Promise<void> {
    const rt = this.opts.runtime;
    let n = this.latestEpoch() + 1;
    let file = rt.writeBootstrap(n, cfg);
    // Both checks run Envoy once; run them side by side, they are independent.
    const versionCheck =
      n > 0 ? rt.binaryHotRestartVersion(cfg.binaryPath).catch((e: Error) => `unknown (${e.message})`) : undefined;
    if (this.opts.validate && !cfg.validated) {
      const problem = await rt.validate(cfg, file);
      if (this.shuttingDown() || this.target() !== cfg) {
        rt.removeBootstrap(file);
        return;
      }
      if (problem !== undefined) {
        rt.removeBootstrap(file);
        this.rejectedHash = cfg.hash;
        this.metricsData.configs_rejected_total++;
        this.recordFailure(
          n,
          cfg.hash,
          `Envoy rejected the new bootstrap; it was not launched and the running epoch keeps serving: ${problem}`,
        );
        return;
      }
    }
    if (versionCheck) {
      const parent = this.epochs.get(n - 1);
      // An epoch that went live from its stats (liveFromStats) has not said its hot restart version yet: asked now.
      if (parent && parent.hotRestartVersion === undefined) {
        const info = await rt.probe(parent.config.admin).catch(() => undefined);
        if (info?.epoch === parent.n) parent.hotRestartVersion = info.hotRestartVersion;
      }
      const want = await versionCheck;
      if (this.shuttingDown()) {
        rt.removeBootstrap(file);
        return;
      }
      if (parent?.hotRestartVersion && want !== parent.hotRestartVersion) {
        log.warn(
          `hot restart version of ${cfg.binaryPath} is ${want}, the running epoch ${n - 1} has ` +
            `${parent.hotRestartVersion}: they cannot hand over sockets, so draining and cold-restarting instead`,
        );
        this.metricsData.cold_restarts_total++;
        await this.drainAndStopAll(this.opts.coldRestartDrainMs ?? this.opts.terminationDrainMs);
        if (this.shuttingDown()) {
          rt.removeBootstrap(file);
          return;
        }
        rt.removeBootstrap(file);
        n = this.latestEpoch() + 1;
        file = rt.writeBootstrap(n, cfg);
      }
    }
    // Envoy allows at most three overlapping epochs: N-3 and older must be gone before N starts.
    for (const e of this.epochs.values()) {
      if (e.n <= n - 3) {
        log.warn(`epoch ${e.n} is still alive while epoch ${n} starts; killing it (at most three epochs may overlap)`);
        this.abort(e);
      }
    }
    this.spawnEpoch(n, cfg, file);
  }

  private spawnEpoch(n: number, cfg: DesiredConfig, file: string): void {
    const baseId = n === 0 ? undefined : this.baseId;
    if (n === 0) this.dropBaseId();
    const proc = this.opts.runtime.spawn(n, cfg, file, baseId);
    this.launchBudget = RESTART_BUDGET;
    const epoch: Epoch = {
      n,
      config: cfg,
      proc,
      file,
      state: 'starting',
      startedAt: this.now(),
      aborted: false,
      baseId,
    };
    this.epochs.set(n, epoch);
    this.current = cfg;
    this.metricsData.epochs_started_total++;
    const base = baseId === undefined ? 'dynamic base id' : `base id ${baseId}`;
    log.info(`epoch ${n} started (pid ${proc.pid}, config ${short(cfg.hash)}, ${base})`);
    void proc.exited.then((status) => this.onExit(epoch, status));
    void this.watchUntilLive(epoch);
  }

  private async watchUntilLive(e: Epoch): Promise<void> {
    const every = this.opts.probeIntervalMs ?? 50;
    while (e.state === 'starting' && this.stateValue !== 'stopping' && this.stateValue !== 'ended') {
      await sleep(every);
      if (e.state !== 'starting') return;
      if (this.startTimedOut(e)) return;
      await this.checkLive(e);
    }
  }

  /** One look at a starting epoch: marks it live once Envoy says LIVE and its workers have started. */
  private checkLive(e: Epoch): Promise<void> {
    e.liveCheck ??= (async () => {
      if (e.baseId === undefined) {
        const id = this.opts.runtime.readBaseId();
        if (id === undefined) return; // epoch N+1 will need the base id epoch 0 chose
        e.baseId = this.baseId = id;
      }
      const info = await this.opts.runtime.probe(e.config.admin).catch(() => undefined);
      if (!info || info.epoch !== e.n || info.state !== 'LIVE') return;
      // LIVE in /server_info comes before the child clears INITIALIZING (after workers started).
      if (this.opts.runtime.isInitializing(e.baseId) === true) return;
      if (e.state !== 'starting') return;
      this.markLive(e, info.hotRestartVersion);
    })().finally(() => (e.liveCheck = undefined));
    return e.liveCheck;
  }

  /**
   * The epoch starting with no other one alive (so Envoy's admin can only be its own), which a readiness check may
   * look at with one /stats request for both its liveness (liveFromStats) and its config.
   */
  startingAlone(): { n: number; config: DesiredConfig } | undefined {
    if (this.shuttingDown()) return undefined;
    const alive = [...this.epochs.values()].filter((e) => e.state !== 'exited');
    return alive.length === 1 && alive[0]!.state === 'starting' ? alive[0] : undefined;
  }

  /**
   * Marks the lone starting epoch n live from its own stats (LIVE_STATS, read in a request the caller made anyway),
   * as checkLive would from /server_info: the admin answering is epoch n's (server.hot_restart_epoch), its workers
   * have started (listener_manager.workers_started, set only after Envoy's init finished, so LIVE; the server.state
   * gauge is not kept current while Envoy starts), and the shared memory no longer says INITIALIZING. Its hot
   * restart version is asked for when a next epoch needs it.
   */
  liveFromStats(n: number, stats: Map<string, number> | undefined): void {
    const e = this.epochs.get(n);
    if (!e || e.state !== 'starting' || e !== this.startingAlone()) return;
    if (stats?.get(HOT_RESTART_EPOCH_STAT) !== n || stats.get(WORKERS_STARTED_STAT) !== 1) return;
    if (e.baseId === undefined) {
      const id = this.opts.runtime.readBaseId();
      if (id === undefined) return;
      e.baseId = this.baseId = id;
    }
    if (this.opts.runtime.isInitializing(e.baseId) === true) return;
    this.markLive(e, undefined);
  }

  /**
   * Looks now, rather than at the next probe tick, whether the starting epochs went live: a readiness request
   * asks, so the first ready answer does not wait up to a probe interval after Envoy is live.
   */
  async checkStartingNow(): Promise<void> {
    if (this.shuttingDown()) return;
    const starting = [...this.epochs.values()].filter((e) => e.state === 'starting');
    await Promise.all(starting.map((e) => this.checkLive(e)));
  }

  /**
   * A new epoch that neither goes live nor exits (waiting on a config it can never get) would hold Envoy's admin
   * port and block every later change. While an older epoch still serves, it is aborted after the start timeout
   * and handled like a child that died (retried with backoff). Epoch 0 with nothing serving may wait forever:
   * waiting for the control plane at boot is normal.
   */
  private startTimedOut(e: Epoch): boolean {
    const limit = this.opts.startTimeoutMs;
    if (!limit || this.now() - e.startedAt < limit) return false;
    if (![...this.epochs.values()].some((x) => x.n < e.n && x.state === 'live')) return false;
    log.warn(`epoch ${e.n} did not go live within ${limit} ms; aborting it, the serving epoch stays`);
    e.timedOut = true;
    e.proc.kill('SIGKILL');
    return true;
  }

  private markLive(e: Epoch, hotRestartVersion: string | undefined): void {
    e.state = 'live';
    e.liveAt = this.now();
    e.hotRestartVersion = hotRestartVersion;
    e.config.validated = true;
    this.lastGood = e.config;
    this.metricsData.epochs_live_total++;
    for (const other of this.epochs.values()) if (other.n < e.n && other.state === 'live') other.state = 'draining';
    log.info(`epoch ${e.n} is live after ${e.liveAt - e.startedAt} ms`);
    for (const fn of this.liveListeners) fn(e.n);
    this.armHealthyReset(e);
    this.reconcile();
  }

  private healthyResetMs(): number {
    return this.opts.healthyResetMs ?? HEALTHY_RESET_MS;
  }

  /**
   * Kubelet-style: an epoch that has stayed live for the reset duration proves Envoy recovered, so earlier
   * crashes no longer count. Without this, ten crashes spread over weeks end the agent, with outages doubling
   * up to minutes on the way. Restored only when nothing else is being retried (a broken new config keeps the
   * budget it has while an old epoch serves).
   */
  private armHealthyReset(e: Epoch): void {
    const ms = this.healthyResetMs();
    if (!ms) return;
    const t = setTimeout(() => {
      // Only in running: no shutdown, no retry due, no launch in flight.
      if (e.state !== 'live' || this.stateValue !== 'running') return;
      const want = this.target();
      if (want && this.current?.hash !== want.hash) return;
      if ([...this.epochs.values()].some((x) => x.n > e.n)) return;
      this.restoreBudget(`epoch ${e.n} has been live for ${ms} ms`);
    }, ms);
    t.unref();
  }

  private restoreBudget(why: string): void {
    if (this.budget === RESTART_BUDGET) return;
    this.budget = RESTART_BUDGET;
    log.info(`${why}: restart budget and backoff restored`);
  }

  // ---- exits ----

  private onExit(e: Epoch, status: ExitStatus): void {
    const wasLive = e.liveAt !== undefined;
    const wasSuperseded =
      e.state === 'draining' && [...this.epochs.values()].some((x) => x.n > e.n && x.state === 'live');
    e.state = 'exited';
    this.epochs.delete(e.n);
    this.opts.runtime.removeBootstrap(e.file);
    const newest = this.epochs.get(this.latestEpoch());
    this.current = newest?.config;
    const how = status.signal ? `signal ${status.signal}` : `code ${status.code}`;

    if (this.epochs.size === 0) for (const w of this.exitWaiters.splice(0)) w();
    if (this.shuttingDown()) {
      log.info(`epoch ${e.n} exited (${how})`);
      this.endIfAllExited();
      return;
    }
    if (e.aborted) {
      log.info(`epoch ${e.n} aborted (${how})`);
      this.scheduleRetry();
      return;
    }
    if (wasSuperseded) {
      // A parent that was already handing over: its death changes nothing for the live child, so unlike the
      // seed's design the others are not aborted (that would turn a parent's crash into an outage).
      if (status.code !== 0) log.warn(`draining epoch ${e.n} exited (${how}); epoch ${newest?.n} keeps serving`);
      else log.info(`epoch ${e.n} exited normally`);
      this.reconcile();
      return;
    }
    // An epoch that served for the reset duration before it died starts the count afresh (the timer may not
    // have restored it when a retry was pending at that moment).
    const ms = this.healthyResetMs();
    const servedMs = wasLive ? this.now() - e.liveAt! : 0;
    if (wasLive && ms && servedMs >= ms) this.restoreBudget(`epoch ${e.n} had been live for ${servedMs} ms`);
    if (status.code === 0 && wasLive) {
      // Istio's agent treats this as "done". The agent's job is to keep Envoy up, and it stops Envoy itself
      // (SIGTERM, its own /quitquitquit), so a serving Envoy that quits (someone POSTed its admin /quitquitquit,
      // or a drain without skip_exit) is an outage to recover from, budget and backoff included.
      this.recordFailure(
        e.n,
        e.config.hash,
        `epoch ${e.n} exited with code 0 without the agent asking ` +
          "(Envoy's own admin /quitquitquit?); restarting it (the agent stops Envoy only on SIGTERM/SIGINT or its " +
          'own /quitquitquit)',
      );
      for (const other of this.epochs.values()) this.abort(other);
    } else {
      if (!wasLive) for (const fn of this.failedStartListeners) fn(e.n, e.config);
      const reason = this.opts.runtime.failureReason(e.proc);
      const anyLive = [...this.epochs.values()].some((x) => x.liveAt !== undefined && x.state !== 'exited');
      if (!wasLive && anyLive) {
        // A failed hot restart: the parent keeps serving. Clear the flag the dead child left in shared memory.
        if (e.baseId !== undefined && !this.opts.runtime.clearInitializing(e.baseId)) {
          log.warn(`could not clear the INITIALIZING flag of base id ${e.baseId}; the next hot restart may be refused`);
        }
        const what = e.timedOut
          ? `did not go live within ${this.opts.startTimeoutMs} ms`
          : `exited (${how}) before it went live`;
        const why = reason && !e.timedOut ? `: ${reason}` : '';
        this.recordFailure(e.n, e.config.hash, `new epoch ${e.n} ${what}; epoch ${newest?.n} keeps serving${why}`);
      } else if (!wasLive && this.lastGood === undefined) {
        // Nothing has ever gone live: Envoy cannot start at all (a binary that exits at once, a port taken).
        // Once to tell a passing hiccup from that; the same failure again is a start-up error, not ten restarts.
        const what =
          `Envoy epoch ${e.n} exited (${how}) before it ever went live` + (reason ? `: ${reason}` : ' (no output)');
        // Ignoring numbers (pids, base ids) and the marker protobuf randomly puts in its debug strings.
        const signature = `${how}\0${reason.replace(/goo\.gle\/debug\w*/g, '').replace(/\d+/g, 'N')}`;
        if (this.startFailure === signature) {
          this.recordFailure(e.n, e.config.hash, `${what}; it failed the same way twice, giving up`);
          if (this.fire('give-up')) this.end(1, `Envoy cannot start: ${what}`);
          return;
        }
        this.startFailure = signature;
        this.recordFailure(e.n, e.config.hash, `${what}; trying once more (the same failure again ends the agent)`);
      } else {
        this.recordFailure(
          e.n,
          e.config.hash,
          `epoch ${e.n} exited abnormally (${how})${reason ? `: ${reason}` : ''}; aborting the other epochs`,
        );
        for (const other of this.epochs.values()) this.abort(other);
      }
    }
    this.scheduleRetry();
  }

  /** A failure: arms the backoff timer (the table's retry), or, when the budget is spent, gives up. */
  private scheduleRetry(kind: 'envoy' | 'launch' = 'envoy'): void {
    if (!this.can('retry')) return; // a retry is already due, or shutting down
    const want = this.target();
    if (want && this.current?.hash === want.hash) return;
    const left = kind === 'launch' ? this.launchBudget : this.budget;
    if (left <= 0) {
      this.metricsData.restart_budget_exhausted_total++;
      if (this.epochs.size === 0) {
        log.error('restart budget spent and no Envoy is running; giving up');
        if (this.fire('give-up')) this.end(1, 'restart budget spent with no Envoy running');
        return;
      }
      const serving = this.newestLive();
      if (want && want === this.adminRestore) {
        this.adminRestore = 'given-up';
        this.recordFailure(
          undefined,
          want.hash,
          `could not restore the admin port; epoch ${serving?.n} keeps serving without it until the next change`,
        );
        return;
      }
      if (want) this.rejectedHash = want.hash;
      this.recordFailure(
        undefined,
        want?.hash ?? '',
        `restart budget spent for config ${short(want?.hash ?? '')}; ` +
          `epoch ${serving?.n} keeps serving the last good config until the next change`,
      );
      if (serving) this.checkAdmin(serving);
      return;
    }
    const delay = (this.opts.initialBackoffMs ?? INITIAL_BACKOFF_MS) * 2 ** (RESTART_BUDGET - left);
    if (kind === 'launch') this.launchBudget--;
    else this.budget--;
    log.info(
      kind === 'launch'
        ? `retrying the launch in ${delay} ms (${this.launchBudget} retries left)`
        : `restarting in ${delay} ms (restart budget left ${this.budget})`,
    );
    this.fire('retry');
    this.retryAt = this.now() + delay;
    this.retryTimer = setTimeout(() => {
      this.retryTimer = undefined;
      this.retryAt = undefined;
      this.fire('retry-due');
      this.reconcile();
    }, delay);
  }

  /**
   * Envoy's hot restart asks the parent to close its admin listener before the child opens its own; a child that
   * then fails leaves the serving parent without one (no scrape, no drain on SIGTERM, no readiness check). Once the
   * new config is given up on, the last good config is started once more as a new epoch, which brings it back.
   */
  private checkAdmin(serving: { n: number; config: DesiredConfig }): void {
    if (this.adminRestore !== 'untried' || !this.lastGood) return;
    this.opts.runtime.probe(serving.config.admin).then(
      () => undefined,
      (err: NodeJS.ErrnoException) => {
        // Refused on TCP; on the admin's Unix socket (ENVOY_ADMIN_MODE=uds) also a socket file that is gone.
        if (err?.code !== 'ECONNREFUSED' && err?.code !== 'ENOENT') return;
        if (this.shuttingDown() || this.adminRestore !== 'untried' || !this.lastGood) return;
        log.warn(
          `epoch ${serving.n} serves without its admin port (a failed hot restart closed it); starting the ` +
            'last good config as a new epoch to restore it',
        );
        this.adminRestore = { ...this.lastGood, hash: `${this.lastGood.hash}+admin` };
        this.reconcile();
      },
    );
  }

  private abort(e: Epoch): void {
    if (e.state === 'exited') return;
    e.aborted = true;
    e.proc.kill('SIGKILL');
  }

  private recordFailure(epoch: number | undefined, configHash: string, reason: string): void {
    this.metricsData.epoch_failures_total++;
    this.lastFailure = { time: new Date(this.now()).toISOString(), epoch, configHash, reason };
    log.error(reason);
  }

  // ---- shutdown ----

  /**
   * graceful: readiness off, drain the live epoch's listeners, wait terminationDrainDuration (or, with
   * EXIT_ON_ZERO_ACTIVE_CONNECTIONS, until connections reach zero, between the minimum and the cap), then SIGKILL.
   * A second call, or graceful false, kills at once; once stopping or ended, a call only returns `done`.
   */
  async shutdown(graceful: boolean, why: string): Promise<SupervisorEnd> {
    switch (this.stateValue) {
      case 'stopping':
      case 'ended':
        return this.done;
      case 'draining':
        log.warn(`${why}: killing Envoy now`);
        this.killAll();
        return this.done;
      default:
    }
    if (graceful && this.drainedOnRequest) {
      log.info(`${why}: Envoy was already drained by POST /drain; stopping it now`);
      graceful = false;
    }
    log.info(`${why}: shutting down${graceful ? ' gracefully' : ''}`);
    const drain = graceful && this.epochs.size > 0 && this.fire('drain');
    for (const e of this.epochs.values()) if (e.state === 'live') e.state = 'draining';
    if (drain) await this.drainWait();
    this.killAll();
    return this.done;
  }

  private async drainWait(): Promise<void> {
    const serving = [...this.epochs.values()].filter((e) => e.liveAt !== undefined).sort((a, b) => b.n - a.n)[0];
    if (!serving) return; // nothing ever served traffic: nothing to drain
    await this.opts.runtime.drain(serving.config.admin, serving.config.inboundOnlyDrain).then(
      () => log.info(`asked epoch ${serving.n} to drain its listeners`),
      (err: Error) => log.warn(`could not ask Envoy to drain: ${err.message}`),
    );
    const allExited = this.allExited();
    if (!this.opts.exitOnZeroActiveConnections) {
      await Promise.race([sleep(this.opts.terminationDrainMs), allExited]);
      return;
    }
    const deadline = this.now() + this.opts.maximumDrainMs;
    await Promise.race([sleep(this.opts.minimumDrainMs), allExited]);
    let errors = 0;
    // A second signal moves the state on to stopping, which ends this loop.
    while (this.stateValue === 'draining' && this.epochs.size > 0 && this.now() < deadline) {
      try {
        const active = await this.opts.runtime.activeConnections(serving.config.admin);
        errors = 0;
        if (active === 0) {
          log.info('no active downstream connections left; ending the drain');
          return;
        }
        log.debug(`${active} downstream connections still active`);
      } catch (err) {
        if (++errors >= 5) {
          log.warn(`could not read active connections 5 times in a row (${(err as Error).message}); ending the drain`);
          return;
        }
      }
      const pause = Math.min(this.opts.connectionPollMs ?? 1000, Math.max(0, deadline - this.now()));
      await Promise.race([sleep(pause), allExited]);
    }
    if (this.epochs.size > 0 && this.now() >= deadline) {
      log.warn(`drain cap of ${this.opts.maximumDrainMs} ms reached with connections still open`);
    }
  }

  /** Synchronous last resort (process exit): SIGKILL every epoch, whatever the state. */
  killAllNow(): void {
    for (const e of this.epochs.values()) e.proc.kill('SIGKILL');
  }

  private readonly exitWaiters: Array<() => void> = [];

  /** Resolves once no epoch is running (Envoy may exit by itself during a drain). */
  private allExited(): Promise<void> {
    if (this.epochs.size === 0) return Promise.resolve();
    return new Promise((r) => this.exitWaiters.push(r));
  }

  private killAll(): void {
    if (!this.fire('stop')) return;
    for (const e of this.epochs.values()) this.abort(e);
    this.endIfAllExited();
  }

  private endIfAllExited(): void {
    if (this.epochs.size === 0 && this.fire('all-exited')) this.end(0, 'shut down');
  }

  /** For a cold restart: drain the live epochs, wait, and stop them all (the agent keeps running). */
  private async drainAndStopAll(waitMs: number): Promise<void> {
    const serving = this.newestLive();
    if (serving) {
      await this.opts.runtime
        .drain(serving.config.admin, false)
        .catch((err: Error) => log.warn(`could not drain before the cold restart: ${err.message}`));
      await sleep(waitMs);
    }
    const gone = [...this.epochs.values()].map((e) => {
      this.abort(e);
      return e.proc.exited;
    });
    await Promise.all(gone);
    // onExit ran for each and may have armed a retry: this restart is deliberate, the table cancels it.
    this.fire('cold-stopped');
  }

  /**
   * The shared memory of the base id epoch 0 chose goes with it (Envoy never unlinks it). An epoch 0 that died
   * before the supervisor read its base id file still wrote it: read it now, or the segment leaks.
   */
  private dropBaseId(): void {
    const id = this.baseId ?? this.opts.runtime.readBaseId();
    if (id !== undefined) this.opts.runtime.removeShm(id);
    this.baseId = undefined;
    this.opts.runtime.clearBaseId();
  }

  /** The action of the rows into ended (after fire() took give-up or all-exited). */
  private end(code: number, reason: string): void {
    this.dropBaseId();
    this.endResolve({ code, reason });
  }
}

function short(hash: string): string {
  return hash.slice(0, 12);
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
