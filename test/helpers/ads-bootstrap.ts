// A minimal Envoy bootstrap for tests: admin on loopback, LDS and CDS over ADS (SotW or Delta) through a static
// `xds-grpc` cluster (HTTP/2) at a Unix socket or a TCP address. The agent's real bootstrap is lib/bootstrap.ts.

export interface AdsBootstrapOptions {
  nodeId: string;
  cluster?: string;
  adminPort: number;
  delta: boolean;
  /** `unix:/abs/path`, an absolute socket path, or `host:port`. */
  xdsAddress: string;
  metadata?: Record<string, unknown>;
  /** Sent as `authorization: Bearer <token>` on the ADS stream (the discovery server authenticates callers). */
  xdsToken?: string;
}

function address(xds: string): Record<string, unknown> {
  if (xds.startsWith('unix:') || xds.startsWith('/')) return { pipe: { path: xds.replace(/^unix:/, '') } };
  const i = xds.lastIndexOf(':');
  return { socket_address: { address: xds.slice(0, i), port_value: Number(xds.slice(i + 1)) } };
}

export function adsBootstrap(o: AdsBootstrapOptions): Record<string, unknown> {
  const ads = { ads: {}, resource_api_version: 'V3', initial_fetch_timeout: '0s' };
  return {
    node: { id: o.nodeId, cluster: o.cluster ?? 'test', metadata: o.metadata ?? {} },
    admin: { address: { socket_address: { address: '127.0.0.1', port_value: o.adminPort } } },
    dynamic_resources: {
      ads_config: {
        api_type: o.delta ? 'DELTA_GRPC' : 'GRPC',
        transport_api_version: 'V3',
        grpc_services: [{
          envoy_grpc: { cluster_name: 'xds-grpc' },
          ...(o.xdsToken && { initial_metadata: [{ key: 'authorization', value: `Bearer ${o.xdsToken}` }] }),
        }],
        set_node_on_first_message_only: true,
      },
      cds_config: ads,
      lds_config: ads,
    },
    static_resources: {
      clusters: [{
        name: 'xds-grpc',
        type: 'STATIC',
        connect_timeout: '1s',
        typed_extension_protocol_options: {
          'envoy.extensions.upstreams.http.v3.HttpProtocolOptions': {
            '@type': 'type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions',
            explicit_http_config: { http2_protocol_options: {} },
          },
        },
        load_assignment: { cluster_name: 'xds-grpc', endpoints: [{ lb_endpoints: [{ endpoint: { address: address(o.xdsAddress) } }] }] },
      }],
    },
  };
}
