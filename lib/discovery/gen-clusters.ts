// CDS and EDS: one cluster per service port (`outbound|<port>||<host>`) and one per DestinationRule subset
// (`outbound|<port>|<subset>|<host>`); STATIC services use EDS, DNS services STRICT_DNS with inline endpoints.
// A proxy sees the clusters of the services its scope admits (Sidecar egress, exportTo), plus PassthroughCluster and
// BlackHoleCluster; mTLS (DestinationRule tls, auto-mTLS by the endpoints' tlsMode label) is the transport socket.

import { packAny } from '../envoy-protos';
import { clusterLbFields, effectivePolicy } from './gen-lb-policy';
import { ISTIOD_UPSTREAM_TLS_PARAMS, originates, originationFields } from './gen-upstream-tls';
import { SDS_SOURCE } from './gen-secrets';
import { BLACKHOLE_CLUSTER, PASSTHROUGH_CLUSTER } from './gen-common';
import {
  type Config,
  type DestinationRuleSpec,
  labelsMatch,
  type Service,
  type ServiceInstance,
  type ServicePort,
  type Subset,
  type TrafficPolicy,
} from './model';
import type { ProxyScope, PushContext } from './push-context';
import { ADS_SOURCE, CLUSTER, clusterName, dur, encodeResource, ENDPOINTS, type Resource } from './resources';

const HTTP_OPTIONS = 'envoy.extensions.upstreams.http.v3.HttpProtocolOptions';
const UNLIMITED = 4294967295; // Istio's default circuit-breaker thresholds: effectively none
const DEFAULT_CONNECT_TIMEOUT_MS = 10_000;
const UPSTREAM_TLS = 'envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext';
const RAW_BUFFER = 'envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer';
/** The label Istio puts on workloads that run a sidecar: auto-mTLS sends them mTLS. */
export const TLS_MODE_LABEL = 'security.istio.io/tlsMode';
// The agent's SDS server, through the bootstrap's sds-grpc cluster (defined with the other SDS names, ./gen-secrets.ts).
export { SDS_SOURCE };
// google.protobuf.Value: the descriptor's well-known types keep protobufjs' camelCase names.
const str = (v: string) => ({ stringValue: v });

interface ClusterSpec {
  name: string;
  service: Service;
  port: ServicePort;
  subset?: Subset;
}

function clusterSpecs(push: PushContext, scope?: ProxyScope): ClusterSpec[] {
  return push.memoize(`cluster-specs|${scope?.key ?? '*'}`, () => {
    const out: ClusterSpec[] = [];
    for (const svc of scope?.services ?? push.services) {
      const dr = push.destinationRule(svc.hostname, scope?.namespace);
      for (const port of svc.ports) {
        out.push({ name: clusterName(port.number, '', svc.hostname), service: svc, port });
        for (const subset of dr?.spec.subsets ?? [])
          out.push({ name: clusterName(port.number, subset.name, svc.hostname), service: svc, port, subset });
      }
    }
    return out;
  });
}

/** The clusters a proxy with this scope sees (its visible services, with the DestinationRules exported to it). */
export function buildClusters(push: PushContext, scope: ProxyScope): Resource[] {
  return push.memoize(`cds|${scope.key}`, () => [
    ...clusterSpecs(push, scope).map((c) => {
      // A cluster depends on its service, its DestinationRule and, for DNS services, its instances.
      const dr = push.destinationRule(c.service.hostname, scope.namespace);
      const inst =
        c.service.resolution === 'STATIC'
          ? mtlsInputs(selectInstances(push, c))
          : JSON.stringify(selectInstances(push, c));
      return push.cache.get(c.service, c.name, `${dr?.meta.resourceVersion ?? ''}|${inst}|${scope.router}`, () =>
        encodeResource(CLUSTER, c.name, clusterObject(push, c, dr, scope.router)),
      );
    }),
    PASSTHROUGH,
    BLACKHOLE,
  ]);
}

// istiod's two fixed clusters: the original destination of the connection (the allow_any route's), and nowhere.
const PASSTHROUGH = encodeResource(CLUSTER, PASSTHROUGH_CLUSTER, {
  name: PASSTHROUGH_CLUSTER,
  type: 'ORIGINAL_DST',
  connect_timeout: dur(DEFAULT_CONNECT_TIMEOUT_MS),
  lb_policy: 'CLUSTER_PROVIDED',
  circuit_breakers: {
    thresholds: [
      {
        max_connections: { value: UNLIMITED },
        max_pending_requests: { value: UNLIMITED },
        max_requests: { value: UNLIMITED },
        max_retries: { value: UNLIMITED },
        track_remaining: true,
      },
    ],
  },
  typed_extension_protocol_options: {
    [HTTP_OPTIONS]: packAny(HTTP_OPTIONS, {
      use_downstream_protocol_config: { http_protocol_options: {}, http2_protocol_options: {} },
    }),
  },
});
const BLACKHOLE = encodeResource(CLUSTER, BLACKHOLE_CLUSTER, {
  name: BLACKHOLE_CLUSTER,
  type: 'STATIC',
  connect_timeout: dur(DEFAULT_CONNECT_TIMEOUT_MS),
});

/** EDS for every EDS cluster, by name. */
export function buildEndpoints(push: PushContext): ReadonlyMap<string, Resource> {
  return push.memoize('eds', () => {
    const out = new Map<string, Resource>();
    for (const c of clusterSpecs(push))
      if (c.service.resolution === 'STATIC') out.set(c.name, endpointResource(push, c));
    return out;
  });
}

function endpointResource(push: PushContext, c: ClusterSpec): Resource {
  // Endpoints depend on the instance list (replaced by the registry only when it changes) and subset labels.
  const all = push.instances(c.service.hostname, c.port.number);
  const variant = c.subset ? JSON.stringify(c.subset.labels) : '';
  return push.cache.get(all, c.name, variant, () =>
    encodeResource(ENDPOINTS, c.name, loadAssignment(c.name, selectInstances(push, c))),
  );
}

/**
 * A new push context's EDS (the same for every proxy) encoded a cluster at a time, `breathe` called in between,
 * and memoised where buildEndpoints() looks: encoding 10,000 assignments in one go blocked the event loop.
 */
export async function warmEndpoints(push: PushContext, breathe: () => Promise<void>): Promise<void> {
  const out = new Map<string, Resource>();
  for (const c of clusterSpecs(push)) {
    if (c.service.resolution !== 'STATIC') continue;
    out.set(c.name, endpointResource(push, c));
    await breathe();
  }
  push.prime('eds', out);
}

/** An empty assignment for a name Envoy asks for that does not (or no longer) exist, so it does not wait on it. */
export function emptyEndpoints(name: string): Resource {
  return encodeResource(ENDPOINTS, name, { cluster_name: name, endpoints: [] });
}

function selectInstances(push: PushContext, c: ClusterSpec): readonly ServiceInstance[] {
  const all = push.instances(c.service.hostname, c.port.number);
  return c.subset ? all.filter((i) => labelsMatch(c.subset!.labels, i.labels)) : all;
}

function loadAssignment(name: string, instances: readonly ServiceInstance[]): Record<string, unknown> {
  if (!instances.length) return { cluster_name: name, endpoints: [] };
  return {
    cluster_name: name,
    endpoints: [
      {
        lb_endpoints: instances.map((i) => ({
          endpoint: { address: { socket_address: { address: i.address, port_value: i.port } } },
          load_balancing_weight: { value: i.weight ?? 1 },
          // Picks the cluster's mTLS transport socket for endpoints with a sidecar (auto-mTLS).
          ...(i.labels[TLS_MODE_LABEL] === 'istio'
            ? {
                metadata: {
                  filter_metadata: { 'envoy.transport_socket_match': { fields: { tlsMode: str('istio') } } },
                },
              }
            : {}),
        })),
      },
    ],
  };
}

/** What of the instances a cluster's mTLS settings depend on (cache variant). */
function mtlsInputs(instances: readonly ServiceInstance[]): string {
  return JSON.stringify(
    instances.map((i) => [
      i.labels[TLS_MODE_LABEL] ?? '',
      i.identity?.namespace ?? '',
      i.identity?.serviceAccount ?? '',
    ]),
  );
}

/**
 * Istio's mTLS to a sidecar: the workload certificate (`default`) and trust bundle (`ROOTCA`) from the agent's SDS,
 * and the peer's SPIFFE id checked: the DestinationRule's subjectAltNames, else the service accounts the
 * endpoints declare (any trust domain: the root already pins it), else only the root.
 */
function istioMutual(
  push: PushContext,
  c: ClusterSpec,
  instances: readonly ServiceInstance[],
  sans: readonly string[],
  sni?: string,
): Record<string, unknown> {
  const ids = new Set(
    instances.flatMap((i) => (i.identity ? [`${i.identity.namespace}/${i.identity.serviceAccount}`] : [])),
  );
  const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  const matchers = sans.length
    ? sans.map((s) => ({ san_type: 'URI', matcher: { exact: s } }))
    : [...ids].sort().map((id) => {
        const [ns, sa] = id.split('/') as [string, string];
        return {
          san_type: 'URI',
          matcher: { safe_regex: { regex: `^spiffe://[^/]+/ns/${escape(ns)}/sa/${escape(sa)}$` } },
        };
      });
  const params = push.tlsCompliance?.({ ...ISTIOD_UPSTREAM_TLS_PARAMS });
  return {
    name: 'envoy.transport_sockets.tls',
    typed_config: packAny(UPSTREAM_TLS, {
      sni: sni ?? `outbound_.${c.port.number}_.${c.subset?.name ?? ''}_.${c.service.hostname}`,
      common_tls_context: {
        // COMPLIANCE_POLICY: istiod's upstream default (TLS 1.2-1.3) as its EnforceCompliance restricts it.
        ...(params && { tls_params: params }),
        alpn_protocols: ['istio-peer-exchange', 'istio'],
        tls_certificate_sds_secret_configs: [{ name: 'default', sds_config: SDS_SOURCE }],
        combined_validation_context: {
          default_validation_context: matchers.length ? { match_typed_subject_alt_names: matchers } : {},
          validation_context_sds_secret_config: { name: 'ROOTCA', sds_config: SDS_SOURCE },
        },
      },
    }),
  };
}

function transportSocket(push: PushContext, c: ClusterSpec, policy: TrafficPolicy): Record<string, unknown> {
  const instances = selectInstances(push, c);
  if (policy.tls?.mode === 'ISTIO_MUTUAL')
    return { transport_socket: istioMutual(push, c, instances, policy.tls.subjectAltNames, policy.tls.sni) };
  if (policy.tls?.mode === 'DISABLE' || c.service.location !== 'MESH_INTERNAL') return {};
  // Auto-mTLS, as Istio: with no TLS setting, endpoints labelled as having a sidecar get mTLS, the rest plaintext.
  if (!instances.some((i) => i.labels[TLS_MODE_LABEL] === 'istio')) return {};
  return {
    transport_socket_matches: [
      {
        name: 'tlsMode-istio',
        match: { fields: { tlsMode: str('istio') } },
        transport_socket: istioMutual(push, c, instances, []),
      },
      {
        name: 'tlsMode-disabled',
        match: {},
        transport_socket: { name: 'envoy.transport_sockets.raw_buffer', typed_config: packAny(RAW_BUFFER, {}) },
      },
    ],
  };
}

function clusterObject(
  push: PushContext,
  c: ClusterSpec,
  dr: Config<DestinationRuleSpec> | undefined,
  router: boolean,
): Record<string, unknown> {
  const policy = effectivePolicy(dr?.spec.trafficPolicy, c.subset?.trafficPolicy, c.port.number);
  // TLS origination (DestinationRule tls SIMPLE/MUTUAL): ./gen-upstream-tls.ts.
  const origination = originates(policy.tls)
    ? originationFields(
        policy.tls,
        router,
        c.port.protocol === 'HTTP2' || c.port.protocol === 'GRPC',
        SDS_SOURCE,
        push.tlsCompliance,
      )
    : undefined;
  const tcp = policy.connectionPool?.tcp;
  const http = policy.connectionPool?.http;
  const out: Record<string, unknown> = {
    name: c.name,
    connect_timeout: dur(tcp?.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS),
    ...clusterLbFields(policy),
    circuit_breakers: {
      thresholds: [
        {
          max_connections: { value: tcp?.maxConnections ?? UNLIMITED },
          max_pending_requests: { value: http?.http1MaxPendingRequests ?? UNLIMITED },
          max_requests: { value: http?.http2MaxRequests ?? UNLIMITED },
          max_retries: { value: http?.maxRetries ?? UNLIMITED },
          track_remaining: true,
        },
      ],
    },
  };
  if (c.service.resolution === 'STATIC') {
    out.type = 'EDS';
    out.eds_cluster_config = { eds_config: ADS_SOURCE, service_name: c.name };
  } else {
    out.type = 'STRICT_DNS';
    out.dns_lookup_family = 'V4_PREFERRED';
    out.load_assignment = loadAssignment(c.name, selectInstances(push, c));
  }
  const h2 = c.port.protocol === 'HTTP2' || c.port.protocol === 'GRPC';
  if (h2 || http?.maxRequestsPerConnection || origination?.httpOptions) {
    const opts: Record<string, unknown> = {
      explicit_http_config: h2 ? { http2_protocol_options: {} } : { http_protocol_options: {} },
    };
    if (origination?.httpOptions) opts.upstream_http_protocol_options = origination.httpOptions;
    if (http?.maxRequestsPerConnection)
      opts.common_http_protocol_options = { max_requests_per_connection: { value: http.maxRequestsPerConnection } };
    out.typed_extension_protocol_options = {
      'envoy.extensions.upstreams.http.v3.HttpProtocolOptions': packAny(HTTP_OPTIONS, opts),
    };
  }
  if (origination) {
    if (origination.socket) out.transport_socket = origination.socket;
  } else Object.assign(out, transportSocket(push, c, policy));
  const od = policy.outlierDetection;
  if (od) {
    const o: Record<string, unknown> = {};
    if (od.consecutive5xxErrors !== undefined) {
      o.consecutive_5xx = { value: od.consecutive5xxErrors };
      o.enforcing_consecutive_5xx = { value: od.consecutive5xxErrors > 0 ? 100 : 0 };
    }
    if (od.consecutiveGatewayErrors !== undefined) {
      o.consecutive_gateway_failure = { value: od.consecutiveGatewayErrors };
      o.enforcing_consecutive_gateway_failure = { value: od.consecutiveGatewayErrors > 0 ? 100 : 0 };
    }
    if (od.intervalMs !== undefined) o.interval = dur(od.intervalMs);
    if (od.baseEjectionTimeMs !== undefined) o.base_ejection_time = dur(od.baseEjectionTimeMs);
    if (od.maxEjectionPercent !== undefined) o.max_ejection_percent = { value: od.maxEjectionPercent };
    out.outlier_detection = o;
  }
  return out;
}
