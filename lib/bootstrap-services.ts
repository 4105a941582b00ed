// Metrics and logs leaving the pod, as Istio's template writes them: ProxyConfig's envoyMetricsService (a cluster
// and a metrics_service stats sink), envoyAccessLogService (a cluster istiod's access log config points at) and
// statsdUdpAddress (a statsd sink), and the mTLS scrape listeners (ENVOY_SECURE_METRICS_PORT,
// ENVOY_SECURE_MERGED_METRICS_PORT). Pure, like the rest of the bootstrap.

import type { AgentConfig } from './config';
import { parseDuration } from './duration';
import { configError } from './errors';

type Json = Record<string, unknown>;

export interface ServiceAddress {
  host: string;
  port: number;
}

/** `host:port` or `[v6]:port`. */
export function hostPort(value: unknown, field: string, source: string): ServiceAddress {
  const m = typeof value === 'string' ? /^(?:\[([^\]]+)\]|([^:\[\]]+)):(\d+)$/.exec(value.trim()) : null;
  const port = m ? Number(m[3]) : 0;
  if (!m || port < 1 || port > 65535) throw configError(field, source, `want "host:port", got ${JSON.stringify(value)}`);
  return { host: (m[1] ?? m[2])!, port };
}

interface RemoteService {
  name: 'envoy_metrics_service' | 'envoy_accesslog_service';
  address: ServiceAddress;
  /** upstream_connection_options from tcpKeepalive, when given. */
  keepalive?: Json;
}

function remoteService(cfg: AgentConfig, field: 'envoyMetricsService' | 'envoyAccessLogService'): RemoteService | undefined {
  const raw = cfg.proxy.extra[field] as Json | undefined;
  const source = cfg.sources[field] ?? 'ProxyConfig';
  if (!raw || typeof raw !== 'object' || !raw.address) return undefined;
  if (raw.tlsSettings) throw configError(`${field}.tlsSettings`, source, 'TLS to this service is not supported by this agent');
  const name = field === 'envoyMetricsService' ? 'envoy_metrics_service' : 'envoy_accesslog_service';
  const out: RemoteService = { name, address: hostPort(raw.address, `${field}.address`, source) };
  const ka = raw.tcpKeepalive as Json | undefined;
  if (ka && typeof ka === 'object') {
    const seconds = (v: unknown, f: string) => {
      try {
        return Math.floor((typeof v === 'number' ? v * 1000 : parseDuration(String(v))) / 1000);
      } catch (e) {
        throw configError(`${field}.tcpKeepalive.${f}`, source, (e as Error).message);
      }
    };
    const tcp: Json = {};
    if (typeof ka.probes === 'number' && ka.probes > 0) tcp.keepalive_probes = ka.probes;
    if (ka.time !== undefined && seconds(ka.time, 'time') > 0) tcp.keepalive_time = seconds(ka.time, 'time');
    if (ka.interval !== undefined && seconds(ka.interval, 'interval') > 0) tcp.keepalive_interval = seconds(ka.interval, 'interval');
    out.keepalive = { tcp_keepalive: tcp };
  }
  return out;
}

export function metricsService(cfg: AgentConfig): RemoteService | undefined {
  return remoteService(cfg, 'envoyMetricsService');
}

export function accessLogService(cfg: AgentConfig): RemoteService | undefined {
  return remoteService(cfg, 'envoyAccessLogService');
}

/** statsdUdpAddress; Envoy's statsd sink needs an IP (the Go agent resolves a name once at start). */
export function statsdAddress(cfg: AgentConfig): ServiceAddress | undefined {
  const raw = cfg.proxy.extra.statsdUdpAddress;
  if (raw === undefined || raw === '') return undefined;
  const source = cfg.sources.statsdUdpAddress ?? 'ProxyConfig';
  const a = hostPort(raw, 'statsdUdpAddress', source);
  if (!/^[\d.]+$/.test(a.host) && !a.host.includes(':')) throw configError('statsdUdpAddress', source, `want an IP address and port, got "${String(raw)}"`);
  return a;
}

const HTTP_OPTIONS = 'envoy.extensions.upstreams.http.v3.HttpProtocolOptions';

export function serviceClusters(cfg: AgentConfig, dnsLookupFamily: string): Json[] {
  return [metricsService(cfg), accessLogService(cfg)].filter((s): s is RemoteService => !!s).map((s) => ({
    name: s.name,
    alt_stat_name: `${s.name};`,
    type: 'STRICT_DNS',
    ...(s.keepalive ? { upstream_connection_options: s.keepalive } : {}),
    respect_dns_ttl: true,
    dns_lookup_family: dnsLookupFamily,
    connect_timeout: '1s',
    lb_policy: 'ROUND_ROBIN',
    typed_extension_protocol_options: {
      [HTTP_OPTIONS]: { '@type': `type.googleapis.com/${HTTP_OPTIONS}`, explicit_http_config: { http2_protocol_options: {} } },
    },
    load_assignment: {
      cluster_name: s.name,
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: s.address.host, port_value: s.address.port } } } }] }],
    },
  }));
}

/** stats_sinks: the metrics service, then statsd; undefined when neither is configured. */
export function statsSinks(cfg: AgentConfig): Json[] | undefined {
  const sinks: Json[] = [];
  if (metricsService(cfg)) {
    sinks.push({
      name: 'envoy.stat_sinks.metrics_service',
      typed_config: {
        '@type': 'type.googleapis.com/envoy.config.metrics.v3.MetricsServiceConfig',
        transport_api_version: 'V3',
        grpc_service: { envoy_grpc: { cluster_name: 'envoy_metrics_service' } },
      },
    });
  }
  const statsd = statsdAddress(cfg);
  if (statsd) {
    sinks.push({
      name: 'envoy.stat_sinks.statsd',
      typed_config: { '@type': 'type.googleapis.com/envoy.config.metrics.v3.StatsdSink', address: { socket_address: { address: statsd.host, port_value: statsd.port } } },
    });
  }
  return sinks.length ? sinks : undefined;
}

// ---- mTLS scrape listeners: the workload certificate from SDS, client certificates required ----

function sdsSecret(name: string): Json {
  return {
    name,
    sds_config: {
      api_config_source: { api_type: 'GRPC', grpc_services: [{ envoy_grpc: { cluster_name: 'sds-grpc' } }], set_node_on_first_message_only: true, transport_api_version: 'V3' },
      resource_api_version: 'V3',
    },
  };
}

function secureListener(wildcard: string, port: number, statPrefix: string, routes: Array<[string, string]>): Json {
  return {
    name: `${wildcard}_${port}`,
    address: { socket_address: { protocol: 'TCP', address: wildcard, port_value: port } },
    ignore_global_conn_limit: true,
    bypass_overload_manager: true,
    listener_filters: [
      { name: 'envoy.filters.listener.tls_inspector', typed_config: { '@type': 'type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector' } },
    ],
    filter_chains: [
      {
        filter_chain_match: { transport_protocol: 'tls' },
        transport_socket: {
          name: 'envoy.transport_sockets.tls',
          typed_config: {
            '@type': 'type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext',
            require_client_certificate: true,
            common_tls_context: {
              tls_certificate_sds_secret_configs: [sdsSecret('default')],
              combined_validation_context: { default_validation_context: {}, validation_context_sds_secret_config: sdsSecret('ROOTCA') },
            },
          },
        },
        filters: [
          {
            name: 'envoy.filters.network.http_connection_manager',
            typed_config: {
              '@type': 'type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager',
              codec_type: 'AUTO',
              stat_prefix: statPrefix,
              route_config: {
                virtual_hosts: [{ name: 'backend', domains: ['*'], routes: routes.map(([prefix, cluster]) => ({ match: { prefix }, route: { cluster } })) }],
              },
              http_filters: [{ name: 'envoy.filters.http.router', typed_config: { '@type': 'type.googleapis.com/envoy.extensions.filters.http.router.v3.Router' } }],
            },
          },
        ],
      },
    ],
  };
}

export function secureMetricsListeners(cfg: AgentConfig, wildcard: string): Json[] {
  const out: Json[] = [];
  if (cfg.secureMetricsPort) out.push(secureListener(wildcard, cfg.secureMetricsPort, 'secure_stats', [['/stats/prometheus', 'prometheus_stats']]));
  if (cfg.secureMergedMetricsPort) {
    out.push(secureListener(wildcard, cfg.secureMergedMetricsPort, 'secure_merged_stats', [['/stats/prometheus', 'agent'], ['/metrics', 'agent']]));
  }
  return out;
}
