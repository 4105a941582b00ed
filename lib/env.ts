// Every environment variable the agent reads is registered here, once, with its default and a description.
// Readers take an env object so tests and pure code never touch process.env directly.

import { type DurationLimits, parseDuration } from './duration';
import { configError, quote } from './errors';

export type Env = Readonly<Record<string, string | undefined>>;

export interface EnvVar<T> {
  readonly name: string;
  readonly description: string;
  readonly defaultText: string;
  get(env: Env): T;
  isSet(env: Env): boolean;
}

const registry = new Map<string, EnvVar<unknown>>();

function register<T>(
  name: string,
  defaultText: string,
  description: string,
  parse: (raw: string) => T,
  def: T,
): EnvVar<T> {
  const v: EnvVar<T> = {
    name,
    description,
    defaultText,
    isSet: (env) => env[name] !== undefined && env[name] !== '',
    get(env) {
      const raw = env[name];
      if (raw === undefined || raw === '') return def;
      try {
        return parse(raw);
      } catch (e) {
        throw configError(name, `environment variable ${name}`, (e as Error).message);
      }
    },
  };
  registry.set(name, v as EnvVar<unknown>);
  return v;
}

export const str = (name: string, def: string, desc: string) => register(name, def, desc, (r) => r, def);
export const bool = (name: string, def: boolean, desc: string) =>
  register(
    name,
    String(def),
    desc,
    (r) => {
      const t = r.trim().toLowerCase();
      if (['1', 'true', 't', 'yes', 'on'].includes(t)) return true;
      if (['0', 'false', 'f', 'no', 'off'].includes(t)) return false;
      throw new Error(`${quote(r)} is not a boolean`);
    },
    def,
  );
export const int = (name: string, def: number, desc: string) =>
  register(
    name,
    String(def),
    desc,
    (r) => {
      const n = Number(r.trim());
      if (!/^-?\d+$/.test(r.trim()) || !Number.isSafeInteger(n)) throw new Error(`${quote(r)} is not an integer`);
      return n;
    },
    def,
  );
export const float = (name: string, def: number, desc: string) =>
  register(
    name,
    String(def),
    desc,
    (r) => {
      const n = Number(r);
      if (!Number.isFinite(n)) throw new Error(`${quote(r)} is not a number`);
      return n;
    },
    def,
  );
/** Milliseconds; at most MAX_TIMER_MS unless `limits` says otherwise (a value a timer cannot hold is an error). */
export const duration = (name: string, defText: string, desc: string, limits: DurationLimits = {}) =>
  register(name, defText, desc, (r) => parseDuration(r, limits), parseDuration(defText, limits));

export function registeredVars(): EnvVar<unknown>[] {
  return [...registry.values()].sort((a, b) => a.name.localeCompare(b.name));
}

// ---- the registry ----
export const POD_NAME = str(
  'POD_NAME',
  '',
  'Pod (or VM workload) name; the node id is <type>~<ip>~POD_NAME.POD_NAMESPACE~<domain>',
);
export const POD_NAMESPACE = str('POD_NAMESPACE', '', 'Namespace of the workload; also the default for --domain');
export const INSTANCE_IP = str('INSTANCE_IP', '', 'Workload IP; first choice for the node id IP (comma list allowed)');
export const SERVICE_ACCOUNT = str('SERVICE_ACCOUNT', '', 'Service account, used in the workload SPIFFE identity');
export const HOST_IP = str('HOST_IP', '', 'IP of the host the workload runs on (node metadata)');
export const TRUST_DOMAIN = str('TRUST_DOMAIN', 'cluster.local', 'SPIFFE trust domain');
export const ISTIO_META_CERT_SIGNER = str(
  'ISTIO_META_CERT_SIGNER',
  '',
  'Sent with each CSR as the request metadata CertSigner: which signer istiod asks (its external-CA signer selection)',
);
export const ISTIO_META_CLUSTER_ID = str(
  'ISTIO_META_CLUSTER_ID',
  'Kubernetes',
  'Cluster id, sent as the ClusterID gRPC header',
);
export const PROXY_CONFIG = str(
  'PROXY_CONFIG',
  '',
  'ProxyConfig as JSON or YAML, layered over the mesh file defaultConfig',
);
export const ISTIO_BOOTSTRAP_OVERRIDE = str(
  'ISTIO_BOOTSTRAP_OVERRIDE',
  '',
  'Path of a JSON/YAML file merged over the generated bootstrap',
);
export const ISTIO_BOOTSTRAP = str('ISTIO_BOOTSTRAP', '', 'Path of a bootstrap template (same as --templateFile)');
export const ISTIO_CPU_LIMIT = int(
  'ISTIO_CPU_LIMIT',
  0,
  'CPU limit; the Envoy concurrency when ProxyConfig.concurrency is unset',
);
export const ISTIO_DELTA_XDS = bool(
  'ISTIO_DELTA_XDS',
  true,
  'Use Delta ADS between Envoy and the agent (false: state of the world)',
);
export const ISTIO_VERSION = str(
  'ISTIO_VERSION',
  '',
  'Istio version reported in node metadata (default: the one this agent implements, lib/istio-version.ts)',
);
export const ENVOY_STATUS_PORT = int('ENVOY_STATUS_PORT', 15021, "Port of Envoy's readiness listener (/healthz/ready)");
export const ENVOY_PROMETHEUS_PORT = int(
  'ENVOY_PROMETHEUS_PORT',
  15090,
  "Port of Envoy's Prometheus listener (/stats/prometheus)",
);
export const DNS_PROXY_ADDR = str('DNS_PROXY_ADDR', 'localhost:15053', 'Address of the agent DNS proxy');
export const ISTIO_META_DNS_CAPTURE = bool('ISTIO_META_DNS_CAPTURE', false, 'Enable the DNS proxy for sidecars');
export const ISTIO_META_ENABLE_DNS_SERVER = bool(
  'ISTIO_META_ENABLE_DNS_SERVER',
  false,
  'Enable the DNS proxy for any proxy type',
);
export const DNS_FORWARD_PARALLEL = bool(
  'DNS_FORWARD_PARALLEL',
  false,
  'Forward DNS queries to all upstreams in parallel',
);
export const DNS_FORWARD_TIMEOUT = duration('DNS_FORWARD_TIMEOUT', '5s', 'Timeout of one upstream DNS query');
export const CA_ADDR = str('CA_ADDR', '', 'CA address (defaults to discoveryAddress; port 15010 means plaintext)');
export const CA_PROVIDER = str(
  'CA_PROVIDER',
  'Citadel',
  "CA client: only Citadel (Istio's CA protocol); another name is a start-up error",
);
export const PILOT_CERT_PROVIDER = str(
  'PILOT_CERT_PROVIDER',
  'istiod',
  "Who signs istiod's certificate (istiod, kubernetes, k8s.io/*, custom, none): where its root is looked for",
);
export const CA_ROOT_CA = str('CA_ROOT_CA', '', 'Root certificate of the CA: a path, or SYSTEM');
export const XDS_ROOT_CA = str('XDS_ROOT_CA', '', 'Root certificate of the discovery server: a path, or SYSTEM');
export const ISTIOD_SAN = str('ISTIOD_SAN', '', 'Expected server name of the discovery server');
export const JWT_POLICY = str('JWT_POLICY', 'third-party-jwt', 'third-party-jwt or first-party-jwt');
export const PROV_CERT = str('PROV_CERT', '', 'Directory of provisioning certificates (client cert for xDS/CA)');
export const OUTPUT_CERTS = str(
  'OUTPUT_CERTS',
  '',
  'Directory where issued certificates are written (0600; 0644 with KUBERNETES_SERVICE_HOST set)',
);
export const KUBERNETES_SERVICE_HOST = str(
  'KUBERNETES_SERVICE_HOST',
  '',
  "Set by Kubernetes in every pod; makes OUTPUT_CERTS files 0644 for the pod's other containers, as Istio",
);
export const FILE_MOUNTED_CERTS = bool('FILE_MOUNTED_CERTS', false, 'Use mounted certificate files instead of a CA');
// A certificate lifetime, not a timer (90-day certificates are common): whoever schedules from it clamps the timer.
export const SECRET_TTL = duration('SECRET_TTL', '24h', 'Requested lifetime of workload certificates', {
  maxMs: Number.MAX_SAFE_INTEGER,
});
export const SECRET_GRACE_PERIOD_RATIO = float(
  'SECRET_GRACE_PERIOD_RATIO',
  0.5,
  'Rotate when this share of the lifetime is left',
);
export const SECRET_GRACE_PERIOD_RATIO_JITTER = float(
  'SECRET_GRACE_PERIOD_RATIO_JITTER',
  0.01,
  'Random jitter added to the grace ratio',
);
export const WORKLOAD_RSA_KEY_SIZE = int('WORKLOAD_RSA_KEY_SIZE', 2048, 'RSA key size for workload keys');
export const ECC_SIGNATURE_ALGORITHM = str(
  'ECC_SIGNATURE_ALGORITHM',
  '',
  'ECDSA instead of RSA for workload keys when set',
);
export const ECC_CURVE = str(
  'ECC_CURVE',
  'P256',
  'Curve of ECDSA workload keys (ECC_SIGNATURE_ALGORITHM=ECDSA): P256 or P384 (signed with SHA-384)',
);
export const PKCS8_KEY = bool('PKCS8_KEY', false, 'Write keys in PKCS#8');
export const FILE_DEBOUNCE_DURATION = duration(
  'FILE_DEBOUNCE_DURATION',
  '100ms',
  'Quiet period before a changed watched file is acted on',
);
export const SDS_MAX_NAMES_PER_STREAM = int(
  'SDS_MAX_NAMES_PER_STREAM',
  5000,
  'Secrets one SDS stream may ask for; names beyond are not served (logged, counted)',
);
export const EXIT_ON_ZERO_ACTIVE_CONNECTIONS = bool(
  'EXIT_ON_ZERO_ACTIVE_CONNECTIONS',
  false,
  'On shutdown, end the drain as soon as Envoy has no downstream connections',
);
export const MINIMUM_DRAIN_DURATION = duration(
  'MINIMUM_DRAIN_DURATION',
  '5s',
  'With EXIT_ON_ZERO_ACTIVE_CONNECTIONS, drain at least this long',
);
export const MAXIMUM_DRAIN_DURATION = duration(
  'MAXIMUM_DRAIN_DURATION',
  '5m',
  'With EXIT_ON_ZERO_ACTIVE_CONNECTIONS, never drain longer than this',
);
export const ISTIO_ENVOY_ENABLE_CORE_DUMP = bool(
  'ISTIO_ENVOY_ENABLE_CORE_DUMP',
  false,
  'Pass --enable-core-dump to Envoy',
);
export const DISABLE_ENVOY = bool(
  'DISABLE_ENVOY',
  false,
  'Proxyless gRPC: no Envoy; xDS proxy for the gRPC library, certificates to OUTPUT_CERTS',
);
export const GRPC_XDS_BOOTSTRAP = str(
  'GRPC_XDS_BOOTSTRAP',
  './etc/istio/proxy/grpc-bootstrap.json',
  'Where the gRPC xDS bootstrap is written (always, as Istio)',
);
export const GRPC_KEEPALIVE_INTERVAL = duration(
  'GRPC_KEEPALIVE_INTERVAL',
  '30s',
  'gRPC keepalive interval to the discovery server',
);
export const GRPC_KEEPALIVE_TIMEOUT = duration(
  'GRPC_KEEPALIVE_TIMEOUT',
  '10s',
  'gRPC keepalive timeout to the discovery server',
);
export const XDS_MAX_MESSAGE_BYTES = int(
  'XDS_MAX_MESSAGE_BYTES',
  256 * 1024 * 1024,
  'Largest xDS message the proxy accepts either way',
);
export const PROXY_CONFIG_XDS_AGENT = bool('PROXY_CONFIG_XDS_AGENT', false, 'Subscribe to ProxyConfig over xDS (PCDS)');
export const ENVOY_VALIDATE_BEFORE_RESTART = bool(
  'ENVOY_VALIDATE_BEFORE_RESTART',
  true,
  'Run envoy --mode validate on a new bootstrap before a hot restart',
);
export const ENVOY_RESTART_INITIAL_BACKOFF = duration(
  'ENVOY_RESTART_INITIAL_BACKOFF',
  '200ms',
  'First delay before restarting a failed Envoy epoch; the n-th retry waits 2^n times this',
);
export const ENVOY_ADMIN_MODE = str(
  'ENVOY_ADMIN_MODE',
  'tcp',
  "Envoy's admin API on loopback proxyAdminPort (tcp, as Istio) or on a 0600 Unix socket under configPath (uds): the agent only",
);
export const PILOT_DEBOUNCE_AFTER = duration(
  'PILOT_DEBOUNCE_AFTER',
  '100ms',
  'Discovery server: quiet period after a config change before a push',
);
export const PILOT_DEBOUNCE_MAX = duration(
  'PILOT_DEBOUNCE_MAX',
  '10s',
  'Discovery server: longest a change waits for the quiet period',
);
export const ENVOY_START_TIMEOUT = duration(
  'ENVOY_START_TIMEOUT',
  '5m',
  'A hot-restarted epoch not live after this long is aborted and retried while the old one serves (0: wait forever)',
);
export const STATUS_SERVER_REMOTE_DEBUG = bool(
  'STATUS_SERVER_REMOTE_DEBUG',
  false,
  "Serve the status port's /debug/ pages to any address, not only loopback",
);

// ---- istio-iptables (traffic capture) and Envoy's uid/gid ----
// Read by `pilot-agent istio-iptables` as Istio's command reads them: the flag wins over the variable.
export const IPTABLES_ENV = {
  INBOUND_CAPTURE_PORT: str('INBOUND_CAPTURE_PORT', '15006', 'istio-iptables -z: port inbound TCP is redirected to'),
  INBOUND_TUNNEL_PORT: str(
    'INBOUND_TUNNEL_PORT',
    '15008',
    'istio-iptables -e: the tunnel port, never captured inbound',
  ),
  PROXY_UID: str(
    'PROXY_UID',
    '',
    "istio-iptables -u: uid(s) whose traffic is not captured (default: ENVOY_USER's uid, else 1337)",
  ),
  PROXY_GID: str('PROXY_GID', '', 'istio-iptables -g: gid(s) whose traffic is not captured (default: the uid)'),
  ISTIO_INBOUND_INTERCEPTION_MODE: str('ISTIO_INBOUND_INTERCEPTION_MODE', '', 'istio-iptables -m: REDIRECT or TPROXY'),
  ISTIO_INBOUND_TPROXY_MARK: str(
    'ISTIO_INBOUND_TPROXY_MARK',
    '1337',
    'istio-iptables -t: packet mark of TPROXY inbound',
  ),
  ISTIO_INBOUND_TPROXY_ROUTE_TABLE: str(
    'ISTIO_INBOUND_TPROXY_ROUTE_TABLE',
    '133',
    'istio-iptables -r: routing table of TPROXY inbound',
  ),
  ISTIO_INBOUND_PORTS: str('ISTIO_INBOUND_PORTS', '', 'istio-iptables -b: inbound ports captured ("*" for all)'),
  ISTIO_LOCAL_EXCLUDE_PORTS: str(
    'ISTIO_LOCAL_EXCLUDE_PORTS',
    '',
    'istio-iptables -d: inbound ports not captured with -b "*"',
  ),
  ISTIO_EXCLUDE_INTERFACES: str('ISTIO_EXCLUDE_INTERFACES', '', 'istio-iptables -c: interfaces never captured'),
  ISTIO_SERVICE_CIDR: str('ISTIO_SERVICE_CIDR', '', 'istio-iptables -i: outbound CIDRs captured ("*" for all)'),
  ISTIO_SERVICE_EXCLUDE_CIDR: str('ISTIO_SERVICE_EXCLUDE_CIDR', '', 'istio-iptables -x: outbound CIDRs not captured'),
  ISTIO_OUTBOUND_PORTS: str('ISTIO_OUTBOUND_PORTS', '', 'istio-iptables -q: outbound ports always captured'),
  ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE: str(
    'ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE',
    '',
    'istio-iptables -o: outbound ports never captured',
  ),
  KUBE_VIRT_INTERFACES: str(
    'KUBE_VIRT_INTERFACES',
    '',
    'istio-iptables -k: interfaces whose inbound traffic is treated as outbound',
  ),
  DRY_RUN: str('DRY_RUN', '', 'istio-iptables -n: print the rules, change nothing'),
  IPTABLES_PROBE_PORT: str('IPTABLES_PROBE_PORT', '15002', 'istio-iptables --iptables-probe-port (accepted)'),
  PROBE_TIMEOUT: str('PROBE_TIMEOUT', '5s', 'istio-iptables --probe-timeout (accepted)'),
  SKIP_RULE_APPLY: str('SKIP_RULE_APPLY', '', 'istio-iptables --skip-rule-apply: do nothing'),
  RUN_VALIDATION: str('RUN_VALIDATION', '', 'istio-iptables --run-validation (accepted)'),
  REDIRECT_DNS: str(
    'REDIRECT_DNS',
    '',
    'istio-iptables --redirect-dns: capture DNS to the agent on 15053 (also ISTIO_META_DNS_CAPTURE)',
  ),
  DROP_INVALID: str(
    'DROP_INVALID',
    '',
    'istio-iptables --drop-invalid: drop conntrack-INVALID packets (also INVALID_DROP)',
  ),
  INVALID_DROP: str('INVALID_DROP', '', 'Older name of DROP_INVALID'),
  DUAL_STACK: str('DUAL_STACK', '', 'istio-iptables --dual-stack (also ISTIO_DUAL_STACK)'),
  ISTIO_DUAL_STACK: str('ISTIO_DUAL_STACK', '', 'Same as DUAL_STACK'),
  CAPTURE_ALL_DNS: str(
    'CAPTURE_ALL_DNS',
    '',
    "istio-iptables --capture-all-dns: capture port 53 to any server, not only resolv.conf's",
  ),
  NETWORK_NAMESPACE: str(
    'NETWORK_NAMESPACE',
    '',
    'istio-iptables --network-namespace: path of the netns to program (run through nsenter)',
  ),
  CNI_MODE: str('CNI_MODE', '', 'istio-iptables --cni-mode (accepted)'),
  RECONCILE: str('RECONCILE', '', 'istio-iptables --reconcile: replace differing Istio rules left by an earlier run'),
  CLEANUP_ONLY: str('CLEANUP_ONLY', '', 'istio-iptables --cleanup-only: remove Istio rules, add none'),
  FORCE_APPLY: str('FORCE_APPLY', '', 'istio-iptables --force-apply: apply even when the rules seem to be in place'),
  NATIVE_NFTABLES: str('NATIVE_NFTABLES', '', 'istio-iptables --native-nftables (not supported: an error)'),
  FORCE_IPTABLES_BINARY: str('FORCE_IPTABLES_BINARY', '', 'istio-iptables --force-iptables-binary: legacy or nft'),
  ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR: str(
    'ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR',
    '127.0.0.1/32',
    'IPv4 loopback CIDR of traffic meant for the app container',
  ),
  ISTIO_OUTBOUND_OWNER_GROUPS: str(
    'ISTIO_OUTBOUND_OWNER_GROUPS',
    '*',
    'Groups whose outbound traffic is captured ("*" for all)',
  ),
  ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE: str(
    'ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE',
    '',
    'Groups whose outbound traffic is not captured (with "*")',
  ),
  ENVOY_USER: str('ENVOY_USER', 'istio-proxy', 'User whose uid is the default of istio-iptables -u'),
} as const;
export const ENVOY_UID = str(
  'ENVOY_UID',
  '',
  'Run Envoy as this uid or user name (agent running as root); pair it with istio-iptables -u',
);
export const ENVOY_GID = str(
  'ENVOY_GID',
  '',
  "Run Envoy with this gid or group name (default: ENVOY_UID's primary group, or the uid); pair it with istio-iptables -g",
);

// ---- app probes, health checker, app metrics, profiling (issue 12) ----
export const ISTIO_KUBE_APP_PROBERS = str(
  'ISTIO_KUBE_APP_PROBERS',
  '',
  'App probes rewritten by the injector: JSON keyed by /app-health/<container>/<kind> (httpGet, tcpSocket or grpc)',
);
export const POD_IP = str('POD_IP', '', 'Pod IP; where app probes go when INSTANCE_IP is unset');
export const REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION = bool(
  'REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION',
  false,
  'Send app probes to localhost instead of the pod IP',
);
export const ISTIO_ENABLE_HTTP2_PROBING = bool(
  'ISTIO_ENABLE_HTTP2_PROBING',
  true,
  'HTTPS app probes offer h2 by ALPN and use it when the app picks it (HTTP probes stay HTTP/1.1)',
);
export const ENABLE_PROBE_KEEPALIVE_CONNECTIONS = bool(
  'ENABLE_PROBE_KEEPALIVE_CONNECTIONS',
  false,
  'HTTP app probes keep and reuse their connections (false: a new connection per probe, Connection: close, as kubelet)',
);
export const ISTIO_PROMETHEUS_ANNOTATIONS = str(
  'ISTIO_PROMETHEUS_ANNOTATIONS',
  '',
  'Where the app serves metrics for the merged /stats/prometheus: JSON {scrape, path, port} (or {targets: [{port, path}]})',
);

// ---- Go agent parity (issue 13) ----
export const ENVOY_SKIP_DEPRECATED_LOGS = bool(
  'ENVOY_SKIP_DEPRECATED_LOGS',
  true,
  'Pass --skip-deprecated-logs to Envoy (false: show deprecation warnings)',
);
export const PEER_METADATA_DISCOVERY = bool(
  'PEER_METADATA_DISCOVERY',
  false,
  'Reported as node metadata METADATA_DISCOVERY (unset: follows ISTIO_META_ENABLE_HBONE)',
);
export const WORKLOAD_IDENTITY_SOCKET_FILE = str(
  'WORKLOAD_IDENTITY_SOCKET_FILE',
  'socket',
  'File name of the workload SDS socket in ./var/run/secrets/workload-spiffe-uds (node metadata)',
);
export const COMPLIANCE_POLICY = str(
  'COMPLIANCE_POLICY',
  '',
  "fips-140-2, fips-140-3 or pqc, as Istio: restricts the agent's own TLS (xDS and CA clients), sets GRPC_SSL_CIPHER_SUITES for Envoy (fips-*), fips-140-2 limits Envoy's Google gRPC client to TLS 1.2, and the embedded discovery server restricts the TLS it generates as istiod",
);
export const HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED = bool(
  'HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED',
  true,
  "false: Envoy keeps URL fragments in paths (Istio's runtime flag of that name)",
);
export const ENVOY_SECURE_METRICS_PORT = int(
  'ENVOY_SECURE_METRICS_PORT',
  0,
  'Envoy serves its own /stats/prometheus over mTLS (workload certificate) on this port (0: none)',
);
export const ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL = bool(
  'ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL',
  false,
  "Envoy's readiness listener (15021) also takes connections that start with a PROXY protocol header (as Istio)",
);
export const PILOT_AGENT_MERGE_ENVOY_STATS = bool(
  'PILOT_AGENT_MERGE_ENVOY_STATS',
  true,
  "false: the status port's /stats/prometheus leaves out Envoy's stats (the agent's and the app's remain), as Istio",
);
export const METRICS_LOCALHOST_ACCESS_ONLY = bool(
  'METRICS_LOCALHOST_ACCESS_ONLY',
  false,
  "The status port's /stats/prometheus answers non-loopback peers 403; as proxyMetadata, Envoy's 15090 also binds loopback only (as Istio)",
);
export const ENVOY_SECURE_MERGED_METRICS_PORT = int(
  'ENVOY_SECURE_MERGED_METRICS_PORT',
  0,
  'Envoy serves the merged scrape (agent, Envoy, app) over mTLS on this port (0: none)',
);

// ---- Envoy supervision (restart budget) ----
export const ENVOY_HEALTHY_RESET_DURATION = duration(
  'ENVOY_HEALTHY_RESET_DURATION',
  '1m',
  'An Envoy epoch live this long restores the restart budget and backoff (as kubelet resets its crash-loop backoff)',
);

// ---- packaging (systemd) ----
export const JOURNAL_STREAM = str(
  'JOURNAL_STREAM',
  '',
  'Set by systemd: <device>:<inode> of stderr when it is the journal; log lines then carry a syslog priority prefix and no timestamp',
);

// ---- bad input limits (issue 9, harden-input) ----
const positiveInt = (name: string, def: number, desc: string) =>
  register(
    name,
    String(def),
    desc,
    (r) => {
      const n = Number(r.trim());
      if (!/^\d+$/.test(r.trim()) || !Number.isSafeInteger(n) || n < 1)
        throw new Error(`want a positive integer, got ${quote(r)}`);
      return n;
    },
    def,
  );
export const DISCOVERY_MAX_FILE_BYTES = positiveInt(
  'DISCOVERY_MAX_FILE_BYTES',
  4 * 1024 * 1024,
  'Discovery server: largest config file read (bytes); a larger one is reported and its last good content kept',
);
export const DISCOVERY_MAX_DOCUMENTS = positiveInt(
  'DISCOVERY_MAX_DOCUMENTS',
  10_000,
  'Discovery server: most YAML documents in one config file',
);

// ---- start-up and memory (issue 16) ----
export const ENVOY_VALIDATE_FIRST_BOOTSTRAP = bool(
  'ENVOY_VALIDATE_FIRST_BOOTSTRAP',
  false,
  'Run envoy --mode validate on the first bootstrap before Envoy is spawned (costs a whole Envoy start-up; by default a rejected first bootstrap is diagnosed after Envoy fails)',
);
export const PILOT_AGENT_CPU_PROFILE = str(
  'PILOT_AGENT_CPU_PROFILE',
  '',
  'Diagnostics: write a CPU profile (.cpuprofile) of the agent from start to exit to this file',
);
export const PILOT_AGENT_HEAP_SNAPSHOTS = bool(
  'PILOT_AGENT_HEAP_SNAPSHOTS',
  false,
  'Serve full V8 heap snapshots on the status port (/debug/pprof/heapsnapshot) to loopback peers; they hold every private key the agent has',
);
export const PILOT_AGENT_V8_FLAGS = str(
  'PILOT_AGENT_V8_FLAGS',
  '',
  "V8 flags the agent sets on itself at start (run-time settable ones only). None by default: a flag set at run time makes V8 reject the code cache of every Node built-in loaded after it (compiled from source instead, ~40 ms of start-up); the heap flags are built into the executable's execArgv",
);

// ---- capture-mode sidecars in standalone mode (issue 11 part 4) ----
// Read by the embedded discovery server from node metadata STANDALONE_CAPTURE (every ISTIO_META_* variable becomes
// node metadata), so a shared `pilot-agent discovery` server also tells captured and uncaptured VMs apart.
export const ISTIO_META_STANDALONE_CAPTURE = bool(
  'ISTIO_META_STANDALONE_CAPTURE',
  false,
  "Standalone sidecar whose traffic istio-iptables captures: the discovery server sends Istio's virtualOutbound (15001) and virtualInbound (15006) listeners instead of loopback ones",
);

// ---- identity knobs from the Go agent (issue 23, identity part) ----
export const PILOT_ENABLE_CA_CRL = bool(
  'PILOT_ENABLE_CA_CRL',
  true,
  "Put the plugged-in CA's CRL (/var/run/secrets/istio/crl/ca-crl.pem, while it exists) into ROOTCA's validation context, as Istio does; the file is watched",
);
export const ISTIO_META_TLS_CLIENT_KEY = str(
  'ISTIO_META_TLS_CLIENT_KEY',
  '',
  'With FILE_MOUNTED_CERTS (and no PROV_CERT): key file of the client certificate the xDS connection presents (also read from proxyMetadata)',
);
export const ISTIO_META_TLS_CLIENT_CERT_CHAIN = str(
  'ISTIO_META_TLS_CLIENT_CERT_CHAIN',
  '',
  'With FILE_MOUNTED_CERTS (and no PROV_CERT): certificate chain file of the xDS client certificate',
);
export const ISTIO_META_TLS_CLIENT_ROOT_CERT = str(
  'ISTIO_META_TLS_CLIENT_ROOT_CERT',
  '',
  'With FILE_MOUNTED_CERTS: the root that verifies the discovery server when XDS_ROOT_CA, ./etc/certs/root-cert.pem and PROV_CERT give none',
);

// ---- WasmPlugin: the agent fetches remote Wasm modules sent over ECDS (issue 24; Go: pilot-agent, pkg/wasm) ----
export const ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION = bool(
  'ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION',
  true,
  'The xDS proxy fetches the remote modules of Wasm filters sent over ECDS and gives Envoy local files (false: ECDS passes unchanged)',
);
export const WASM_INSECURE_REGISTRIES = str(
  'WASM_INSECURE_REGISTRIES',
  '',
  'Comma-separated hosts (host or host:port; * for all) whose Wasm modules are fetched without TLS verification (OCI: also over plain HTTP)',
);
export const WASM_MODULE_EXPIRY = duration(
  'WASM_MODULE_EXPIRY',
  '24h',
  'A cached Wasm module unused this long is removed',
  { maxMs: Number.MAX_SAFE_INTEGER },
);
export const WASM_PURGE_INTERVAL = duration(
  'WASM_PURGE_INTERVAL',
  '1h',
  'How often the Wasm cache looks for expired modules',
);
export const WASM_HTTP_REQUEST_TIMEOUT = duration(
  'WASM_HTTP_REQUEST_TIMEOUT',
  '15s',
  'Timeout of one HTTP request when fetching a Wasm module',
);
export const WASM_HTTP_REQUEST_MAX_RETRIES = positiveInt(
  'WASM_HTTP_REQUEST_MAX_RETRIES',
  5,
  'Attempts (as Go counts them) to fetch a Wasm module over HTTP(S) on connection errors and 5xx',
);
export const ISTIO_WASM_MAX_BINARY_SIZE_BYTES = positiveInt(
  'ISTIO_WASM_MAX_BINARY_SIZE_BYTES',
  256 * 1024 * 1024,
  "Largest Wasm module (bytes) the agent fetches; a larger one fails the fetch (the plugin's failStrategy applies)",
);
export const BLOCKED_CIDRS_IN_WASM_FETCH = str(
  'BLOCKED_CIDRS_IN_WASM_FETCH',
  '169.254.169.254/32,fd00:ec2::254/128,169.254.170.2/32,100.100.100.200/32',
  'Comma-separated CIDRs a Wasm fetch may not connect to (checked on every resolved address and redirect; `none`: no list). The default: cloud metadata addresses',
);
