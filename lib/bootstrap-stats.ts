// The bootstrap's stats_config: Istio's tag extraction regexes (facts from Istio's bootstrap template), the
// stats inclusion list (what Envoy keeps; everything else is never created), and the per-pod stats annotations.
// Pure, like the rest of the bootstrap.

import type { AgentConfig } from './config';
import type { NodeIdentity } from './node-identity';
import { parseDuration, formatProtoDuration } from './duration';
import { configError } from './errors';

type Json = Record<string, unknown>;

// Istio's tag extraction, in Istio's order; cluster and HTTP prefixes use the `;`-delimited form that current
// istiod emits in alt_stat_name / stat_prefix.
const TAGS_BEFORE_EXTRA: Array<[string, string]> = [
  ['cluster_name', '^cluster(\\.(.+);)'],
  ['http_conn_manager_prefix', '^http\\.(((?:[_.[:digit:]\\w]*|[_\\[\\]aAbBcCdDeEfF[:digit:]\\w\\:]*));\\.)'],
  ['thread_name', '^server(\\.(.+))\\.watchdog'],
  ['tcp_prefix', '^tcp\\.((.*?)\\.)\\w+?$'],
  ['response_code', '_rq(_(\\d{3}))$'],
  ['response_code_class', '_rq(_(\\dxx))$'],
  [
    'http_conn_manager_listener_prefix',
    '^listener(?=\\.).*?\\.http\\.(((?:[_.[:digit:]]*|[_\\[\\]aAbBcCdDeEfF[:digit:]]*))\\.)',
  ],
  ['listener_address', '^listener\\.(((?:[_.[:digit:]]*|[_\\[\\]aAbBcCdDeEfF[:digit:]]*))\\.)'],
  ['mongo_prefix', '^mongo\\.(.+?)\\.(collection|cmd|cx_|op_|delays_|decoding_)(.*?)$'],
];
const TAGS_AFTER_EXTRA: Array<[string, string]> = [
  ['cache', '(cache\\.(.+?)\\.)'],
  ['component', '(component\\.(.+?)\\.)'],
  ['tag', '(tag\\.(.+?);\\.)'],
  ['wasm_filter', '(wasm_filter\\.(.+?)\\.)'],
  ['authz_enforce_result', 'rbac(\\.(allowed|denied))'],
  ['authz_dry_run_action', '(\\.istio_dry_run_(allow|deny)_)'],
  ['authz_dry_run_result', '(\\.shadow_(allowed|denied))'],
];

// Always kept: readiness and the agent's own checks read these.
const REQUIRED_PREFIXES = ['cluster_manager', 'listener_manager', 'server', 'cluster.xds-grpc', 'wasm'];
const RBAC_SUFFIXES = ['rbac.allowed', 'rbac.denied', 'shadow_allowed', 'shadow_denied'];
// The EXIT_ON_ZERO_ACTIVE_CONNECTIONS drain polls downstream_cx_active, so it must not be filtered out.
const DRAIN_SUFFIX = 'downstream_cx_active';
const REQUIRED_REGEXPS = ['vhost\\..*\\.route\\..*'];

const ANN_EXTRA_TAGS = 'sidecar.istio.io/extraStatTags';
const ANN_PREFIXES = 'sidecar.istio.io/statsInclusionPrefixes';
const ANN_SUFFIXES = 'sidecar.istio.io/statsInclusionSuffixes';
const ANN_REGEXPS = 'sidecar.istio.io/statsInclusionRegexps';
const ANN_BUCKETS = 'sidecar.istio.io/statsHistogramBuckets';
const ANN_FLUSH = 'sidecar.istio.io/statsFlushInterval';
const ANN_EVICTION = 'sidecar.istio.io/statsEvictionInterval';

const splitList = (s: string | undefined): string[] =>
  (s ?? '')
    .split(',')
    .map((x) => x.trim())
    .filter(Boolean);

/** ProxyConfig.extraStatTags and the pod's extraStatTags annotation, without duplicates. */
export function extraStatTags(cfg: AgentConfig): string[] {
  return [...new Set([...cfg.proxy.extraStatTags.filter(Boolean), ...splitList(cfg.podAnnotations[ANN_EXTRA_TAGS])])];
}

export function statsConfig(cfg: AgentConfig, node: NodeIdentity, metadataDiscovery = false): Json {
  const extra = extraStatTags(cfg);
  const tag = ([tag_name, regex]: [string, string]) => ({ tag_name, regex });
  const out: Json = {
    use_all_default_tags: false,
    stats_tags: [
      ...TAGS_BEFORE_EXTRA.map(tag),
      ...extra.map((t) => ({ tag_name: t, regex: `(${t}=\\.=(.*?);\\.;)` })),
      ...TAGS_AFTER_EXTRA.map(tag),
    ],
  };
  const buckets = histogramBucketSettings(cfg);
  if (buckets) out.histogram_bucket_settings = buckets;
  out.stats_matcher = { inclusion_list: { patterns: inclusionPatterns(cfg, node, metadataDiscovery) } };
  return out;
}

/** The stats inclusion lists (annotation or ProxyConfig, then the required entries), pod IPs substituted. */
export function statsInclusion(
  cfg: AgentConfig,
  node: NodeIdentity,
): { prefixes: string[]; suffixes: string[]; regexps: string[] } {
  const m = cfg.proxy.proxyStatsMatcher ?? {};
  const ann = cfg.podAnnotations;
  // An annotation replaces the ProxyConfig list rather than adding to it, as in Istio.
  const pick = (annotation: string, fromConfig: string[] | undefined, required: string[]) =>
    withPodIps([...(ann[annotation] ? splitList(ann[annotation]) : (fromConfig ?? [])), ...required], node.ips);
  const suffixes = cfg.exitOnZeroActiveConnections ? [...RBAC_SUFFIXES, DRAIN_SUFFIX] : RBAC_SUFFIXES;
  return {
    prefixes: pick(ANN_PREFIXES, m.inclusionPrefixes, REQUIRED_PREFIXES),
    suffixes: pick(ANN_SUFFIXES, m.inclusionSuffixes, suffixes),
    regexps: pick(ANN_REGEXPS, m.inclusionRegexps, REQUIRED_REGEXPS),
  };
}

function inclusionPatterns(cfg: AgentConfig, node: NodeIdentity, metadataDiscovery: boolean): Json[] {
  const { prefixes, suffixes, regexps } = statsInclusion(cfg, node);
  return [
    { prefix: 'reporter=' },
    // The peer metadata discovery extension's own stats.
    ...(metadataDiscovery ? [{ prefix: 'workload_discovery' }] : []),
    ...prefixes.map((prefix) => ({ prefix })),
    ...suffixes.map((suffix) => ({ suffix })),
    ...regexps.map((regex) => ({ safe_regex: { regex } })),
    { prefix: 'component' },
    { prefix: 'istio' },
  ];
}

/** `http.{pod_ip}_` expands to one pattern per pod IP, so a sidecar can keep only its inbound HTTP stats. */
function withPodIps(patterns: string[], ips: string[]): string[] {
  return patterns.flatMap((p) => (p.includes('{pod_ip}') ? ips.map((ip) => p.split('{pod_ip}').join(ip)) : [p]));
}

/** The pod's statsHistogramBuckets annotation as Envoy's histogram_bucket_settings, sorted by prefix. */
export function histogramBucketSettings(cfg: AgentConfig): Json[] | undefined {
  const raw = cfg.podAnnotations[ANN_BUCKETS];
  if (raw === undefined) return undefined;
  const fail = (problem: string) => configError(ANN_BUCKETS, `pod annotation ${ANN_BUCKETS}`, problem);
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw);
  } catch (e) {
    throw fail(`not valid JSON: ${(e as Error).message}`);
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed))
    throw fail('want a JSON object of prefix -> [bucket, ...]');
  return Object.entries(parsed as Record<string, unknown>)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([prefix, buckets]) => {
      if (!Array.isArray(buckets) || buckets.length === 0 || !buckets.every((x) => typeof x === 'number' && x > 0)) {
        throw fail(`buckets of "${prefix}" must be a non-empty list of positive numbers`);
      }
      return { match: { prefix }, buckets };
    });
}

export function statsFlushInterval(cfg: AgentConfig): string | undefined {
  const ms = statsFlushIntervalMs(cfg);
  return ms === undefined ? undefined : formatProtoDuration(ms);
}

/** The pod's statsFlushInterval annotation in milliseconds. */
export function statsFlushIntervalMs(cfg: AgentConfig): number | undefined {
  const raw = cfg.podAnnotations[ANN_FLUSH];
  if (raw === undefined) return undefined;
  try {
    return parseDuration(raw);
  } catch (e) {
    throw configError(ANN_FLUSH, `pod annotation ${ANN_FLUSH}`, (e as Error).message);
  }
}

// ---- compression of Envoy's Prometheus listener (ProxyConfig.statsCompression, default on, as in Istio) ----

const STATS_CONTENT_TYPES = [
  'text/plain',
  'application/vnd.google.protobuf',
  'application/openmetrics-text',
  'application/openmetrics-protobuf',
];

function compressor(kind: 'brotli' | 'zstd' | 'gzip'): Json {
  return {
    name: `envoy.filters.http.compressor.${kind}`,
    typed_config: {
      '@type': 'type.googleapis.com/envoy.extensions.filters.http.compressor.v3.Compressor',
      compressor_library: {
        name: `stats_${kind}`,
        typed_config: {
          '@type': `type.googleapis.com/envoy.extensions.compression.${kind}.compressor.v3.${kind[0]!.toUpperCase()}${kind.slice(1)}`,
        },
      },
      response_direction_config: { common_config: { content_type: STATS_CONTENT_TYPES } },
    },
  };
}

/** Compressor filters for the /stats/prometheus listener, in Istio's order (a client's Accept-Encoding picks one). */
export function statsCompressors(cfg: AgentConfig): Json[] {
  return cfg.proxy.extra.statsCompression === false
    ? []
    : [compressor('brotli'), compressor('zstd'), compressor('gzip')];
}

/**
 * The pod's statsEvictionInterval annotation, in whole seconds; it must be a multiple of the flush interval
 * (Envoy's default 5s), as Istio checks.
 */
export function statsEvictionInterval(cfg: AgentConfig): string | undefined {
  const raw = cfg.podAnnotations[ANN_EVICTION];
  if (raw === undefined) return undefined;
  const fail = (problem: string) => configError(ANN_EVICTION, `pod annotation ${ANN_EVICTION}`, problem);
  let ms: number;
  try {
    ms = parseDuration(raw);
  } catch (e) {
    throw fail((e as Error).message);
  }
  const flush = statsFlushIntervalMs(cfg) ?? 5000;
  if (flush === 0 || ms % flush !== 0) throw fail(`must be a multiple of the stats flush interval (${flush / 1000}s)`);
  return `${Math.floor(ms / 1000)}s`;
}
