// Envoy's v3 bootstrap as a plain JSON object (proto field names), built from the frozen config and the node
// identity. Pure: no file system, environment or clock, so golden files can pin the output exactly.
//
// Facts (field names, defaults, stat tag regexes, inclusion lists) follow Istio's bootstrap template and
// pkg/bootstrap; the code is ours. Sidecar and router bootstraps share one shape, as in Istio: what differs
// comes in through the node (id prefix, DNS metadata), not through different sections.

import type { AgentConfig } from './config';
import type { NodeIdentity } from './node-identity';
import { configError } from './errors';
import { secureMetricsListeners, serviceClusters, statsSinks, tlsTransportSocket } from './bootstrap-services';
import { statsCompressors, statsConfig, statsEvictionInterval, statsFlushInterval } from './bootstrap-stats';
import { own, plainCopy, setOwn } from './dict';

export interface BootstrapInputs {
  cfg: AgentConfig;
  node: NodeIdentity;
}

type Json = Record<string, unknown>;

const TYPE = 'type.googleapis.com/';
const HCM_TYPE = `${TYPE}envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager`;
const ROUTER_TYPE = `${TYPE}envoy.extensions.filters.http.router.v3.Router`;
const HTTP_OPTIONS = 'envoy.extensions.upstreams.http.v3.HttpProtocolOptions';

/** Envoy's overload manager limit when runtimeValues does not set one (Istio's default: effectively none). */
export const DEFAULT_MAX_DOWNSTREAM_CONNECTIONS = 2147483647;
const MAX_CONNECTIONS_KEY = 'overload.global_downstream_max_connections';

/** Where Envoy listens and connects locally; IPv6-only pods use the IPv6 loopback and wildcard. */
export interface LocalNet {
  localhost: string;
  wildcard: string;
  dnsLookupFamily: 'V4_ONLY' | 'V6_ONLY' | 'ALL';
  /** Dual stack: the other family's loopback and wildcard, also bound by the local listeners. */
  additional?: { localhost: string; wildcard: string };
}

const V4 = { localhost: '127.0.0.1', wildcard: '0.0.0.0' };
const V6 = { localhost: '::1', wildcard: '::' };

export function localNet(node: NodeIdentity): LocalNet {
  if (node.dualStack === 'ipv6-first') return { ...V6, dnsLookupFamily: 'ALL', additional: V4 };
  if (node.dualStack === 'ipv4-first') return { ...V4, dnsLookupFamily: 'ALL', additional: V6 };
  return node.ipv6 ? { ...V6, dnsLookupFamily: 'V6_ONLY' } : { ...V4, dnsLookupFamily: 'V4_ONLY' };
}

const isWaypoint = (node: NodeIdentity) => node.id.startsWith('waypoint~');

/** Delta unless ISTIO_DELTA_XDS=false; a waypoint always uses Delta, as in Istio. */
export function xdsApiType(cfg: AgentConfig, node: NodeIdentity): 'DELTA_GRPC' | 'GRPC' {
  return cfg.deltaXds || isWaypoint(node) ? 'DELTA_GRPC' : 'GRPC';
}

/**
 * Envoy's peer metadata discovery extension (Istio's `metadata_discovery`): on for waypoints, else as
 * PEER_METADATA_DISCOVERY says (unset: on with ENABLE_HBONE); never over state-of-the-world xDS.
 */
export function metadataDiscovery(cfg: AgentConfig, node: NodeIdentity): boolean {
  const on = isWaypoint(node) || (cfg.metadataDiscovery ?? node.metadata.ENABLE_HBONE === 'true');
  return on && xdsApiType(cfg, node) === 'DELTA_GRPC';
}

export function buildBootstrap(i: BootstrapInputs): Json {
  const { cfg, node } = i;
  const net = localNet(node);
  const tracer = tracing(cfg, node, net);
  const maxConnections = maxDownstreamConnections(cfg);

  const b: Json = {
    application_log_config: {
      // Istio's log line shape (JSON with --log_as_json), so Envoy's own lines read like the agent's.
      log_format: cfg.logAsJson
        ? {
            json_format: {
              level: '%l',
              time: '%Y-%m-%dT%T.%fZ',
              scope: 'envoy %n',
              msg: '%j',
              caller: '%g:%#',
              thread: '%t',
            },
          }
        : { text_format: '%Y-%m-%dT%T.%fZ\t%l\tenvoy %n %g:%#\t%v\tthread=%t' },
    },
    node: nodeSection(node),
    layered_runtime: {
      layers: [
        { name: 'global config', static_layer: runtimeFlags(cfg) },
        { name: 'admin', admin_layer: {} },
      ],
    },
    bootstrap_extensions: [
      ...(metadataDiscovery(cfg, node)
        ? [
            {
              name: 'metadata_discovery',
              typed_config: {
                '@type': `${TYPE}udpa.type.v1.TypedStruct`,
                type_url: `${TYPE}istio.workload.BootstrapExtension`,
                value: { config_source: { ads: {} } },
              },
            },
          ]
        : []),
      {
        name: 'envoy.bootstrap.internal_listener',
        typed_config: {
          '@type': `${TYPE}envoy.extensions.bootstrap.internal_listener.v3.InternalListener`,
          buffer_size_kb: 64,
        },
      },
    ],
    stats_config: statsConfig(cfg, node, metadataDiscovery(cfg, node)),
    admin: admin(cfg, net),
    dynamic_resources: dynamicResources(cfg, node),
    static_resources: {
      clusters: [
        ...localClusters(cfg, net),
        ...(tracer ? [tracer.cluster] : []),
        ...serviceClusters(cfg, net.dnsLookupFamily, node.metadata),
        ...(selfDiscovery(node) ? [SELF_DISCOVERY_CLUSTER] : []),
      ],
      listeners: [
        alsoOtherFamily(net, localOnly(cfg, net, withHttpFilters(prometheusListener(cfg, net), statsCompressors(cfg)))),
        ...secureMetricsListeners(cfg, net.wildcard),
        alsoOtherFamily(net, readinessListener(cfg, net)),
      ],
    },
  };
  if (tracer) b.tracing = tracer.tracing;
  const sinks = statsSinks(cfg);
  if (sinks) b.stats_sinks = sinks;
  b.overload_manager = overloadManager(maxConnections);
  const flush = statsFlushInterval(cfg);
  if (flush) b.stats_flush_interval = flush;
  const eviction = statsEvictionInterval(cfg);
  if (eviction) b.stats_eviction_interval = eviction;
  const cm = clusterManager(cfg, node);
  if (cm) b.cluster_manager = cm;
  // Istio's default: stats objects are created on first use, which saves memory on large meshes.
  b.deferred_stat_options = { enable_deferred_creation_stats: true };
  return b;
}

function nodeSection(node: NodeIdentity): Json {
  // Copied so that later edits of the bootstrap (overrides, callers) never reach back into the node identity.
  return {
    id: node.id,
    cluster: node.cluster,
    locality: { ...node.locality },
    metadata: structuredClone(node.metadata),
  };
}

/**
 * The static runtime layer: Istio's defaults, then every ProxyConfig.runtimeValues key. An empty value removes a
 * default; "true"/"false" become booleans because Envoy no longer accepts strings for boolean flags.
 */
export function runtimeFlags(cfg: AgentConfig): Json {
  const flags: Json = {
    'envoy.deprecated_features:envoy.config.listener.v3.Listener.hidden_envoy_deprecated_use_original_dst': true,
    'envoy.reloadable_features.http_reject_path_with_fragment': false,
    'envoy.reloadable_features.fixed_heap_use_allocated': true,
    // Istio turns this off to work around https://github.com/envoyproxy/envoy/issues/45212.
    'envoy.reloadable_features.coalesce_lb_rebuilds_on_batch_update': false,
    're2.max_program_size.error_level': '32768',
  };
  if (cfg.compliancePolicy === 'fips-140-2') flags['envoy.reloadable_features.google_grpc_disable_tls_13'] = true;
  // Istio's condition is backwards, and kept so for compatibility: the variable set to false adds "false".
  if (!cfg.stripFragmentFromPath)
    flags['envoy.reloadable_features.http_strip_fragment_from_path_unsafe_if_disabled'] = 'false';
  for (const [k, v] of Object.entries(cfg.proxy.runtimeValues)) {
    if (v === '') delete flags[k];
    else flags[k] = v === 'true' ? true : v === 'false' ? false : v;
  }
  return flags;
}

/**
 * The overload manager's limit: proxyMetadata ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS, else the
 * runtimeValues key (which also stays in the runtime layer, as in Istio), else no practical limit.
 */
export function maxDownstreamConnections(cfg: AgentConfig): number {
  const fromMeta = cfg.proxy.proxyMetadata.ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS;
  if (fromMeta !== undefined && /^\d+$/.test(fromMeta)) return Number(fromMeta);
  const raw = cfg.proxy.runtimeValues[MAX_CONNECTIONS_KEY];
  if (raw === undefined || raw === '') return DEFAULT_MAX_DOWNSTREAM_CONNECTIONS;
  if (!/^\d+$/.test(raw) || Number(raw) < 1) {
    throw configError(
      `runtimeValues["${MAX_CONNECTIONS_KEY}"]`,
      cfg.sources.runtimeValues ?? 'ProxyConfig',
      `want a positive integer, got "${raw}"`,
    );
  }
  return Number(raw);
}

function overloadManager(max: number): Json {
  return {
    resource_monitors: [
      {
        name: 'envoy.resource_monitors.global_downstream_max_connections',
        typed_config: {
          '@type': `${TYPE}envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig`,
          max_active_downstream_connections: max,
        },
      },
    ],
  };
}

// ---- admin, xDS, static resources ----

function admin(cfg: AgentConfig, net: LocalNet): Json {
  return {
    access_log: [
      {
        name: 'envoy.access_loggers.file',
        typed_config: { '@type': `${TYPE}envoy.extensions.access_loggers.file.v3.FileAccessLog`, path: '/dev/null' },
      },
    ],
    profile_path: '/var/lib/istio/data/envoy.prof',
    address: { socket_address: { address: net.localhost, port_value: cfg.proxy.proxyAdminPort } },
  };
}

function dynamicResources(cfg: AgentConfig, node: NodeIdentity): Json {
  // initial_fetch_timeout 0s: Envoy waits for the first LDS/CDS instead of starting with nothing.
  const overAds = () => ({ ads: {}, initial_fetch_timeout: '0s', resource_api_version: 'V3' });
  return {
    lds_config: overAds(),
    cds_config: overAds(),
    ads_config: {
      api_type: xdsApiType(cfg, node),
      set_node_on_first_message_only: true,
      transport_api_version: 'V3',
      grpc_services: [{ envoy_grpc: { cluster_name: 'xds-grpc' } }],
    },
  };
}

function http2Options(common?: Json): Json {
  const options: Json = { '@type': `${TYPE}${HTTP_OPTIONS}` };
  if (common) options.common_http_protocol_options = common;
  options.explicit_http_config = { http2_protocol_options: {} };
  return { [HTTP_OPTIONS]: options };
}

function assignment(name: string, address: Json): Json {
  return { cluster_name: name, endpoints: [{ lb_endpoints: [{ endpoint: { address } }] }] };
}

// alt_stat_name ends in `;` so the cluster_name tag regex extracts the name.
function loopbackCluster(name: string, host: string, port: number): Json {
  return {
    name,
    alt_stat_name: `${name};`,
    type: 'STATIC',
    connect_timeout: '0.250s',
    lb_policy: 'ROUND_ROBIN',
    load_assignment: assignment(name, { socket_address: { protocol: 'TCP', address: host, port_value: port } }),
  };
}

function pipeCluster(name: string, path: string, common?: Json): Json {
  return {
    name,
    alt_stat_name: `${name};`,
    type: 'STATIC',
    typed_extension_protocol_options: http2Options(common),
    connect_timeout: '1s',
    lb_policy: 'ROUND_ROBIN',
    load_assignment: assignment(name, { pipe: { path } }),
  };
}

function localClusters(cfg: AgentConfig, net: LocalNet): Json[] {
  const limits = (priority: string) => ({
    priority,
    max_connections: 100000,
    max_pending_requests: 100000,
    max_requests: 100000,
  });
  return [
    loopbackCluster('prometheus_stats', net.localhost, cfg.proxy.proxyAdminPort),
    loopbackCluster('agent', net.localhost, cfg.proxy.statusPort),
    pipeCluster('sds-grpc', cfg.sdsSocket),
    // Another server serves sds-grpc: the agent's own SDS server serves file certificates here (Go's custom_file_path).
    ...(cfg.sockets.externalSds ? [pipeCluster('sds-files-grpc', cfg.sdsServeSocket)] : []),
    {
      // One ADS stream per connection, so a new stream always comes with a new connection to the agent.
      // Set in the protocol options: the Cluster-level max_requests_per_connection is deprecated.
      // The path is written as Istio's template writes it (`<configPath>/XDS`, not normalised).
      ...pipeCluster('xds-grpc', `${cfg.proxy.configPath}/XDS`, { max_requests_per_connection: 1 }),
      circuit_breakers: { thresholds: [limits('DEFAULT'), limits('HIGH')] },
      upstream_connection_options: { tcp_keepalive: { keepalive_time: 300 } },
    },
  ];
}

/**
 * A public listener that forwards exactly one GET (or HEAD) path to a loopback cluster (Envoy's admin, or the
 * agent's status port, which trusts loopback peers). Anything else must never reach that cluster: the path is
 * normalised (`..`, `%2e`) and slashes merged before matching, escaped slashes are rejected, the match is exact
 * (a prefix would let `/stats/prometheus/../../quitquitquit` through), other methods get 405, other paths 404.
 */
function httpListener(net: LocalNet, port: number, statPrefix: string, exactPath: string, cluster: string): Json {
  const getOrHead = { name: ':method', string_match: { safe_regex: { regex: '^(GET|HEAD)$' } } };
  return {
    name: `${net.wildcard}_${port}`,
    address: { socket_address: { protocol: 'TCP', address: net.wildcard, port_value: port } },
    // Scrapes and readiness probes must keep working when Envoy is at its connection limit or overloaded.
    ignore_global_conn_limit: true,
    bypass_overload_manager: true,
    filter_chains: [
      {
        filters: [
          {
            name: 'envoy.filters.network.http_connection_manager',
            typed_config: {
              '@type': HCM_TYPE,
              codec_type: 'AUTO',
              stat_prefix: statPrefix,
              normalize_path: true,
              merge_slashes: true,
              path_with_escaped_slashes_action: 'REJECT_REQUEST',
              route_config: {
                virtual_hosts: [
                  {
                    name: 'backend',
                    domains: ['*'],
                    routes: [
                      { match: { path: exactPath, headers: [getOrHead] }, route: { cluster } },
                      { match: { path: exactPath }, direct_response: { status: 405 } },
                      { match: { prefix: '/' }, direct_response: { status: 404 } },
                    ],
                  },
                ],
              },
              http_filters: [{ name: 'envoy.filters.http.router', typed_config: { '@type': ROUTER_TYPE } }],
            },
          },
        ],
      },
    ],
  };
}

/**
 * The same guarantees for a bootstrap from a template (Istio's stock template routes a *prefix* of the public
 * 15090/15021 listeners to the admin-backed clusters, which lets `/stats/prometheus/../../quitquitquit` through):
 * in every static listener on those ports, a route that sends a prefix to a cluster becomes the exact path for
 * GET/HEAD, 405 for other methods, and everything else 404, behind path normalisation. Returns a new bootstrap.
 */
export function hardenPublicListeners(
  bootstrap: Record<string, unknown>,
  ports: readonly number[],
): Record<string, unknown> {
  const copy = JSON.parse(JSON.stringify(bootstrap)) as Json;
  const getOrHead = { name: ':method', string_match: { safe_regex: { regex: '^(GET|HEAD)$' } } };
  const listeners = ((copy.static_resources as Json | undefined)?.listeners ?? []) as Json[];
  for (const l of listeners) {
    const port = ((l.address as Json | undefined)?.socket_address as Json | undefined)?.port_value;
    if (!ports.includes(Number(port))) continue;
    for (const fc of (l.filter_chains ?? []) as Json[]) {
      for (const f of (fc.filters ?? []) as Json[]) {
        const hcm = f.typed_config as Json | undefined;
        if (!hcm || hcm['@type'] !== HCM_TYPE) continue;
        hcm.normalize_path = true;
        hcm.merge_slashes = true;
        hcm.path_with_escaped_slashes_action = 'REJECT_REQUEST';
        for (const vh of ((hcm.route_config as Json | undefined)?.virtual_hosts ?? []) as Json[]) {
          const out: Json[] = [];
          for (const r of (vh.routes ?? []) as Json[]) {
            const m = r.match as Json | undefined;
            if (m && typeof m.prefix === 'string' && m.prefix !== '/' && r.route) {
              out.push(
                { ...r, match: { path: m.prefix, headers: [getOrHead] } },
                { match: { path: m.prefix }, direct_response: { status: 405 } },
              );
            } else out.push(r);
          }
          if (!out.some((r) => (r.match as Json | undefined)?.prefix === '/'))
            out.push({ match: { prefix: '/' }, direct_response: { status: 404 } });
          vh.routes = out;
        }
      }
    }
  }
  return copy;
}

const LOOPBACK_HOSTS = new Set(['127.0.0.1', '::1', 'localhost', '0.0.0.0', '::']);

/**
 * ENVOY_ADMIN_MODE=uds, for any bootstrap (generated, template or custom): Envoy's admin listens on `socket`, mode
 * 0600, instead of its TCP port, and every static cluster endpoint that pointed at that port on loopback (the
 * `prometheus_stats` cluster behind the 15090 listener, or a template's own) points at the socket, so the public
 * listeners keep serving their one path. A bootstrap without an admin address is returned unchanged. Returns a copy.
 */
export function adminOnSocket(bootstrap: Record<string, unknown>, socket: string): Record<string, unknown> {
  const copy = JSON.parse(JSON.stringify(bootstrap)) as Json;
  const admin = copy.admin as Json | undefined;
  const address = admin?.address as Json | undefined;
  if (!admin || !address) return copy;
  const sa = address.socket_address as Json | undefined;
  const port = sa ? Number(sa.port_value) : undefined;
  admin.address = { pipe: { path: socket, mode: 0o600 } };
  if (port === undefined) return copy;
  for (const c of ((copy.static_resources as Json | undefined)?.clusters ?? []) as Json[]) {
    for (const group of ((c.load_assignment as Json | undefined)?.endpoints ?? []) as Json[]) {
      for (const lb of (group.lb_endpoints ?? []) as Json[]) {
        const endpoint = lb.endpoint as Json | undefined;
        const to = (endpoint?.address as Json | undefined)?.socket_address as Json | undefined;
        if (to && LOOPBACK_HOSTS.has(String(to.address)) && Number(to.port_value) === port)
          endpoint!.address = { pipe: { path: socket } };
      }
    }
  }
  return copy;
}

function prometheusListener(cfg: AgentConfig, net: LocalNet): Json {
  return httpListener(net, cfg.envoyPrometheusPort, 'stats', '/stats/prometheus', 'prometheus_stats');
}

/** ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL: a load balancer that sends PROXY protocol may probe 15021, as in Istio. */
function readinessListener(cfg: AgentConfig, net: LocalNet): Json {
  const listener = httpListener(net, cfg.envoyStatusPort, 'agent', '/healthz/ready', 'agent');
  if (!cfg.statusPortProxyProtocol) return listener;
  const proxyProtocol = {
    name: 'envoy.listener.proxy_protocol',
    typed_config: {
      '@type': `${TYPE}envoy.extensions.filters.listener.proxy_protocol.v3.ProxyProtocol`,
      allow_requests_without_proxy_protocol: true,
    },
  };
  return { ...listener, listener_filters: [proxyProtocol] };
}

/** Node metadata ENABLE_SELF_DISCOVERY (ISTIO_META_ENABLE_SELF_DISCOVERY): Istio's local_cluster for zone-aware LB. */
function selfDiscovery(node: NodeIdentity): boolean {
  return node.metadata.ENABLE_SELF_DISCOVERY === 'true';
}

// The proxy's own service, by EDS from istiod, as Envoy's local cluster: zone-aware balancing weighs localities
// by where this service's endpoints are. Istio's template's cluster, field for field.
const SELF_DISCOVERY_CLUSTER: Json = {
  name: 'local_cluster',
  alt_stat_name: 'local_cluster;',
  type: 'EDS',
  connect_timeout: '1s',
  load_balancing_policy: {
    policies: [
      {
        typed_extension_config: {
          name: 'envoy.load_balancing_policies.least_request',
          typed_config: {
            '@type': `${TYPE}envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest`,
            locality_lb_config: { zone_aware_lb_config: { min_cluster_size: '1' } },
          },
        },
      },
    ],
  },
  eds_cluster_config: { eds_config: { ads: {}, resource_api_version: 'V3' }, service_name: 'local_cluster' },
};

/**
 * Istio's template writes cluster_manager only for an outlier log, LRS or self discovery, and then defers cluster
 * creation too.
 */
function clusterManager(cfg: AgentConfig, node: NodeIdentity): Json | undefined {
  const lrs = node.metadata.LOAD_STATS_CONFIG_JSON;
  if (!cfg.outlierLogPath && typeof lrs !== 'string' && !selfDiscovery(node)) return undefined;
  const out: Json = {};
  if (selfDiscovery(node)) out.local_cluster_name = 'local_cluster';
  if (cfg.outlierLogPath) out.outlier_detection = { event_log_path: cfg.outlierLogPath };
  if (typeof lrs === 'string') {
    try {
      out.load_stats_config = JSON.parse(lrs);
    } catch (e) {
      throw configError(
        'ISTIO_META_LOAD_STATS_CONFIG_JSON',
        'node metadata LOAD_STATS_CONFIG_JSON',
        `not valid JSON: ${(e as Error).message}`,
      );
    }
  }
  out.enable_deferred_cluster_creation = true;
  return out;
}

/** proxyMetadata METRICS_LOCALHOST_ACCESS_ONLY=true: the Prometheus listener binds loopback only, as in Istio. */
function localOnly(cfg: AgentConfig, net: LocalNet, listener: Json): Json {
  if (cfg.proxy.proxyMetadata.METRICS_LOCALHOST_ACCESS_ONLY !== 'true') return listener;
  const sa = (listener.address as { socket_address: Json }).socket_address;
  listener.name = `${net.localhost}_${sa.port_value}`;
  sa.address = net.localhost;
  return listener;
}

/** Dual stack: the listener also binds the other family's address (its loopback for a loopback listener). */
function alsoOtherFamily(net: LocalNet, listener: Json): Json {
  if (!net.additional) return listener;
  const sa = (listener.address as { socket_address: Json }).socket_address;
  const address = sa.address === net.localhost ? net.additional.localhost : net.additional.wildcard;
  listener.additional_addresses = [
    { address: { socket_address: { protocol: 'TCP', address, port_value: sa.port_value } } },
  ];
  return listener;
}

/** Adds HTTP filters in front of a listener's router filter. */
function withHttpFilters(listener: Json, filters: Json[]): Json {
  if (filters.length === 0) return listener;
  const hcm = ((listener.filter_chains as Json[])[0]!.filters as Json[])[0]!.typed_config as Json;
  hcm.http_filters = [...filters, ...(hcm.http_filters as Json[])];
  return listener;
}

// ---- tracing (ProxyConfig.tracing: zipkin or datadog; other tracers are gone from current Envoy) ----
// Bootstrap-level tracing is deprecated in Envoy but still honoured; Istio still writes it for ProxyConfig.tracing.

// Fields of Istio's Tracing message that istiod consumes, not the bootstrap.
// tlsSettings is read with the tracer.
const TRACING_IGNORED = new Set([
  'sampling',
  'customTags',
  'maxPathTagLength',
  'useRequestIdForTraceSampling',
  'enableIstioTags',
  'tlsSettings',
]);

/** The tracer ProxyConfig.tracing names and its collector address, if any. */
export function tracer(cfg: AgentConfig): { kind: 'zipkin' | 'datadog'; host: string; port: number } | undefined {
  const t = cfg.proxy.tracing;
  if (!t) return undefined;
  const source = cfg.sources.tracing ?? 'ProxyConfig';
  const tracers = Object.keys(t).filter((k) => !TRACING_IGNORED.has(k));
  if (tracers.length === 0) return undefined;
  if (tracers.length > 1 || !['zipkin', 'datadog'].includes(tracers[0]!)) {
    throw configError(
      'tracing',
      source,
      `unsupported tracing settings ${tracers.map((k) => `"${k}"`).join(', ')} (this agent supports zipkin and datadog)`,
    );
  }
  const kind = tracers[0] as 'zipkin' | 'datadog';
  const address = tracerAddress(t[kind], `tracing.${kind}`, source);
  // Tracer addresses once lived in the pod spec, where Kubernetes expanded $(HOST_IP); Istio does it here now.
  if (address.host === '$(HOST_IP)' && cfg.hostIp) address.host = cfg.hostIp;
  return { kind, ...address };
}

function tracing(cfg: AgentConfig, node: NodeIdentity, net: LocalNet): { cluster: Json; tracing: Json } | undefined {
  const found = tracer(cfg);
  if (!found) return undefined;
  const { kind } = found;
  const address = found;
  const clusterName = kind === 'zipkin' ? 'zipkin' : 'datadog_agent';
  // Istio's fields; Envoy deprecates respect_dns_ttl / dns_refresh_rate on Cluster but still honours them.
  const transportSocket = tlsTransportSocket(
    cfg.proxy.tracing!.tlsSettings,
    'tracer',
    node.metadata,
    false,
    'tracing.tlsSettings',
    cfg.sources.tracing ?? 'ProxyConfig',
  );
  const cluster: Json = {
    name: clusterName,
    alt_stat_name: `${clusterName};`,
    ...(transportSocket ? { transport_socket: transportSocket } : {}),
    type: 'STRICT_DNS',
    respect_dns_ttl: true,
    dns_lookup_family: net.dnsLookupFamily,
    ...(kind === 'zipkin' ? { dns_refresh_rate: '30s' } : {}),
    connect_timeout: '1s',
    lb_policy: 'ROUND_ROBIN',
    load_assignment: assignment(clusterName, { socket_address: { address: address.host, port_value: address.port } }),
  };
  const http =
    kind === 'zipkin'
      ? {
          name: 'envoy.tracers.zipkin',
          typed_config: {
            '@type': `${TYPE}envoy.config.trace.v3.ZipkinConfig`,
            collector_cluster: 'zipkin',
            collector_endpoint: '/api/v2/spans',
            collector_endpoint_version: 'HTTP_JSON',
            trace_id_128bit: true,
            shared_span_context: false,
          },
        }
      : {
          name: 'envoy.tracers.datadog',
          typed_config: {
            '@type': `${TYPE}envoy.config.trace.v3.DatadogConfig`,
            collector_cluster: 'datadog_agent',
            service_name: node.cluster,
          },
        };
  return { cluster, tracing: { http } };
}

/** `host:port` or `[v6]:port`, as Istio's tracing address fields take it. */
function tracerAddress(settings: unknown, field: string, source: string): { host: string; port: number } {
  const addr = (settings as { address?: unknown } | null)?.address;
  const m = typeof addr === 'string' ? /^(?:\[([^\]]+)\]|([^:]+)):(\d+)$/.exec(addr.trim()) : null;
  const port = m ? Number(m[3]) : 0;
  if (!m || port < 1 || port > 65535) {
    throw configError(`${field}.address`, source, `want "host:port", got ${JSON.stringify(addr)}`);
  }
  return { host: (m[1] ?? m[2])!, port };
}

// ---- override ----

/**
 * Merges an override over a bootstrap the way Envoy's --config-yaml does (Istio passes ISTIO_BOOTSTRAP_OVERRIDE
 * to Envoy that way), i.e. protobuf MergeFrom: objects merge field by field, lists are appended (so an override
 * can add a cluster or listener), scalars are replaced, and a typed_config (an object with `@type`, a proto Any)
 * is replaced whole. Neither input is modified.
 */
export function mergeBootstrapOverride(
  base: Record<string, unknown>,
  override: Record<string, unknown>,
): Record<string, unknown> {
  // An override key `__proto__` is a (bogus) field for Envoy to reject, never the prototype.
  const out = plainCopy(base);
  for (const [k, v] of Object.entries(override)) setOwn(out, k, mergeValue(own(out, k), v));
  return out;
}

const isObject = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === 'object' && !Array.isArray(v);

function mergeValue(base: unknown, over: unknown): unknown {
  if (Array.isArray(base) && Array.isArray(over)) return [...base, ...over];
  if (isObject(base) && isObject(over) && !('@type' in over)) return mergeBootstrapOverride(base, over);
  return over;
}

/** The text written to disk: pretty JSON in the order the object was built, ending in a newline. */
export function renderBootstrap(b: Record<string, unknown>): string {
  return JSON.stringify(b, null, 2) + '\n';
}
