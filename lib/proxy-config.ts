// Istio's ProxyConfig: field names, defaults, and strict parsing of one layer (mesh file, PROXY_CONFIG, annotation).
// Layers replace whole top-level fields, as Istio's merge does; durations are kept as milliseconds.

import * as net from 'node:net';
import { checkDurationMs, parseDuration } from './duration';
import { dict } from './dict';
import { configError, quote } from './errors';
import { scope } from './log';

const log = scope('config');

export interface StatsMatcher {
  inclusionPrefixes?: string[];
  inclusionSuffixes?: string[];
  inclusionRegexps?: string[];
}

export interface ProxyConfig {
  configPath: string;
  binaryPath: string;
  serviceCluster: string;
  drainDuration: number;
  parentShutdownDuration: number;
  terminationDrainDuration: number;
  discoveryAddress: string;
  proxyAdminPort: number;
  statusPort: number;
  controlPlaneAuthPolicy: 'NONE' | 'MUTUAL_TLS';
  /** 0 means "all cores" as Envoy reads it; undefined means unset (ISTIO_CPU_LIMIT may fill it). */
  concurrency: number | undefined;
  statNameLength: number;
  proxyMetadata: Record<string, string>;
  customConfigFile: string;
  proxyBootstrapTemplatePath: string;
  fileFlushInterval: number;
  fileFlushMinSize: number;
  extraStatTags: string[];
  runtimeValues: Record<string, string>;
  proxyStatsMatcher: StatsMatcher | undefined;
  meshId: string;
  availabilityZone: string;
  holdApplicationUntilProxyStarts: boolean;
  /** Kept as given; the health checker reads it. */
  readinessProbe: Record<string, unknown> | undefined;
  tracing: Record<string, unknown> | undefined;
  /** APP_LABEL_AND_NAMESPACE, CANONICAL_NAME_ONLY or CANONICAL_NAME_AND_NAMESPACE; "" when serviceCluster names the cluster. */
  tracingServiceName: string;
  /**
   * ProxyConfig fields Istio defines that this agent does not act on itself (gatewayTopology, proxyHeaders,
   * privateKeyProvider, ...), kept as given: istiod reads them from the node's PROXY_CONFIG metadata.
   */
  extra: Record<string, unknown>;
}

export function defaultProxyConfig(): ProxyConfig {
  return {
    configPath: './etc/istio/proxy',
    binaryPath: '/usr/local/bin/envoy',
    serviceCluster: 'istio-proxy',
    drainDuration: 45_000,
    parentShutdownDuration: 60_000,
    terminationDrainDuration: 5_000,
    discoveryAddress: 'istiod.istio-system.svc:15012',
    proxyAdminPort: 15000,
    statusPort: 15020,
    controlPlaneAuthPolicy: 'MUTUAL_TLS',
    concurrency: undefined,
    statNameLength: 189,
    proxyMetadata: {},
    customConfigFile: '',
    proxyBootstrapTemplatePath: '',
    fileFlushInterval: 1000,
    fileFlushMinSize: 0,
    extraStatTags: [],
    runtimeValues: {},
    proxyStatsMatcher: undefined,
    meshId: '',
    availabilityZone: '',
    holdApplicationUntilProxyStarts: false,
    readinessProbe: undefined,
    tracing: undefined,
    tracingServiceName: '',
    extra: {},
  };
}

const HOSTNAME =
  /^(?=.{1,253}$)[A-Za-z0-9_]([-A-Za-z0-9_]{0,61}[A-Za-z0-9_])?(\.[A-Za-z0-9_]([-A-Za-z0-9_]{0,61}[A-Za-z0-9_])?)*\.?$/;

/**
 * What is wrong with a discovery address, or undefined: the forms the xDS proxy dials are `host:port`,
 * `[IPv6]:port`, and a Unix socket as `unix:///abs/path` (or gRPC's `unix:path`).
 */
export function discoveryAddressProblem(address: string): string | undefined {
  const want = 'want host:port, [IPv6]:port or unix:///path/to/socket';
  if (address.startsWith('unix:')) {
    const rest = address.slice('unix:'.length);
    if (rest.startsWith('//') && !rest.slice(2).startsWith('/'))
      return `${quote(address)} is not a Unix socket address: unix:// takes an absolute path (unix:///run/xds.sock)`;
    if (rest.replace(/^\/\//, '') === '') return `${quote(address)} names no socket path`;
    return undefined;
  }
  if (/^[A-Za-z][A-Za-z0-9+.-]*:\/\//.test(address))
    return `${quote(address)} has a URL scheme; ${want} (TLS is chosen by controlPlaneAuthPolicy)`;
  const m = /^\[([^\]]*)\]:([^:]*)$/.exec(address) ?? /^([^:[\]]*):([^:]*)$/.exec(address);
  if (!m) return `${quote(address)} is not an address; ${want}`;
  const [, host, port] = m as unknown as [string, string, string];
  if (address.startsWith('[') ? !net.isIPv6(host) : !(net.isIPv4(host) || HOSTNAME.test(host)))
    return `${quote(address)}: ${quote(host)} is not a host name or IP address; ${want}`;
  if (!/^\d{1,5}$/.test(port) || +port < 1 || +port > 65535)
    return `${quote(address)}: port ${quote(port)} is out of range 1-65535`;
  return undefined;
}

type FieldParser = (value: unknown, fail: (problem: string) => never, source?: string) => unknown;

const asString: FieldParser = (v, fail) => (typeof v === 'string' ? v : fail(`want a string, got ${quote(v)}`));
const asDuration: FieldParser = (v, fail) => {
  if (typeof v !== 'string' && typeof v !== 'number') return fail(`want a duration such as "45s", got ${quote(v)}`);
  try {
    // A bare number is seconds; YAML's .inf and .nan are numbers too and are refused here, by this field's name.
    return typeof v === 'number' ? checkDurationMs(v * 1000, `${v} seconds`) : parseDuration(v);
  } catch (e) {
    return fail((e as Error).message);
  }
};
export const asPort: FieldParser = (v, fail) => {
  const n = typeof v === 'string' && /^\d+$/.test(v) ? Number(v) : v;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 1 || n > 65535)
    return fail(`port ${quote(v)} is out of range 1-65535`);
  return n;
};
const asNonNegInt: FieldParser = (v, fail) => {
  const n = typeof v === 'string' && /^\d+$/.test(v) ? Number(v) : v;
  // isSafeInteger: 1e30 is an "integer" to Number.isInteger, and no field here can use it.
  if (typeof n !== 'number' || !Number.isSafeInteger(n) || n < 0)
    return fail(`want a non-negative integer, got ${quote(v)}`);
  return n;
};

/**
 * Envoy runs one worker thread per unit of concurrency, each with its own listeners and connection pools. No host
 * has use for more than this; a larger value is a typo that would start that many threads or fail to.
 */
export const MAX_CONCURRENCY = 1024;

export function concurrencyProblem(n: unknown): string | undefined {
  if (typeof n !== 'number' || !Number.isSafeInteger(n) || n < 0)
    return `want a non-negative integer (0: one worker per core), got ${quote(n)}`;
  if (n > MAX_CONCURRENCY) return `${n} is above the maximum ${MAX_CONCURRENCY} worker threads`;
  return undefined;
}

const asConcurrency: FieldParser = (v, fail) => {
  const n = typeof v === 'string' && /^\d+$/.test(v) ? Number(v) : v;
  const problem = concurrencyProblem(n);
  return problem ? fail(problem) : n;
};

const asBool: FieldParser = (v, fail) => (typeof v === 'boolean' ? v : fail(`want true or false, got ${quote(v)}`));
const asStringMap: FieldParser = (v, fail) => {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return fail('want a map of strings');
  const out = dict<string>();
  for (const [k, x] of Object.entries(v)) {
    if (typeof x !== 'string' && typeof x !== 'number' && typeof x !== 'boolean')
      return fail(`value of ${quote(k)} must be a string`);
    out[k] = String(x);
  }
  return out;
};
const asStringList: FieldParser = (v, fail) =>
  Array.isArray(v) && v.every((x) => typeof x === 'string') ? v : fail('want a list of strings');
const asObject: FieldParser = (v, fail) =>
  v !== null && typeof v === 'object' && !Array.isArray(v) ? v : fail('want an object');
const asAuthPolicy: FieldParser = (v, fail) =>
  v === 'NONE' || v === 'MUTUAL_TLS' ? v : fail(`want NONE or MUTUAL_TLS, got ${quote(v)}`);
const asTracingServiceName: FieldParser = (v, fail) =>
  typeof v === 'string' &&
  ['APP_LABEL_AND_NAMESPACE', 'CANONICAL_NAME_ONLY', 'CANONICAL_NAME_AND_NAMESPACE'].includes(v)
    ? v
    : fail(`want APP_LABEL_AND_NAMESPACE, CANONICAL_NAME_ONLY or CANONICAL_NAME_AND_NAMESPACE, got ${quote(v)}`);
const STATS_MATCHER_FIELDS = ['inclusionPrefixes', 'inclusionSuffixes', 'inclusionRegexps'];
const asStatsMatcher: FieldParser = (v, fail, source) => {
  const o = asObject(v, fail, source) as Record<string, unknown>;
  const out = dict<unknown>();
  for (const [raw, x] of Object.entries(o)) {
    const k = protoName(raw);
    if (!STATS_MATCHER_FIELDS.includes(k)) {
      warnUnknown(`proxyStatsMatcher.${raw}`, source ?? 'ProxyConfig');
      continue;
    }
    if (x !== null) out[k] = asStringList(x, fail, source);
  }
  return out;
};

const FIELDS: Record<Exclude<keyof ProxyConfig, 'extra'>, FieldParser> = {
  configPath: asString,
  binaryPath: asString,
  serviceCluster: asString,
  drainDuration: asDuration,
  parentShutdownDuration: asDuration,
  terminationDrainDuration: asDuration,
  discoveryAddress: asString,
  proxyAdminPort: asPort,
  statusPort: asPort,
  controlPlaneAuthPolicy: asAuthPolicy,
  concurrency: asConcurrency,
  statNameLength: asNonNegInt,
  proxyMetadata: asStringMap,
  customConfigFile: asString,
  proxyBootstrapTemplatePath: asString,
  fileFlushInterval: asDuration,
  fileFlushMinSize: asNonNegInt,
  extraStatTags: asStringList,
  runtimeValues: asStringMap,
  proxyStatsMatcher: asStatsMatcher,
  meshId: asString,
  availabilityZone: asString,
  holdApplicationUntilProxyStarts: asBool,
  readinessProbe: asObject,
  tracing: asObject,
  tracingServiceName: asTracingServiceName,
};

// ProxyConfig fields Istio defines that this agent accepts but does not act on; kept for the node metadata.
const ACCEPTED_UNUSED = new Set([
  'discoveryRefreshDelay',
  'zipkinAddress',
  'connectTimeout',
  'statsdUdpAddress',
  'envoyMetricsServiceAddress',
  'interceptionMode',
  'envoyAccessLogService',
  'envoyMetricsService',
  'sds',
  'gatewayTopology',
  'caCertificatesPem',
  'image',
  'privateKeyProvider',
  'proxyHeaders',
  'stsPort',
  'statsCompression',
]);

export type ProxyConfigLayer = Partial<ProxyConfig>;

/** Istio's names for fields this agent calls otherwise (same unit). */
const ISTIO_NAMES: Record<string, keyof ProxyConfig> = { fileFlushMinSizeKb: 'fileFlushMinSize' };

/** protojson takes a field by its JSON name or by its proto name: `proxy_metadata` is `proxyMetadata`. */
function protoName(key: string): string {
  return key.includes('_') ? key.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase()) : key;
}

const warnedUnknown = new Set<string>();

/** One warning per unknown field name for the life of the process (a config reload repeats the same ones). */
function warnUnknown(field: string, source: string): void {
  if (warnedUnknown.has(field) || warnedUnknown.size > 1000) return;
  warnedUnknown.add(field);
  const name = /^[\w.-]{1,60}$/.test(field) ? field : quote(field, 60);
  log.warn(`ignoring ProxyConfig field ${name} from ${source}: not known to this agent`);
}

/**
 * Validates one layer; every error names the field and the layer's source. As Istio's protomarshal.ApplyJSON,
 * which retries with unknown fields allowed, a field this agent does not know is not an error: istiod puts the
 * mesh's whole defaultConfig in PROXY_CONFIG, which may name fields newer than this agent. It is warned about
 * once and passed on in the node metadata (for istiod); a known field with a wrong value is still an error.
 */
export function parseProxyConfigLayer(raw: unknown, source: string): ProxyConfigLayer {
  if (raw === undefined || raw === null) return {};
  if (typeof raw !== 'object' || Array.isArray(raw))
    throw configError('ProxyConfig', source, 'want a mapping of ProxyConfig fields');
  const out = dict<unknown>();
  const seen = dict<string>();
  for (const [given, value] of Object.entries(raw as Record<string, unknown>)) {
    const name = protoName(given);
    const key = Object.hasOwn(ISTIO_NAMES, name) ? ISTIO_NAMES[name]! : name;
    // protojson refuses a field given twice (as proxyMetadata and proxy_metadata).
    if (Object.hasOwn(seen, key)) throw configError(given, source, `the same field as ${quote(seen[key])}`);
    seen[key] = given;
    // Own fields only: `constructor` or `__proto__` is an unknown field, not Object.prototype's.
    const parse = Object.hasOwn(FIELDS, key) ? (FIELDS as Record<string, FieldParser>)[key] : undefined;
    if (!parse) {
      if (!ACCEPTED_UNUSED.has(key)) {
        warnUnknown(given, source);
        // Kept for istiod under its JSON name, unless the name could not be a proto field's.
        if (!/^[a-z][A-Za-z0-9]{0,99}$/.test(key) || key === 'constructor') continue;
      }
      if (value !== null) ((out.extra ??= dict()) as Record<string, unknown>)[key] = value;
      continue;
    }
    if (value === null) continue;
    out[key] = parse(
      value,
      (problem) => {
        throw configError(given === key ? key : `${given} (${key})`, source, problem);
      },
      source,
    );
  }
  return out as ProxyConfigLayer;
}

// ---- Istio's JSON form (node metadata PROXY_CONFIG) ----

/** The fields Istio's DefaultProxyConfig sets: always in the effective config, whoever set them. */
const ISTIO_DEFAULTS = new Set<keyof ProxyConfig>([
  'configPath',
  'binaryPath',
  'serviceCluster',
  'drainDuration',
  'terminationDrainDuration',
  'discoveryAddress',
  'proxyAdminPort',
  'statusPort',
  'controlPlaneAuthPolicy',
  'statNameLength',
]);
const DURATIONS = new Set<keyof ProxyConfig>([
  'drainDuration',
  'parentShutdownDuration',
  'terminationDrainDuration',
  'fileFlushInterval',
]);
// google.protobuf wrappers: emitted even when they hold the zero value.
const WRAPPERS = new Set<keyof ProxyConfig>(['concurrency', 'holdApplicationUntilProxyStarts']);

/** protojson's Duration: whole seconds, else 3, 6 or 9 fractional digits ("0.500s"). */
export function protojsonDuration(ms: number): string {
  const secs = ms / 1000;
  if (Number.isInteger(secs)) return `${secs}s`;
  const digits = Number.isInteger(ms) ? 3 : Number.isInteger(ms * 1000) ? 6 : 9;
  return `${secs.toFixed(digits)}s`;
}

const isZero = (v: unknown) =>
  v === undefined ||
  v === '' ||
  v === 0 ||
  v === false ||
  (Array.isArray(v) && v.length === 0) ||
  (v !== null && typeof v === 'object' && !Array.isArray(v) && Object.keys(v).length === 0);

/**
 * The effective ProxyConfig as Istio marshals it (protojson): Istio's defaults plus every field a layer set,
 * zero values left out, durations as "45s". `sources` says which fields still hold this agent's own default
 * (parentShutdownDuration, fileFlushInterval), which Istio's DefaultProxyConfig does not have.
 */
export function proxyConfigJson(p: Readonly<ProxyConfig>, sources: Record<string, string>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const k of Object.keys(FIELDS) as Array<keyof ProxyConfig>) {
    const v = p[k];
    if (!ISTIO_DEFAULTS.has(k) && (sources[k] ?? 'default') === 'default') continue;
    if (v === undefined || (isZero(v) && !WRAPPERS.has(k))) continue;
    out[k === 'fileFlushMinSize' ? 'fileFlushMinSizeKb' : k] = DURATIONS.has(k) ? protojsonDuration(v as number) : v;
  }
  for (const [k, v] of Object.entries(p.extra)) out[k] = v;
  return out;
}
