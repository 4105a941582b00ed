// What several generators share, so that they import it from here and never from each other: the names that tie
// listeners, routes and clusters together, and the HTTP connection manager every HTTP listener carries.

import { packAny } from '../envoy-protos';
import { CORS_FILTER, FAULT_FILTER } from './gen-http-policy';
import type { Config, GatewayServer, GatewaySpec } from './model';
import { ADS_SOURCE, dur } from './resources';

const HCM = 'envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager';
const ROUTER = 'envoy.extensions.filters.http.router.v3.Router';
const GRPC_STATS = 'envoy.extensions.filters.http.grpc_stats.v3.FilterConfig';
const FAULT = 'envoy.extensions.filters.http.fault.v3.HTTPFault';
const CORS = 'envoy.extensions.filters.http.cors.v3.Cors';
const UUID_REQUEST_ID = 'envoy.extensions.request_id.uuid.v3.UuidRequestIdConfig';

/** Where a sidecar's outbound listeners listen. */
export const SIDECAR_BIND = '127.0.0.1';

export const PASSTHROUGH_CLUSTER = 'PassthroughCluster';
export const BLACKHOLE_CLUSTER = 'BlackHoleCluster';

export const sidecarRouteName = (port: number) => String(port);

export const isPlainHttp = (s: GatewayServer) =>
  s.port.protocol === 'HTTP' || s.port.protocol === 'HTTP2' || s.port.protocol === 'GRPC';
export const terminatesHttps = (s: GatewayServer) =>
  s.port.protocol === 'HTTPS' && s.tls !== undefined && s.tls.mode !== 'PASSTHROUGH';

/** istiod's gatewayRDSRouteName: `http.<port>` for plaintext servers, one name per terminating HTTPS server. */
export function gatewayServerRouteName(gw: Config<GatewaySpec>, s: GatewayServer): string | undefined {
  if (isPlainHttp(s)) return `http.${s.port.number}`;
  if (terminatesHttps(s)) return `https.${s.port.number}.${s.port.name}.${gw.meta.name}.${gw.meta.namespace}`;
  return undefined;
}

/**
 * `tracing`: the HCM's tracing block (./gen-tracing.ts), when tracing is configured. `wasm`: WasmPlugin filters
 * (./gen-wasm.ts), which istiod puts before its own (grpc_stats, fault, cors, router).
 */
export function hcmFilter(
  statPrefix: string,
  routeName: string,
  edge: boolean,
  tracing?: Record<string, unknown>,
  wasm: readonly Record<string, unknown>[] = [],
): Record<string, unknown> {
  // The settings istiod puts on every HTTP connection manager (istio/istio 86c9f01f,
  // pilot/pkg/networking/core/listener_builder.go buildHTTPConnectionManager). No mTLS here, so no client
  // certificate to forward: SANITIZE_SET drops any x-forwarded-client-cert a client sent.
  return {
    name: 'envoy.filters.network.http_connection_manager',
    typed_config: packAny(HCM, {
      stat_prefix: statPrefix,
      codec_type: 'AUTO',
      rds: { config_source: { ...ADS_SOURCE, initial_fetch_timeout: dur(0) }, route_config_name: routeName },
      http_filters: wasm.length ? [...wasm, ...HTTP_FILTERS] : HTTP_FILTERS,
      use_remote_address: { value: edge },
      normalize_path: { value: true },
      path_with_escaped_slashes_action: 'KEEP_UNCHANGED',
      upgrade_configs: [{ upgrade_type: 'websocket' }],
      stream_idle_timeout: dur(0),
      proxy_100_continue: true,
      server_name: 'istio-envoy',
      forward_client_cert_details: 'SANITIZE_SET',
      set_current_client_cert_details: { subject: { value: true }, dns: true, uri: true },
      request_id_extension: {
        typed_config: packAny(UUID_REQUEST_ID, { use_request_id_for_trace_sampling: { value: true } }),
      },
      access_log: [],
      ...(tracing && { tracing }),
    }),
  };
}

// grpc_stats, then fault and cors (which read the routes' typed_per_filter_config), then the router: istiod's order.
const HTTP_FILTERS = [
  {
    name: 'envoy.filters.http.grpc_stats',
    typed_config: packAny(GRPC_STATS, { emit_filter_state: true, stats_for_all_methods: { value: false } }),
  },
  { name: FAULT_FILTER, typed_config: packAny(FAULT, {}) },
  { name: CORS_FILTER, typed_config: packAny(CORS, {}) },
  { name: 'envoy.filters.http.router', typed_config: packAny(ROUTER, {}) },
];
