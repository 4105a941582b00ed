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
  if (!m || port < 1 || port > 65535)
    throw configError(field, source, `want "host:port", got ${JSON.stringify(value)}`);
  return { host: (m[1] ?? m[2])!, port };
}

// ---- TLS to a tracer or service (Istio's ClientTLSSettings), certificates from the agent's SDS ----

function sdsConfig(name: string): Json {
  // Istio's workload certificate and root are asked for with no initial fetch timeout; file resources are not.
  const builtIn = name === 'default' || name === 'ROOTCA';
  return {
    name,
    sds_config: {
      api_config_source: {
        api_type: 'GRPC',
        grpc_services: [{ envoy_grpc: { cluster_name: 'sds-grpc' } }],
        set_node_on_first_message_only: true,
        transport_api_version: 'V3',
      },
      ...(builtIn ? { initial_fetch_timeout: '0s' } : {}),
      resource_api_version: 'V3',
    },
  };
}

/**
 * The transport socket for ClientTLSSettings (mode SIMPLE, MUTUAL or ISTIO_MUTUAL; DISABLE gives none), as
 * Istio builds it: roots and certificates by SDS resource name (file-root:<ca>, file-cert:<cert>~<key>, or the
 * workload's default/ROOTCA), node metadata TLS_CLIENT_* overriding the files, ALPN only for HTTP/2 peers.
 */
export function tlsTransportSocket(
  tls: unknown,
  sniName: string,
  metadata: Json,
  h2: boolean,
  field: string,
  source: string,
): Json | undefined {
  if (tls === undefined || tls === null) return undefined;
  if (typeof tls !== 'object' || Array.isArray(tls)) throw configError(field, source, 'want ClientTLSSettings');
  const t = tls as Json;
  const str = (v: unknown) => (typeof v === 'string' ? v : '');
  const meta = (k: string, def: unknown) => str(metadata[k]) || str(def);
  const sans = Array.isArray(t.subjectAltNames) ? (t.subjectAltNames as unknown[]).map(str) : [];
  const validation = (rootName: string): Json => ({
    default_validation_context: sans.length ? { match_subject_alt_names: sans.map((exact) => ({ exact })) } : {},
    ...(rootName ? { validation_context_sds_secret_config: sdsConfig(rootName) } : {}),
  });
  const common: Json = {};
  let alpn: string[];
  let sni = str(t.sni);
  const mode = t.mode ?? 'DISABLE';
  if (mode === 'SIMPLE' || mode === 'MUTUAL') {
    const ca = meta('TLS_CLIENT_ROOT_CERT', t.caCertificates);
    if (mode === 'MUTUAL') {
      const cert = meta('TLS_CLIENT_CERT_CHAIN', t.clientCertificate);
      const key = meta('TLS_CLIENT_KEY', t.privateKey);
      if (cert && key) common.tls_certificate_sds_secret_configs = [sdsConfig(`file-cert:${cert}~${key}`)];
    }
    common.combined_validation_context = validation(ca ? `file-root:${ca}` : '');
    alpn = ['h2'];
  } else if (mode === 'ISTIO_MUTUAL') {
    common.tls_certificate_sds_secret_configs = [sdsConfig('default')];
    common.combined_validation_context = validation('ROOTCA');
    alpn = ['istio', 'h2'];
    sni ||= sniName;
  } else if (mode === 'DISABLE') {
    return undefined;
  } else {
    throw configError(
      `${field}.mode`,
      source,
      `want DISABLE, SIMPLE, MUTUAL or ISTIO_MUTUAL, got ${JSON.stringify(mode)}`,
    );
  }
  if (h2) common.alpn_protocols = alpn;
  return {
    name: 'envoy.transport_sockets.tls',
    typed_config: {
      '@type': 'type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext',
      common_tls_context: common,
      ...(sni ? { sni } : {}),
    },
  };
}

interface RemoteService {
  name: 'envoy_metrics_service' | 'envoy_accesslog_service';
  address: ServiceAddress;
  /** upstream_connection_options from tcpKeepalive, when given. */
  keepalive?: Json;
  /** From tlsSettings. */
  transportSocket?: Json;
}

function remoteService(
  cfg: AgentConfig,
  field: 'envoyMetricsService' | 'envoyAccessLogService',
  metadata: Json = {},
): RemoteService | undefined {
  const raw = cfg.proxy.extra[field] as Json | undefined;
  const source = cfg.sources[field] ?? 'ProxyConfig';
  if (!raw || typeof raw !== 'object' || !raw.address) return undefined;
  const name = field === 'envoyMetricsService' ? 'envoy_metrics_service' : 'envoy_accesslog_service';
  const out: RemoteService = { name, address: hostPort(raw.address, `${field}.address`, source) };
  const ts = tlsTransportSocket(raw.tlsSettings, name, metadata, true, `${field}.tlsSettings`, source);
  if (ts) out.transportSocket = ts;
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
    if (ka.interval !== undefined && seconds(ka.interval, 'interval') > 0)
      tcp.keepalive_interval = seconds(ka.interval, 'interval');
    out.keepalive = { tcp_keepalive: tcp };
  }
  return out;
}

export function metricsService(cfg: AgentConfig, metadata?: Json): RemoteService | undefined {
  return remoteService(cfg, 'envoyMetricsService', metadata);
}

export function accessLogService(cfg: AgentConfig, metadata?: Json): RemoteService | undefined {
  return remoteService(cfg, 'envoyAccessLogService', metadata);
}

/** statsdUdpAddress; Envoy's statsd sink needs an IP (the Go agent resolves a name once at start). */
export function statsdAddress(cfg: AgentConfig): ServiceAddress | undefined {
  const raw = cfg.proxy.extra.statsdUdpAddress;
  if (raw === undefined || raw === '') return undefined;
  const source = cfg.sources.statsdUdpAddress ?? 'ProxyConfig';
  const a = hostPort(raw, 'statsdUdpAddress', source);
  if (!/^[\d.]+$/.test(a.host) && !a.host.includes(':'))
    throw configError('statsdUdpAddress', source, `want an IP address and port, got "${String(raw)}"`);
  return a;
}

const HTTP_OPTIONS = 'envoy.extensions.upstreams.http.v3.HttpProtocolOptions';

export function serviceClusters(cfg: AgentConfig, dnsLookupFamily: string, metadata: Json): Json[] {
  return [metricsService(cfg, metadata), accessLogService(cfg, metadata)]
    .filter((s): s is RemoteService => !!s)
    .map((s) => ({
      name: s.name,
      alt_stat_name: `${s.name};`,
      type: 'STRICT_DNS',
      ...(s.transportSocket ? { transport_socket: s.transportSocket } : {}),
      ...(s.keepalive ? { upstream_connection_options: s.keepalive } : {}),
      respect_dns_ttl: true,
      dns_lookup_family: dnsLookupFamily,
      connect_timeout: '1s',
      lb_policy: 'ROUND_ROBIN',
      typed_extension_protocol_options: {
        [HTTP_OPTIONS]: {
          '@type': `type.googleapis.com/${HTTP_OPTIONS}`,
          explicit_http_config: { http2_protocol_options: {} },
        },
      },
      load_assignment: {
        cluster_name: s.name,
        endpoints: [
          {
            lb_endpoints: [
              { endpoint: { address: { socket_address: { address: s.address.host, port_value: s.address.port } } } },
            ],
          },
        ],
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
      typed_config: {
        '@type': 'type.googleapis.com/envoy.config.metrics.v3.StatsdSink',
        address: { socket_address: { address: statsd.host, port_value: statsd.port } },
      },
    });
  }
  return sinks.length ? sinks : undefined;
}

// ---- mTLS scrape listeners: the workload certificate from SDS, client certificates required ----

function sdsSecret(name: string): Json {
  return {
    name,
    sds_config: {
      api_config_source: {
        api_type: 'GRPC',
        grpc_services: [{ envoy_grpc: { cluster_name: 'sds-grpc' } }],
        set_node_on_first_message_only: true,
        transport_api_version: 'V3',
      },
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
      {
        name: 'envoy.filters.listener.tls_inspector',
        typed_config: {
          '@type': 'type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector',
        },
      },
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
              combined_validation_context: {
                default_validation_context: {},
                validation_context_sds_secret_config: sdsSecret('ROOTCA'),
              },
            },
          },
        },
        filters: [
          {
            name: 'envoy.filters.network.http_connection_manager',
            typed_config: {
              '@type':
                'type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager',
              codec_type: 'AUTO',
              stat_prefix: statPrefix,
              route_config: {
                virtual_hosts: [
                  {
                    name: 'backend',
                    domains: ['*'],
                    routes: routes.map(([prefix, cluster]) => ({ match: { prefix }, route: { cluster } })),
                  },
                ],
              },
              http_filters: [
                {
                  name: 'envoy.filters.http.router',
                  typed_config: { '@type': 'type.googleapis.com/envoy.extensions.filters.http.router.v3.Router' },
                },
              ],
            },
          },
        ],
      },
    ],
  };
}

export function secureMetricsListeners(cfg: AgentConfig, wildcard: string): Json[] {
  const out: Json[] = [];
  if (cfg.secureMetricsPort)
    out.push(
      secureListener(wildcard, cfg.secureMetricsPort, 'secure_stats', [['/stats/prometheus', 'prometheus_stats']]),
    );
  if (cfg.secureMergedMetricsPort) {
    out.push(
      secureListener(wildcard, cfg.secureMergedMetricsPort, 'secure_merged_stats', [
        ['/stats/prometheus', 'agent'],
        ['/metrics', 'agent'],
      ]),
    );
  }
  return out;
}
