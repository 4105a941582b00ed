// A connected proxy as the discovery server sees it, from the node of its first request:
// id `sidecar~<ip>~<pod>.<ns>~<ns>.svc.cluster.local` (or `router~...`), labels from metadata LABELS.

import { dict } from '../dict';
import { AgentError, quote } from '../errors';
import type { Identity } from './identities';
import { proxyTracingFromMetadata, type ProxyTracing } from './mesh-tracing';

export type ProxyType = 'sidecar' | 'router';

export interface Proxy {
  readonly id: string;
  readonly type: ProxyType;
  readonly ip: string;
  /** The node id's IP and metadata INSTANCE_IPS: the addresses the proxy claims. */
  readonly ips: readonly string[];
  readonly namespace: string;
  /** Who the proxy proved to be on its stream (./xds-auth.ts); its namespace is the node's. Absent: anonymous. */
  readonly identity?: VerifiedIdentity;
  readonly labels: Readonly<Record<string, string>>;
  /** Metadata WORKLOAD_ENTRY: the WorkloadEntry this proxy runs for (its health events apply to it). */
  readonly workloadEntry?: string;
  /** Metadata STANDALONE_CAPTURE=true (env ISTIO_META_STANDALONE_CAPTURE): the host's traffic is captured by
   * istio-iptables, so the sidecar gets Istio's 15001/15006 listeners instead of loopback ones. */
  readonly capture: boolean;
  /** Metadata PROXY_CONFIG, when sent: istiod then takes the proxy's ProxyConfig from it, not meshConfig's defaultConfig. */
  readonly proxyConfig?: { readonly tracing?: ProxyTracing };
  /** Metadata DNS_CAPTURE=true: its DNS proxy answers the auto-allocated VIPs, so istiod routes them too. */
  readonly dnsCapture?: boolean;
  /** Metadata MESH_ID and CLUSTER_ID (trace tags). */
  readonly meshId?: string;
  readonly clusterId?: string;
  /** Metadata GENERATOR: `grpc` for proxyless gRPC (the agent's gRPC bootstrap sets it), answered by ./gen-grpc.ts. */
  readonly generator?: string;
}

export interface VerifiedIdentity extends Identity {
  /** `token`: a ca/identities token; `in-process`: the agent that runs this server (proxy --standalone). */
  readonly via: 'token' | 'in-process';
}

/** The proxy as authenticated on its stream. */
export function withIdentity(p: Proxy, identity: VerifiedIdentity): Proxy {
  return Object.freeze({ ...p, identity: Object.freeze({ ...identity }) });
}

export function proxyFromNode(node: { id?: string; metadata?: unknown } | undefined): Proxy {
  const id = node?.id;
  if (!id) throw new AgentError('BAD_INPUT', 'the first request has no node id');
  const parts = id.split('~');
  if (parts.length !== 4)
    throw new AgentError('BAD_INPUT', `node id ${quote(id)} is not <type>~<ip>~<pod>.<namespace>~<domain>`);
  const [t, ip, podNs, domain] = parts as [string, string, string, string];
  let type: ProxyType;
  if (t === 'sidecar') type = 'sidecar';
  else if (t === 'router' || t === 'ingress') type = 'router';
  else
    throw new AgentError('BAD_INPUT', `node id ${quote(id)}: unknown proxy type ${quote(t)} (want sidecar or router)`);
  const dot = podNs.indexOf('.');
  const namespace = (dot >= 0 ? podNs.slice(dot + 1) : domain.split('.')[0]) || 'default';
  const meta = structToJson(node?.metadata);
  const labels = dict<string>();
  if (meta && typeof meta === 'object' && Object.hasOwn(meta, 'LABELS')) {
    const l = (meta as Record<string, unknown>).LABELS;
    if (l && typeof l === 'object') for (const [k, v] of Object.entries(l)) if (typeof v === 'string') labels[k] = v;
  }
  const we = meta && typeof meta === 'object' ? (meta as Record<string, unknown>).WORKLOAD_ENTRY : undefined;
  const capture = meta && typeof meta === 'object' ? (meta as Record<string, unknown>).STANDALONE_CAPTURE : undefined;
  const m = meta && typeof meta === 'object' ? (meta as Record<string, unknown>) : {};
  const pc =
    m.PROXY_CONFIG && typeof m.PROXY_CONFIG === 'object' ? (m.PROXY_CONFIG as Record<string, unknown>) : undefined;
  const tracing = pc && proxyTracingFromMetadata(pc.tracing);
  const str = (k: string) =>
    typeof m[k] === 'string' && m[k] ? { [k === 'MESH_ID' ? 'meshId' : 'clusterId']: m[k] as string } : {};
  const ips = [ip, ...(typeof m.INSTANCE_IPS === 'string' ? m.INSTANCE_IPS.split(',').map((x) => x.trim()) : [])];
  return Object.freeze({
    id,
    type,
    ip,
    ips: Object.freeze([...new Set(ips.filter(Boolean))]),
    namespace,
    labels: Object.freeze(labels),
    capture: capture === true || capture === 'true',
    ...(typeof we === 'string' && we ? { workloadEntry: we } : {}),
    ...(pc && { proxyConfig: Object.freeze(tracing ? { tracing } : {}) }),
    ...str('MESH_ID'),
    ...str('CLUSTER_ID'),
    ...((m.DNS_CAPTURE === true || m.DNS_CAPTURE === 'true') && { dnsCapture: true }),
    ...(typeof m.GENERATOR === 'string' && m.GENERATOR && { generator: m.GENERATOR }),
  });
}

/** google.protobuf.Struct as protobufjs toObject gives it -> plain JSON. The descriptor's well-known types use
 * protobufjs' camelCase field names (stringValue), Envoy's own messages snake_case; accept both. */
export function structToJson(s: unknown): unknown {
  if (!s || typeof s !== 'object') return undefined;
  const fields = (s as { fields?: Record<string, unknown> }).fields;
  if (!fields) return dict();
  const out = dict<unknown>();
  for (const [k, v] of Object.entries(fields)) out[k] = valueToJson(v);
  return out;
}

function valueToJson(v: unknown): unknown {
  if (!v || typeof v !== 'object') return null;
  const o = v as Record<string, unknown>;
  const get = (camel: string, snake: string) => (camel in o ? o[camel] : o[snake]);
  if ('stringValue' in o || 'string_value' in o) return get('stringValue', 'string_value');
  if ('numberValue' in o || 'number_value' in o) return get('numberValue', 'number_value');
  if ('boolValue' in o || 'bool_value' in o) return get('boolValue', 'bool_value');
  if ('structValue' in o || 'struct_value' in o) return structToJson(get('structValue', 'struct_value'));
  if ('listValue' in o || 'list_value' in o)
    return ((get('listValue', 'list_value') as { values?: unknown[] }).values ?? []).map(valueToJson);
  return null;
}
