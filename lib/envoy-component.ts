// Envoy as a component: the epoch supervisor with the real runtime, the desired config built from a resolved
// config, and what Envoy contributes to the status server (lifecycle routes, readiness, metrics, its stats text).

import type { Registry } from 'prom-client';
import type { Component, Condition, StatusRoute } from './component';
import * as admin from './envoy-admin';
import { binaryIdentity, makeDesiredConfig, RealEnvoyRuntime, removeStaleHotRestartState, type EnvoyDesiredConfig } from './envoy-runtime';
import type { Env } from './env';
import * as envs from './env';
import { AgentError } from './errors';
import { fingerprint, referencedFiles } from './file-watcher';
import { scope } from './log';
import { gaugeFrom, registerCounters, type MetricsSource } from './metrics';
import type { Resolved } from './resolve';
import { json } from './status-server';
import { Supervisor, type SupervisorEnd } from './supervisor';

const log = scope('agent');

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
  private announcedLive = false;

  constructor(private readonly o: { resolved: Resolved; env: Env; startedAt: number }) {
    const { cfg } = o.resolved;
    this.runtime = new RealEnvoyRuntime(cfg, o.env as NodeJS.ProcessEnv);
    this.supervisor = new Supervisor({
      runtime: this.runtime,
      validate: envs.ENVOY_VALIDATE_BEFORE_RESTART.get(o.env),
      terminationDrainMs: cfg.proxy.terminationDrainDuration,
      exitOnZeroActiveConnections: cfg.exitOnZeroActiveConnections,
      minimumDrainMs: cfg.minimumDrainDuration,
      maximumDrainMs: cfg.maximumDrainDuration,
      initialBackoffMs: envs.ENVOY_RESTART_INITIAL_BACKOFF.get(o.env),
      startTimeoutMs: envs.ENVOY_START_TIMEOUT.get(o.env),
    });
    this.done = this.supervisor.done;
    this.closed = this.done.then((end) => (end.code === 0 ? undefined : new Error(end.reason)));
    this.supervisor.onLive((n) => {
      // Only the first epoch ever to go live measures start-up; a later epoch 0 is a recovery.
      if (n !== 0 || this.announcedLive) return;
      this.announcedLive = true;
      log.info(`Envoy is live ${Date.now() - o.startedAt} ms after the agent started`);
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
      filesId: [...referencedFiles(r.bootstrap)].sort().map((p) => `${p}=${fingerprint({ path: p, mode: 'content' })}`).join('\n'),
    });
  }

  /**
   * Checks the first bootstrap with `envoy --mode validate` before anything starts: a bootstrap Envoy rejects, or
   * a binary that cannot run, is a start-up error. Returns a promise so it runs while the other modules load.
   */
  async validateFirst(): Promise<void> {
    if (!envs.ENVOY_VALIDATE_BEFORE_RESTART.get(this.o.env)) return;
    const { cfg } = this.o.resolved;
    const file = this.runtime.writeBootstrap(0, this.first);
    let problem: string | undefined;
    try {
      problem = await this.runtime.validate(this.first, file);
    } catch (err) {
      throw new AgentError('ENVOY_MISSING', `invalid binaryPath (from ${cfg.sources.binaryPath}): ${(err as Error).message}`);
    } finally {
      this.runtime.removeBootstrap(file);
    }
    if (problem !== undefined) throw new AgentError('CONFIG_INVALID', `Envoy rejects the bootstrap built from this config: ${problem}`);
    this.first.validated = true;
  }

  async start(): Promise<void> {
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
        method: 'POST', path: '/quitquitquit', localOnly: true,
        handler: () => {
          setImmediate(() => void this.supervisor.shutdown(false, 'POST /quitquitquit'));
          return { status: 200, body: 'OK\n' };
        },
      },
      {
        method: 'POST', path: '/drain', localOnly: true,
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
   */
  async readiness(): Promise<Condition> {
    if (!this.supervisor.ready()) return { ready: false, reason: 'Envoy is not live (starting, restarting or draining)' };
    const live = this.supervisor.newestLive();
    if (!live) return { ready: false, reason: 'Envoy is not live (starting, restarting or draining)' };
    const r = await admin.adminRequest(live.config.admin, 'GET', '/ready', 1000).catch((err: NodeJS.ErrnoException) => ({ status: 0, body: err.message, code: err.code }));
    // A hot-restart child that fails after the parent closed its admin listener (Envoy's protocol asks the parent to
    // close it) leaves the serving parent without one: it still serves traffic, so that is not unreadiness. A
    // stopped or hung Envoy still accepts the connection and never answers: that is.
    const adminGone = 'code' in r && r.code === 'ECONNREFUSED' && this.supervisor.debugState().lastFailure !== null;
    if (r.status !== 200 && !adminGone) {
      return { ready: false, reason: r.status === 0 ? `Envoy does not answer on its admin port: ${r.body}` : `Envoy's /ready answered ${r.status} ${r.body.trim()}` };
    }
    if (!this.xdsConfigSeen && needsXdsConfig(live.config.bootstrap)) {
      const [cds, lds] = await Promise.all([
        admin.statValue(live.config.admin, 'cluster_manager.cds.update_success').catch(() => undefined),
        admin.statValue(live.config.admin, 'listener_manager.lds.update_success').catch(() => undefined),
      ]);
      if (!cds || !lds) return { ready: false, reason: `Envoy has no config from xDS yet (cds updates ${cds ?? 0}, lds updates ${lds ?? 0})` };
      this.xdsConfigSeen = true;
    }
    return { ready: true, reason: '' };
  }

  registerMetrics(registry: Registry): void {
    registerCounters(registry, 'istio_agent_envoy_', 'Envoy supervisor', () => this.supervisor.metrics() as unknown as Record<string, number>);
    gaugeFrom(registry, 'istio_agent_ready', 'Whether the newest Envoy epoch that went live is still live', () => (this.supervisor.ready() ? 1 : 0));
  }

  /** Envoy's own Prometheus text, for the merged /stats/prometheus. */
  readonly statsSource: MetricsSource = {
    name: 'envoy',
    type: 'envoy',
    scrape: async () => {
      const live = this.supervisor.newestLive();
      if (!live) return { ok: false, reason: 'no live Envoy' };
      const r = await admin.adminRequest(live.config.admin, 'GET', '/stats/prometheus', 2000);
      return r.status === 200 ? { ok: true, text: r.body, format: 'text' } : { ok: false, reason: `Envoy's /stats/prometheus answered ${r.status}` };
    },
  };
}
