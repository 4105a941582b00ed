// The agent's configuration, built once and frozen:
// defaults <- mesh config file (defaultConfig) <- PROXY_CONFIG <- pod annotation proxy.istio.io/config <- env <- flags.

import * as path from 'node:path';
import * as envs from './env';
import type { Env } from './env';
import { dict } from './dict';
import { formatDuration } from './duration';
import { configError, errorMessage } from './errors';
import {
  asPort,
  concurrencyProblem,
  defaultProxyConfig,
  discoveryAddressProblem,
  parseProxyConfigLayer,
  type ProxyConfig,
  type ProxyConfigLayer,
} from './proxy-config';
import { parseLevel } from './log';
import { parseJsonOrYaml } from './json-or-yaml';
import { type MeshTracing, readMeshTracing } from './discovery/mesh-tracing';

export type ProxyType = 'sidecar' | 'router';

export interface Flags {
  proxyType?: string;
  domain?: string;
  meshConfig?: string;
  serviceCluster?: string;
  proxyLogLevel?: string;
  proxyComponentLogLevel?: string;
  concurrency?: number;
  templateFile?: string;
  outlierLogPath?: string;
  /** Directory of standalone discovery config; the agent runs its own discovery server. */
  standalone?: string;
  /** --log_as_json: the agent's and Envoy's logs as JSON lines. */
  logAsJson?: boolean;
}

export interface ConfigInputs {
  flags: Flags;
  env: Env;
  /** Returns the file's text, or undefined when it does not exist. */
  readFile(file: string): string | undefined;
  /** What the agent found at the well-known SDS sockets at start (lib/sds-sockets.ts); default: nothing. */
  sockets?: SdsSocketFacts;
}

/**
 * The Go agent's socket facts: `externalSds`, another server (e.g. SPIRE's agent) serves the workload SDS socket, so
 * the agent serves only file certificates, on FILES_SOCKET (Go's ServeOnlyFiles, metadata `file-credential`);
 * `credentialSocket`, a server answers on CREDENTIAL_SOCKET (metadata `credential`, istiod's `sds-external`).
 */
export interface SdsSocketFacts {
  externalSds: boolean;
  credentialSocket: boolean;
}

export interface AgentConfig {
  /** The role used in the node id and bootstrap (`ingress` is run as a router). */
  proxyType: ProxyType;
  /** What the user asked for: sidecar, router or ingress. */
  requestedType: string;
  proxy: Readonly<ProxyConfig>;
  domain: string;
  serviceCluster: string;
  /** Envoy's -l level. */
  proxyLogLevel: string;
  /** Envoy's --component-log-level, including components given in --proxyLogLevel. */
  componentLogLevel: string;
  /** Envoy logs JSON lines too (--log_as_json), else Istio's tab-separated text. */
  logAsJson: boolean;
  concurrency: number | undefined;
  templateFile: string;
  meshConfigFile: string;
  /** The mesh config's outboundTrafficPolicy.mode, for the embedded discovery server (standalone mode). */
  outboundTrafficPolicy: OutboundTrafficPolicy;
  /** The mesh config's tracing fields (enableTracing, defaultProviders.tracing, ...), for the embedded discovery server (read in standalone mode only). */
  meshTracing: MeshTracing | undefined;
  bootstrapOverrideFile: string;
  outlierLogPath: string;
  podName: string;
  podNamespace: string;
  instanceIps: string[];
  serviceAccount: string;
  trustDomain: string;
  clusterId: string;
  deltaXds: boolean;
  dnsEnabled: boolean;
  dnsProxyAddr: string;
  envoyStatusPort: number;
  envoyPrometheusPort: number;
  exitOnZeroActiveConnections: boolean;
  minimumDrainDuration: number;
  maximumDrainDuration: number;
  xdsSocket: string;
  /** The workload SDS socket Envoy's sds-grpc cluster names: WORKLOAD_SDS_DIR/WORKLOAD_IDENTITY_SOCKET_FILE. */
  sdsSocket: string;
  /** Where the agent's own SDS server listens: sdsSocket, or FILES_SOCKET when another server serves sdsSocket. */
  sdsServeSocket: string;
  sockets: SdsSocketFacts;
  /** ENVOY_ADMIN_MODE=uds: Envoy's admin listens on this Unix socket instead of proxyAdminPort ('' for TCP). */
  envoyAdminSocket: string;
  standaloneDir: string;
  /** Limits on the standalone directory's files (DISCOVERY_MAX_FILE_BYTES, DISCOVERY_MAX_DOCUMENTS). */
  discoveryLimits: { maxFileBytes: number; maxDocuments: number };
  /** Pod labels and annotations read from ./etc/istio/pod. */
  podLabels: Record<string, string>;
  podAnnotations: Record<string, string>;
  /** Envoy gets --skip-deprecated-logs (ENVOY_SKIP_DEPRECATED_LOGS, default true as in Istio). */
  skipDeprecatedLogs: boolean;
  /** PEER_METADATA_DISCOVERY when set. */
  metadataDiscovery: boolean | undefined;
  workloadIdentitySocketFile: string;
  /** COMPLIANCE_POLICY (fips-140-2 adds a runtime flag; standalone: restricts the TLS the discovery server generates). */
  compliancePolicy: string;
  /** HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED. */
  stripFragmentFromPath: boolean;
  /** ENVOY_SECURE_METRICS_PORT / ENVOY_SECURE_MERGED_METRICS_PORT (0: none): mTLS scrape listeners. */
  secureMetricsPort: number;
  secureMergedMetricsPort: number;
  /** ISTIO_DUAL_STACK: a pod with IPv4 and IPv6 addresses gets both loopbacks and wildcards, as in Istio. */
  dualStack: boolean;
  /** HOST_IP: replaces `$(HOST_IP)` in tracer addresses, as Istio does. */
  hostIp: string;
  /** ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL: the readiness listener accepts a PROXY protocol header. */
  statusPortProxyProtocol: boolean;
  /** Where each ProxyConfig field's value came from, for error messages and `bootstrap` output. */
  sources: Record<string, string>;
}

export type OutboundTrafficPolicy = 'ALLOW_ANY' | 'REGISTRY_ONLY';

export const DEFAULT_MESH_CONFIG = './etc/istio/config/mesh';
export const POD_LABELS_FILE = './etc/istio/pod/labels';
/** Where Istio's images (and VM packages) put the bootstrap template; the Go agent renders it when present. */
export const DEFAULT_TEMPLATE_FILE = './var/lib/istio/envoy/envoy_bootstrap_tmpl.json';
export const POD_ANNOTATIONS_FILE = './etc/istio/pod/annotations';
export const WORKLOAD_SDS_DIR = './var/run/secrets/workload-spiffe-uds';
export const SDS_SOCKET = `${WORKLOAD_SDS_DIR}/socket`;
/** Istio's gateway credential socket (pkg/security CredentialNameSocketPath) and the agent's files-only SDS one. */
export const CREDENTIAL_SOCKET = './var/run/secrets/credential-uds/socket';
export const FILES_SOCKET = './var/run/secrets/credential-uds/files-socket';

/** WORKLOAD_IDENTITY_SOCKET_FILE names a file in WORKLOAD_SDS_DIR, never a path (Go refuses one at start). */
export function workloadSdsSocket(file: string, source: string): string {
  if (!file || file !== path.basename(file) || file === '.' || file === '..') {
    throw configError(
      'WORKLOAD_IDENTITY_SOCKET_FILE',
      source,
      `workload identity socket file override must be a filename, not a path: ${file}`,
    );
  }
  return `${WORKLOAD_SDS_DIR}/${file}`;
}

const ENVOY_LEVELS = new Set(['trace', 'debug', 'info', 'warning', 'warn', 'error', 'critical', 'off']);

function parseYamlOrJson(text: string, source: string): unknown {
  try {
    return parseJsonOrYaml(text);
  } catch (e) {
    throw configError('document', source, `not valid YAML or JSON: ${errorMessage(e).split('\n')[0]}`);
  }
}

/** Parses Kubernetes downward-API files: `key="value"` lines with Go-quoted values. */
export function parseDownwardApi(text: string): Record<string, string> {
  const out = dict<string>();
  for (const line of text.split('\n')) {
    const m = /^([^=]+)=(.*)$/.exec(line.trim());
    if (!m) continue;
    let v = m[2]!;
    if (v.startsWith('"') && v.endsWith('"') && v.length >= 2) {
      try {
        v = JSON.parse(v);
      } catch {
        v = v.slice(1, -1);
      }
    }
    out[m[1]!] = v;
  }
  return out;
}

/** `info,misc:error` -> level info, components misc:error. */
export function splitProxyLogLevel(spec: string, source: string): { level: string; components: string[] } {
  let level = '';
  const components: string[] = [];
  for (const part of spec
    .split(',')
    .map((p) => p.trim())
    .filter(Boolean)) {
    const idx = part.indexOf(':');
    const lvl = idx < 0 ? part : part.slice(idx + 1);
    if (!ENVOY_LEVELS.has(lvl)) throw configError('proxyLogLevel', source, `unknown Envoy log level "${lvl}"`);
    if (idx < 0) level = part;
    else components.push(part);
  }
  return { level: level === 'warn' ? 'warning' : level, components };
}

export function buildConfig(inputs: ConfigInputs): AgentConfig {
  const { flags, env } = inputs;
  const sources = dict<string>();
  let proxy: ProxyConfig = defaultProxyConfig();
  for (const k of Object.keys(proxy)) sources[k] = 'default';

  const apply = (layer: ProxyConfigLayer, source: string) => {
    const { extra, ...fields } = layer;
    // serviceCluster and tracingServiceName are one field in Istio (a oneof): setting one clears the other.
    const oneof: ProxyConfigLayer = fields.tracingServiceName
      ? { serviceCluster: '' }
      : fields.serviceCluster !== undefined
        ? { tracingServiceName: '' }
        : {};
    proxy = { ...proxy, ...oneof, ...fields, extra: { ...proxy.extra, ...extra } };
    for (const k of [...Object.keys(fields), ...Object.keys(extra ?? {})]) sources[k] = source;
  };

  // Mesh config file: absent at the default path is fine; absent when named explicitly is an error.
  const meshConfigFile = flags.meshConfig ?? DEFAULT_MESH_CONFIG;
  const meshText = inputs.readFile(meshConfigFile);
  if (meshText === undefined && flags.meshConfig !== undefined) {
    throw configError('meshConfig', '--meshConfig', `file ${meshConfigFile} does not exist`);
  }
  let outboundTrafficPolicy: OutboundTrafficPolicy = 'ALLOW_ANY';
  let meshTracing: MeshTracing | undefined;
  if (meshText !== undefined && meshText.trim() !== '') {
    const src = `mesh config ${meshConfigFile}`;
    const mesh = parseYamlOrJson(meshText, src);
    if (mesh !== null && (typeof mesh !== 'object' || Array.isArray(mesh)))
      throw configError('document', src, 'want a MeshConfig mapping');
    const dc = (mesh as Record<string, unknown> | null)?.defaultConfig;
    apply(parseProxyConfigLayer(dc, `${src} defaultConfig`), src);
    const otp = (mesh as Record<string, unknown> | null)?.outboundTrafficPolicy;
    if (otp !== undefined && otp !== null) {
      const mode = typeof otp === 'object' && !Array.isArray(otp) ? (otp as Record<string, unknown>).mode : undefined;
      if (mode !== undefined && mode !== 'ALLOW_ANY' && mode !== 'REGISTRY_ONLY') {
        throw configError(
          'outboundTrafficPolicy.mode',
          src,
          `${JSON.stringify(mode)} is not ALLOW_ANY or REGISTRY_ONLY`,
        );
      }
      if (mode) outboundTrafficPolicy = mode;
    }
    // Only the embedded discovery server uses these, and it supports fewer providers than istiod: an agent fed
    // by istiod must not refuse a mesh config whose tracing it never reads.
    if (flags.standalone !== undefined) meshTracing = readMeshTracing(mesh, src);
  }

  const proxyConfigEnv = envs.PROXY_CONFIG.get(env);
  if (proxyConfigEnv.trim() !== '') {
    apply(
      parseProxyConfigLayer(
        parseYamlOrJson(proxyConfigEnv, 'environment variable PROXY_CONFIG'),
        'environment variable PROXY_CONFIG',
      ),
      'environment variable PROXY_CONFIG',
    );
  }

  const labelsText = inputs.readFile(POD_LABELS_FILE);
  const annotationsText = inputs.readFile(POD_ANNOTATIONS_FILE);
  const podLabels = labelsText ? parseDownwardApi(labelsText) : dict<string>();
  const podAnnotations = annotationsText ? parseDownwardApi(annotationsText) : dict<string>();
  const annSrc = `annotation proxy.istio.io/config in ${POD_ANNOTATIONS_FILE}`;
  if (podAnnotations['proxy.istio.io/config'])
    apply(parseProxyConfigLayer(parseYamlOrJson(podAnnotations['proxy.istio.io/config'], annSrc), annSrc), annSrc);
  if (podAnnotations['sidecar.istio.io/discoveryAddress'])
    apply(
      { discoveryAddress: podAnnotations['sidecar.istio.io/discoveryAddress'] },
      'annotation sidecar.istio.io/discoveryAddress',
    );
  if (podAnnotations['status.sidecar.istio.io/port']) {
    const src = 'annotation status.sidecar.istio.io/port';
    apply(
      {
        statusPort: asPort(podAnnotations['status.sidecar.istio.io/port'], (p) => {
          throw configError('statusPort', src, p);
        }) as number,
      },
      src,
    );
  }

  // proxyMetadata entries act as environment variables (Istio applies them before reading env).
  const effEnv: Env = dict({ ...proxy.proxyMetadata, ...env });

  // Flags.
  if (flags.serviceCluster !== undefined && !proxy.tracingServiceName)
    apply({ serviceCluster: flags.serviceCluster }, '--serviceCluster');
  if (flags.concurrency !== undefined) apply({ concurrency: flags.concurrency }, '--concurrency');
  if (proxy.concurrency === undefined) {
    const cpu = envs.ISTIO_CPU_LIMIT.get(effEnv);
    if (cpu > 0) apply({ concurrency: cpu }, 'environment variable ISTIO_CPU_LIMIT');
  }
  // Checked once, whichever layer set it last (the flag and ISTIO_CPU_LIMIT bypass the ProxyConfig parser).
  const concurrencyBad = proxy.concurrency === undefined ? undefined : concurrencyProblem(proxy.concurrency);
  if (concurrencyBad) throw configError('concurrency', sources.concurrency!, concurrencyBad);
  if (flags.templateFile) apply({ proxyBootstrapTemplatePath: flags.templateFile }, '--templateFile');
  // ISTIO_BOOTSTRAP picks the template over everything else, as in Istio, without becoming part of the ProxyConfig.
  // With no template named, a file at Istio's default template path is used, as the Go agent does (a template
  // customised in the image or mounted there); without one, the bootstrap is generated (the same as Istio's
  // stock template gives, which test/parity.test.ts checks).
  let templateFile = proxy.proxyBootstrapTemplatePath;
  if (envs.ISTIO_BOOTSTRAP.isSet(effEnv)) {
    sources.ISTIO_BOOTSTRAP = 'environment variable ISTIO_BOOTSTRAP';
    templateFile = envs.ISTIO_BOOTSTRAP.get(effEnv);
  } else if (!templateFile && inputs.readFile(DEFAULT_TEMPLATE_FILE) !== undefined) {
    sources.defaultTemplate = `Istio's default template path ${DEFAULT_TEMPLATE_FILE}`;
    templateFile = DEFAULT_TEMPLATE_FILE;
  }

  // Istio no longer has a parent shutdown time (no hot restart), so a long drainDuration alone must not be an
  // error: the default then follows it.
  if (sources.parentShutdownDuration === 'default' && proxy.parentShutdownDuration <= proxy.drainDuration) {
    proxy = { ...proxy, parentShutdownDuration: proxy.drainDuration + 15_000 };
  }
  if (proxy.parentShutdownDuration <= proxy.drainDuration) {
    throw configError(
      'parentShutdownDuration',
      sources.parentShutdownDuration!,
      `${formatDuration(proxy.parentShutdownDuration)} must be longer than drainDuration (${formatDuration(proxy.drainDuration)} from ${sources.drainDuration}), or the parent is killed before it drains`,
    );
  }

  const addressBad = discoveryAddressProblem(proxy.discoveryAddress);
  if (addressBad) throw configError('discoveryAddress', sources.discoveryAddress!, addressBad);

  const requested = flags.proxyType ?? 'sidecar';
  if (!['sidecar', 'router', 'ingress', 'waypoint'].includes(requested)) {
    throw configError(
      'proxy type',
      'command line',
      `unknown proxy type "${requested}" (want sidecar, router, ingress or waypoint)`,
    );
  }
  const proxyType: ProxyType = requested === 'sidecar' ? 'sidecar' : 'router';

  const podNamespace = envs.POD_NAMESPACE.get(effEnv);
  const { level, components } = splitProxyLogLevel(flags.proxyLogLevel ?? 'warning', '--proxyLogLevel');
  const extraComponents = (flags.proxyComponentLogLevel ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  for (const c of extraComponents) {
    const lvl = c.split(':')[1];
    if (!lvl || !ENVOY_LEVELS.has(lvl))
      throw configError('proxyComponentLogLevel', '--proxyComponentLogLevel', `"${c}" is not component:level`);
  }
  if (flags.proxyLogLevel !== undefined && !parseLevel(level || 'info') && !ENVOY_LEVELS.has(level)) {
    throw configError('proxyLogLevel', '--proxyLogLevel', `unknown level "${level}"`);
  }

  const instanceIps = envs.INSTANCE_IP.get(effEnv)
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  const ecp = envs.ENVOY_STATUS_PORT;
  const epp = envs.ENVOY_PROMETHEUS_PORT;
  const envSource = (name: string) =>
    env[name] !== undefined && env[name] !== ''
      ? `environment variable ${name}`
      : proxy.proxyMetadata[name] !== undefined
        ? `proxyMetadata.${name} in ${sources.proxyMetadata}`
        : 'default';
  const portFromEnv = (v: typeof ecp) =>
    asPort(v.get(effEnv), (p) => {
      throw configError(v.name, envSource(v.name), p);
    }) as number;
  const envoyStatusPort = portFromEnv(ecp);
  const envoyPrometheusPort = portFromEnv(epp);
  const dnsEnabled =
    (envs.ISTIO_META_DNS_CAPTURE.get(effEnv) && proxyType === 'sidecar') ||
    envs.ISTIO_META_ENABLE_DNS_SERVER.get(effEnv);
  const dnsProxyAddr = envs.DNS_PROXY_ADDR.get(effEnv);
  const envoyAdminSocket = adminSocketFor(proxy.configPath, effEnv, envSource, sources);
  const sdsSocket = workloadSdsSocket(
    envs.WORKLOAD_IDENTITY_SOCKET_FILE.get(effEnv),
    envSource('WORKLOAD_IDENTITY_SOCKET_FILE'),
  );
  const sockets: SdsSocketFacts = Object.freeze({ externalSds: false, credentialSocket: false, ...inputs.sockets });
  const listeners: PortUse[] = [
    ...(envoyAdminSocket
      ? []
      : [
          {
            field: 'proxyAdminPort',
            what: "Envoy's admin",
            port: proxy.proxyAdminPort,
            source: sources.proxyAdminPort!,
          },
        ]),
    { field: 'statusPort', what: "the agent's status server", port: proxy.statusPort, source: sources.statusPort! },
    { field: ecp.name, what: "Envoy's readiness listener", port: envoyStatusPort, source: envSource(ecp.name) },
    { field: epp.name, what: "Envoy's Prometheus listener", port: envoyPrometheusPort, source: envSource(epp.name) },
  ];
  if (dnsEnabled) {
    const m = /:(\d+)$/.exec(dnsProxyAddr);
    const port = m ? Number(m[1]) : NaN;
    if (!(port >= 1 && port <= 65535))
      throw configError(
        'DNS_PROXY_ADDR',
        envSource('DNS_PROXY_ADDR'),
        `${JSON.stringify(dnsProxyAddr)} is not host:port with a port in 1-65535`,
      );
    // The DNS proxy serves TCP as well as UDP, so its port collides with TCP listeners.
    listeners.push({
      field: 'DNS_PROXY_ADDR',
      what: "the agent's DNS proxy",
      port,
      source: envSource('DNS_PROXY_ADDR'),
    });
  }
  for (const v of [envs.ENVOY_SECURE_METRICS_PORT, envs.ENVOY_SECURE_MERGED_METRICS_PORT]) {
    const port = v.get(effEnv);
    if (port === 0) continue;
    if (port < 1 || port > 65535)
      throw configError(v.name, envSource(v.name), `port ${port} is out of range 1-65535 (0: none)`);
    listeners.push({ field: v.name, what: "Envoy's mTLS metrics listener", port, source: envSource(v.name) });
  }
  checkPortCollisions(listeners);

  const cfg: AgentConfig = {
    proxyType,
    requestedType: requested,
    proxy: Object.freeze(proxy),
    domain: flags.domain ?? (podNamespace ? `${podNamespace}.svc.cluster.local` : 'cluster.local'),
    serviceCluster: proxy.serviceCluster,
    proxyLogLevel: level || 'warning',
    componentLogLevel: [...components, ...extraComponents].join(','),
    logAsJson: flags.logAsJson ?? false,
    concurrency: proxy.concurrency,
    templateFile,
    meshConfigFile,
    outboundTrafficPolicy,
    meshTracing,
    bootstrapOverrideFile: envs.ISTIO_BOOTSTRAP_OVERRIDE.get(effEnv),
    outlierLogPath: flags.outlierLogPath ?? '',
    podName: envs.POD_NAME.get(effEnv),
    podNamespace,
    instanceIps,
    serviceAccount: envs.SERVICE_ACCOUNT.get(effEnv),
    trustDomain: envs.TRUST_DOMAIN.get(effEnv),
    clusterId: envs.ISTIO_META_CLUSTER_ID.get(effEnv),
    deltaXds: envs.ISTIO_DELTA_XDS.get(effEnv),
    dnsEnabled,
    dnsProxyAddr,
    envoyStatusPort,
    envoyPrometheusPort,
    exitOnZeroActiveConnections: envs.EXIT_ON_ZERO_ACTIVE_CONNECTIONS.get(effEnv),
    minimumDrainDuration: envs.MINIMUM_DRAIN_DURATION.get(effEnv),
    maximumDrainDuration: envs.MAXIMUM_DRAIN_DURATION.get(effEnv),
    xdsSocket: path.join(proxy.configPath, 'XDS'),
    sdsSocket,
    sdsServeSocket: sockets.externalSds ? FILES_SOCKET : sdsSocket,
    sockets,
    envoyAdminSocket,
    standaloneDir: flags.standalone ?? '',
    discoveryLimits: {
      maxFileBytes: envs.DISCOVERY_MAX_FILE_BYTES.get(effEnv),
      maxDocuments: envs.DISCOVERY_MAX_DOCUMENTS.get(effEnv),
    },
    podLabels,
    podAnnotations,
    skipDeprecatedLogs: envs.ENVOY_SKIP_DEPRECATED_LOGS.get(effEnv),
    metadataDiscovery: envs.PEER_METADATA_DISCOVERY.isSet(effEnv)
      ? envs.PEER_METADATA_DISCOVERY.get(effEnv)
      : undefined,
    workloadIdentitySocketFile: envs.WORKLOAD_IDENTITY_SOCKET_FILE.get(effEnv),
    compliancePolicy: envs.COMPLIANCE_POLICY.get(effEnv),
    stripFragmentFromPath: envs.HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED.get(effEnv),
    hostIp: envs.HOST_IP.get(effEnv),
    statusPortProxyProtocol: envs.ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL.get(effEnv),
    secureMetricsPort: envs.ENVOY_SECURE_METRICS_PORT.get(effEnv),
    secureMergedMetricsPort: envs.ENVOY_SECURE_MERGED_METRICS_PORT.get(effEnv),
    dualStack: ['1', 't', 'T', 'TRUE', 'true', 'True'].includes(envs.IPTABLES_ENV.ISTIO_DUAL_STACK.get(effEnv)),
    sources,
  };
  return deepFreeze(cfg);
}

/** Where ENVOY_ADMIN_MODE=uds puts Envoy's admin socket, in a directory of its own (see ADMIN_SOCKET_DIR). */
export function adminSocketPath(configPath: string): string {
  return path.resolve(configPath, ADMIN_SOCKET_DIR, 'envoy-admin.sock');
}

/**
 * The socket's own directory is 0700 and owned by Envoy's user: Envoy binds the socket before it applies mode
 * 0600, so in between only that directory keeps other users out. The path is absolute so that the agent, Envoy
 * and `pilot-agent request` agree on it whatever their working directory.
 */
export const ADMIN_SOCKET_DIR = 'admin';

function adminSocketFor(
  configPath: string,
  env: Env,
  envSource: (name: string) => string,
  sources: Record<string, string>,
): string {
  const mode = envs.ENVOY_ADMIN_MODE.get(env).trim().toLowerCase();
  if (mode === 'tcp') return '';
  sources[envs.ENVOY_ADMIN_MODE.name] = envSource(envs.ENVOY_ADMIN_MODE.name);
  if (mode !== 'uds')
    throw configError(
      envs.ENVOY_ADMIN_MODE.name,
      envSource(envs.ENVOY_ADMIN_MODE.name),
      `${JSON.stringify(mode)} is not tcp or uds`,
    );
  const socket = adminSocketPath(configPath);
  // sun_path holds 108 bytes with its terminating NUL.
  if (Buffer.byteLength(socket) > 107) {
    throw configError(
      'configPath',
      sources.configPath!,
      `with ENVOY_ADMIN_MODE=uds Envoy's admin socket would be ${socket}, longer than the 107 bytes a Unix socket path can hold`,
    );
  }
  return socket;
}

interface PortUse {
  field: string;
  what: string;
  port: number;
  source: string;
}

/**
 * Every port the agent and Envoy listen on must differ: a collision passes each field's own check, then fails at
 * run time as a crash loop (Envoy cannot bind, or binds what the agent wanted). Blames the value that was set
 * over the one that is a default, so the message points at what the user wrote.
 */
function checkPortCollisions(uses: readonly PortUse[]): void {
  for (let i = 0; i < uses.length; i++) {
    for (let j = i + 1; j < uses.length; j++) {
      const [a, b] = [uses[i]!, uses[j]!];
      if (a.port !== b.port) continue;
      const [blamed, other] = b.source === 'default' && a.source !== 'default' ? [a, b] : [b, a];
      throw configError(
        blamed.field,
        blamed.source,
        `port ${blamed.port} is also ${other.field}, ${other.what} (from ${other.source}); every port the agent and Envoy listen on must differ`,
      );
    }
  }
}

function deepFreeze<T>(o: T): T {
  if (o && typeof o === 'object' && !Object.isFrozen(o)) {
    Object.freeze(o);
    for (const v of Object.values(o as object)) deepFreeze(v);
  }
  return o;
}
