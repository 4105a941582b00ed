// DestinationRule load balancing as istiod maps it (istio/istio 86c9f01f, pilot/pkg/networking/core/
// cluster_traffic_policy.go and route/route.go): the cluster's lb_policy, and for consistent hashing the ring or
// Maglev on the cluster plus the hash_policy on every route to it.

import { type ConsistentHash, type TrafficPolicy } from './model';
import type { PushContext } from './push-context';
import { dur } from './resources';

/** A subset's policy merged over the DestinationRule's top-level one, field by field, as Istio does. */
export function mergePolicy(top: TrafficPolicy | undefined, sub: TrafficPolicy | undefined): TrafficPolicy {
  const out: TrafficPolicy = { ...top, ...sub };
  // loadBalancer.simple and loadBalancer.consistentHash are one field in Istio: a subset's choice replaces both.
  if (sub?.loadBalancer) delete out.consistentHash;
  if (sub?.consistentHash) delete out.loadBalancer;
  return out;
}

/** The consistent hash in force for a destination (host + optional subset), if any. */
function consistentHashFor(push: PushContext, hostname: string, subset: string | undefined, namespace?: string): ConsistentHash | undefined {
  const dr = push.destinationRule(hostname, namespace);
  if (!dr) return undefined;
  const sub = subset ? dr.spec.subsets.find((s) => s.name === subset)?.trafficPolicy : undefined;
  return mergePolicy(dr.spec.trafficPolicy, sub).consistentHash;
}

/** Route hash_policy for a destination with consistent hashing, else undefined. */
export function hashPolicy(push: PushContext, hostname: string, subset: string | undefined, namespace?: string): Record<string, unknown>[] | undefined {
  const ch = consistentHashFor(push, hostname, subset, namespace);
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
  if (!ch) return { lb_policy: policy.loadBalancer ?? 'LEAST_REQUEST' };
  if (ch.maglev) return { lb_policy: 'MAGLEV' };
  return { lb_policy: 'RING_HASH', ring_hash_lb_config: { minimum_ring_size: { value: ch.minimumRingSize ?? 1024 } } };
}
