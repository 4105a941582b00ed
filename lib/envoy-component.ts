// Envoy as a component: the epoch supervisor with the real runtime, the desired config built from a resolved
// config, and what Envoy contributes to the status server (lifecycle routes, readiness, metrics, its stats text).

import type { Registry } from './prom';
import { json, type Component, type Condition, type StatusRoute } from './component';
import * as admin from './envoy-admin';
import {
  binaryIdentity,
  makeDesiredConfig,
  RealEnvoyRuntime,
  removeStaleHotRestartState,
  sweepOrphanedShm,
  type EnvoyDesiredConfig,
} from './envoy-runtime';
import type { Env } from './env';
import * as envs from './env';
import { AgentError, configError } from './errors';
import { adminSocketUnreachable } from './envoy-process';
import { fingerprint, referencedFiles } from './file-watcher';
import { collectStartupGarbage } from './heap';
import { scope } from './log';
import type { MetricsSource } from './metrics';
import type { Resolved } from './resolve';
import { LIVE_STATS, Supervisor, type DesiredConfig, type SupervisorEnd } from './supervisor';

const log = scope('agent');

const CDS_UPDATES = 'cluster_manager.cds.update_success';
const LDS_UPDATES = 'listener_manager.lds.update_success';

const needsXdsConfig = (b: Record<string, unknown>) => {
  const dr = b.dynamic_resources as Record<string, unknown> | undefined;
  return Boolean(dr && (dr.lds_config || dr.cds_config));
};

export class EnvoyComponent implements Component {
  readonly name = 'Envoy';
  readonly closed: Promise<Error | undefined>;
  /** How the supervisor ended (its exit code and reason), once it has. */
  readonly done: Promise<SupervisorEnd>;
  private readonly runtime: RealEnvoyRuntime;
  private readonly supervisor: Supervisor;
  private first: EnvoyDesiredConfig;
  private xdsConfigSeen = false;
  private readinessCheck: Promise<Condition> | undefined;
  private announcedLive = false;
  private endRejected!: (end: SupervisorEnd) => void;
  private diagnosis: Promise<SupervisorEnd | undefined> | undefined;

  constructor(private readonly o: { resolved: Resolved; env: Env; startedAt: number }) {
    const { cfg } = o.resolved;
    this.runtime = new RealEnvoyRuntime(cfg, o.env as NodeJS.ProcessEnv);
    const blind = cfg.envoyAdminSocket
      ? adminSocketUnreachable(this.runtime.credentials, process.getuid?.() ?? -1)
      : undefined;
    if (blind)
      throw configError(envs.ENVOY_ADMIN_MODE.name, cfg.sources[envs.ENVOY_ADMIN_MODE.name] ?? 'environment', blind);
    this.supervisor = new Supervisor({
      runtime: this.runtime,
      validate: envs.ENVOY_VALIDATE_BEFORE_RESTART.get(o.env),
      terminationDrainMs: cfg.proxy.terminationDrainDuration,
      exitOnZeroActiveConnections: cfg.exitOnZeroActiveConnections,
      minimumDrainMs: cfg.minimumDrainDuration,
      maximumDrainMs: cfg.maximumDrainDuration,
      initialBackoffMs: envs.ENVOY_RESTART_INITIAL_BACKOFF.get(o.env),
      startTimeoutMs: envs.ENVOY_START_TIMEOUT.get(o.env),
      healthyResetMs: envs.ENVOY_HEALTHY_RESET_DURATION.get(o.env),
    });
    // The first bootstrap is not validated before Envoy's spawn (ENVOY_VALIDATE_FIRST_BOOTSTRAP): Envoy's own
    // start is the check, and only when it fails is the config diagnosed, ending the agent if Envoy rejects it.
    const firstRejected = new Promise<SupervisorEnd>((r) => (this.endRejected = r));
    // The supervisor may end on a repeated failure while the diagnosis runs: its verdict names the cause better.
    this.done = Promise.race([
      this.supervisor.done.then(async (end) => (await this.diagnosis) ?? end),
      firstRejected,
    ]).finally(() => this.runtime.removeAdminSocket());
    this.supervisor.onFailedStart((_n, config) => {
      if (config === this.first && !this.announcedLive) this.diagnoseFirst();
    });
    this.closed = this.done.then((end) => (end.code === 0 ? undefined : new Error(end.reason)));
    this.supervisor.onLive((n) => {
      // Only the first epoch ever to go live measures start-up; a later epoch 0 is a recovery.
      if (n !== 0 || this.announcedLive) return;
      this.announcedLive = true;
      const tries = this.supervisor.metrics().epochs_started_total;
      const after = `Envoy is live ${Date.now() - o.startedAt} ms after the agent started`;
      log.info(tries > 1 ? `${after}, at its ${ordinal(tries)} start (the earlier ones failed)` : after);
      // Start-up is over: one full collection returns what only it needed (see lib/heap.ts).
      setTimeout(collectStartupGarbage, 1000).unref();
    });
    removeStaleHotRestartState(cfg);
    this.first = this.desiredFrom(o.resolved, 0);
  }

  private desiredFrom(r: Resolved, generation: number): EnvoyDesiredConfig {
    return makeDesiredConfig({
      cfg: r.cfg,
      bootstrap: r.bootstrap,
      ipv6: r.node.ipv6,
      coreDump: envs.ISTIO_ENVOY_ENABLE_CORE_DUMP.get(this.o.env),
      binaryId: binaryIdentity(r.cfg.proxy.binaryPath),
      generation,
      filesId: [...referencedFiles(r.bootstrap)]
        .sort()
        .map((p) => `${p}=${fingerprint({ path: p, mode: 'content' })}`)
        .join('\n'),
    });
  }

  /**
   * Checks the first bootstrap with `envoy --mode validate` before anything starts: a bootstrap Envoy rejects, or
   * a binary that cannot run, is a start-up error. Returns a promise so it runs while the other modules load.
   */
  async validateFirst(): Promise<void> {
    if (!envs.ENVOY_VALIDATE_BEFORE_RESTART.get(this.o.env)) return;
    // Off by default: it costs Envoy's whole start-up (validate mode) before the spawn; see diagnoseFirst().
    if (!envs.ENVOY_VALIDATE_FIRST_BOOTSTRAP.get(this.o.env)) {
      this.first.validated = true;
      return;
    }
    const { cfg } = this.o.resolved;
    const file = this.runtime.writeBootstrap(0, this.first);
    let problem: string | undefined;
    try {
      problem = await this.runtime.validate(this.first, file);
    } catch (err) {
      throw new AgentError(
        'ENVOY_MISSING',
        `invalid binaryPath (from ${cfg.sources.binaryPath}): ${(err as Error).message}`,
      );
    } finally {
      this.runtime.removeBootstrap(file);
    }
    if (problem !== undefined)
      throw new AgentError('CONFIG_INVALID', `Envoy rejects the bootstrap built from this config: ${problem}`);
    this.first.validated = true;
  }

  /**
   * The first Envoy exited before it went live: if `envoy --mode validate` rejects the first bootstrap (or the
   * binary cannot run) no retry can help, so the agent ends with the same error validateFirst() would have given.
   * Anything else (a port in use, a crash) is retried by the supervisor as usual.
   */
  private diagnoseFirst(): void {
    if (this.diagnosis || !envs.ENVOY_VALIDATE_BEFORE_RESTART.get(this.o.env)) return;
    this.diagnosis = this.diagnose().then((reason) => {
      if (reason === undefined) return undefined;
      log.error(reason);
      const end = { code: 1, reason };
      this.endRejected(end);
      return end;
    });
  }

  private async diagnose(): Promise<string | undefined> {
    const { cfg } = this.o.resolved;
    // Epoch -1: a file name no epoch uses, so a retry the supervisor starts meanwhile is not disturbed.
    const file = this.runtime.writeBootstrap(-1, this.first);
    try {
      const problem = await this.runtime.validate(this.first, file);
      return problem === undefined ? undefined : `Envoy rejects the bootstrap built from this config: ${problem}`;
    } catch (err) {
      return `invalid binaryPath (from ${cfg.sources.binaryPath}): ${(err as Error).message}`;
    } finally {
      this.runtime.removeBootstrap(file);
    }
  }

  async start(): Promise<void> {
    await sweepOrphanedShm();
    this.supervisor.setDesired(this.first);
  }

  /** A new resolved config (file change, SIGHUP): a new epoch if anything Envoy sees changed. */
  setDesired(r: Resolved, generation: number): void {
    this.supervisor.setDesired(this.desiredFrom(r, generation));
  }

  /** SIGTERM/SIGINT: drain, then stop (graceful); /quitquitquit or a failing component: stop now. */
  shutdown(graceful: boolean, why: string): Promise<SupervisorEnd> {
    return this.supervisor.shutdown(graceful, why);
  }

  async close(): Promise<void> {
    await this.supervisor.shutdown(false, 'agent closing');
  }

  /** Envoy dies with the agent (PR_SET_PDEATHSIG); this also covers an agent that exits through a crash. */
  killAllNow(): void {
    this.supervisor.killAllNow();
  }

  routes(): StatusRoute[] {
    return [
      {
        method: 'POST',
        path: '/quitquitquit',
        localOnly: true,
        handler: () => {
          setImmediate(() => void this.supervisor.shutdown(false, 'POST /quitquitquit'));
          return { status: 200, body: 'OK\n' };
        },
      },
      {
        method: 'POST',
        path: '/drain',
        localOnly: true,
        handler: async () => {
          const live = this.supervisor.newestLive();
          if (!live) return { status: 503, body: 'no live Envoy to drain\n' };
          await admin.drainListeners(live.config.admin, { inboundOnly: live.config.inboundOnlyDrain, skipExit: true });
          this.supervisor.markDrained();
          return { status: 200, body: 'OK\n' };
        },
      },
      { method: 'GET', path: '/debug/epochs', handler: () => json(this.supervisor.debugState()) },
    ];
  }

  /**
   * Envoy is live (the newest epoch that went live still is, and it answers its own /ready now: a stopped or hung
   * Envoy is not ready), and, when its bootstrap asks for xDS, it has had its first CDS and LDS update.
   *
   * Requests that arrive together share one look: when Envoy's workers start, the probes queued on its 15021
   * listener all reach the status server at once, and each asking Envoy's admin (on Envoy's main thread, busy then)
   * for the same answers slowed every one of them.
   */
  readiness(): Promise<Condition> {
    this.readinessCheck ??= this.checkReadiness().finally(() => (this.readinessCheck = undefined));
    return this.readinessCheck;
  }

  private async checkReadiness(): Promise<Condition> {
    const notLive = { ready: false, reason: 'Envoy is not live (starting, restarting or draining)' };
    let early: { n: number; look: Promise<Condition> } | undefined;
    if (!this.supervisor.ready()) {
      // The first Envoy, with nothing else alive: one /stats request says both whether it is live and whether it
      // has its first config (Envoy's main thread, busy as its workers start, answers one request, not three).
      const alone = this.xdsConfigSeen ? undefined : this.supervisor.startingAlone();
      if (alone) return this.firstLook(alone.n, alone.config, notLive);
      // Otherwise Envoy's own answers are asked for beside the supervisor's live check, not after it: the first
      // ready answer is one admin round trip, not two.
      const starting = this.xdsConfigSeen ? undefined : this.supervisor.newestStarting();
      if (starting) early = { n: starting.n, look: this.look(starting.config) };
      await this.supervisor.checkStartingNow();
      if (!this.supervisor.ready()) return notLive;
    }
    const live = this.supervisor.newestLive();
    if (!live) return notLive;
    return early?.n === live.n ? early.look : this.look(live.config);
  }

  /** The lone starting epoch's liveness and first config, from one /stats request (see Supervisor.liveFromStats). */
  private async firstLook(n: number, config: DesiredConfig, notLive: Condition): Promise<Condition> {
    const xds = needsXdsConfig(config.bootstrap);
    const names = xds ? [...LIVE_STATS, CDS_UPDATES, LDS_UPDATES] : LIVE_STATS;
    const stats = await admin.statValues(config.admin, names).catch(() => undefined);
    this.supervisor.liveFromStats(n, stats);
    const live = this.supervisor.newestLive();
    if (!this.supervisor.ready() || live?.n !== n) return notLive;
    return xds && !this.xdsConfigSeen ? this.configFrom(stats) : { ready: true, reason: '' };
  }

  /** Ready once Envoy has had its first CDS and LDS update (remembered: later looks ask /ready only). */
  private configFrom(stats: Map<string, number> | undefined): Condition {
    const cds = stats?.get(CDS_UPDATES) ?? 0;
    const lds = stats?.get(LDS_UPDATES) ?? 0;
    if (!cds || !lds)
      return { ready: false, reason: `Envoy has no config from xDS yet (cds updates ${cds}, lds updates ${lds})` };
    this.xdsConfigSeen = true;
    return { ready: true, reason: '' };
  }

  /** Envoy's own /ready now and, until they are first seen, its first CDS and LDS updates (asked together). */
  private async look(config: DesiredConfig): Promise<Condition> {
    const configStats =
      this.xdsConfigSeen || !needsXdsConfig(config.bootstrap)
        ? undefined
        : admin.statValues(config.admin, [CDS_UPDATES, LDS_UPDATES]).catch(() => undefined);
    const r = await admin
      .adminRequest(config.admin, 'GET', '/ready', 1000)
      .catch((err: NodeJS.ErrnoException) => ({ status: 0, body: err.message, code: err.code }));
    // A hot-restart child that fails after the parent closed its admin listener (Envoy's protocol asks the parent to
    // close it) leaves the serving parent without one until the supervisor restores it: it still serves traffic, so
    // that is not unreadiness. A stopped or hung Envoy still accepts the connection and never answers: that is.
    const adminGone = 'code' in r && admin.adminAbsent(r) && this.supervisor.debugState().lastFailure !== null;
    if (r.status !== 200 && !adminGone) {
      return {
        ready: false,
        reason:
          r.status === 0
            ? `Envoy does not answer on its admin ${'socketPath' in config.admin ? `socket ${config.admin.socketPath}` : 'port'}: ${r.body}`
            : `Envoy's /ready answered ${r.status} ${r.body.trim()}`,
      };
    }
    if (configStats && !this.xdsConfigSeen) return this.configFrom(await configStats);
    return { ready: true, reason: '' };
  }

  registerMetrics(registry: Registry): void {
    // Required here, after Envoy's spawn: starting Envoy does not need prom-client.
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const { gaugeFrom, registerCounters } = require('./metrics') as typeof import('./metrics');
    registerCounters(
      registry,
      'istio_agent_envoy_',
      'Envoy supervisor',
      () => this.supervisor.metrics() as unknown as Record<string, number>,
    );
    gaugeFrom(registry, 'istio_agent_ready', 'Whether the newest Envoy epoch that went live is still live', () =>
      this.supervisor.ready() ? 1 : 0,
    );
  }

  /** Envoy's own Prometheus text, for the merged /stats/prometheus. */
  readonly statsSource: MetricsSource = {
    name: 'envoy',
    type: 'envoy',
    scrape: async () => {
      const live = this.supervisor.newestLive();
      if (!live) return { ok: false, reason: 'no live Envoy' };
      const r = await admin.adminRequest(live.config.admin, 'GET', '/stats/prometheus', 2000);
      return r.status === 200
        ? { ok: true, text: r.body, format: 'text' }
        : { ok: false, reason: `Envoy's /stats/prometheus answered ${r.status}` };
    },
  };
}

function ordinal(n: number): string {
  const suffix = n % 100 >= 11 && n % 100 <= 13 ? 'th' : (['th', 'st', 'nd', 'rd'][n % 10] ?? 'th');
  return `${n}${suffix}`;
}
