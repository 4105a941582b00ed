// pilot-agent: the entry point, and the only place that wires components together.
// It parses Istio's command line, builds the frozen config, starts the components, connects them with
// callbacks, waits for the first one to end, and closes the rest in reverse order.

import * as fs from 'node:fs';
import * as path from 'node:path';
import type { Argv } from 'yargs';
import type { Component, Condition } from './lib/component';
import type { EnvoyComponent } from './lib/envoy-component';
import type { AgentConfig, Flags } from './lib/config';
import type { DiscoveryServer } from './lib/discovery/index';
import * as envs from './lib/env';
import { AgentError, errorMessage } from './lib/errors';
import { mkdirs } from './lib/fs-atomic';
import { configureLogging, journalPrefix, scope } from './lib/log';
import type { Registry } from './lib/prom';
import type { Resolved } from './lib/resolve';
import type { UpstreamOptions } from './lib/xds-upstream';
import { VERSION, versionText } from './lib/version';
import { applyV8Flags } from './lib/heap';

const log = scope('agent');

/** Exit code for errors found before anything started (bad config, missing Envoy, a port in use). */
const EXIT_STARTUP_ERROR = 1;
/** Exit code for a command line that cannot be parsed (unknown command, a flag without its value). */
const EXIT_USAGE = 2;

class UsageError extends AgentError {
  constructor(message: string) {
    super('BAD_INPUT', message);
  }
}

/** A flag given twice arrives as an array: the last one wins, as with Go's pflag. */
const lastOf = (v: unknown): unknown => (Array.isArray(v) ? v[v.length - 1] : v);

function proxyFlags(argv: Record<string, unknown>): Flags {
  const str = (k: string) => (lastOf(argv[k]) === undefined ? undefined : String(lastOf(argv[k])));
  return {
    proxyType: str('type'),
    domain: str('domain'),
    meshConfig: str('meshConfig'),
    serviceCluster: str('serviceCluster'),
    proxyLogLevel: str('proxyLogLevel'),
    proxyComponentLogLevel: str('proxyComponentLogLevel'),
    concurrency: lastOf(argv.concurrency) === undefined ? undefined : Number(lastOf(argv.concurrency)),
    templateFile: str('templateFile'),
    outlierLogPath: str('outlierLogPath'),
    standalone: str('standalone'),
    logAsJson: Boolean(argv.log_as_json),
  };
}

function setUpLogging(argv: Record<string, unknown>): void {
  const opt = (name: string) => (argv[name] === undefined ? undefined : String(lastOf(argv[name])));
  const targets = argv.log_target === undefined ? undefined : ([] as unknown[]).concat(argv.log_target).map(String);
  configureLogging({
    outputLevel: opt('log_output_level'),
    json: Boolean(argv.log_as_json),
    targets,
    callers: opt('log_caller'),
    stacktraceLevel: opt('log_stacktrace_level'),
  });
}

// Each command's flags for `completion`; test/go-knobs-cli.test.ts checks them against every command's --help.
const LOG_FLAGS = ['--log_output_level', '--log_as_json', '--log_target', '--log_caller', '--log_stacktrace_level'];
const PROXY_FLAGS = [
  ...LOG_FLAGS,
  '--domain',
  '--meshConfig',
  '--serviceCluster',
  '--proxyLogLevel',
  '--proxyComponentLogLevel',
  '--concurrency',
  '--templateFile',
  '--outlierLogPath',
  '--standalone',
  '--profiling',
  '--help',
];

async function completionCommand(shell: 'bash' | 'zsh'): Promise<number> {
  const [{ completionScript }, { iptablesFlagNames }] = await Promise.all([
    import('./lib/completion'),
    import('./lib/iptables-flags'),
  ]);
  const iptables = [...new Set([...iptablesFlagNames(), '--help'])];
  process.stdout.write(
    completionScript(shell, 'pilot-agent', {
      proxy: PROXY_FLAGS,
      bootstrap: PROXY_FLAGS,
      wait: ['--url', '--periodMillis', '--requestTimeoutMillis', '--timeoutSeconds', '--help'],
      request: ['--debug-port', '--help'],
      discovery: [...LOG_FLAGS, '--config-dir', '--grpc-addr', '--outbound-traffic-policy', '--meshConfig', '--help'],
      'istio-iptables': iptables,
      'istio-clean-iptables': iptables,
      completion: ['bash', 'zsh'],
      version: ['--short', '--output', '--help'],
    }),
  );
  return 0;
}

/** One clear line and a non-zero exit, before anything was started. */
function startupFailure(err: unknown): number {
  process.stderr.write(`${journalPrefix('error')}error: ${errorMessage(err)}\n`);
  return EXIT_STARTUP_ERROR;
}

async function bootstrapCommand(argv: Record<string, unknown>): Promise<number> {
  try {
    const [{ resolveAll }, { renderBootstrap }] = await Promise.all([
      import('./lib/resolve'),
      import('./lib/bootstrap'),
    ]);
    const r = resolveAll(proxyFlags(argv), process.env);
    process.stdout.write(renderBootstrap(r.bootstrap));
    return 0;
  } catch (err) {
    return startupFailure(err);
  }
}

/**
 * `request`: to Envoy's admin port it goes to the admin socket when the agent's config (the same environment and
 * files) says ENVOY_ADMIN_MODE=uds. A config that cannot be read is an error only when the environment asks for the
 * socket; otherwise the request goes to the port, as before.
 */
async function requestCommand(o: { method: string; path: string; body?: string; port: number }): Promise<number> {
  const client = await import('./lib/agent-client');
  let adminSocket: string | undefined;
  if (o.port === client.REQUEST_ADMIN_PORT) {
    const [{ buildConfig }, { readFileOrUndefined }] = await Promise.all([
      import('./lib/config'),
      import('./lib/resolve'),
    ]);
    try {
      adminSocket =
        buildConfig({ flags: {}, env: process.env, readFile: readFileOrUndefined }).envoyAdminSocket || undefined;
    } catch (err) {
      if (envs.ENVOY_ADMIN_MODE.isSet(process.env)) return startupFailure(err);
    }
  }
  return client.localRequest({ ...o, adminSocket });
}

function checkEnvoyBinary(cfg: AgentConfig): void {
  const bin = cfg.proxy.binaryPath;
  try {
    const st = fs.statSync(bin);
    if (!st.isFile()) throw new Error('not a file');
    fs.accessSync(bin, fs.constants.X_OK);
  } catch (err) {
    const why =
      (err as NodeJS.ErrnoException).code === 'ENOENT'
        ? 'does not exist'
        : (err as NodeJS.ErrnoException).code === 'EACCES'
          ? 'is not executable'
          : errorMessage(err);
    throw new AgentError(
      'ENVOY_MISSING',
      `invalid binaryPath (from ${cfg.sources.binaryPath}): Envoy binary ${bin} ${why}`,
    );
  }
}

function checkConfigPathWritable(cfg: AgentConfig): void {
  const dir = cfg.proxy.configPath;
  try {
    mkdirs(dir);
    fs.accessSync(dir, fs.constants.W_OK);
  } catch (err) {
    throw new AgentError(
      'CONFIG_INVALID',
      `invalid configPath (from ${cfg.sources.configPath}): ${dir} is not a writable directory: ${errorMessage(err)}`,
    );
  }
}

/** Everything checked before anything starts; throws AgentError naming the field. Claims configPath last. */
async function startupChecks(flags: Flags, env: NodeJS.ProcessEnv, withEnvoy = true): Promise<Resolved> {
  // Loaded by the commands that need them: `version` and the others start faster without.
  const [{ resolveAll }, { claimConfigPath }] = await Promise.all([
    import('./lib/resolve'),
    import('./lib/config-path-lock'),
  ]);
  let resolved = resolveAll(flags, env);
  if (withEnvoy) checkEnvoyBinary(resolved.cfg);
  checkConfigPathWritable(resolved.cfg);
  // Before anything touches configPath: a second agent there would wreck the first one's Envoy.
  const lock = await claimConfigPath(resolved.cfg.proxy.configPath);
  process.on('exit', () => lock.release());
  // Which SDS sockets other servers serve decides the node metadata and the bootstrap (as Go's Run): resolved again
  // only when one does.
  const sockets = await (await import('./lib/sds-sockets')).probeSdsSockets(resolved.cfg.sdsSocket);
  if (sockets.externalSds || sockets.credentialSocket) resolved = resolveAll(flags, env, sockets);
  return resolved;
}

/**
 * SIGTERM and SIGINT have one listener from the start of `proxy` to its end: a listener removed and another added can
 * lose a signal that arrived in between (Node drops it with the old listener). Before Envoy is started they exit
 * through the exit handlers (which release configPath and remove the sockets bound so far); `whenEnvoy` makes them
 * drain Envoy, and makes the agent's exit kill what is left of it.
 */
function stopSignals(): {
  whenEnvoy(envoy: EnvoyComponent): void;
  instead(fn: (sig: NodeJS.Signals) => void): void;
  off(): void;
} {
  let onStop = (sig: NodeJS.Signals) => {
    log.info(`${sig} before Envoy was started: exiting`);
    exitAfterFlush(0);
  };
  let killOnExit: () => void = () => undefined;
  const listener = (sig: NodeJS.Signals) => onStop(sig);
  process.on('SIGTERM', listener).on('SIGINT', listener);
  return {
    whenEnvoy(envoy) {
      onStop = (sig) => void envoy.shutdown(true, sig);
      killOnExit = () => envoy.killAllNow();
      process.on('exit', killOnExit);
    },
    instead(fn) {
      onStop = fn;
    },
    off() {
      process.off('SIGTERM', listener).off('SIGINT', listener).off('exit', killOnExit);
    },
  };
}

/**
 * Starts the components (Envoy and the others in `started` have been), ends with the first one to end (SIGTERM/SIGINT
 * drain Envoy), closes the rest in reverse.
 */
async function runComponents(
  components: Component[],
  started: Component[],
  envoy: EnvoyComponent,
  signalsOff: () => void,
): Promise<number> {
  const { startAll, firstToEnd, closeAll } = await import('./lib/component');
  try {
    await startAll(components, started);
  } catch (err) {
    signalsOff();
    throw err;
  }
  const first = await firstToEnd(components);
  const end =
    first.component === envoy
      ? await envoy.done
      : { code: 1, reason: `${first.component.name} closed${first.err ? `: ${first.err.message}` : ''}` };
  if (first.component !== envoy) await envoy.shutdown(false, end.reason);
  await closeAll(components);
  signalsOff();
  (end.code === 0 ? log.info : log.error)(`agent exiting with code ${end.code}: ${end.reason}`);
  return end.code;
}

/**
 * The xDS upstream: the control plane from the config, or in standalone mode the embedded discovery server (and the
 * socket its CA answers on).
 */
async function xdsUpstream(
  cfg: AgentConfig,
  agentEnv: NodeJS.ProcessEnv,
): Promise<{
  discovery?: DiscoveryServer;
  discoverySock?: string;
  upstream: UpstreamOptions;
}> {
  const { upstreamFromConfig } = await import('./lib/xds-upstream');
  if (!cfg.standaloneDir) return { upstream: upstreamFromConfig(cfg, agentEnv) };
  const discoverySock = path.resolve(cfg.proxy.configPath, 'discovery.sock');
  const { DiscoveryServer } = await import('./lib/discovery/index');
  const discovery = new DiscoveryServer({
    configDir: cfg.standaloneDir,
    listen: `unix:${discoverySock}`,
    mesh: { outboundTrafficPolicy: cfg.outboundTrafficPolicy, ...(cfg.meshTracing && { tracing: cfg.meshTracing }) },
    trustDomain: cfg.trustDomain,
    ...cfg.discoveryLimits,
    ...(cfg.compliancePolicy && { compliancePolicy: cfg.compliancePolicy }),
    // This agent is trusted as its own identity by a token only its memory holds (it reads the directory anyway).
    inProcess: { namespace: cfg.podNamespace || 'default', serviceAccount: cfg.serviceAccount || 'default' },
  });
  log.info(`standalone: embedded discovery server for ${cfg.standaloneDir} is the xDS upstream`);
  const upstream = { address: `unix://${discoverySock}`, tls: false, token: discovery.inProcessToken };
  return { discovery, discoverySock, upstream };
}

/**
 * The gRPC xDS bootstrap at GRPC_XDS_BOOTSTRAP, as Istio's agent writes it for every proxy (directory 0700, file
 * 0644: it holds no secret, only the node and the socket and certificate paths). Returns its path.
 */
async function writeGrpcBootstrap(resolved: Resolved, agentEnv: NodeJS.ProcessEnv): Promise<string> {
  const [{ renderGrpcBootstrap }, { writeFileAtomic }] = await Promise.all([
    import('./lib/grpc-bootstrap'),
    import('./lib/fs-atomic'),
  ]);
  const file = path.resolve(envs.GRPC_XDS_BOOTSTRAP.get(agentEnv));
  const { node, cfg } = resolved;
  const text = renderGrpcBootstrap({
    nodeId: node.id,
    metadata: node.metadata,
    locality: node.locality,
    xdsSocket: cfg.xdsSocket,
    certDir: envs.OUTPUT_CERTS.get(agentEnv) || undefined,
    cwd: process.cwd(),
  });
  try {
    mkdirs(path.dirname(file), 0o700);
    // Written again at every start, like Envoy's bootstrap: atomic, not durable (two fsyncs were ~2.5 ms of the main
    // thread while Envoy starts; the Go agent does not fsync it either).
    writeFileAtomic(file, text, 0o644, { durable: false });
  } catch (err) {
    throw new AgentError('IO', `failed generating gRPC XDS bootstrap (GRPC_XDS_BOOTSTRAP): ${errorMessage(err)}`, err);
  }
  return file;
}

/**
 * `proxy` with DISABLE_ENVOY=true (proxyless gRPC, Istio's grpc-agent template): no Envoy, no bootstrap, no SDS
 * server. The gRPC library in the app reads the gRPC bootstrap and talks xDS to the xDS proxy on the XDS socket;
 * certificates (with a CA or mounted files) are fetched at once and written to OUTPUT_CERTS for its file_watcher
 * provider. Start order: status server, (app probes), (embedded discovery server), (secret cache), xDS proxy, (DNS
 * proxy), gRPC readiness. The agent ends on SIGTERM/SIGINT (exit 0: nothing to drain) or when a component ends
 * (exit 1).
 */
async function proxylessCommand(
  flags: Flags,
  env: NodeJS.ProcessEnv,
  signals: ReturnType<typeof stopSignals>,
  startedAt: number,
): Promise<number> {
  const resolved = await startupChecks(flags, env, false);
  const { cfg } = resolved;
  const agentEnv = { ...cfg.proxy.proxyMetadata, ...env };
  const [
    { composeReadiness, startAll, firstToEnd, closeAll, closedSignal },
    { newRegistry },
    { StatusServer },
    { XdsProxy },
    istio,
    { workloadIdentity },
    { GrpcReady },
    { WORKLOAD_SECRET },
  ] = await Promise.all([
    import('./lib/component'),
    import('./lib/metrics'),
    import('./lib/status-server'),
    import('./lib/xds-proxy'),
    import('./lib/xds-istio'),
    import('./lib/workload-identity'),
    import('./lib/grpc-ready'),
    import('./lib/sds-server'),
  ]);
  const appProbe = await import('./lib/app-probe');
  const appProbers = appProbe.parseAppProbers(env);
  log.info(`pilot-agent ${VERSION} starting proxyless (DISABLE_ENVOY) ${resolved.node.id}`);
  const { discovery, discoverySock, upstream } = await xdsUpstream(cfg, agentEnv);
  // No SDS server: the SDS socket is neither bound nor checked, the secret cache only writes OUTPUT_CERTS.
  const identity = await workloadIdentity(cfg, agentEnv, discoverySock, { sdsServedElsewhere: false });
  const maxMessageBytes = envs.XDS_MAX_MESSAGE_BYTES.get(env);
  const xds = new XdsProxy({ socketPath: cfg.xdsSocket, upstream, maxMessageBytes });
  const [{ readFileOrUndefined }, { canBindPort }] = await Promise.all([
    import('./lib/resolve'),
    import('./lib/capabilities'),
  ]);
  const dnsOptions = { readFile: readFileOrUndefined, canBind53: canBindPort(53) };
  const dns = cfg.dnsEnabled
    ? await import('./lib/dns-server').then((m) => new m.DnsServer(m.dnsOptionsFor(cfg, agentEnv, dnsOptions)))
    : undefined;
  const bootstrapFile = await writeGrpcBootstrap(resolved, agentEnv);
  log.info(`gRPC xDS bootstrap written to ${bootstrapFile}`);
  const registry = newRegistry();
  const stop = closedSignal();
  // SIGTERM/SIGINT as a component that ends, so the agent ends through the same race as when a component fails.
  const stopper: Component = {
    name: 'signal',
    closed: stop.closed,
    start: async () => undefined,
    close: async () => stop.resolve(undefined),
  };
  const status = new StatusServer({
    port: cfg.proxy.statusPort,
    startedAt,
    remoteDebug: envs.STATUS_SERVER_REMOTE_DEBUG.get(env),
    readiness: (): Promise<Condition> => composeReadiness(components),
    metrics: { registry, sources: [] },
  });
  // The app's probes (Kubernetes' rewritten ones) are answered as beside Envoy.
  const probes = appProbers.size
    ? new appProbe.AppProbes({
        probers: appProbers,
        destination: appProbe.appProbeDestination(env),
        connections: appProbe.appProbeConnections(env),
        statusPort: cfg.proxy.statusPort,
        ownPorts: [cfg.proxy.proxyAdminPort],
      })
    : undefined;
  const components = [
    status,
    probes,
    discovery,
    identity?.cache,
    xds,
    dns,
    new GrpcReady(bootstrapFile),
    stopper,
  ].filter((c): c is Component => c !== undefined);
  for (const c of components) {
    if (c.routes) status.addRoutes(c.routes());
    c.registerMetrics?.(registry);
  }
  if (dns) {
    xds.registerHandler(istio.NAME_TABLE_TYPE, (resources) => {
      const table = resources.length ? istio.decodeNameTable(resources[0]!) : { table: {} };
      if (!dns.updateTable(table)) throw new Error('name table rejected by the DNS proxy');
    });
  }
  let stoppedBy: string | undefined;
  signals.instead((sig) => {
    stoppedBy = sig;
    stop.resolve(undefined);
  });
  try {
    await startAll(components);
  } catch (err) {
    signals.off();
    throw err;
  }
  // Nobody asks for certificates over SDS here: with OUTPUT_CERTS they are fetched at once for the gRPC library's
  // file_watcher provider (and rotated by the cache); without, nothing would read them.
  if (envs.OUTPUT_CERTS.get(agentEnv)) identity?.cache.requested(WORKLOAD_SECRET);
  const first = await firstToEnd(components);
  const code = first.component === stopper ? 0 : 1;
  const reason =
    first.component === stopper
      ? (stoppedBy ?? 'stopped')
      : `${first.component.name} closed${first.err ? `: ${first.err.message}` : ''}`;
  await closeAll(components);
  signals.off();
  (code === 0 ? log.info : log.error)(`agent exiting with code ${code}: ${reason}`);
  return code;
}

/** Resolves in the next turn of the event loop, after the I/O that is ready now has been handled. */
const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve));

/**
 * `proxy`: Envoy first (its xDS and SDS sockets bound before it), then the other components, in start order:
 * status server, app probes, profiling, (embedded discovery server), (SDS server and secret cache), xDS proxy, (DNS
 * proxy), (health checker), config watcher. The agent ends when the first of them ends: Envoy's supervisor ends as
 * listed in lib/supervisor.ts (exit 0 or 1); any other component ending shuts Envoy down and exits 1. Anything wrong
 * in the settings is one line and exit 1 before Envoy is spawned.
 */
async function proxyCommand(argv: Record<string, unknown>): Promise<number> {
  serving = true;
  const flags = proxyFlags(argv);
  const env = process.env;
  const startedAt = Date.now();
  const signals = stopSignals();
  try {
    if (envs.DISABLE_ENVOY.get(env)) return await proxylessCommand(flags, env, signals, startedAt);
    // A sidecar that will ask a CA starts its workload key before anything else, on the thread pool (an RSA key is
    // 70-250 ms of it), so it is made while the settings are read and Envoy starts. Its algorithm comes from the
    // process's environment; proxyMetadata rarely changes it, and if it does, the key is made again below.
    if (!flags.standalone && !envs.FILE_MOUNTED_CERTS.get(env)) {
      const csr = await import('./lib/csr');
      try {
        csr.pregenerateKey(csr.workloadKeyAlgorithm(env));
      } catch {
        // a bad setting is reported, with its name, by the checks below
      }
    }
    const resolved = await startupChecks(flags, env);
    const { cfg } = resolved;
    // proxyMetadata entries act as environment variables for the agent, as in Istio.
    const agentEnv = { ...cfg.proxy.proxyMetadata, ...env };
    // Settings read from the environment are checked before anything starts.
    const [appProbe, health, appMetrics, { workloadKeyAlgorithm, pregenerateKey }] = await Promise.all([
      import('./lib/app-probe'),
      import('./lib/health-checker'),
      import('./lib/app-metrics'),
      import('./lib/csr'),
    ]);
    const appProbers = appProbe.parseAppProbers(env);
    // Istio merges the app's metrics for sidecars only.
    const appTargets = cfg.proxyType === 'sidecar' ? appMetrics.parseAppMetricsConfig(env, cfg.proxy.statusPort) : [];
    const readinessProbe = cfg.proxy.readinessProbe
      ? health.parseReadinessProbe(cfg.proxy.readinessProbe, cfg.sources.readinessProbe ?? 'ProxyConfig')
      : undefined;
    const algorithm = workloadKeyAlgorithm(agentEnv);
    // The workload key when a CA will be asked (mounted files may still make it moot): the one started above, unless
    // proxyMetadata changed the algorithm (or standalone with the embedded CA): then one is started after the spawn.
    const standaloneCa = cfg.standaloneDir && fs.existsSync(path.join(cfg.standaloneDir, 'ca', 'identities'));
    const wantKey = !envs.FILE_MOUNTED_CERTS.get(agentEnv) && (!cfg.standaloneDir || standaloneCa);
    envs.METRICS_LOCALHOST_ACCESS_ONLY.get(agentEnv);
    envs.PILOT_AGENT_MERGE_ENVOY_STATS.get(agentEnv);
    const certProvider = await import('./lib/cert-provider');
    if (!cfg.standaloneDir) {
      const xdsPlaintext = cfg.proxy.controlPlaneAuthPolicy === 'NONE' || cfg.proxy.discoveryAddress.endsWith(':15010');
      certProvider.startupRootCheck(agentEnv, !xdsPlaintext, fs.existsSync);
    }
    // As Istio: the CA client (and so CA_PROVIDER) matters unless the certificates are mounted files.
    if (!cfg.standaloneDir && !envs.FILE_MOUNTED_CERTS.get(agentEnv)) {
      const caAddress = envs.CA_ADDR.get(agentEnv) || cfg.proxy.discoveryAddress;
      certProvider.checkCaProvider(envs.CA_PROVIDER.get(agentEnv), caAddress);
    }

    // Envoy is spawned before the rest of the agent loads (gRPC, the servers): its xDS and SDS sockets are bound
    // first and served once their servers have loaded; connections that arrive before wait in the socket. An SDS
    // socket another server already serves (e.g. SPIRE's agent) is left to it.
    const { EnvoyComponent } = await import('./lib/envoy-component');
    const envoy = new EnvoyComponent({ resolved, env, startedAt });
    await envoy.validateFirst();
    log.info(`pilot-agent ${VERSION} starting ${cfg.requestedType} proxy ${resolved.node.id}`);
    const [{ socketInUse }, { prebindUnixSocket, prebindPort }] = await Promise.all([
      import('./lib/unix-socket'),
      import('./lib/prebind'),
    ]);
    // The status port too: one that something else holds ends the start here, before Envoy is spawned, and kubelet's
    // probes and Envoy's 15021 wait (accepted, paused; not refused) until the status server loads. The three are
    // independent, so they are bound side by side; a socket bound when another fails is removed at exit.
    const [sdsServedElsewhere] = await Promise.all([
      socketInUse(cfg.sdsServeSocket),
      prebindUnixSocket(cfg.xdsSocket),
      prebindPort(cfg.proxy.statusPort).catch((err: Error) => {
        throw new AgentError(
          'IO',
          `cannot listen on status port ${cfg.proxy.statusPort} (statusPort from ${cfg.sources.statusPort}): ${err.message}`,
          err,
        );
      }),
    ]);
    // A socket that cannot be bound fails the start only if the agent has certificates to serve (see lib/workload-identity.ts).
    const sdsUnavailable = sdsServedElsewhere
      ? undefined
      : await prebindUnixSocket(cfg.sdsServeSocket).then(
          () => undefined,
          (err: Error) => err,
        );
    signals.whenEnvoy(envoy);
    await envoy.start();
    if (wantKey) pregenerateKey(algorithm);
    // With a CA (not the embedded one, which serves only once the components start), the workload certificate is
    // asked for now, before the rest of the agent loads: the CA's answer overlaps Envoy's start and the loading.
    const { workloadIdentity } = await import('./lib/workload-identity');
    const early = cfg.standaloneDir
      ? undefined
      : await workloadIdentity(cfg, agentEnv, undefined, { sdsServedElsewhere, sdsUnavailable });
    await early?.cache.start();
    // The bundle's dynamic imports resolve as microtasks, so loading the rest would hold the event loop until it is
    // all done: the CA call's connect and answer, Envoy's first connections, wait for a turn of the loop. The CSR is
    // made and its connection opened within start(); a few turns let the connection (and TLS) get the request out,
    // then each group of modules loads in a turn of its own.
    for (let i = 0; i < 3; i++) await nextTurn();
    // The xDS proxy (its gRPC is node:http2, lib/grpc-server.ts; protobufjs is not on this path: see
    // lib/xds-secret-names.ts).
    const xdsMod = await import('./lib/xds-proxy');
    await nextTurn();

    const { discovery, discoverySock, upstream } = await xdsUpstream(cfg, agentEnv);
    const identity = cfg.standaloneDir
      ? await workloadIdentity(cfg, agentEnv, discoverySock, { sdsServedElsewhere, sdsUnavailable })
      : early;
    // The SDS server serves a file name only while this Envoy's config references it: the listeners and clusters the
    // xDS proxy passes on, and the bootstrap (names of every epoch's bootstrap are kept: an old epoch may still drain).
    const xds = new xdsMod.XdsProxy({
      socketPath: cfg.xdsSocket,
      upstream,
      maxMessageBytes: envs.XDS_MAX_MESSAGE_BYTES.get(env),
      secretReferences: identity?.sds.references,
    });
    // WasmPlugin: ECDS Wasm filters with a remote module get it as a local file the agent fetched (lib/wasm-ecds.ts).
    const wasm = envs.ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION.get(agentEnv)
      ? await Promise.all([import('./lib/wasm-ecds'), import('./lib/envoy-process')]).then(
          ([m, { envoyCredentials }]) => {
            // The modules are Envoy's to read: 0600 files owned by the user it runs as.
            const owner = envoyCredentials(env, process.getuid?.() ?? -1);
            const w = new m.WasmEcds(m.wasmCacheOptions(agentEnv, cfg.proxy.configPath, owner));
            xds.registerRewriter(m.EXTENSION_CONFIG_TYPE, w.rewrite);
            return w;
          },
        )
      : undefined;
    const { sdsNamesInJson } = await import('./lib/secret-names');
    const bootstrapSecrets = new Set<string>();
    const noteBootstrapSecrets = (r: Resolved) => {
      for (const n of sdsNamesInJson(r.bootstrap)) bootstrapSecrets.add(n);
      identity?.sds.references.set('bootstrap', bootstrapSecrets);
    };
    noteBootstrapSecrets(resolved);
    // Certificate updates go to every Envoy stream holding the secret.
    identity?.cache.onUpdate((name) => identity.sds.push(name));
    // Envoy's first xDS and SDS streams wait in their pre-bound sockets for these two servers, so with a control plane
    // elsewhere they start now, before the rest of the agent loads (the status server, metrics, the config watcher,
    // the DNS proxy). Standalone, the embedded discovery server they talk to starts first, in order below.
    const started: Component[] = [envoy];
    if (!cfg.standaloneDir) {
      // The ECDS rewriter's module cache first: the proxy may pass it a response as soon as it serves.
      if (wasm) {
        await wasm.start();
        started.push(wasm);
      }
      await xds.start();
      started.push(xds);
      if (identity) {
        await identity.sds.start();
        started.push(identity.sds);
      }
    }
    await nextTurn();
    // The rest loads in three turns, so Envoy's first xDS request and the CA's answer, which arrive about now, wait
    // for one group at most (each is a few ms of module bodies run as one task).
    const [{ composeReadiness }, { StatusServer }] = await Promise.all([
      import('./lib/component'),
      import('./lib/status-server'),
    ]);
    await nextTurn();
    const [{ ConfigReloader }, istio, { Profiling }] = await Promise.all([
      import('./lib/config-reloader'),
      import('./lib/xds-istio'),
      import('./lib/profiling'),
    ]);
    await nextTurn();
    const { readFileOrUndefined } = await import('./lib/resolve');
    const { canBindPort } = await import('./lib/capabilities');
    const dns = cfg.dnsEnabled
      ? await import('./lib/dns-server').then(
          (m) =>
            new m.DnsServer(
              m.dnsOptionsFor(cfg, agentEnv, { readFile: readFileOrUndefined, canBind53: canBindPort(53) }),
            ),
        )
      : undefined;
    // The agent's own metrics are made on the first scrape (prom-client and each component's metric objects: ~5 ms
    // of the main thread while Envoy starts otherwise); the values they read are kept by the components meanwhile.
    const registry = (): Registry => {
      // eslint-disable-next-line @typescript-eslint/no-require-imports
      const r = (require('./lib/metrics') as typeof import('./lib/metrics')).newRegistry();
      for (const c of components) c.registerMetrics?.(r);
      identity?.signer?.registerMetrics(r);
      return r;
    };
    const status = new StatusServer({
      port: cfg.proxy.statusPort,
      startedAt,
      remoteDebug: envs.STATUS_SERVER_REMOTE_DEBUG.get(env),
      readiness: (): Promise<Condition> => composeReadiness(components),
      metrics: {
        registry,
        sources: [
          ...(envs.PILOT_AGENT_MERGE_ENVOY_STATS.get(agentEnv) ? [envoy.statsSource] : []),
          ...appMetrics.appMetricsSources(appTargets),
        ],
        localOnly: envs.METRICS_LOCALHOST_ACCESS_ONLY.get(agentEnv),
      },
    });
    // VMs: the workload's readiness goes to the control plane as a health event; the xDS proxy re-sends it on reconnect.
    const healthChecker =
      readinessProbe &&
      new health.HealthChecker({
        probe: readinessProbe,
        defaultHost: envs.REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION.get(env)
          ? 'localhost'
          : (resolved.node.ips[0] ?? 'localhost'),
        onChange: (e) => xds.send(health.healthInformationRequest(e)),
        envoyReady: async () => (await envoy.readiness()).ready,
      });
    const optional: Array<Component | undefined> = [
      status,
      appProbers.size
        ? new appProbe.AppProbes({
            probers: appProbers,
            destination: appProbe.appProbeDestination(env),
            connections: appProbe.appProbeConnections(env),
            statusPort: cfg.proxy.statusPort,
            ownPorts: [cfg.proxy.proxyAdminPort, cfg.envoyStatusPort, cfg.envoyPrometheusPort],
          })
        : undefined,
      argv.profiling === false ? undefined : new Profiling({ heapSnapshots: envs.PILOT_AGENT_HEAP_SNAPSHOTS.get(env) }),
      discovery,
      identity?.cache,
      identity?.sds,
      wasm,
      xds,
      dns,
      envoy,
      healthChecker,
      new ConfigReloader({
        flags,
        env,
        resolved,
        onChange: (r, generation) => {
          noteBootstrapSecrets(r);
          envoy.setDesired(r, generation);
        },
      }),
    ];
    const components = optional.filter((c): c is Component => c !== undefined);
    for (const c of components) if (c.routes) status.addRoutes(c.routes());

    // Types for the agent, never for Envoy: the xDS proxy subscribes to them after Envoy's first LDS request. A name
    // table the DNS proxy rejects is NACKed; it keeps answering from the last good one.
    if (dns) {
      xds.registerHandler(istio.NAME_TABLE_TYPE, (resources) => {
        if (!dns.updateTable(resources.length ? istio.decodeNameTable(resources[0]!) : { table: {} }))
          throw new Error('name table rejected by the DNS proxy');
      });
    } else status.route('GET', '/debug/ndsz', () => ({ status: 404, body: 'DNS proxy is not enabled\n' }));
    if (envs.PROXY_CONFIG_XDS_AGENT.get(env)) {
      // Pushed ProxyConfig (PCDS): its caCertificatesPem join ROOTCA (root migration), as Go's UpdateConfigTrustBundle;
      // a root that does not parse NACKs the push. Without a secret cache it is only acknowledged and recorded.
      xds.registerHandler(istio.PROXY_CONFIG_TYPE, (resources, meta) => {
        log.info(`proxy config from the control plane: version ${meta.version}, ${resources.length} resource(s)`);
        if (resources.length) identity?.cache.setConfigTrustBundle(istio.decodeProxyConfigCaCerts(resources[0]!));
      });
    }
    const running = runComponents(components, started, envoy, () => signals.off());
    running.catch(() => undefined); // awaited below; a failed start must not count as unhandled meanwhile
    // Beside Envoy the gRPC bootstrap is a by-product (an app may use proxyless gRPC next to the sidecar), written
    // once the components are starting: a failure to write it is logged, and like Envoy's bootstrap it is removed
    // when the agent exits.
    await writeGrpcBootstrap(resolved, agentEnv).then(
      (f) => process.on('exit', () => fs.rmSync(f, { force: true })),
      (err: Error) => log.warn(err.message),
    );
    return await running;
  } catch (err) {
    return startupFailure(err);
  }
}

// `proxy` flags the fast path below parses itself: those taking a value, and the booleans.
const PROXY_VALUE_FLAGS = new Set([
  'log_output_level',
  'log_target',
  'log_caller',
  'log_stacktrace_level',
  'domain',
  'meshConfig',
  'serviceCluster',
  'proxyLogLevel',
  'proxyComponentLogLevel',
  'concurrency',
  'templateFile',
  'outlierLogPath',
  'standalone',
]);
const PROXY_BOOLEAN_FLAGS = new Set(['log_as_json', 'profiling']);

/**
 * `proxy [type] --flag=value --flag value ...` with only the flags above, as the injector and every bench run it,
 * parsed without loading yargs (its load and parse were ~10 ms of the agent's start before Envoy's spawn). Anything
 * else (help, an unknown or repeated-positional form, a boolean written otherwise, a value that looks like a flag)
 * returns undefined and goes to yargs, so errors and help stay yargs'.
 */
export function fastProxyArgv(args: string[]): Record<string, unknown> | undefined {
  if (args[0] !== 'proxy') return undefined;
  const argv: Record<string, unknown> = { log_as_json: false, profiling: true, type: 'sidecar' };
  let positional = false;
  for (let i = 1; i < args.length; i++) {
    const a = args[i]!;
    if (!a.startsWith('--')) {
      if (positional || a.startsWith('-') || a === '') return undefined;
      positional = true;
      argv.type = a;
      continue;
    }
    const eq = a.indexOf('=');
    const name = a.slice(2, eq < 0 ? undefined : eq);
    let value: string;
    if (PROXY_BOOLEAN_FLAGS.has(name)) {
      const v = eq < 0 ? (name === 'log_as_json' ? 'true' : '') : a.slice(eq + 1);
      // yargs takes a following "true"/"false" as the boolean's value; that form is left to it.
      if ((v !== 'true' && v !== 'false') || (eq < 0 && /^(true|false)$/.test(args[i + 1] ?? ''))) return undefined;
      argv[name] = v === 'true';
      continue;
    }
    if (!PROXY_VALUE_FLAGS.has(name)) return undefined;
    if (eq >= 0) value = a.slice(eq + 1);
    else {
      const next = args[i + 1];
      if (next === undefined || next.startsWith('-')) return undefined;
      value = next;
      i++;
    }
    if (value === '') return undefined;
    if (name === 'concurrency') {
      if (!/^\d+$/.test(value)) return undefined;
      argv[name] = Number(value);
    } else if (name === 'log_target') {
      argv[name] = [...((argv[name] as string[] | undefined) ?? []), value];
    } else {
      argv[name] = value;
    }
  }
  return argv;
}

export async function main(args: string[]): Promise<number> {
  // The most common call by scripts and image checks, answered without loading the command-line parser.
  if (args.length === 1 && args[0] === 'version') {
    process.stdout.write(versionText('', false));
    return 0;
  }
  const fast = fastProxyArgv(args);
  if (fast) {
    setUpLogging(fast);
    return proxyCommand(fast);
  }
  // istio-iptables keeps Istio's own flag syntax (pflag: -p 15001, -x "", grouped shorthands), so it bypasses yargs.
  const sub = args.findIndex((a) => !a.startsWith('-'));
  if (args[sub] === 'istio-iptables' || args[sub] === 'istio-clean-iptables') {
    return import('./lib/iptables-command').then((m) =>
      (args[sub] === 'istio-iptables' ? m.runIstioIptables : m.runIstioCleanIptables)([
        ...args.slice(0, sub),
        ...args.slice(sub + 1),
      ]),
    );
  }
  let result: Promise<number> = Promise.resolve(0);
  const logFlags = (y: Argv) =>
    y
      .option('log_output_level', {
        type: 'string',
        describe: 'Per-scope log levels: scope:level,... (a bare level sets the default)',
      })
      .option('log_as_json', { type: 'boolean', default: false, describe: 'Log one JSON object per line' })
      // Not `array: true`: that would take the command's positional argument too; a repeated flag is a list anyway.
      .option('log_target', {
        type: 'string',
        describe: 'Where the log goes: stdout, stderr (default) or a file (repeatable)',
      })
      .option('log_caller', { type: 'string', describe: 'Scopes whose lines carry the caller (file:line), or all' })
      .option('log_stacktrace_level', {
        type: 'string',
        describe: 'scope:level,... from which lines carry a stack trace',
      });
  const proxyOptions = (y: Argv) =>
    logFlags(y)
      .positional('type', { type: 'string', default: 'sidecar', describe: 'sidecar, router, ingress or waypoint' })
      .option('domain', {
        type: 'string',
        requiresArg: true,
        describe: 'DNS domain suffix (default $POD_NAMESPACE.svc.cluster.local)',
      })
      .option('meshConfig', {
        type: 'string',
        requiresArg: true,
        describe: 'Mesh config file (default ./etc/istio/config/mesh)',
      })
      .option('serviceCluster', {
        type: 'string',
        requiresArg: true,
        describe: 'Service cluster (default istio-proxy)',
      })
      .option('proxyLogLevel', {
        type: 'string',
        requiresArg: true,
        describe: 'Envoy log level, optionally with component levels: info,misc:error',
      })
      .option('proxyComponentLogLevel', {
        type: 'string',
        requiresArg: true,
        describe: 'Envoy component log levels: misc:error,upstream:debug',
      })
      .option('concurrency', { type: 'number', requiresArg: true, describe: 'Envoy worker threads (0: all cores)' })
      .option('templateFile', { type: 'string', requiresArg: true, describe: 'Bootstrap template file' })
      .option('outlierLogPath', { type: 'string', requiresArg: true, describe: 'Outlier detection log path' })
      .option('standalone', {
        type: 'string',
        requiresArg: true,
        describe: 'Directory of mesh config YAML: run an embedded discovery server instead of using istiod',
      })
      .option('profiling', {
        type: 'boolean',
        default: true,
        describe: 'Serve /debug/pprof/ (heap snapshot, CPU and allocation profiles) on the status port, loopback only',
      });

  const { default: yargs } = await import('yargs');
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
    .command(
      'version',
      'Print the version',
      (y) =>
        y
          .option('short', { alias: 's', type: 'boolean', describe: 'Print only the version number' })
          .option('output', { alias: 'o', type: 'string', describe: 'json or yaml' }),
      (argv) => {
        process.stdout.write(versionText(String(argv.output ?? ''), Boolean(argv.short)));
      },
    )
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
        // node:http is loaded only by the commands that need it (it cannot live in the startup snapshot).
        result = import('./lib/agent-client').then((m) =>
          m.waitReady({
            url: argv.url,
            periodMs: argv.periodMillis,
            requestTimeoutMs: argv.requestTimeoutMillis,
            timeoutMs: argv.timeoutSeconds * 1000,
          }),
        );
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
        result = requestCommand({ method: argv.method, path: argv.path, body: argv.body, port: argv['debug-port'] });
      },
    )
    .command(
      'discovery',
      'Run the embedded, file-driven discovery server',
      (y) =>
        logFlags(y)
          .option('config-dir', { type: 'string', demandOption: true, describe: 'Directory of Istio-style YAML' })
          .option('grpc-addr', {
            type: 'string',
            describe: 'HOST:PORT or a unix socket path (default 127.0.0.1:15010)',
          })
          .option('outbound-traffic-policy', {
            type: 'string',
            choices: ['ALLOW_ANY', 'REGISTRY_ONLY'],
            describe: 'What sidecars do with unknown hosts (default ALLOW_ANY)',
          })
          .option('meshConfig', {
            type: 'string',
            requiresArg: true,
            describe: 'Mesh config file whose tracing fields (enableTracing, defaultProviders.tracing) apply',
          }),
      (argv) => {
        setUpLogging(argv);
        serving = true;
        result = import('./lib/discovery/index').then((m) =>
          m.runDiscoveryCommand({
            configDir: argv['config-dir'],
            grpcAddr: argv['grpc-addr'],
            outboundTrafficPolicy: argv['outbound-traffic-policy'] as 'ALLOW_ANY' | 'REGISTRY_ONLY' | undefined,
            meshConfigFile: argv['meshConfig'],
          }),
        );
      },
    )
    .command(
      'completion <shell>',
      'Print a shell completion script (bash or zsh)',
      (y) => y.positional('shell', { type: 'string', choices: ['bash', 'zsh'], demandOption: true }),
      (argv) => {
        result = completionCommand(argv.shell as 'bash' | 'zsh');
      },
    )
    .command('istio-iptables', "Set up traffic capture with iptables (Istio's flags; run before the proxy starts)")
    .command('istio-clean-iptables', 'Remove the traffic capture rules istio-iptables set up')
    .demandCommand(
      1,
      'name a command: proxy, bootstrap, wait, request, discovery, istio-iptables, istio-clean-iptables, ' +
        'completion or version',
    )
    .strictCommands()
    .fail((msg, err) => {
      throw msg ? new UsageError(msg) : err;
    });
  try {
    await parser.parseAsync();
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(`error: ${err.message} (see pilot-agent --help)\n`);
      return EXIT_USAGE;
    }
    return startupFailure(err);
  }
  return result;
}

/** Exits once stdout and stderr have written everything (process.exit alone cuts a piped output at 64 KiB). */
function exitAfterFlush(code: number): void {
  let pending = 2;
  const done = () => --pending === 0 && process.exit(code);
  process.stdout.write('', done);
  process.stderr.write('', done);
}

/** Set by the long-running commands: output that closes under them is not a reason to stop. */
let serving = false;

/** The executable's entry: runs the command line and exits. The V8 startup snapshot calls it as its main function. */
export function runCli(): void {
  applyV8Flags(envs.PILOT_AGENT_V8_FLAGS.get(process.env));
  const profile = envs.PILOT_AGENT_CPU_PROFILE.get(process.env);
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  if (profile) (require('./lib/cpu-profile') as typeof import('./lib/cpu-profile')).startCpuProfile(profile);
  // A reader that went away (`pilot-agent request ... | head`): a one-shot command stops quietly, as a Go program
  // does on SIGPIPE. `proxy` and `discovery` keep serving without their output (their log lines are dropped): the
  // Go agent dies there and leaves Envoy running without its agent, and its shared memory behind.
  for (const stream of [process.stdout, process.stderr]) {
    stream.on('error', (err: NodeJS.ErrnoException) => {
      if (serving) return;
      if (err.code === 'EPIPE') process.exit(0);
      throw err;
    });
  }
  main(process.argv.slice(2)).then(
    (code) => exitAfterFlush(code),
    (err) => {
      log.error(`fatal: ${errorMessage(err)}`);
      exitAfterFlush(EXIT_STARTUP_ERROR);
    },
  );
}

/**
 * Build time only (scripts/code-cache.js): loads what every `proxy` sidecar start loads (not what only some
 * settings load, such as the DNS proxy: the cache is deserialised whole at each start), without running anything,
 * so that the V8 code cache made after it holds those modules compiled (see scripts/sea-main.js).
 */
export async function loadForCodeCache(exercise?: { templateFile: string; dir: string }): Promise<void> {
  const [{ resolveAll }, { renderBootstrap }, { generateKeyAndCsr }, { encodeCertificateRequest }] = await Promise.all([
    import('./lib/resolve'),
    import('./lib/bootstrap'),
    import('./lib/csr'),
    import('./lib/ca-protos'),
  ]);
  if (exercise) {
    // The pure part of a start, once, so that the functions it calls are compiled into the cache too: settings and
    // bootstrap from Istio's template, and a CSR (an ECDSA key: fast; RSA shares the code after key generation).
    const env = {
      PROXY_CONFIG: JSON.stringify({ configPath: exercise.dir, binaryPath: '/bin/true' }),
      POD_NAME: 'app-1',
      POD_NAMESPACE: 'default',
      INSTANCE_IP: '10.0.0.1',
      SERVICE_ACCOUNT: 'default',
    };
    const r = resolveAll({ proxyType: 'sidecar', templateFile: exercise.templateFile, logAsJson: false }, env);
    renderBootstrap(r.bootstrap);
    const { csrPem } = await generateKeyAndCsr({
      identity: 'spiffe://cluster.local/ns/default/sa/default',
      algorithm: { kind: 'ECDSA' },
    });
    encodeCertificateRequest({ csr: csrPem, validityDuration: 86400 });
  }
  // Besides the four above:
  await Promise.all([
    import('./lib/config-path-lock'),
    import('./lib/sds-sockets'),
    import('./lib/app-probe'),
    import('./lib/health-checker'),
    import('./lib/app-metrics'),
    import('./lib/cert-provider'),
    import('./lib/envoy-component'),
    import('./lib/envoy-process'),
    import('./lib/unix-socket'),
    import('./lib/prebind'),
    import('./lib/workload-identity'),
    import('./lib/envoy-protos'),
    import('./lib/xds-proxy'),
    import('./lib/xds-upstream'),
    import('./lib/grpc-server'),
    import('./lib/sds-server'),
    import('./lib/component'),
    import('./lib/metrics'),
    import('./lib/status-server'),
    import('./lib/config-reloader'),
    import('./lib/xds-istio'),
    import('./lib/profiling'),
    import('./lib/secret-names'),
    import('./lib/capabilities'),
    import('./lib/wasm-ecds'),
    import('./lib/grpc-bootstrap'),
    import('./lib/fs-atomic'),
  ]);
}

// (`module` is not defined inside the snapshot builder, where agent-snapshot.ts is the entry.)
if (typeof module !== 'undefined' && require.main === module) runCli();
