// pilot-agent: the entry point, and the only place that wires components together.
// It parses Istio's command line, builds the frozen config, starts the components, connects them with
// callbacks, waits for the first one to end, and closes the rest in reverse order.

import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import yargs from 'yargs';
import { buildConfig, type AgentConfig, type Flags } from './lib/config';
import type { Env } from './lib/env';
import * as envs from './lib/env';
import { AgentError, errorMessage } from './lib/errors';
import { configureLogging, scope } from './lib/log';
import { buildNodeIdentity, type HostAddress, type NodeIdentity } from './lib/node-identity';
import { resolveBootstrap } from './lib/bootstrap-loader';
import { renderBootstrap } from './lib/bootstrap';
import { VERSION } from './lib/version';
import { localRequest, waitReady } from './lib/agent-client';

const log = scope('agent');

/** Exit code for errors found before anything started (bad flags, config, missing Envoy). */
const EXIT_STARTUP_ERROR = 1;

function readFileOrUndefined(file: string): string | undefined {
  try {
    return fs.readFileSync(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new AgentError('IO', `cannot read ${file}: ${errorMessage(err)}`, err);
  }
}

export function hostAddresses(): HostAddress[] {
  const out: HostAddress[] = [];
  for (const list of Object.values(os.networkInterfaces())) {
    for (const a of list ?? []) out.push({ address: a.address, family: a.family === 'IPv6' ? 'IPv6' : 'IPv4', internal: a.internal });
  }
  return out;
}

export interface Resolved {
  cfg: AgentConfig;
  node: NodeIdentity;
  bootstrap: Record<string, unknown>;
  /** Files that fed the config and bootstrap; a change to any of them means a new epoch. */
  inputs: string[];
}

/** flags + env + files -> frozen config, node identity and bootstrap. Throws AgentError naming the field. */
export function resolveAll(flags: Flags, env: Env): Resolved {
  const cfg = buildConfig({ flags, env, readFile: readFileOrUndefined });
  const node = buildNodeIdentity(cfg, env, hostAddresses(), VERSION);
  const { bootstrap, inputs } = resolveBootstrap(cfg, node, readFileOrUndefined);
  return { cfg, node, bootstrap, inputs: [cfg.meshConfigFile, ...inputs] };
}

function proxyFlags(argv: Record<string, unknown>): Flags {
  const str = (k: string) => (argv[k] === undefined ? undefined : String(argv[k]));
  return {
    proxyType: str('type'),
    domain: str('domain'),
    meshConfig: str('meshConfig'),
    serviceCluster: str('serviceCluster'),
    proxyLogLevel: str('proxyLogLevel'),
    proxyComponentLogLevel: str('proxyComponentLogLevel'),
    concurrency: argv.concurrency === undefined ? undefined : Number(argv.concurrency),
    templateFile: str('templateFile'),
    outlierLogPath: str('outlierLogPath'),
    standalone: str('standalone'),
    logAsJson: Boolean(argv.log_as_json),
  };
}

function setUpLogging(argv: Record<string, unknown>): void {
  configureLogging({
    outputLevel: argv.log_output_level === undefined ? undefined : String(argv.log_output_level),
    json: Boolean(argv.log_as_json),
  });
}

/** One clear line and a non-zero exit, before anything was started. */
function startupFailure(err: unknown): number {
  process.stderr.write(`error: ${errorMessage(err)}\n`);
  return EXIT_STARTUP_ERROR;
}

async function bootstrapCommand(argv: Record<string, unknown>): Promise<number> {
  try {
    const r = resolveAll(proxyFlags(argv), process.env);
    process.stdout.write(renderBootstrap(r.bootstrap));
    return 0;
  } catch (err) {
    return startupFailure(err);
  }
}

function checkEnvoyBinary(cfg: AgentConfig): void {
  const bin = cfg.proxy.binaryPath;
  try {
    const st = fs.statSync(bin);
    if (!st.isFile()) throw new Error('not a file');
    fs.accessSync(bin, fs.constants.X_OK);
  } catch (err) {
    const why = (err as NodeJS.ErrnoException).code === 'ENOENT' ? 'does not exist' : (err as NodeJS.ErrnoException).code === 'EACCES' ? 'is not executable' : errorMessage(err);
    throw new AgentError('ENVOY_MISSING', `invalid binaryPath (from ${cfg.sources.binaryPath}): Envoy binary ${bin} ${why}`);
  }
}

function checkConfigPathWritable(cfg: AgentConfig): void {
  const dir = cfg.proxy.configPath;
  try {
    fs.mkdirSync(dir, { recursive: true });
    fs.accessSync(dir, fs.constants.W_OK);
  } catch (err) {
    throw new AgentError('CONFIG_INVALID', `invalid configPath (from ${cfg.sources.configPath}): ${dir} is not a writable directory: ${errorMessage(err)}`);
  }
}

/**
 * `proxy`: every way it ends is listed on the Supervisor (lib/supervisor.ts); beyond those, a component that
 * fails after start (the status server or xDS proxy closing with an error) shuts Envoy down and exits 1.
 */
async function proxyCommand(argv: Record<string, unknown>): Promise<number> {
  const flags = proxyFlags(argv);
  const env = process.env;
  let resolved: Resolved;
  try {
    resolved = resolveAll(flags, env);
    checkEnvoyBinary(resolved.cfg);
    checkConfigPathWritable(resolved.cfg);
  } catch (err) {
    return startupFailure(err);
  }
  // Loaded lazily: only `proxy` needs the supervisor, gRPC and the servers. The light modules come first, so
  // Envoy can validate the first bootstrap while gRPC and the rest load.
  const [rt, { FileWatcher, referencedFiles, fingerprint }] = await Promise.all([import('./lib/envoy-runtime'), import('./lib/file-watcher')]);
  const { cfg } = resolved;
  const t0 = Date.now();
  rt.removeStaleHotRestartState(cfg);
  let generation = 0;
  let last = resolved;
  const desiredFrom = (r: Resolved) =>
    rt.makeDesiredConfig({
      cfg: r.cfg,
      bootstrap: r.bootstrap,
      ipv6: r.node.ipv6,
      coreDump: envs.ISTIO_ENVOY_ENABLE_CORE_DUMP.get(env),
      binaryId: rt.binaryIdentity(r.cfg.proxy.binaryPath),
      generation,
      filesId: [...referencedFiles(r.bootstrap)].sort().map((p) => `${p}=${fingerprint({ path: p, mode: 'content' })}`).join('\n'),
    });
  // The first bootstrap is checked before anything starts: one Envoy rejects is a startup error.
  const envoyRuntime = new rt.RealEnvoyRuntime(cfg);
  const first0 = desiredFrom(last);
  const validateFirst = envs.ENVOY_VALIDATE_BEFORE_RESTART.get(env);
  const firstFile = validateFirst ? envoyRuntime.writeBootstrap(0, first0) : '';
  const validation = validateFirst ? envoyRuntime.validate(first0, firstFile).then((problem) => ({ problem }), (err: Error) => ({ cannotRun: err })) : undefined;
  const [{ Supervisor }, { StatusServer, json }, admin, xdsMod] = await Promise.all([
    import('./lib/supervisor'), import('./lib/status-server'), import('./lib/envoy-admin'), import('./lib/xds-proxy'),
  ]);
  if (validation) {
    const v = await validation;
    envoyRuntime.removeBootstrap(firstFile);
    if ('cannotRun' in v) return startupFailure(new AgentError('ENVOY_MISSING', `invalid binaryPath (from ${cfg.sources.binaryPath}): ${v.cannotRun.message}`));
    if (v.problem !== undefined) return startupFailure(new AgentError('CONFIG_INVALID', `Envoy rejects the bootstrap built from this config: ${v.problem}`));
    first0.validated = true;
  }
  log.info(`pilot-agent ${VERSION} starting ${cfg.requestedType} proxy ${resolved.node.id}`);

  const supervisor = new Supervisor({
    runtime: envoyRuntime,
    validate: envs.ENVOY_VALIDATE_BEFORE_RESTART.get(env),
    terminationDrainMs: cfg.proxy.terminationDrainDuration,
    exitOnZeroActiveConnections: cfg.exitOnZeroActiveConnections,
    minimumDrainMs: cfg.minimumDrainDuration,
    maximumDrainMs: cfg.maximumDrainDuration,
    initialBackoffMs: envs.ENVOY_RESTART_INITIAL_BACKOFF.get(env),
    startTimeoutMs: envs.ENVOY_START_TIMEOUT.get(env),
  });

  // ---- status server ----
  let xdsReadyCached = false;
  let startupSeconds: number | undefined;
  const needsXdsConfig = (b: Record<string, unknown>) => {
    const dr = b.dynamic_resources as Record<string, unknown> | undefined;
    return Boolean(dr && (dr.lds_config || dr.cds_config));
  };
  const readiness = async (): Promise<{ ready: boolean; reason: string }> => {
    if (!supervisor.ready()) return { ready: false, reason: 'Envoy is not live (starting, restarting or draining)' };
    const live = supervisor.newestLive();
    if (!xdsReadyCached && live && needsXdsConfig(live.config.bootstrap)) {
      const [cds, lds] = await Promise.all([
        admin.statValue(live.config.admin, 'cluster_manager.cds.update_success').catch(() => undefined),
        admin.statValue(live.config.admin, 'listener_manager.lds.update_success').catch(() => undefined),
      ]);
      if (!cds || !lds) return { ready: false, reason: `Envoy has no config from xDS yet (cds updates ${cds ?? 0}, lds updates ${lds ?? 0})` };
      xdsReadyCached = true;
    }
    // Istio's istio_agent_startup_duration_seconds: agent start to first readiness.
    startupSeconds ??= (Date.now() - t0) / 1000;
    return { ready: true, reason: '' };
  };
  const status = new StatusServer({ port: cfg.proxy.statusPort })
    .route('GET', '/healthz/ready', async () => {
      const r = await readiness();
      return r.ready ? { status: 200, body: '' } : { status: 503, body: r.reason + '\n' };
    })
    .route('POST', '/quitquitquit', () => {
      setImmediate(() => void supervisor.shutdown(false, 'POST /quitquitquit'));
      return { status: 200, body: 'OK\n' };
    }, { localOnly: true })
    .route('POST', '/drain', async () => {
      const live = supervisor.newestLive();
      if (!live) return { status: 503, body: 'no live Envoy to drain\n' };
      await admin.drainListeners(live.config.admin, { inboundOnly: live.config.inboundOnlyDrain, skipExit: true });
      supervisor.markDrained();
      return { status: 200, body: 'OK\n' };
    }, { localOnly: true })
    .route('GET', '/debug/epochs', () => json(supervisor.debugState()))
    .route('GET', '/debug/xds', () => json(xds ? xds.debugState() : {}))
    .route('GET', '/debug/ndsz', () => (cfg.dnsEnabled ? json(nameTable ?? {}) : { status: 404, body: 'DNS proxy is not enabled\n' }))
    .route('GET', '/stats/prometheus', async () => ({ status: 200, body: await mergedMetrics(), contentType: 'text/plain; version=0.0.4' }))
    .route('GET', '/metrics', async () => ({ status: 200, body: await mergedMetrics(), contentType: 'text/plain; version=0.0.4' }));

  const mergedMetrics = async (): Promise<string> => {
    const lines: string[] = [];
    for (const [k, v] of Object.entries(supervisor.metrics())) {
      lines.push(`# TYPE istio_agent_envoy_${k} ${k.endsWith('_total') ? 'counter' : 'gauge'}`, `istio_agent_envoy_${k} ${v}`);
    }
    lines.push(`# TYPE istio_agent_ready gauge`, `istio_agent_ready ${supervisor.ready() ? 1 : 0}`);
    if (startupSeconds !== undefined) lines.push('# TYPE istio_agent_startup_duration_seconds gauge', `istio_agent_startup_duration_seconds ${startupSeconds}`);
    for (const [k, v] of Object.entries(xds?.metrics() ?? {})) {
      lines.push(`# TYPE istio_agent_${k} ${k.endsWith('_total') ? 'counter' : 'gauge'}`, `istio_agent_${k} ${v}`);
    }
    const live = supervisor.newestLive();
    let envoyText = '';
    if (live) {
      envoyText = await admin.adminRequest(live.config.admin, 'GET', '/stats/prometheus', 5000).then(
        (r) => (r.status === 200 ? r.body : ''),
        () => '',
      );
    }
    return lines.join('\n') + '\n' + envoyText;
  };

  // ---- servers Envoy needs, started before Envoy: status, (embedded discovery), xDS proxy ----
  let xds: InstanceType<typeof xdsMod.XdsProxy> | undefined;
  let nameTable: { table: Record<string, unknown> } | undefined;
  let discovery: { close(): Promise<void>; closed: Promise<Error | undefined> } | undefined;
  const closeServers = async () => {
    await xds?.close();
    await discovery?.close();
    await status.close();
  };
  try {
    await status.start();
    // proxyMetadata entries act as environment variables for the agent, as in Istio.
    let upstream = xdsMod.upstreamFromConfig(cfg, { ...cfg.proxy.proxyMetadata, ...env });
    if (cfg.standaloneDir) {
      const { DiscoveryServer } = await import('./lib/discovery/index');
      const sock = path.resolve(cfg.proxy.configPath, 'discovery.sock');
      const d = new DiscoveryServer({ configDir: cfg.standaloneDir, listen: `unix:${sock}` });
      discovery = d;
      await d.start();
      upstream = { address: `unix://${sock}`, tls: false };
      log.info(`standalone: embedded discovery server for ${cfg.standaloneDir} is the xDS upstream`);
    }
    xds = new xdsMod.XdsProxy({ socketPath: cfg.xdsSocket, upstream, maxMessageBytes: envs.XDS_MAX_MESSAGE_BYTES.get(env) });
    // Types for the agent, never for Envoy: the xDS proxy subscribes to them after Envoy's first LDS request.
    const istio = await import('./lib/xds-istio');
    if (cfg.dnsEnabled) {
      xds.registerHandler(istio.NAME_TABLE_TYPE, (resources) => {
        nameTable = resources.length ? istio.decodeNameTable(resources[0]!) : { table: {} };
        log.debug(`name table with ${Object.keys(nameTable.table).length} hosts`);
      });
    }
    if (envs.PROXY_CONFIG_XDS_AGENT.get(env)) {
      // Pushed ProxyConfig (PCDS) carries the mesh's trust bundle for the SDS server (a later component); until
      // then it is acknowledged and recorded, so the control plane sees a healthy subscriber.
      xds.registerHandler(istio.PROXY_CONFIG_TYPE, (resources, meta) => {
        log.info(`proxy config from the control plane: version ${meta.version}, ${resources.length} resource(s)`);
      });
    }
    await xds.start();
  } catch (err) {
    await closeServers();
    return startupFailure(err);
  }

  // ---- desired config, watcher, signals ----
  const watched = (r: Resolved) => [
    ...[...new Set([...r.inputs, ...referencedFiles(r.bootstrap)])].map((p) => ({ path: p, mode: 'content' as const })),
    { path: r.cfg.proxy.binaryPath, mode: 'stat' as const },
  ];
  const watcher = new FileWatcher(() => refresh('file change'), { debounceMs: envs.FILE_DEBOUNCE_DURATION.get(env) });
  const refresh = (why: string) => {
    try {
      const r = resolveAll(flags, env);
      if (r.cfg.proxy.statusPort !== cfg.proxy.statusPort) log.warn('a new statusPort takes effect only when the agent restarts');
      last = r;
      watcher.watch(watched(r));
      supervisor.setDesired(desiredFrom(r));
    } catch (err) {
      log.error(`${why}: new config not applied, keeping the last good one: ${errorMessage(err)}`);
    }
  };
  watcher.watch(watched(last));
  const onHup = () => {
    generation++;
    log.info('SIGHUP: hot-restarting Envoy');
    refresh('SIGHUP');
  };
  const onTerm = (sig: NodeJS.Signals) => void supervisor.shutdown(true, sig);
  process.on('SIGHUP', onHup);
  process.on('SIGTERM', onTerm);
  process.on('SIGINT', onTerm);
  // Envoy dies with the agent (PR_SET_PDEATHSIG); this also covers an agent that exits through a crash.
  const killOnExit = () => supervisor.killAllNow();
  process.on('exit', killOnExit);

  supervisor.onLive((n) => {
    if (n === 0) log.info(`Envoy is live ${Date.now() - t0} ms after the agent started`);
  });
  supervisor.setDesired(first0);

  // ---- wait for the first component to end, then close the rest in reverse order ----
  const componentEnded = (name: string, closed: Promise<Error | undefined> | undefined) =>
    closed ? closed.then((err) => ({ code: 1, reason: `${name} closed${err ? `: ${err.message}` : ''}`, component: true })) : new Promise<never>(() => {});
  const first = await Promise.race([
    supervisor.done.then((end) => ({ code: end.code, reason: end.reason, component: false })),
    componentEnded('status server', status.closed),
    componentEnded('xDS proxy', xds?.closed),
    componentEnded('discovery server', discovery?.closed),
  ]);
  if (first.component) await supervisor.shutdown(false, first.reason);
  watcher.close();
  await closeServers();
  process.off('SIGHUP', onHup);
  process.off('SIGTERM', onTerm);
  process.off('SIGINT', onTerm);
  process.off('exit', killOnExit);
  (first.code === 0 ? log.info : log.error)(`agent exiting with code ${first.code}: ${first.reason}`);
  return first.code;
}

export async function main(args: string[]): Promise<number> {
  let result: Promise<number> = Promise.resolve(0);
  const logFlags = (y: yargs.Argv) =>
    y
      .option('log_output_level', { type: 'string', describe: 'Per-scope log levels: scope:level,... (a bare level sets the default)' })
      .option('log_as_json', { type: 'boolean', default: false, describe: 'Log one JSON object per line' });
  const proxyOptions = (y: yargs.Argv) =>
    logFlags(y)
      .positional('type', { type: 'string', default: 'sidecar', describe: 'sidecar, router or ingress' })
      .option('domain', { type: 'string', describe: 'DNS domain suffix (default $POD_NAMESPACE.svc.cluster.local)' })
      .option('meshConfig', { type: 'string', describe: 'Mesh config file (default ./etc/istio/config/mesh)' })
      .option('serviceCluster', { type: 'string', describe: 'Service cluster (default istio-proxy)' })
      .option('proxyLogLevel', { type: 'string', describe: 'Envoy log level, optionally with component levels: info,misc:error' })
      .option('proxyComponentLogLevel', { type: 'string', describe: 'Envoy component log levels: misc:error,upstream:debug' })
      .option('concurrency', { type: 'number', describe: 'Envoy worker threads (0: all cores)' })
      .option('templateFile', { type: 'string', describe: 'Bootstrap template file' })
      .option('outlierLogPath', { type: 'string', describe: 'Outlier detection log path' })
      .option('standalone', { type: 'string', describe: 'Directory of mesh config YAML: run an embedded discovery server instead of using istiod' });

  const parser = yargs(args)
    .scriptName('pilot-agent')
    .wrap(100)
    .parserConfiguration({ 'unknown-options-as-args': false, 'camel-case-expansion': false })
    .strict(false) // the Go agent accepts unknown flags; so do we
    .version(VERSION)
    .help()
    .command('proxy [type]', 'Run Envoy and the agent beside it', proxyOptions, (argv) => {
      setUpLogging(argv);
      result = proxyCommand(argv);
    })
    .command('bootstrap [type]', 'Print the bootstrap that `proxy` would write', proxyOptions, (argv) => {
      setUpLogging(argv);
      result = bootstrapCommand(argv);
    })
    .command('version', 'Print the version', (y) => y.option('short', { alias: 's', type: 'boolean' }), () => {
      process.stdout.write(`pilot-agent version ${VERSION}\n`);
    })
    .command(
      'wait',
      'Wait until Envoy is ready',
      (y) =>
        y
          .option('url', { type: 'string', default: 'http://localhost:15021/healthz/ready' })
          .option('periodMillis', { type: 'number', default: 500 })
          .option('requestTimeoutMillis', { type: 'number', default: 500 })
          .option('timeoutSeconds', { type: 'number', default: 60 }),
      (argv) => {
        result = waitReady({ url: argv.url, periodMs: argv.periodMillis, requestTimeoutMs: argv.requestTimeoutMillis, timeoutMs: argv.timeoutSeconds * 1000 });
      },
    )
    .command(
      'request <method> <path> [body]',
      'Send a request to the local Envoy admin or agent port and print the raw body',
      (y) =>
        y
          .positional('method', { type: 'string', demandOption: true })
          .positional('path', { type: 'string', demandOption: true })
          .positional('body', { type: 'string' })
          .option('debug-port', { type: 'number', default: 15000 }),
      (argv) => {
        result = localRequest({ method: argv.method, path: argv.path, body: argv.body, port: argv['debug-port'] });
      },
    )
    .command(
      'discovery',
      'Run the embedded, file-driven discovery server',
      (y) =>
        logFlags(y)
          .option('config-dir', { type: 'string', demandOption: true, describe: 'Directory of Istio-style YAML' })
          .option('grpc-addr', { type: 'string', describe: 'HOST:PORT or a unix socket path (default 127.0.0.1:15010)' }),
      (argv) => {
        setUpLogging(argv);
        result = import('./lib/discovery/index').then((m) => m.runDiscoveryCommand({ configDir: argv['config-dir'], grpcAddr: argv['grpc-addr'] }));
      },
    )
    .demandCommand(1, 'name a command: proxy, bootstrap, wait, request, discovery or version')
    .fail((msg, err) => {
      throw new AgentError('BAD_INPUT', msg ?? errorMessage(err));
    });
  try {
    await parser.parseAsync();
  } catch (err) {
    return startupFailure(err);
  }
  return result;
}

if (require.main === module) {
  main(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (err) => {
      log.error(`fatal: ${errorMessage(err)}`);
      process.exit(EXIT_STARTUP_ERROR);
    },
  );
}

