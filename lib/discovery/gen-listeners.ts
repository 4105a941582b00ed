// LDS. With no traffic capture on the host, a sidecar exposes each service port on a loopback listener the app
// calls (Istio's Sidecar egress listener with a bind address): HTTP ports route by Host through RDS `<port>`, TCP
// ports proxy to the one service on that port. A router binds the ports of the Gateways that select it.
// If a port is taken on the host, Envoy NACKs that listener; the server reports it and does not retry it.

import { packAny } from '../envoy-protos';
import { isHttp, type Service } from './model';
import { tcpProxyFilter } from './gen-tcp';
import type { Proxy } from './proxy';
import type { ProxyScope, PushContext } from './push-context';
import { CORS_FILTER, FAULT_FILTER } from './gen-http-policy';
import { ADS_SOURCE, dur, encodeResource, LISTENER, type Resource } from './resources';
import { sidecarRouteName } from './gen-routes';
import { captureListeners } from './gen-capture-listeners';
import { inboundCaptureChains } from './gen-inbound';
import { routerListeners } from './gen-gateway-tls';
import { hcmTracing, tracingKey } from './gen-tracing';

const HCM = 'envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager';
const ROUTER = 'envoy.extensions.filters.http.router.v3.Router';
const GRPC_STATS = 'envoy.extensions.filters.http.grpc_stats.v3.FilterConfig';
const FAULT = 'envoy.extensions.filters.http.fault.v3.HTTPFault';
const CORS = 'envoy.extensions.filters.http.cors.v3.Cors';
const UUID_REQUEST_ID = 'envoy.extensions.request_id.uuid.v3.UuidRequestIdConfig';

/** Where a sidecar's outbound listeners listen. */
export const SIDECAR_BIND = '127.0.0.1';

export function buildListeners(push: PushContext, proxy: Proxy): ReadonlyMap<string, Resource> {
  if (proxy.type === 'sidecar') {
    const scope = push.scopeFor(proxy);
    const tk = tracingKey(push, proxy);
    if (proxy.capture) {
      // The workload's own ports (inbound mTLS) depend on the proxy's address and PeerAuthentication mode.
      const key = `lds|sidecar-capture|${scope.key}|${proxy.ip}|${push.peerAuthenticationMode(proxy)}|${tk}`;
      return push.memoize(key, () => captureListeners(push, scope, inboundCaptureChains(push, proxy), hcmTracing(push, proxy, 'outbound')));
    }
    return push.memoize(`lds|sidecar|${scope.key}|${tk}`, () => sidecarListeners(push, scope, hcmTracing(push, proxy, 'outbound')));
  }
  const gws = push.gatewaysFor(proxy);
  // Plaintext, HTTPS, TLS and TCP servers: ./gen-gateway-tls.ts.
  const key = `lds|router|${proxy.namespace}|${gws.map((g) => `${g.meta.namespace}/${g.meta.name}`).join(',')}|${tracingKey(push, proxy)}`;
  return push.memoize(key, () => routerListeners(push, gws, proxy.namespace, hcmTracing(push, proxy, 'gateway')));
}

function sidecarListeners(push: PushContext, scope: ProxyScope, tracing: Record<string, unknown> | undefined): Map<string, Resource> {
  const http = new Set<number>();
  const tcp = new Map<number, Service>(); // port -> the first service with a TCP port there
  for (const svc of scope.services) {
    for (const p of svc.ports) {
      if (isHttp(p.protocol)) http.add(p.number);
      else if (!tcp.has(p.number)) tcp.set(p.number, svc);
    }
  }
  const out = new Map<string, Resource>();
  for (const port of [...new Set([...http, ...tcp.keys()])].sort((a, b) => a - b)) {
    const name = `${SIDECAR_BIND}_${port}`;
    // A port with both HTTP and TCP services is served as HTTP: Host is the only way to tell them apart.
    const filter = http.has(port)
      ? hcmFilter(name, sidecarRouteName(port), false, tracing)
      : tcpProxyFilter(push, tcp.get(port)!, port, scope.namespace);
    out.set(name, encodeResource(LISTENER, name, listener(name, SIDECAR_BIND, port, filter, 'OUTBOUND')));
  }
  return out;
}

function listener(name: string, address: string, port: number, filter: Record<string, unknown>, direction: string): Record<string, unknown> {
  return {
    name,
    address: { socket_address: { address, port_value: port } },
    filter_chains: [{ filters: [filter] }],
    traffic_direction: direction,
  };
}

/** `tracing`: the HCM's tracing block (./gen-tracing.ts), when tracing is configured. */
export function hcmFilter(statPrefix: string, routeName: string, edge: boolean, tracing?: Record<string, unknown>): Record<string, unknown> {
  // The settings istiod puts on every HTTP connection manager (istio/istio 86c9f01f,
  // pilot/pkg/networking/core/listener_builder.go buildHTTPConnectionManager). No mTLS here, so no client
  // certificate to forward: SANITIZE_SET drops any x-forwarded-client-cert a client sent.
  return {
    name: 'envoy.filters.network.http_connection_manager',
    typed_config: packAny(HCM, {
      stat_prefix: statPrefix,
      codec_type: 'AUTO',
      rds: { config_source: { ...ADS_SOURCE, initial_fetch_timeout: dur(0) }, route_config_name: routeName },
      http_filters: HTTP_FILTERS,
      use_remote_address: { value: edge },
      normalize_path: { value: true },
      path_with_escaped_slashes_action: 'KEEP_UNCHANGED',
      upgrade_configs: [{ upgrade_type: 'websocket' }],
      stream_idle_timeout: dur(0),
      proxy_100_continue: true,
      server_name: 'istio-envoy',
      forward_client_cert_details: 'SANITIZE_SET',
      set_current_client_cert_details: { subject: { value: true }, dns: true, uri: true },
      request_id_extension: { typed_config: packAny(UUID_REQUEST_ID, { use_request_id_for_trace_sampling: { value: true } }) },
      access_log: [],
      ...(tracing && { tracing }),
    }),
  };
}

// grpc_stats, then fault and cors (which read the routes' typed_per_filter_config), then the router: istiod's order.
const HTTP_FILTERS = [
  { name: 'envoy.filters.http.grpc_stats', typed_config: packAny(GRPC_STATS, { emit_filter_state: true, stats_for_all_methods: { value: false } }) },
  { name: FAULT_FILTER, typed_config: packAny(FAULT, {}) },
  { name: CORS_FILTER, typed_config: packAny(CORS, {}) },
  { name: 'envoy.filters.http.router', typed_config: packAny(ROUTER, {}) },
];
