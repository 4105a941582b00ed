// Envoy's node identity: id `type~ip~POD_NAME.POD_NAMESPACE~POD_NAMESPACE.svc.cluster.local`, and metadata from
// ISTIO_META_* (strings), ISTIO_METAJSON_* (JSON) and the pod's labels and annotations. Pure: inputs are values.

import * as net from 'node:net';
import type { Env } from './env';
import type { AgentConfig } from './config';
import { dict, plainCopy, setOwn } from './dict';
import { configError, quote } from './errors';
import { proxyConfigJson } from './proxy-config';

export interface NodeIdentity {
  id: string;
  cluster: string;
  ips: string[];
  ipv6: boolean;
  /** ISTIO_DUAL_STACK and addresses of both families: the first address's family leads, the other is added. */
  dualStack?: 'ipv4-first' | 'ipv6-first';
  metadata: Record<string, unknown>;
  locality: { region?: string; zone?: string; sub_zone?: string };
}

/** A host's addresses as os.networkInterfaces() gives them, flattened. */
export interface HostAddress {
  address: string;
  family: 'IPv4' | 'IPv6';
  internal: boolean;
}

function isPrivateOrGlobalUnicast(ip: string): boolean {
  if (net.isIPv4(ip)) return !ip.startsWith('127.') && !ip.startsWith('169.254.') && ip !== '0.0.0.0';
  const l = ip.toLowerCase();
  return l !== '::1' && l !== '::' && !l.startsWith('fe80:');
}

/**
 * INSTANCE_IP first, then the host's non-loopback addresses; when the host has none, 127.0.0.1 and ::1 are
 * added (after INSTANCE_IP, if any), as Istio does.
 */
export function chooseIps(instanceIps: string[], host: HostAddress[]): string[] {
  const out: string[] = [];
  for (const ip of instanceIps) {
    if (!net.isIP(ip))
      throw configError('INSTANCE_IP', 'environment variable INSTANCE_IP', `"${ip}" is not an IP address`);
    if (!out.includes(ip)) out.push(ip);
  }
  const hostIps = host.filter((a) => !a.internal && isPrivateOrGlobalUnicast(a.address)).map((a) => a.address);
  for (const ip of hostIps.length ? hostIps : ['127.0.0.1', '::1']) if (!out.includes(ip)) out.push(ip);
  return out;
}

/** IPv6 mode when every chosen address is IPv6 (an IPv6-only pod). */
export function isIpv6Only(ips: string[]): boolean {
  // The colon test first: net.isIPv6's first call compiles a large regular expression (~5 ms of start-up).
  return ips.length > 0 && ips.every((ip) => ip.includes(':') && net.isIPv6(ip));
}

/** Istio's order for the app name behind node.cluster: app, app.kubernetes.io/name, the canonical name. */
const APP_LABELS = ['app', 'app.kubernetes.io/name', 'service.istio.io/canonical-name'];
const CANONICAL_LABELS = ['service.istio.io/canonical-name', 'app.kubernetes.io/name', 'app'];
const LOCALITY_LABELS = ['topology.istio.io/locality', 'istio-locality'];

const firstLabel = (labels: Record<string, string>, keys: string[]) =>
  keys.map((k) => labels[k]).find((v) => v !== undefined);

/**
 * node.cluster as Istio derives it (istiod uses it as the tracing service name): an explicit serviceCluster,
 * else `<app>.<namespace>` from the pod labels, else `<WORKLOAD_NAME>.<namespace>`, else `istio-proxy.<namespace>`;
 * tracingServiceName picks the canonical service name instead.
 */
export function serviceClusterName(
  cfg: AgentConfig,
  labels: Record<string, string>,
  workloadName: string,
  ns: string,
): string {
  const orDefault = (name: string) => {
    if (name !== '' && name !== 'istio-proxy') return name;
    const app = firstLabel(labels, APP_LABELS);
    if (app !== undefined) return `${app}.${ns}`;
    if (workloadName) return `${workloadName}.${ns}`;
    return ns ? `istio-proxy.${ns}` : 'istio-proxy';
  };
  const canonical = () => firstLabel(labels, CANONICAL_LABELS) ?? (workloadName || 'istio-proxy');
  switch (cfg.proxy.tracingServiceName) {
    case 'CANONICAL_NAME_ONLY':
      return orDefault(canonical());
    case 'CANONICAL_NAME_AND_NAMESPACE':
      return ns ? `${canonical()}.${ns}` : orDefault(canonical());
    case 'APP_LABEL_AND_NAMESPACE':
      return orDefault('istio-proxy');
    default:
      return orDefault(cfg.serviceCluster);
  }
}

// Metadata keys Istio reads into typed fields and writes back in that type's form (the rest pass as given).
const STRING_BOOLS = [
  'ENABLE_SELF_DISCOVERY',
  'DNS_CAPTURE',
  'DNS_AUTO_ALLOCATE',
  'ENABLE_HBONE',
  'DISABLE_HBONE_SEND',
  'INBOUND_LISTENER_EXACT_BALANCE',
  'OUTBOUND_LISTENER_EXACT_BALANCE',
];
const GO_TRUE = new Set(['1', 't', 'T', 'TRUE', 'true', 'True']);
const GO_FALSE = new Set(['0', 'f', 'F', 'FALSE', 'false', 'False']);

/** "true"/"false" strings (false ones left out) and POD_PORTS as compact JSON text, as Istio's typed metadata. */
function typedMetadata(metadata: Record<string, unknown>): void {
  for (const k of STRING_BOOLS) {
    const v = metadata[k];
    if (typeof v !== 'string') continue;
    if (GO_TRUE.has(v)) metadata[k] = 'true';
    else if (GO_FALSE.has(v)) delete metadata[k];
  }
  if (typeof metadata.POD_PORTS === 'string') {
    try {
      const ports = JSON.parse(metadata.POD_PORTS) as Array<Record<string, unknown>>;
      if (Array.isArray(ports)) {
        metadata.POD_PORTS = JSON.stringify(
          ports.map((p) => ({
            ...(p.name ? { name: p.name } : {}),
            containerPort: p.containerPort ?? 0,
            protocol: p.protocol ?? '',
          })),
        );
      }
    } catch {
      // Passed on as given; istiod reports what it cannot read.
    }
  }
}

/** Istio's discovery SAN: the discovery host (istiod's own name when it is localhost). */
export function pilotSan(discoveryAddress: string): string {
  const host = discoveryAddress.split(':')[0]!;
  return host === 'localhost' ? 'istiod.istio-system.svc' : host;
}

/** `istioVersion`: ISTIO_VERSION when the environment does not set it (see istio-version.ts). */
export function buildNodeIdentity(cfg: AgentConfig, env: Env, host: HostAddress[], istioVersion: string): NodeIdentity {
  const ips = chooseIps(cfg.instanceIps, host);
  const ns = cfg.podNamespace;
  const id = `${cfg.requestedType === 'waypoint' ? 'waypoint' : cfg.proxyType}~${ips[0]}~${cfg.podName}.${ns}~${ns}.svc.cluster.local`;

  const metadata: Record<string, unknown> = {};
  // As Istio: proxyMetadata ISTIO_META_* first, then the environment's ISTIO_META_* (strings), then each
  // ISTIO_METAJSON_* object merged into the top level (the variable's name is ignored).
  const sources: Env = dict({ ...cfg.proxy.proxyMetadata, ...env });
  const names = Object.keys(sources).sort();
  for (const k of names) {
    const v = sources[k];
    if (v !== undefined && k.startsWith('ISTIO_META_')) setOwn(metadata, k.slice('ISTIO_META_'.length), v);
  }
  for (const k of names) {
    const v = sources[k];
    if (v === undefined || !k.startsWith('ISTIO_METAJSON_')) continue;
    let parsed: unknown;
    try {
      parsed = JSON.parse(v);
    } catch (e) {
      throw configError(k, `environment variable ${k}`, `not valid JSON: ${(e as Error).message}`);
    }
    if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed))
      throw configError(k, `environment variable ${k}`, `want a JSON object, got ${quote(v)}`);
    // Not Object.assign: its `__proto__` key would replace the prototype and hide NAMESPACE and the rest.
    for (const [key, value] of Object.entries(parsed)) setOwn(metadata, key, value);
  }
  typedMetadata(metadata);
  // Only the environment's own DNS_PROXY_ADDR is reported (istiod falls back to its default), as Istio does.
  if (env.DNS_PROXY_ADDR) metadata.DNS_PROXY_ADDR = env.DNS_PROXY_ADDR;

  // Labels: ISTIO_METAJSON_LABELS (also reported as STATIC_LABELS), then the pod's labels file over it
  // (without pod-template-hash). Own-property copies: a `__proto__` key stays a label.
  const staticLabels = sources.ISTIO_METAJSON_LABELS
    ? (JSON.parse(sources.ISTIO_METAJSON_LABELS) as Record<string, string>)
    : {};
  if (Object.keys(staticLabels).length) metadata.STATIC_LABELS = plainCopy(staticLabels);
  const labels = plainCopy<string>(staticLabels);
  for (const [k, v] of Object.entries(cfg.podLabels)) if (k !== 'pod-template-hash') setOwn(labels, k, v);
  const localityLabel = firstLabel(labels, LOCALITY_LABELS);
  if (localityLabel)
    labels[LOCALITY_LABELS[1]!] = localityLabel.includes('/') ? localityLabel : localityLabel.split('.').join('/');
  if (Object.keys(labels).length) metadata.LABELS = labels;
  else delete metadata.LABELS;
  if (Object.keys(cfg.podAnnotations).length)
    metadata.ANNOTATIONS = plainCopy({ ...(metadata.ANNOTATIONS as object), ...cfg.podAnnotations });
  metadata.INSTANCE_IPS = ips.join(',');
  metadata.ISTIO_VERSION = (sources.ISTIO_VERSION as string | undefined) || istioVersion;
  // The pod's own variables win over ISTIO_META_NAME and friends, as in Istio.
  if (cfg.podName) metadata.NAME = cfg.podName;
  if (ns) metadata.NAMESPACE = ns;
  if (cfg.serviceAccount) metadata.SERVICE_ACCOUNT = cfg.serviceAccount;
  metadata.ENVOY_STATUS_PORT = cfg.envoyStatusPort;
  metadata.ENVOY_PROMETHEUS_PORT = cfg.envoyPrometheusPort;
  if (cfg.secureMetricsPort) metadata.ENVOY_SECURE_METRICS_PORT = cfg.secureMetricsPort;
  if (cfg.secureMergedMetricsPort) metadata.ENVOY_SECURE_MERGED_METRICS_PORT = cfg.secureMergedMetricsPort;
  if (cfg.exitOnZeroActiveConnections) metadata.EXIT_ON_ZERO_ACTIVE_CONNECTIONS = 'true';
  else delete metadata.EXIT_ON_ZERO_ACTIVE_CONNECTIONS;
  if (cfg.outlierLogPath) metadata.OUTLIER_LOG_PATH = cfg.outlierLogPath;
  if (cfg.proxy.controlPlaneAuthPolicy === 'MUTUAL_TLS') metadata.PILOT_SAN = [pilotSan(cfg.proxy.discoveryAddress)];
  else delete metadata.PILOT_SAN;
  metadata.METADATA_DISCOVERY = String(cfg.metadataDiscovery ?? metadata.ENABLE_HBONE === 'true');
  if (cfg.skipDeprecatedLogs) metadata.ENVOY_SKIP_DEPRECATED_LOGS = 'true';
  else delete metadata.ENVOY_SKIP_DEPRECATED_LOGS;
  metadata.WORKLOAD_IDENTITY_SOCKET_FILE = cfg.workloadIdentitySocketFile;
  // As Go's GetNodeMetaData: istiod adds the sds-external cluster for `credential`, and sends file certificates over
  // sds-files-grpc for `file-credential`.
  if (cfg.sockets.credentialSocket) metadata.credential = 'true';
  if (cfg.sockets.externalSds) metadata['file-credential'] = 'true';
  metadata.PROXY_CONFIG = proxyConfigJson(cfg.proxy, cfg.sources);

  const locality: NodeIdentity['locality'] = {};
  const loc = (labels[LOCALITY_LABELS[1]!] ?? (metadata.LOCALITY as string | undefined)) || cfg.proxy.availabilityZone;
  if (loc) {
    const [region, zone, sub] = String(loc).split('/');
    if (region) locality.region = region;
    if (zone) locality.zone = zone;
    if (sub) locality.sub_zone = sub;
  }

  const workloadName = typeof metadata.WORKLOAD_NAME === 'string' ? metadata.WORKLOAD_NAME : '';
  const cluster = serviceClusterName(cfg, labels, workloadName, ns);
  const mixed = !isIpv6Only(ips) && !ips.every((ip) => net.isIPv4(ip));
  const dualStack =
    cfg.dualStack && mixed ? (ips[0]!.includes(':') && net.isIPv6(ips[0]!) ? 'ipv6-first' : 'ipv4-first') : undefined;
  return { id, cluster, ips, ipv6: isIpv6Only(ips), ...(dualStack ? { dualStack } : {}), metadata, locality };
}
