// DestinationRule load balancing as istiod maps it (istio/istio 86c9f01f, pilot/pkg/networking/core/
// cluster_traffic_policy.go and route/route.go): the cluster's lb_policy, and for consistent hashing the ring or
// Maglev on the cluster plus the hash_policy on every route to it.

import { type ConsistentHash, type TrafficPolicy } from './model';
import type { PushContext } from './push-context';
import { dur } from './resources';

/** The policy of one cluster, as istiod merges it: the top-level policy, its settings for the port, then the
 * subset's policy and the subset's settings for the port, each overriding field by field. */
export function effectivePolicy(
  top: TrafficPolicy | undefined,
  sub: TrafficPolicy | undefined,
  port?: number,
): TrafficPolicy {
  const atPort = (p: TrafficPolicy | undefined) =>
    port === undefined ? undefined : p?.portLevelSettings?.find((l) => l.port === port)?.policy;
  let out = mergePolicy(top, atPort(top));
  if (sub) out = mergePolicy(mergePolicy(out, sub), atPort(sub));
  delete out.portLevelSettings;
  return out;
}

/** `over`'s fields replace `base`'s, field by field. */
export function mergePolicy(base: TrafficPolicy | undefined, over: TrafficPolicy | undefined): TrafficPolicy {
  const out: TrafficPolicy = { ...base, ...over };
  // simple, consistentHash and warmupDurationSecs are one field in Istio (loadBalancer): an override replaces all.
  if (over?.loadBalancer || over?.consistentHash || over?.warmupMs !== undefined) {
    for (const k of ['loadBalancer', 'consistentHash', 'warmupMs'] as const) if (over[k] === undefined) delete out[k];
  }
  return out;
}

/** The consistent hash in force for a destination (host + optional subset), if any. */
function consistentHashFor(
  push: PushContext,
  hostname: string,
  subset: string | undefined,
  namespace?: string,
  port?: number,
): ConsistentHash | undefined {
  const dr = push.destinationRule(hostname, namespace);
  if (!dr) return undefined;
  const sub = subset ? dr.spec.subsets.find((s) => s.name === subset)?.trafficPolicy : undefined;
  return effectivePolicy(dr.spec.trafficPolicy, sub, port).consistentHash;
}

/** Route hash_policy for a destination with consistent hashing, else undefined. */
export function hashPolicy(
  push: PushContext,
  hostname: string,
  subset: string | undefined,
  namespace?: string,
  port?: number,
): Record<string, unknown>[] | undefined {
  const ch = consistentHashFor(push, hostname, subset, namespace, port);
  if (!ch) return undefined;
  const k = ch.key;
  if ('httpHeaderName' in k) return [{ header: { header_name: k.httpHeaderName } }];
  if ('httpQueryParameterName' in k) return [{ query_parameter: { name: k.httpQueryParameterName } }];
  if ('useSourceIp' in k) return [{ connection_properties: { source_ip: true } }];
  const cookie: Record<string, unknown> = { name: k.httpCookie.name };
  if (k.httpCookie.path !== undefined) cookie.path = k.httpCookie.path;
  if (k.httpCookie.ttlMs !== undefined) cookie.ttl = dur(k.httpCookie.ttlMs);
  return [{ cookie }];
}

/** Cluster fields for the load balancer: lb_policy, and the ring hash or Maglev config. */
export function clusterLbFields(policy: TrafficPolicy): Record<string, unknown> {
  const ch = policy.consistentHash;
  if (!ch) {
    const lb = policy.loadBalancer ?? 'LEAST_REQUEST';
    // warmupDurationSecs: slow start for round robin and least request only (RANDOM has none in istiod either).
    const slow =
      policy.warmupMs === undefined ? undefined : { slow_start_config: { slow_start_window: dur(policy.warmupMs) } };
    if (slow && lb === 'ROUND_ROBIN') return { lb_policy: lb, round_robin_lb_config: slow };
    if (slow && lb === 'LEAST_REQUEST') return { lb_policy: lb, least_request_lb_config: slow };
    return { lb_policy: lb };
  }
  if (ch.maglev)
    return ch.maglevTableSize
      ? { lb_policy: 'MAGLEV', maglev_lb_config: { table_size: { value: ch.maglevTableSize } } }
      : { lb_policy: 'MAGLEV' };
  return { lb_policy: 'RING_HASH', ring_hash_lb_config: { minimum_ring_size: { value: ch.minimumRingSize ?? 1024 } } };
}
