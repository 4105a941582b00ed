// The embedded discovery server: a directory of Istio YAML -> ConfigStore -> service registry -> debounced pushes
// of CDS/EDS/LDS/RDS over ADS. Used by `pilot-agent discovery` on its own and by `pilot-agent proxy --standalone`.
//
// Data flow: FileConfigSource.sync() applies a validated set to the store; store and registry handlers feed the
// Debouncer; each flush builds one immutable PushContext and asks every connection to push from it.

import * as fs from 'node:fs';
import * as path from 'node:path';
import type { Registry } from '../prom';
import type { Component } from '../component';
import { AgentError, errorMessage } from '../errors';
import { isLocalTarget } from '../grpc-wire';
import { parseJsonOrYaml } from '../json-or-yaml';
import {
  COMPLIANCE_POLICY,
  DISCOVERY_MAX_DOCUMENTS,
  DISCOVERY_MAX_FILE_BYTES,
  PILOT_DEBOUNCE_AFTER,
  PILOT_DEBOUNCE_MAX,
  type Env,
} from '../env';
import { timestamp, scope } from '../log';
import { registerCounters } from '../metrics';
import { AdsServer, type ConnectionStatus } from './ads-server';
import { caDeclared, EmbeddedCa } from './ca';
import type { Nack } from './ads-connection';
import { MemoryConfigStore } from './config-store';
import { Debouncer, type PushRequest, pushRequest } from './debounce';
import { FileConfigSource } from './file-source';
import { readMeshTracing } from './mesh-tracing';
import { DEFAULT_MESH, KINDS, type MeshConfig } from './model';
import { warmEndpoints } from './gen-clusters';
import { warmSidecarRoutes } from './gen-routes';
import { PushContext } from './push-context';
import { ResourceCache } from './resources';
import { ServiceEntryRegistry } from './registry';
import type { Identity } from './identities';
import { Refusals } from './refusals';
import { WorkloadHealth, type HealthReport } from './workload-health';
import { XdsAuthenticator } from './xds-auth';
import { type ConfigIssue, formatIssue } from './yaml-file';

const log = scope('discovery');

export interface DiscoveryOptions {
  configDir: string;
  /** `127.0.0.1:15010`, `unix:/abs/path` or an absolute socket path. Port 0 picks a free port. */
  listen: string;
  /** Quiet period before a push (default 100 ms). */
  debounceMs?: number;
  /** Longest a change waits while events keep coming (default 10 s). */
  maxDelayMs?: number;
  /** Quiet period after a file event before the directory is read (default 50 ms). */
  fileDebounceMs?: number;
  /** meshConfig fields routing depends on (default: outboundTrafficPolicy ALLOW_ANY, as Istio). */
  mesh?: Partial<MeshConfig>;
  /** Largest config file read (default 4 MiB, DISCOVERY_MAX_FILE_BYTES). */
  maxFileBytes?: number;
  /** Most documents in one config file (default 10,000, DISCOVERY_MAX_DOCUMENTS). */
  maxDocuments?: number;
  /** SPIFFE trust domain of the embedded CA, served when <configDir>/ca/identities exists (default cluster.local). */
  trustDomain?: string;
  /** `proxy --standalone`: the identity of the agent this server runs in. It connects with `inProcessToken`. */
  inProcess?: Identity;
  /** COMPLIANCE_POLICY: the TLS contexts generated for Envoy are restricted as istiod restricts them. */
  compliancePolicy?: string;
}

/** The file limits from the environment (DISCOVERY_MAX_FILE_BYTES, DISCOVERY_MAX_DOCUMENTS). */
export function fileLimitsFromEnv(env: Env): Pick<DiscoveryOptions, 'maxFileBytes' | 'maxDocuments'> {
  return { maxFileBytes: DISCOVERY_MAX_FILE_BYTES.get(env), maxDocuments: DISCOVERY_MAX_DOCUMENTS.get(env) };
}

export interface DiscoveryStatus {
  version: string;
  address: string;
  services: number;
  connections: ConnectionStatus[];
  nacks: Nack[];
  issues: string[];
  pushes: number;
  health: HealthReport[];
  /** The embedded CA, when served. */
  ca?: { root: string; signed: number; refused: number };
  /** Streams refused (a bad token, another namespace) and health reports ignored (./workload-health.ts). */
  refused: Refusals['counts'];
}

export class DiscoveryServer implements Component {
  readonly name = 'discovery server';
  readonly store = new MemoryConfigStore();
  readonly registry = new ServiceEntryRegistry(this.store);
  private readonly refusals = new Refusals();
  readonly health = new WorkloadHealth(this.registry, this.store, this.refusals);
  readonly closed: Promise<Error | undefined>;
  private resolveClosed!: (e: Error | undefined) => void;
  private readonly files: FileConfigSource;
  private readonly debouncer: Debouncer;
  private readonly ads: AdsServer;
  private readonly cache = new ResourceCache();
  private readonly mesh: MeshConfig;
  private push: PushContext;
  private ca: EmbeddedCa | undefined;
  private readonly auth: XdsAuthenticator;
  private pushes = 0;
  private versionSeq = 0;
  private boundAddress = '';
  private state: 'new' | 'starting' | 'running' | 'closed' = 'new';
  private building = false;
  /** Called after every push context is built: for stats and benchmarks. */
  onPushContext: (push: PushContext, req: PushRequest, buildMs: number) => void = () => {};

  constructor(private readonly o: DiscoveryOptions) {
    this.closed = new Promise((r) => (this.resolveClosed = r));
    this.mesh = Object.freeze({ ...DEFAULT_MESH, ...o.mesh });
    this.files = new FileConfigSource({
      dir: o.configDir,
      store: this.store,
      quietMs: o.fileDebounceMs ?? 50,
      ...(o.maxFileBytes !== undefined && { maxFileBytes: o.maxFileBytes }),
      ...(o.maxDocuments !== undefined && { maxDocuments: o.maxDocuments }),
    });
    this.debouncer = new Debouncer({
      quietMs: o.debounceMs ?? 100,
      maxDelayMs: o.maxDelayMs ?? 10_000,
      onFlush: (req) => this.onFlush(req),
    });
    this.push = PushContext.build(this.nextVersion(), this.store, this.registry, this.cache, this.mesh, {
      servePrivateKeys: isLocalTarget(o.listen),
      compliancePolicy: o.compliancePolicy,
    });
    this.auth = new XdsAuthenticator({ ...(o.inProcess && { inProcess: o.inProcess }) });
    this.ads = new AdsServer({
      current: () => this.push,
      onHealth: (p, e) => this.health.report(p, e),
      authenticate: (md, p) => this.auth.authenticate(md, p),
      onRefused: (reason, fields) => this.refusals.refuse('xds_stream', reason, fields),
    });
  }

  /** The bearer token of the agent this server runs in (DiscoveryOptions.inProcess); never leaves the process. */
  get inProcessToken(): string | undefined {
    return this.auth.inProcessToken;
  }

  get address(): string {
    return this.boundAddress;
  }

  get pushContext(): PushContext {
    return this.push;
  }

  /** Loads the directory and listens. Rejects (having started nothing) if the initial config has any issue. */
  async start(): Promise<void> {
    if (this.state !== 'new') throw new AgentError('INTERNAL', 'the discovery server was already started');
    this.state = 'starting';
    for (const kind of KINDS) {
      this.store.registerEventHandler(kind, (old, cur, event) => {
        const c = (cur ?? old)!;
        this.debouncer.push(pushRequest(`${kind}/${c.meta.namespace}/${c.meta.name}`, `config ${event}`));
      });
    }
    this.registry.appendServiceHandler((svc, event) =>
      this.debouncer.push(pushRequest(`Service/${svc.hostname}`, `service ${event}`)),
    );
    this.registry.appendInstanceHandler((inst, event) =>
      this.debouncer.push(pushRequest(`Service/${inst.hostname}`, `endpoint ${event}`)),
    );
    this.registry.run();
    try {
      let issues: ConfigIssue[];
      try {
        issues = (await this.files.sync({ report: false })).issues;
      } catch (e) {
        throw new AgentError(
          'CONFIG_INVALID',
          `cannot read config directory ${this.o.configDir}: ${errorMessage(e)}`,
          e,
        );
      }
      if (issues.length) {
        throw new AgentError(
          'CONFIG_INVALID',
          `invalid config in ${this.o.configDir}:\n  ${issues.map(formatIssue).join('\n  ')}`,
        );
      }
      // The initial load needs no debounce: build the first push context now.
      this.debouncer.close();
      this.push = await this.buildPushContext();
      await this.startCa();
      this.boundAddress = await this.ads.listen(this.o.listen);
    } catch (e) {
      this.state = 'closed';
      this.files.close();
      this.debouncer.close();
      await this.ads.close();
      this.resolveClosed(e as Error);
      throw e instanceof AgentError
        ? e
        : new AgentError('IO', `failed to start the discovery server: ${errorMessage(e)}`, e);
    }
    if (!this.push.servePrivateKeys && this.push.secrets.some((x) => x.spec.key)) {
      log.warn(
        `Secret private keys are not served: ${this.o.listen} is not a Unix socket or loopback address and the xDS stream is plaintext; gateways get only CA bundles (use certificate files on the gateway host)`,
      );
    } else if (!this.auth.enabled && this.push.secrets.some((x) => x.spec.key)) {
      log.warn(
        `Secret private keys are not served: they go only to a gateway authenticated with a token of its namespace, and ${path.join(this.o.configDir, 'ca', 'identities')} declares none; gateways get only CA bundles`,
      );
    }
    this.files.start();
    this.state = 'running';
    log.info('discovery server listening', {
      address: this.boundAddress,
      configDir: this.o.configDir,
      services: this.push.services.length,
      version: this.push.version,
    });
  }

  /** The embedded CA, when the config directory declares identities and the address is local. */
  private async startCa(): Promise<void> {
    if (!caDeclared(this.o.configDir)) return;
    if (!isLocalTarget(this.o.listen)) {
      log.warn(
        `embedded CA not served: ${this.o.listen} is not a Unix socket or loopback address, and tokens must not cross the network in plaintext`,
      );
      return;
    }
    this.ca = await EmbeddedCa.open({
      dir: path.join(this.o.configDir, 'ca'),
      trustDomain: this.o.trustDomain ?? 'cluster.local',
    });
    // The same tokens authenticate xDS streams: a gateway's private keys and a VM's health reports need them.
    this.auth.identities = this.ca.identities;
    const svc = this.ca.service();
    this.ads.addService(svc.definition, svc.implementation);
  }

  /** Safe to call twice. */
  async close(): Promise<void> {
    if (this.state === 'closed') return;
    this.state = 'closed';
    this.files.close();
    this.debouncer.close();
    await this.ads.close();
    this.resolveClosed(undefined);
  }

  status(): DiscoveryStatus {
    const s = this.ads.status();
    return {
      version: this.push.version,
      address: this.boundAddress,
      services: this.push.services.length,
      connections: s.connections,
      nacks: s.nacks,
      issues: this.files.issues.map(formatIssue),
      pushes: this.pushes,
      health: this.health.status(),
      ca: this.ca && { root: this.ca.rootSerial, ...this.ca.stats },
      refused: { ...this.refusals.counts },
    };
  }

  /** In `proxy --standalone`, on the agent's /stats/prometheus. */
  registerMetrics(registry: Registry): void {
    registerCounters(registry, 'istio_agent_discovery_', 'embedded discovery server', () => ({
      refused_xds_streams_total: this.refusals.counts.xds_stream,
      ignored_health_reports_total: this.refusals.counts.health_report,
    }));
  }

  /** Called after each connection finishes a push. */
  set onPushed(fn: (proxy: string, version: string, ms: number) => void) {
    this.ads.onPushed = (c, v, ms) => fn(c.proxy.id, v, ms);
  }

  /** Sends pending changes now instead of waiting for the debounce (tests, benchmarks). */
  flush(): void {
    this.debouncer.flush();
  }

  /** Re-reads the config directory now. */
  reload(): Promise<void> {
    return this.files.sync().then(() => undefined);
  }

  private onFlush(req: PushRequest): void {
    if (this.state !== 'running') return;
    // A set being applied is not snapshotted half way, and one push context is built at a time: the merged
    // request waits for the next quiet period.
    if (this.files.applying || this.building) return this.debouncer.push(req);
    this.building = true;
    void this.buildAndPush(req).finally(() => (this.building = false));
  }

  private async buildAndPush(req: PushRequest): Promise<void> {
    const t0 = performance.now();
    let push: PushContext;
    try {
      push = await this.buildPushContext();
    } catch (e) {
      log.error('failed to build the push context; proxies keep the previous config', {
        error: (e as Error).stack ?? String(e),
      });
      return;
    }
    if (this.state !== 'running') return;
    this.push = push;
    const buildMs = performance.now() - t0;
    this.pushes++;
    log.info('push', {
      version: this.push.version,
      events: req.events,
      reasons: Object.entries(req.reasons)
        .map(([k, v]) => `${k}:${v}`)
        .join(','),
      debouncedMs: Date.now() - req.start,
      buildMs: Math.round(buildMs * 10) / 10,
      connections: this.ads.connectionCount(),
    });
    this.onPushContext(this.push, req, buildMs);
    this.ads.pushAll();
  }

  /**
   * A new push context with its endpoints and the connected sidecars' routes encoded ahead, the event loop given
   * back every 10 ms (one RouteConfiguration of 10,000 virtual hosts took over a second to encode in one go).
   */
  private async buildPushContext(): Promise<PushContext> {
    const push = PushContext.build(this.nextVersion(), this.store, this.registry, this.cache, this.mesh, {
      servePrivateKeys: isLocalTarget(this.o.listen),
      compliancePolicy: this.o.compliancePolicy,
    });
    let sliceStart = performance.now();
    const breathe = async () => {
      if (performance.now() - sliceStart < 10) return;
      await new Promise<void>((r) => setImmediate(r));
      sliceStart = performance.now();
    };
    await warmEndpoints(push, breathe);
    const scopes = new Map<string, ReturnType<PushContext['scopeFor']>>();
    for (const proxy of this.ads.proxies()) {
      if (proxy.type !== 'sidecar') continue;
      const scope = push.scopeFor(proxy);
      scopes.set(scope.key, scope);
    }
    for (const scope of scopes.values()) await warmSidecarRoutes(push, scope, breathe);
    return push;
  }

  private nextVersion(): string {
    // Istio's form: time of the push plus a sequence number, so versions sort and are unique per process.
    return `${timestamp().slice(0, 19)}Z/${++this.versionSeq}`;
  }
}

function readMeshFile(file: string): unknown {
  try {
    return parseJsonOrYaml(fs.readFileSync(file, 'utf8'));
  } catch (e) {
    throw new AgentError('CONFIG_INVALID', `mesh config ${file}: ${errorMessage(e).split('\n')[0]}`, e);
  }
}

/**
 * `pilot-agent discovery --config-dir DIR [--grpc-addr HOST:PORT | unix path]`: runs until SIGTERM or SIGINT.
 * `meshConfigFile`: a meshConfig file whose tracing fields apply (./mesh-tracing.ts).
 * Returns 0 after a signal, 1 if the config is invalid or the server cannot start or fails.
 */
export async function runDiscoveryCommand(
  argv: {
    configDir: string;
    grpcAddr?: string;
    outboundTrafficPolicy?: MeshConfig['outboundTrafficPolicy'];
    meshConfigFile?: string;
  },
  env: Env = process.env,
): Promise<number> {
  let server: DiscoveryServer;
  try {
    server = new DiscoveryServer({
      configDir: argv.configDir,
      listen: argv.grpcAddr ?? '127.0.0.1:15010',
      mesh: {
        ...(argv.outboundTrafficPolicy && { outboundTrafficPolicy: argv.outboundTrafficPolicy }),
        ...(argv.meshConfigFile && {
          tracing: readMeshTracing(readMeshFile(argv.meshConfigFile), `mesh config ${argv.meshConfigFile}`),
        }),
      },
      debounceMs: PILOT_DEBOUNCE_AFTER.get(env),
      maxDelayMs: PILOT_DEBOUNCE_MAX.get(env),
      ...fileLimitsFromEnv(env),
      compliancePolicy: COMPLIANCE_POLICY.get(env) || undefined,
    });
    await server.start();
  } catch (e) {
    log.error(`discovery server not started: ${errorMessage(e)}`);
    return 1;
  }
  let onSignal: (s: NodeJS.Signals) => void = () => {};
  const signal = new Promise<string>((resolve) => (onSignal = resolve));
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
  const ended = await Promise.race([signal, server.closed.then((e) => e ?? new Error('closed'))]);
  process.off('SIGTERM', onSignal);
  process.off('SIGINT', onSignal);
  if (typeof ended === 'string') {
    log.info(`received ${ended}, stopping the discovery server`);
    await server.close();
    return 0;
  }
  log.error('discovery server stopped', { error: ended.message });
  await server.close();
  return 1;
}
