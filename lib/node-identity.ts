// Envoy's node identity: id `type~ip~POD_NAME.POD_NAMESPACE~POD_NAMESPACE.svc.cluster.local`, and metadata from
// ISTIO_META_* (strings), ISTIO_METAJSON_* (JSON) and the pod's labels and annotations. Pure: inputs are values.

import * as net from 'node:net';
import type { Env } from './env';
import type { AgentConfig } from './config';
import { configError } from './errors';

export interface NodeIdentity {
  id: string;
  cluster: string;
  ips: string[];
  ipv6: boolean;
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

/** INSTANCE_IP first, then the host's non-loopback addresses; 127.0.0.1 (or ::1 on an IPv6-only host) if none. */
export function chooseIps(instanceIps: string[], host: HostAddress[]): string[] {
  const out: string[] = [];
  for (const ip of instanceIps) {
    if (!net.isIP(ip)) throw configError('INSTANCE_IP', 'environment variable INSTANCE_IP', `"${ip}" is not an IP address`);
    if (!out.includes(ip)) out.push(ip);
  }
  for (const a of host) {
    if (!a.internal && isPrivateOrGlobalUnicast(a.address) && !out.includes(a.address)) out.push(a.address);
  }
  if (out.length === 0) out.push(host.some((a) => a.family === 'IPv4') || host.length === 0 ? '127.0.0.1' : '::1');
  return out;
}

/** IPv6 mode when every chosen address is IPv6 (an IPv6-only pod). */
export function isIpv6Only(ips: string[]): boolean {
  return ips.length > 0 && ips.every((ip) => net.isIPv6(ip));
}

export function buildNodeIdentity(cfg: AgentConfig, env: Env, host: HostAddress[], agentVersion: string): NodeIdentity {
  const ips = chooseIps(cfg.instanceIps, host);
  const ns = cfg.podNamespace;
  const id = `${cfg.requestedType === 'waypoint' ? 'waypoint' : cfg.proxyType}~${ips[0]}~${cfg.podName}.${ns}~${ns}.svc.cluster.local`;

  const metadata: Record<string, unknown> = {};
  // As Istio: proxyMetadata ISTIO_META_* first, then the environment's ISTIO_META_* (strings), then each
  // ISTIO_METAJSON_* object merged into the top level (the variable's name is ignored).
  const sources: Env = { ...cfg.proxy.proxyMetadata, ...env };
  const names = Object.keys(sources).sort();
  for (const k of names) {
    const v = sources[k];
    if (v !== undefined && k.startsWith('ISTIO_META_')) metadata[k.slice('ISTIO_META_'.length)] = v;
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
    if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) throw configError(k, `environment variable ${k}`, 'want a JSON object');
    Object.assign(metadata, parsed);
  }

  // Labels: ISTIO_METAJSON_LABELS, then the pod's labels file over it (without pod-template-hash).
  const labels: Record<string, string> = {};
  const staticLabels = sources.ISTIO_METAJSON_LABELS ? (JSON.parse(sources.ISTIO_METAJSON_LABELS) as Record<string, string>) : {};
  Object.assign(labels, staticLabels);
  for (const [k, v] of Object.entries(cfg.podLabels)) if (k !== 'pod-template-hash') labels[k] = v;
  if (Object.keys(labels).length) metadata.LABELS = labels;
  if (Object.keys(cfg.podAnnotations).length) metadata.ANNOTATIONS = { ...cfg.podAnnotations };
  metadata.INSTANCE_IPS = ips.join(',');
  metadata.ISTIO_VERSION = (sources.ISTIO_VERSION as string | undefined) || agentVersion;
  metadata.NAMESPACE ??= ns;
  if (cfg.podName) metadata.NAME ??= cfg.podName;
  metadata.CLUSTER_ID = cfg.clusterId;
  if (cfg.serviceAccount) metadata.SERVICE_ACCOUNT ??= cfg.serviceAccount;
  metadata.ENVOY_STATUS_PORT = cfg.envoyStatusPort;
  metadata.ENVOY_PROMETHEUS_PORT = cfg.envoyPrometheusPort;
  if (cfg.dnsEnabled) metadata.DNS_PROXY_ADDR = cfg.dnsProxyAddr;
  if (cfg.proxy.meshId) metadata.MESH_ID ??= cfg.proxy.meshId;
  metadata.PROXY_CONFIG = proxyConfigForMetadata(cfg);

  const locality: NodeIdentity['locality'] = {};
  const loc = (metadata.LOCALITY as string | undefined) ?? cfg.proxy.availabilityZone;
  if (loc) {
    const [region, zone, sub] = String(loc).split('/');
    if (region) locality.region = region;
    if (zone) locality.zone = zone;
    if (sub) locality.sub_zone = sub;
  }

  return { id, cluster: cfg.serviceCluster, ips, ipv6: isIpv6Only(ips), metadata, locality };
}

function proxyConfigForMetadata(cfg: AgentConfig): Record<string, unknown> {
  const p = cfg.proxy;
  const secs = (ms: number) => `${ms / 1000}s`;
  const out: Record<string, unknown> = {
    configPath: p.configPath,
    binaryPath: p.binaryPath,
    serviceCluster: p.serviceCluster,
    drainDuration: secs(p.drainDuration),
    parentShutdownDuration: secs(p.parentShutdownDuration),
    terminationDrainDuration: secs(p.terminationDrainDuration),
    discoveryAddress: p.discoveryAddress,
    proxyAdminPort: p.proxyAdminPort,
    statusPort: p.statusPort,
    controlPlaneAuthPolicy: p.controlPlaneAuthPolicy,
    statNameLength: p.statNameLength,
  };
  if (p.concurrency !== undefined) out.concurrency = p.concurrency;
  if (Object.keys(p.proxyMetadata).length) out.proxyMetadata = p.proxyMetadata;
  return out;
}
