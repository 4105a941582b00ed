// The discovery server's platform-neutral model: configs keyed by kind + namespace + name (the Istio kinds this
// server accepts, already validated and normalised), and the service registry's Service and ServiceInstance.

import type { MeshTracing } from './mesh-tracing';

export const KINDS = [
  'ServiceEntry',
  'WorkloadEntry',
  'VirtualService',
  'DestinationRule',
  'Gateway',
  'Sidecar',
  'PeerAuthentication',
  'Secret',
  'WasmPlugin',
] as const;
export type Kind = (typeof KINDS)[number];

export type Event = 'add' | 'update' | 'delete';

/** Where a config came from, so every later error can name the file and the document. */
export interface ConfigSource {
  file: string;
  /** 1-based index of the YAML document in the file. */
  doc: number;
  /** Line and column of a field path inside that document, when the text is at hand. */
  locate?: (path: (string | number)[]) => { line?: number; col?: number };
}

export interface ConfigMeta {
  kind: Kind;
  name: string;
  namespace: string;
  labels: Readonly<Record<string, string>>;
  /** Set by the store on create/update. */
  resourceVersion: string;
  source?: ConfigSource;
}

export interface Config<S = Spec> {
  meta: ConfigMeta;
  spec: S;
}

export type Spec =
  | ServiceEntrySpec
  | WorkloadEntrySpec
  | VirtualServiceSpec
  | DestinationRuleSpec
  | GatewaySpec
  | SidecarSpec
  | PeerAuthenticationSpec
  | SecretSpec
  | WasmPluginSpec;

/** meshConfig fields the server honours. */
export interface MeshConfig {
  /** ALLOW_ANY: a sidecar passes unknown Hosts through (PassthroughCluster); REGISTRY_ONLY: it answers 502. */
  outboundTrafficPolicy: 'ALLOW_ANY' | 'REGISTRY_ONLY';
  /** enableTracing, defaultProviders.tracing and defaultConfig.tracing (./mesh-tracing.ts); absent: no tracing. */
  tracing?: MeshTracing;
}

export const DEFAULT_MESH: MeshConfig = Object.freeze({ outboundTrafficPolicy: 'ALLOW_ANY' });

export const configKey = (kind: Kind, namespace: string, name: string) => `${kind}/${namespace}/${name}`;
export const keyOf = (c: Config) => configKey(c.meta.kind, c.meta.namespace, c.meta.name);

/** `file document N (Kind ns/name)`, for messages. */
export function describe(c: Config): string {
  const where = c.meta.source ? `${c.meta.source.file} document ${c.meta.source.doc} ` : '';
  return `${where}(${c.meta.kind} ${c.meta.namespace}/${c.meta.name})`;
}

// ---- specs (normalised: defaults filled in, durations in ms) ----

export type Protocol = 'HTTP' | 'HTTP2' | 'GRPC' | 'TCP';
export const isHttp = (p: Protocol) => p !== 'TCP';

export interface ServicePort {
  number: number;
  name: string;
  protocol: Protocol;
  targetPort?: number;
}

export interface WorkloadEntrySpec {
  address: string;
  /** port name -> port number on the workload. */
  ports: Readonly<Record<string, number>>;
  labels: Readonly<Record<string, string>>;
  weight?: number;
  /** The workload's service account: its SPIFFE identity is spiffe://<td>/ns/<namespace>/sa/<serviceAccount>. */
  serviceAccount?: string;
}

export interface ServiceEntrySpec {
  hosts: string[];
  /** VIPs (IPs or CIDRs); absent when the ServiceEntry lists none. */
  addresses?: string[];
  ports: ServicePort[];
  resolution: 'STATIC' | 'DNS';
  location: 'MESH_EXTERNAL' | 'MESH_INTERNAL';
  endpoints: WorkloadEntrySpec[];
  /** Selects WorkloadEntries of the same namespace by label. */
  workloadSelector?: Readonly<Record<string, string>>;
  exportTo?: string[];
}

export type StringMatch = { exact: string } | { prefix: string } | { regex: string };

export interface HttpMatch {
  uri?: StringMatch;
  headers: Readonly<Record<string, StringMatch>>;
  withoutHeaders?: Readonly<Record<string, StringMatch>>;
  queryParams?: Readonly<Record<string, StringMatch>>;
  method?: StringMatch;
  authority?: StringMatch;
  scheme?: StringMatch;
  port?: number;
  ignoreUriCase: boolean;
  /** The route applies only to proxies with these labels / in this namespace (istiod drops it for others). */
  sourceLabels?: Readonly<Record<string, string>>;
  sourceNamespace?: string;
  /** `mesh` or `namespace/name` of Gateways: the route applies only to those; sourceLabels are then not looked at. */
  gateways?: readonly string[];
  /** The route's stat_prefix. */
  statPrefix?: string;
}

export interface RouteDestination {
  host: string;
  subset?: string;
  port?: number;
  weight: number;
  /** Header manipulation when this destination is picked (HTTP routes only). */
  headers?: { request?: HeaderOperations; response?: HeaderOperations };
}

/** Percent in [0, 100], fractions allowed (Istio's `Percent`). */
export type Percent = number;

export interface HeaderOperations {
  set: Readonly<Record<string, string>>;
  add: Readonly<Record<string, string>>;
  remove: readonly string[];
}

export interface CorsPolicy {
  allowOrigins: StringMatch[];
  allowMethods: string[];
  allowHeaders: string[];
  exposeHeaders: string[];
  maxAgeMs?: number;
  allowCredentials?: boolean;
}

export interface HttpFault {
  delay?: { fixedDelayMs: number; percentage?: Percent };
  abort?: { httpStatus?: number; grpcStatus?: number; percentage?: Percent };
}

export interface HttpRoute {
  name?: string;
  match: HttpMatch[];
  route: RouteDestination[];
  timeoutMs?: number;
  retries?: {
    attempts: number;
    perTryTimeoutMs?: number;
    retryOn?: string;
    ignorePreviousHosts?: boolean;
    backoffMs?: number;
    retryRemoteLocalities?: boolean;
  };
  rewrite?: { uri?: string; authority?: string };
  fault?: HttpFault;
  corsPolicy?: CorsPolicy;
  mirror?: { host: string; subset?: string; port?: number };
  mirrorPercentage?: Percent;
  headers?: { request?: HeaderOperations; response?: HeaderOperations };
  /** Instead of `route`: an HTTP redirect, or a response from the proxy itself. */
  redirect?: {
    uri?: string;
    authority?: string;
    port?: number;
    derivePort?: 'FROM_PROTOCOL_DEFAULT' | 'FROM_REQUEST_PORT';
    scheme?: 'http' | 'https';
    redirectCode?: number;
  };
  /** `body` is text; `bodyBytes` base64, as body.bytes is written in YAML. */
  directResponse?: { status: number; body?: string; bodyBytes?: string };
}

/** A `tcp` route: the first whose match (a port; none means any) fits a connection takes it. */
export interface TcpRoute {
  match: { port?: number }[];
  route: RouteDestination[];
}

export interface VirtualServiceSpec {
  hosts: string[];
  /** `mesh` or Gateway references (`name` or `namespace/name`); empty means mesh. */
  gateways: string[];
  http: HttpRoute[];
  tcp: TcpRoute[];
  /** `tls` routes: SNI-routed passthrough TLS (see ./kind-tls.ts). */
  tls?: TlsRoute[];
  exportTo?: string[];
}

/** DestinationRule loadBalancer.consistentHash: one hash key source, ring hash (Istio's default) or Maglev. */
export interface ConsistentHash {
  key:
    | { httpHeaderName: string }
    | { httpCookie: { name: string; path?: string; ttlMs?: number } }
    | { useSourceIp: true }
    | { httpQueryParameterName: string };
  maglev: boolean;
  minimumRingSize?: number;
  /** maglev.tableSize: a prime. */
  maglevTableSize?: number;
}

export interface TrafficPolicy {
  /** Per-port overrides of the other fields (not nested further). */
  portLevelSettings?: { port: number; policy: TrafficPolicy }[];
  /** ISTIO_MUTUAL: mTLS with the workload certificate and ROOTCA from the agent's SDS; DISABLE: plaintext;
   * SIMPLE/MUTUAL: TLS origination (./gen-upstream-tls.ts). */
  tls?: ClientTls;
  loadBalancer?: 'ROUND_ROBIN' | 'LEAST_REQUEST' | 'RANDOM';
  consistentHash?: ConsistentHash;
  /** loadBalancer.warmupDurationSecs (a duration): slow start for ROUND_ROBIN and LEAST_REQUEST. */
  warmupMs?: number;
  connectionPool?: {
    tcp?: { maxConnections?: number; connectTimeoutMs?: number };
    http?: {
      http1MaxPendingRequests?: number;
      http2MaxRequests?: number;
      maxRequestsPerConnection?: number;
      maxRetries?: number;
    };
  };
  outlierDetection?: {
    consecutive5xxErrors?: number;
    consecutiveGatewayErrors?: number;
    intervalMs?: number;
    baseEjectionTimeMs?: number;
    maxEjectionPercent?: number;
  };
}

export interface Subset {
  name: string;
  labels: Readonly<Record<string, string>>;
  trafficPolicy?: TrafficPolicy;
}

export interface DestinationRuleSpec {
  host: string;
  exportTo?: string[];
  trafficPolicy?: TrafficPolicy;
  subsets: Subset[];
}

export interface GatewayServer {
  port: { number: number; name: string; protocol: GatewayProtocol };
  tls?: ServerTls;
  /** `host`, `*.suffix`, `*`, optionally prefixed `namespace/`. */
  hosts: string[];
  /** Address the router binds this port on; 0.0.0.0 when unset. */
  bind?: string;
}

/** A Sidecar's egress hosts (`namespace/host`); it applies to the sidecars of its namespace it selects. */
export interface SidecarSpec {
  workloadSelector?: Readonly<Record<string, string>>;
  egressHosts: string[];
  outboundTrafficPolicy?: 'ALLOW_ANY' | 'REGISTRY_ONLY';
}

/** Inbound mTLS of the workloads it selects (all of its namespace without a selector; the mesh in istio-system). */
export interface PeerAuthenticationSpec {
  selector?: Readonly<Record<string, string>>;
  mode: 'STRICT' | 'PERMISSIVE' | 'DISABLE';
}

export interface GatewaySpec {
  selector: Readonly<Record<string, string>>;
  servers: GatewayServer[];
}

// ---- service registry model ----

export interface Service {
  hostname: string;
  namespace: string;
  /** The ServiceEntry's addresses (IPs or CIDRs); empty when it has none. */
  addresses: readonly string[];
  ports: readonly ServicePort[];
  resolution: 'STATIC' | 'DNS';
  location: 'MESH_EXTERNAL' | 'MESH_INTERNAL';
  exportTo?: readonly string[];
  /** Key of the ServiceEntry that defines it. */
  source: string;
}

export interface ServiceInstance {
  hostname: string;
  servicePort: ServicePort;
  address: string;
  /** Port on the workload that traffic for servicePort goes to. */
  port: number;
  labels: Readonly<Record<string, string>>;
  weight?: number;
  /** Namespace and service account of the workload, when it declares one (the identity mTLS expects). */
  identity?: { namespace: string; serviceAccount: string };
  /** Key of the config that contributed it (the ServiceEntry, or the selected WorkloadEntry). */
  source: string;
}

export const instanceKey = (i: ServiceInstance) =>
  `${i.hostname}|${i.servicePort.number}|${i.address}|${i.port}|${i.source}`;

/** A short name (no dot) means `<name>.<namespace>.svc.cluster.local`, as in Istio; anything else is taken as is. */
export function qualifyHost(host: string, namespace: string): string {
  return host.includes('.') || host.includes('*') ? host : `${host}.${namespace}.svc.cluster.local`;
}

/** Does `labels` contain every key/value of `selector`? */
export function labelsMatch(
  selector: Readonly<Record<string, string>>,
  labels: Readonly<Record<string, string>>,
): boolean {
  for (const [k, v] of Object.entries(selector)) if (labels[k] !== v) return false;
  return true;
}

// ---- TLS (./kind-tls.ts, ./kind-secret.ts) ----

export type GatewayProtocol = 'HTTP' | 'HTTP2' | 'GRPC' | 'HTTPS' | 'TLS' | 'TCP';
export type TlsVersion = 'TLS_AUTO' | 'TLSV1_0' | 'TLSV1_1' | 'TLSV1_2' | 'TLSV1_3';

/** A Gateway server's `tls`. */
export interface ServerTls {
  mode: 'SIMPLE' | 'MUTUAL' | 'PASSTHROUGH' | 'ISTIO_MUTUAL';
  httpsRedirect: boolean;
  credentialName?: string;
  serverCertificate?: string;
  privateKey?: string;
  caCertificates?: string;
  subjectAltNames: string[];
  minProtocolVersion?: TlsVersion;
  maxProtocolVersion?: TlsVersion;
  cipherSuites: string[];
}

/** A DestinationRule's `trafficPolicy.tls`. */
export interface ClientTls {
  mode: 'DISABLE' | 'ISTIO_MUTUAL' | 'SIMPLE' | 'MUTUAL';
  subjectAltNames: string[];
  caCertificates?: string;
  clientCertificate?: string;
  privateKey?: string;
  credentialName?: string;
  sni?: string;
  insecureSkipVerify?: boolean;
}

/** A VirtualService `tls` route: connections whose SNI (and port) match go, still encrypted, to the destinations. */
export interface TlsRoute {
  match: { sniHosts: string[]; port?: number; gateways: string[] }[];
  route: RouteDestination[];
}

/** A `kind: Secret` (v1), as Istio reads gateway credentials: PEM text, checked at load. Never logged. */
export interface SecretSpec {
  /** Certificate chain and its private key (absent in a CA-only Secret). */
  cert?: string;
  key?: string;
  /** Trust bundle for client or server verification (`ca.crt` / `cacert`). */
  ca?: string;
  /** `.dockerconfigjson` of a `kubernetes.io/dockerconfigjson` Secret: a WasmPlugin's imagePullSecret. */
  dockerConfigJson?: string;
}

// ---- extensions (./kind-wasm-plugin.ts, ./gen-wasm.ts) ----

export type WasmPhase = 'AUTHN' | 'AUTHZ' | 'STATS' | 'UNSPECIFIED_PHASE';
export type WorkloadMode = 'UNDEFINED' | 'CLIENT' | 'SERVER' | 'CLIENT_AND_SERVER';

/** A WasmPlugin (extensions.istio.io/v1alpha1), defaults filled in. */
export interface WasmPluginSpec {
  selector?: Readonly<Record<string, string>>;
  /** Gateway API Gateways (`gateway.networking.k8s.io` kind Gateway) by name, in the plugin's namespace. */
  targetGateways?: readonly string[];
  phase: WasmPhase;
  /** Higher first within a phase; absent sorts last (istiod: MinInt32). */
  priority?: number;
  /** As written; no scheme means `oci://`. */
  url: string;
  sha256?: string;
  imagePullPolicy: 'UNSPECIFIED_POLICY' | 'IfNotPresent' | 'Always';
  /** Name of a Secret of the plugin's namespace. */
  imagePullSecret?: string;
  /** pluginConfig, as JSON text (istiod sends it as a StringValue). */
  pluginConfigJson?: string;
  pluginName?: string;
  failStrategy: 'FAIL_CLOSE' | 'FAIL_OPEN' | 'FAIL_RELOAD';
  env: readonly { name: string; value: string; valueFrom: 'INLINE' | 'HOST' }[];
  match: readonly { mode: WorkloadMode; ports: readonly number[] }[];
  type: 'HTTP' | 'NETWORK';
}
