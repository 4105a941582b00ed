// The variables a bootstrap template sees: the names and value forms the Go agent passes to Istio's template
// (pkg/bootstrap/config.go and option/instances.go), so a template written for Istio renders the same here.
// Pure, like the bootstrap. A few names of this agent's own are added (xds_socket, sds_socket, ...).
//
// As in Istio, `meta_json_str`, `runtime_flags`, `pilot_SAN` and the tracer addresses (`zipkin`, `datadog`,
// `pilot_grpc_address`: `{"address": "host", "port_value": N}`) are JSON text, inserted as is; `config` is the
// ProxyConfig with Go field names (`.config.ProxyAdminPort`), `metadata` the node metadata with Go field names
// (`.metadata.Labels`). A variable Istio leaves out when empty (region, zone, outlier_log_path, extraStatTags,
// inclusion lists, zipkin, ...) is absent here too, so `{{ if .x }}` behaves the same.

import type { AgentConfig } from './config';
import type { NodeIdentity } from './node-identity';
import { pilotSan } from './node-identity';
import { localNet, maxDownstreamConnections, metadataDiscovery, runtimeFlags, tracer, xdsApiType } from './bootstrap';
import {
  extraStatTags,
  histogramBucketSettings,
  statsEvictionInterval,
  statsFlushIntervalMs,
  statsInclusion,
} from './bootstrap-stats';
import { GO_NIL, goStruct } from './go-template';
import { accessLogService, metricsService, statsdAddress, tlsTransportSocket } from './bootstrap-services';
import { formatProtoDuration } from './duration';

type Json = Record<string, unknown>;

/** Go's time.Duration.String() for whole milliseconds: 500ms, 5s, 1m30s, 1h0m0s. */
export function goDuration(ms: number): string {
  if (ms === 0) return '0s';
  if (ms < 1000) return `${ms}ms`;
  const h = Math.floor(ms / 3_600_000);
  const m = Math.floor((ms % 3_600_000) / 60_000);
  const s = (ms % 60_000) / 1000;
  return `${h ? `${h}h` : ''}${h || m ? `${m}m` : ''}${s}s`;
}

// Go's nil map / slice / pointer for an unset field.
const isEmpty = (v: unknown) => v !== null && typeof v === 'object' && Object.keys(v).length === 0;
const upperFirst = (k: string) => k[0]!.toUpperCase() + k.slice(1);

/** The ProxyConfig as the Go struct a template sees: every field (zero when unset), Go names. */
function configStruct(cfg: AgentConfig): Json {
  const p = cfg.proxy;
  const out: Json = {};
  for (const [k, v] of Object.entries(p)) {
    if (k === 'extra') continue;
    out[upperFirst(k)] = [
      'drainDuration',
      'parentShutdownDuration',
      'terminationDrainDuration',
      'fileFlushInterval',
    ].includes(k)
      ? formatProtoDuration(v as number)
      : v === undefined
        ? null
        : isEmpty(v)
          ? GO_NIL
          : v;
  }
  for (const [k, v] of Object.entries(p.extra)) out[upperFirst(k)] = v;
  return goStruct('*model.NodeMetaProxyConfig', out);
}

// Node metadata keys -> the Go field names of model.BootstrapNodeMetadata, with the kind of each field.
const STR = 'string';
const BOOL = 'bool';
const INT = 'int';
const MAP = 'map';
const LIST = 'list';
const METADATA_FIELDS: Record<string, [string, string]> = {
  LABELS: ['Labels', MAP],
  STATIC_LABELS: ['StaticLabels', MAP],
  ANNOTATIONS: ['Annotations', MAP],
  PLATFORM_METADATA: ['PlatformMetadata', MAP],
  NAMESPACE: ['Namespace', STR],
  NAME: ['InstanceName', STR],
  WORKLOAD_NAME: ['WorkloadName', STR],
  SERVICE_ACCOUNT: ['ServiceAccount', STR],
  CLUSTER_ID: ['ClusterID', STR],
  MESH_ID: ['MeshID', STR],
  NETWORK: ['Network', STR],
  ISTIO_VERSION: ['IstioVersion', STR],
  ISTIO_REVISION: ['IstioRevision', STR],
  OWNER: ['Owner', STR],
  INTERCEPTION_MODE: ['InterceptionMode', STR],
  NODE_NAME: ['NodeName', STR],
  APP_CONTAINERS: ['AppContainers', STR],
  HTTP_PROXY_PORT: ['HTTPProxyPort', STR],
  GENERATOR: ['Generator', STR],
  IDLE_TIMEOUT: ['IdleTimeout', STR],
  HTTP10: ['HTTP10', STR],
  BASE: ['CertBaseDir', STR],
  DNS_PROXY_ADDR: ['DNSProxyAddr', STR],
  AUTO_REGISTER_GROUP: ['AutoRegisterGroup', STR],
  WORKLOAD_ENTRY: ['WorkloadEntry', STR],
  UNPRIVILEGED_POD: ['UnprivilegedPod', STR],
  STS_PORT: ['StsPort', STR],
  CLOUDRUN_ADDR: ['CloudrunAddr', STR],
  OUTLIER_LOG_PATH: ['OutlierLogPath', STR],
  ISTIO_PROXY_SHA: ['IstioProxySHA', STR],
  WORKLOAD_IDENTITY_SOCKET_FILE: ['WorkloadIdentitySocketFile', STR],
  TLS_SERVER_CERT_CHAIN: ['TLSServerCertChain', STR],
  TLS_SERVER_KEY: ['TLSServerKey', STR],
  TLS_SERVER_ROOT_CERT: ['TLSServerRootCert', STR],
  TLS_CLIENT_CERT_CHAIN: ['TLSClientCertChain', STR],
  TLS_CLIENT_KEY: ['TLSClientKey', STR],
  TLS_CLIENT_ROOT_CERT: ['TLSClientRootCert', STR],
  POD_PORTS: ['PodPorts', STR],
  PILOT_SAN: ['PilotSubjectAltName', LIST],
  REQUESTED_NETWORK_VIEW: ['RequestedNetworkView', STR],
  ENVOY_STATUS_PORT: ['EnvoyStatusPort', INT],
  ENVOY_PROMETHEUS_PORT: ['EnvoyPrometheusPort', INT],
  ENVOY_SECURE_METRICS_PORT: ['EnvoySecureMetricsPort', INT],
  ENVOY_SECURE_MERGED_METRICS_PORT: ['EnvoySecureMergedMetricsPort', INT],
  ENABLE_SELF_DISCOVERY: ['EnableSelfDiscovery', BOOL],
  DNS_CAPTURE: ['DNSCapture', BOOL],
  DNS_AUTO_ALLOCATE: ['DNSAutoAllocate', BOOL],
  ENABLE_HBONE: ['EnableHBONE', BOOL],
  DISABLE_HBONE_SEND: ['DisableHBONESend', BOOL],
  EXIT_ON_ZERO_ACTIVE_CONNECTIONS: ['ExitOnZeroActiveConnections', BOOL],
  INBOUND_LISTENER_EXACT_BALANCE: ['InboundListenerExactBalance', BOOL],
  OUTBOUND_LISTENER_EXACT_BALANCE: ['OutboundListenerExactBalance', BOOL],
  METADATA_DISCOVERY: ['MetadataDiscovery', BOOL],
  ENVOY_SKIP_DEPRECATED_LOGS: ['EnvoySkipDeprecatedLogs', BOOL],
};

function metadataStruct(cfg: AgentConfig, node: NodeIdentity): Json {
  const m = node.metadata;
  const out: Json = {};
  for (const [key, [field, kind]] of Object.entries(METADATA_FIELDS)) {
    const v = m[key];
    if (kind === BOOL) out[field] = v === 'true' || v === true;
    else if (kind === INT) out[field] = typeof v === 'number' ? v : 0;
    else if (kind === MAP || kind === LIST) out[field] = v === undefined || isEmpty(v) ? GO_NIL : v;
    else out[field] = typeof v === 'string' ? v : '';
  }
  out.InstanceIPs = node.ips;
  out.ProxyConfig = configStruct(cfg);
  return goStruct('*model.BootstrapNodeMetadata', out);
}

const address = (host: string, port: number | string) => `{"address": "${host}", "port_value": ${port}}`;

export function templateVariables(cfg: AgentConfig, node: NodeIdentity): Json {
  const net = localNet(node);
  const p = cfg.proxy;
  const v: Json = {
    nodeID: node.id,
    nodeType: node.id.split('~')[0],
    cluster: node.cluster,
    config: configStruct(cfg),
    metadata: metadataStruct(cfg, node),
    meta_json_str: JSON.stringify(node.metadata),
    runtime_flags: JSON.stringify(runtimeFlags(cfg)),
    pilot_SAN: `[${(p.controlPlaneAuthPolicy === 'MUTUAL_TLS' ? [pilotSan(p.discoveryAddress)] : []).map((s) => `{"exact":"${s}"}`).join(',')}]`,
    discovery_address: p.discoveryAddress,
    discovery_host: p.discoveryAddress.split(':')[0],
    xds_type: xdsApiType(cfg, node),
    xds_root_cert: '',
    log_json: cfg.logAsJson,
    metadata_discovery: metadataDiscovery(cfg, node),
    metrics_localhost_access_only: p.proxyMetadata.METRICS_LOCALHOST_ACCESS_ONLY === 'true',
    workload_identity_socket_file: cfg.workloadIdentitySocketFile,
    ...(cfg.sockets.externalSds ? { custom_file_path: cfg.sdsServeSocket } : {}),
    localhost: net.localhost,
    wildcard: net.wildcard,
    dns_lookup_family: net.dnsLookupFamily,
    ...(net.additional
      ? {
          dual_stack: true,
          additional_localhost: net.additional.localhost,
          additional_wildcard: net.additional.wildcard,
        }
      : {}),
    envoy_status_port: cfg.envoyStatusPort,
    envoy_prometheus_port: cfg.envoyPrometheusPort,
    global_downstream_max_connections: maxDownstreamConnections(cfg),
    envoy_metrics_stats_compression: p.extra.statsCompression !== false,
    envoy_status_port_enable_proxy_protocol: cfg.statusPortProxyProtocol,
    enable_self_discovery: node.metadata.ENABLE_SELF_DISCOVERY === 'true',
    histogram_buckets: histogramBucketSettings(cfg) ?? null,
    ...(cfg.secureMetricsPort ? { secure_metrics_port: cfg.secureMetricsPort } : {}),
    ...(cfg.secureMergedMetricsPort ? { secure_merged_metrics_port: cfg.secureMergedMetricsPort } : {}),
    // This agent's own names.
    xds_socket: cfg.xdsSocket,
    sds_socket: cfg.sdsSocket,
  };
  const [host, port] = p.discoveryAddress.split(/:(?=[^:]*$)/);
  if (host && port) v.pilot_grpc_address = address(host, port);
  if (node.locality.region) v.region = node.locality.region;
  if (node.locality.zone) v.zone = node.locality.zone;
  if (node.locality.sub_zone) v.sub_zone = node.locality.sub_zone;
  if (cfg.outlierLogPath) v.outlier_log_path = cfg.outlierLogPath;
  const tags = extraStatTags(cfg);
  if (tags.length) v.extraStatTags = tags;
  const inc = statsInclusion(cfg, node);
  if (inc.prefixes.length) v.inclusionPrefix = inc.prefixes;
  if (inc.suffixes.length) v.inclusionSuffix = inc.suffixes;
  if (inc.regexps.length) v.inclusionRegexps = inc.regexps;
  const flush = statsFlushIntervalMs(cfg);
  if (flush !== undefined) v.stats_flush_interval = goDuration(flush);
  const eviction = statsEvictionInterval(cfg);
  if (eviction) v.stats_eviction_interval = eviction;
  const t = tracer(cfg);
  if (t) v[t.kind] = address(t.host, t.port);
  for (const [svc, prefix] of [
    [metricsService(cfg, node.metadata), 'envoy_metrics_service'],
    [accessLogService(cfg, node.metadata), 'envoy_accesslog_service'],
  ] as const) {
    if (!svc) continue;
    v[`${prefix}_address`] = address(svc.address.host, svc.address.port);
    if (svc.keepalive) v[`${prefix}_tcp_keepalive`] = JSON.stringify(svc.keepalive);
    if (svc.transportSocket) v[`${prefix}_tls`] = JSON.stringify(svc.transportSocket);
  }
  if (t) {
    const ts = tlsTransportSocket(
      p.tracing!.tlsSettings,
      'tracer',
      node.metadata,
      false,
      'tracing.tlsSettings',
      cfg.sources.tracing ?? 'ProxyConfig',
    );
    if (ts) v.tracing_tls = JSON.stringify(ts);
  }
  const statsd = statsdAddress(cfg);
  if (statsd) v.statsd = address(statsd.host, statsd.port);
  if (typeof node.metadata.LOAD_STATS_CONFIG_JSON === 'string')
    v.load_stats_config_json_str = node.metadata.LOAD_STATS_CONFIG_JSON;
  return v;
}
