// istiod's `grpc` generator, for proxyless gRPC clients and servers (node metadata GENERATOR=grpc, which the gRPC
// bootstrap the agent writes sets). gRPC asks for every resource by name and understands a subset of Envoy's config:
// - LDS `host:port` (the target of `xds:///host:port`; short names are expanded as in the proxy's namespace): an
//   api_listener whose HttpConnectionManager takes its routes over RDS, named like the cluster `outbound|port||host`.
// - RDS `outbound|port||host`: one virtual host, the service's, with the routes a sidecar gets (its VirtualService).
// - CDS `outbound|port|subset|host`: an EDS cluster, with the DestinationRule's load balancer, max requests, and mTLS
//   only when it says ISTIO_MUTUAL (gRPC cannot fall back to plaintext, so there is no auto-mTLS, as in istiod).
// - EDS: each cluster's endpoints in one locality, with the locality weight gRPC needs (it skips localities without).
// - LDS `xds.istio.io/grpc/lds/inbound/IP:port` (an xDS gRPC server): a listener for the proxy's own endpoint on
//   that port, plaintext or mTLS (STRICT; PERMISSIVE counts as STRICT when the workload is labelled
//   security.istio.io/tlsMode=istio, as istiod), routes answered by the server itself (non_forwarding_action).
// TLS names the certificate provider instance `default` of the gRPC bootstrap (file_watcher: OUTPUT_CERTS).

import { packAny } from '../envoy-protos';
import { effectivePolicy } from './gen-lb-policy';
import { meshServiceRoutes } from './gen-routes';
import { labelsMatch, type Service, type ServiceInstance, type TrafficPolicy } from './model';
import type { Proxy } from './proxy';
import type { PushContext } from './push-context';
import {
  ADS_SOURCE,
  CLUSTER,
  clusterName,
  ENDPOINTS,
  encodeResource,
  LISTENER,
  type Resource,
  ROUTE,
  TYPE_URLS,
} from './resources';

export const GRPC_GENERATOR = 'grpc';
const INBOUND_PREFIX = 'xds.istio.io/grpc/lds/inbound/';
const HCM = 'envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager';
const ROUTER = 'envoy.extensions.filters.http.router.v3.Router';
const FAULT = 'envoy.extensions.filters.http.fault.v3.HTTPFault';
const UPSTREAM_TLS = 'envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext';
const DOWNSTREAM_TLS = 'envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext';
const TLS_MODE_LABEL = 'security.istio.io/tlsMode';

const ROUTER_FILTER = Object.freeze({ name: 'envoy.filters.http.router', typed_config: packAny(ROUTER, {}) });
const FAULT_FILTER = Object.freeze({ name: 'envoy.filters.http.fault', typed_config: packAny(FAULT, {}) });

/** The resources of one type a gRPC node asked for, by name (gRPC never subscribes to a wildcard). */
export function generateGrpc(
  push: PushContext,
  proxy: Proxy,
  typeUrl: string,
  names: ReadonlySet<string>,
): ReadonlyMap<string, Resource> {
  const out = new Map<string, Resource>();
  const add = (r: Resource | undefined) => r && out.set(r.name, r);
  for (const name of names) {
    switch (typeUrl) {
      case TYPE_URLS.listener:
        add(name.startsWith(INBOUND_PREFIX) ? inboundListener(push, proxy, name) : outboundListener(push, proxy, name));
        break;
      case TYPE_URLS.route:
        add(route(push, proxy, name));
        break;
      case TYPE_URLS.cluster:
        add(cluster(push, proxy, name));
        break;
      case TYPE_URLS.endpoint:
        add(endpoints(push, proxy, name));
        break;
    }
  }
  return out;
}

/** A visible service by the name gRPC was given: its hostname, or a short name in the proxy's namespace. */
function serviceFor(push: PushContext, proxy: Proxy, host: string): Service | undefined {
  const scope = push.scopeFor(proxy);
  const cands = [host, `${host}.${proxy.namespace}.svc.cluster.local`];
  for (const suffix of [`.${proxy.namespace}`, `.${proxy.namespace}.svc`]) {
    if (host.endsWith(suffix)) cands.push(`${host.slice(0, -suffix.length)}.${proxy.namespace}.svc.cluster.local`);
  }
  for (const h of cands) {
    const svc = scope.services.find((s) => s.hostname === h);
    if (svc) return svc;
  }
  return undefined;
}

/** A Kubernetes-style host and the short names serviceFor() accepts for it from `namespace`. */
function aliases(hostname: string, namespace: string): string[] {
  const suffix = `.${namespace}.svc.cluster.local`;
  if (!hostname.endsWith(suffix)) return [hostname];
  const short = hostname.slice(0, -suffix.length);
  return [hostname, short, `${short}.${namespace}`, `${short}.${namespace}.svc`];
}

function splitHostPort(s: string): { host: string; port: number } | undefined {
  const m = /^\[?([^\]]*?)\]?:(\d+)$/.exec(s);
  if (!m) return undefined;
  const port = Number(m[2]);
  return port > 0 && port < 65536 ? { host: m[1]!, port } : undefined;
}

/** `outbound|port|subset|host` -> its parts; undefined for anything else. */
function parseClusterName(name: string): { port: number; subset: string; host: string } | undefined {
  const p = name.split('|');
  if (p.length !== 4 || p[0] !== 'outbound' || !/^\d+$/.test(p[1]!) || !p[3]) return undefined;
  return { port: Number(p[1]), subset: p[2]!, host: p[3] };
}

function outboundListener(push: PushContext, proxy: Proxy, name: string): Resource | undefined {
  const hp = splitHostPort(name);
  if (!hp) return undefined;
  const svc = serviceFor(push, proxy, hp.host);
  if (!svc?.ports.some((p) => p.number === hp.port)) return undefined;
  const hcm = {
    http_filters: [FAULT_FILTER, ROUTER_FILTER],
    rds: { config_source: ADS_SOURCE, route_config_name: clusterName(hp.port, '', svc.hostname) },
  };
  return encodeResource(LISTENER, name, {
    name,
    // The service's address, as istiod's GetAddressForProxy (gRPC does not use it).
    address: {
      socket_address: { address: svc.addresses.find((x) => !x.includes('/')) ?? '0.0.0.0', port_value: hp.port },
    },
    api_listener: { api_listener: packAny(HCM, hcm) },
  });
}

function route(push: PushContext, proxy: Proxy, name: string): Resource | undefined {
  const c = parseClusterName(name);
  const svc = c && serviceFor(push, proxy, c.host);
  if (!c || !svc || c.subset) return undefined;
  const routes = meshServiceRoutes(push, svc.hostname, c.port, proxy.namespace, proxy.labels);
  // gRPC matches a virtual host against the name it dialled (`xds:///echo:7070` -> `echo:7070`): every name the
  // listener answers to, with and without the port. The configuration holds this one service, so none collide.
  const domains = aliases(svc.hostname, proxy.namespace).flatMap((h) => [h, `${h}:${c.port}`]);
  const vh = { name: `${svc.hostname}:${c.port}`, domains, routes };
  return encodeResource(ROUTE, name, { name, virtual_hosts: [vh] });
}

interface Target {
  svc: Service;
  port: number;
  subset?: { name: string; labels: Readonly<Record<string, string>>; trafficPolicy?: TrafficPolicy };
  policy: TrafficPolicy;
}

function target(push: PushContext, proxy: Proxy, name: string): Target | undefined {
  const c = parseClusterName(name);
  const svc = c && serviceFor(push, proxy, c.host);
  if (!c || !svc || svc.hostname !== c.host || !svc.ports.some((p) => p.number === c.port)) return undefined;
  const dr = push.destinationRule(svc.hostname, proxy.namespace);
  const subset = c.subset ? dr?.spec.subsets.find((s) => s.name === c.subset) : undefined;
  if (c.subset && !subset) return undefined;
  return { svc, port: c.port, subset, policy: effectivePolicy(dr?.spec.trafficPolicy, subset?.trafficPolicy, c.port) };
}

function cluster(push: PushContext, proxy: Proxy, name: string): Resource | undefined {
  const t = target(push, proxy, name);
  if (!t || t.svc.resolution !== 'STATIC') return undefined;
  const out: Record<string, unknown> = {
    name,
    type: 'EDS',
    eds_cluster_config: { service_name: name, eds_config: ADS_SOURCE },
  };
  if (t.policy.consistentHash) {
    out.lb_policy = 'RING_HASH';
    out.ring_hash_lb_config = { minimum_ring_size: { value: 1024 } };
  } else if (t.policy.loadBalancer === 'LEAST_REQUEST') out.lb_policy = 'LEAST_REQUEST';
  const maxRequests = t.policy.connectionPool?.http?.http2MaxRequests;
  if (maxRequests && maxRequests > 0) out.circuit_breakers = { thresholds: [{ max_requests: { value: maxRequests } }] };
  if (t.policy.tls?.mode === 'ISTIO_MUTUAL') {
    const given = t.policy.tls.subjectAltNames;
    const sans = given.length ? given.map((x) => ({ exact: x })) : serviceAccountMatchers(push, t);
    out.transport_socket = {
      name: 'envoy.transport_sockets.tls',
      typed_config: packAny(UPSTREAM_TLS, { common_tls_context: commonTls(sans) }),
    };
  }
  return encodeResource(CLUSTER, name, out);
}

function instancesOf(push: PushContext, t: Target): readonly ServiceInstance[] {
  const all = push.instances(t.svc.hostname, t.port);
  return t.subset ? all.filter((i) => labelsMatch(t.subset!.labels, i.labels)) : all;
}

/** The service accounts the endpoints declare (istiod: the service's accounts), for the client's SAN check: any
 * trust domain, the root already pins it. */
function serviceAccountMatchers(push: PushContext, t: Target): Record<string, unknown>[] {
  const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  const declared = instancesOf(push, t).flatMap((i) =>
    i.identity ? [`${i.identity.namespace}/${i.identity.serviceAccount}`] : [],
  );
  const ids = new Set(declared);
  return [...ids].sort().map((id) => {
    const [ns, sa] = id.split('/') as [string, string];
    return { safe_regex: { regex: `^spiffe://[^/]+/ns/${escape(ns)}/sa/${escape(sa)}$` } };
  });
}

function endpoints(push: PushContext, proxy: Proxy, name: string): Resource {
  const t = target(push, proxy, name);
  const instances = t ? instancesOf(push, t) : [];
  if (!instances.length) return encodeResource(ENDPOINTS, name, { cluster_name: name, endpoints: [] });
  const weights = instances.map((i) => i.weight ?? 1);
  return encodeResource(ENDPOINTS, name, {
    cluster_name: name,
    endpoints: [
      {
        locality: {},
        load_balancing_weight: { value: weights.reduce((a, b) => a + b, 0) },
        lb_endpoints: instances.map((i, n) => ({
          endpoint: { address: { socket_address: { address: i.address, port_value: i.port } } },
          load_balancing_weight: { value: weights[n] },
        })),
      },
    ],
  });
}

/** The certificate and root from the bootstrap's `default` provider, in both the current and the deprecated fields
 * (gRPC libraries read one or the other), as istiod sends them. */
function commonTls(sans: readonly Record<string, unknown>[]): Record<string, unknown> {
  return {
    tls_certificate_provider_instance: { instance_name: 'default', certificate_name: 'default' },
    tls_certificate_certificate_provider_instance: { instance_name: 'default', certificate_name: 'default' },
    combined_validation_context: {
      default_validation_context: {
        ...(sans.length && { match_subject_alt_names: sans }),
        ca_certificate_provider_instance: { instance_name: 'default', certificate_name: 'ROOTCA' },
      },
      validation_context_certificate_provider_instance: { instance_name: 'default', certificate_name: 'ROOTCA' },
    },
  };
}

function inboundListener(push: PushContext, proxy: Proxy, name: string): Resource | undefined {
  const hp = splitHostPort(name.slice(INBOUND_PREFIX.length));
  if (!hp) return undefined;
  const own = ownInstance(push, proxy, hp.port);
  if (!own) return undefined;
  let mode = push.peerAuthenticationMode(proxy);
  const sidecarLabel = proxy.labels[TLS_MODE_LABEL] === 'istio' || own.labels[TLS_MODE_LABEL] === 'istio';
  if (mode === 'PERMISSIVE' && sidecarLabel) mode = 'STRICT';
  // gRPC servers cannot tell plaintext from TLS on one port: PERMISSIVE serves plaintext, as istiod.
  const mtls = mode === 'STRICT';
  const hcm = {
    route_config: {
      name: 'inbound',
      virtual_hosts: [
        {
          name: 'inbound',
          domains: ['*'],
          routes: [{ match: { prefix: '/' }, non_forwarding_action: {} }],
        },
      ],
    },
    http_filters: [ROUTER_FILTER],
  };
  const chain: Record<string, unknown> = {
    name: mtls ? 'inbound-mtls' : 'inbound-plaintext',
    filters: [{ name: mtls ? 'inbound-hcmmtls' : 'inbound-hcmplaintext', typed_config: packAny(HCM, hcm) }],
  };
  if (mtls) {
    chain.transport_socket = {
      name: 'envoy.transport_sockets.tls',
      typed_config: packAny(DOWNSTREAM_TLS, {
        common_tls_context: commonTls([]),
        require_client_certificate: { value: true },
      }),
    };
  }
  const address = { socket_address: { address: hp.host, port_value: hp.port } };
  return encodeResource(LISTENER, name, { name, address, filter_chains: [chain] });
}

/** The proxy's own endpoint on a workload port: an instance at the proxy's address (its IP or INSTANCE_IPS). */
function ownInstance(push: PushContext, proxy: Proxy, port: number): ServiceInstance | undefined {
  for (const svc of push.services) {
    for (const p of svc.ports) {
      const i = push.instances(svc.hostname, p.number).find((x) => x.port === port && proxy.ips.includes(x.address));
      if (i) return i;
    }
  }
  return undefined;
}
