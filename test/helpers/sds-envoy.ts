// A real Envoy whose TLS secrets come over SDS from a Unix socket (the agent's SDS server): an optional inbound
// mTLS listener in front of a loopback backend (XFCC set from the client certificate), and an optional plaintext
// outbound listener that originates mTLS to a peer, checking its SPIFFE SAN. Everything is stopped by stop().

import type { ChildProcess } from 'node:child_process';
import * as path from 'node:path';
import { spawnTestEnvoy } from './discovery-envoy';
import { freePort, httpRequest } from './harness';

export interface SdsEnvoyOptions {
  sdsSocket: string;
  nodeId?: string;
  /** mTLS listener -> backendPort. */
  inbound?: { port: number; backendPort: number; peerSanPrefix?: string };
  /** Plain HTTP listener -> mTLS to peerPort, which must present peerSan. */
  outbound?: { port: number; peerPort: number; peerSan: string };
  /** Secret names (default `default` and `ROOTCA`). */
  certName?: string;
  rootName?: string;
  delta?: boolean;
}

export interface SdsEnvoy {
  adminPort: number;
  proc: ChildProcess;
  logs(): string;
  stat(name: string): Promise<number>;
  stop(): Promise<void>;
}

const router = { name: 'envoy.filters.http.router', typed_config: { '@type': 'type.googleapis.com/envoy.extensions.filters.http.router.v3.Router' } };

export function sdsEnvoyBootstrap(o: SdsEnvoyOptions, adminPort: number): Record<string, unknown> {
  const sdsConfig = {
    api_config_source: { api_type: o.delta ? 'DELTA_GRPC' : 'GRPC', transport_api_version: 'V3', grpc_services: [{ envoy_grpc: { cluster_name: 'sds-grpc' } }], set_node_on_first_message_only: true },
    resource_api_version: 'V3',
    initial_fetch_timeout: '0s',
  };
  const common = (sanMatch?: unknown) => ({
    tls_certificate_sds_secret_configs: [{ name: o.certName ?? 'default', sds_config: sdsConfig }],
    combined_validation_context: {
      default_validation_context: sanMatch ? { match_typed_subject_alt_names: [sanMatch] } : {},
      validation_context_sds_secret_config: { name: o.rootName ?? 'ROOTCA', sds_config: sdsConfig },
    },
  });
  const cluster = (name: string, port: number, extra: Record<string, unknown> = {}) => ({
    name, type: 'STATIC', connect_timeout: '1s',
    load_assignment: { cluster_name: name, endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: '127.0.0.1', port_value: port } } } }] }] },
    ...extra,
  });
  const hcm = (prefix: string, clusterName: string, extra: Record<string, unknown> = {}) => ({
    name: 'envoy.filters.network.http_connection_manager',
    typed_config: {
      '@type': 'type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager',
      stat_prefix: prefix,
      route_config: { virtual_hosts: [{ name: 'all', domains: ['*'], routes: [{ match: { prefix: '/' }, route: { cluster: clusterName, timeout: '10s' } }] }] },
      http_filters: [router],
      ...extra,
    },
  });
  const listeners: unknown[] = [];
  const clusters: unknown[] = [
    {
      name: 'sds-grpc', type: 'STATIC', connect_timeout: '1s',
      typed_extension_protocol_options: { 'envoy.extensions.upstreams.http.v3.HttpProtocolOptions': { '@type': 'type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions', explicit_http_config: { http2_protocol_options: {} } } },
      load_assignment: { cluster_name: 'sds-grpc', endpoints: [{ lb_endpoints: [{ endpoint: { address: { pipe: { path: path.resolve(o.sdsSocket) } } } }] }] },
    },
  ];
  if (o.inbound) {
    const san = o.inbound.peerSanPrefix ? { san_type: 'URI', matcher: { prefix: o.inbound.peerSanPrefix } } : undefined;
    listeners.push({
      name: 'inbound', address: { socket_address: { address: '127.0.0.1', port_value: o.inbound.port } },
      filter_chains: [{
        filters: [hcm('inbound', 'backend', { forward_client_cert_details: 'SANITIZE_SET', set_current_client_cert_details: { uri: true } })],
        transport_socket: {
          name: 'envoy.transport_sockets.tls',
          typed_config: { '@type': 'type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext', require_client_certificate: true, common_tls_context: common(san) },
        },
      }],
    });
    clusters.push(cluster('backend', o.inbound.backendPort));
  }
  if (o.outbound) {
    listeners.push({ name: 'outbound', address: { socket_address: { address: '127.0.0.1', port_value: o.outbound.port } }, filter_chains: [{ filters: [hcm('outbound', 'peer')] }] });
    clusters.push(cluster('peer', o.outbound.peerPort, {
      transport_socket: {
        name: 'envoy.transport_sockets.tls',
        typed_config: {
          '@type': 'type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext',
          common_tls_context: common({ san_type: 'URI', matcher: { exact: o.outbound.peerSan } }),
        },
      },
    }));
  }
  return {
    node: { id: o.nodeId ?? 'sidecar~127.0.0.1~test.ns~ns.svc.cluster.local', cluster: 'test' },
    admin: { address: { socket_address: { address: '127.0.0.1', port_value: adminPort } } },
    static_resources: { listeners, clusters },
  };
}

export async function startSdsEnvoy(o: SdsEnvoyOptions): Promise<SdsEnvoy> {
  const adminPort = await freePort();
  const envoy = await spawnTestEnvoy(sdsEnvoyBootstrap(o, adminPort), adminPort, 'pa-sds-envoy-');
  return {
    adminPort,
    ...envoy,
    stat: async (name) => {
      const body = (await httpRequest(`http://127.0.0.1:${adminPort}/stats?filter=${encodeURIComponent(`^${name.replace(/\./g, '\\.')}$`)}`)).body;
      const m = /: (\d+)/.exec(body);
      return m ? Number(m[1]) : 0;
    },
  };
}

/** Serial numbers (hex, upper case) of the certificates Envoy currently holds, from its /certs admin page. */
export async function envoyCertSerials(adminPort: number): Promise<string[]> {
  const j = JSON.parse((await httpRequest(`http://127.0.0.1:${adminPort}/certs`)).body) as { certificates?: { cert_chain?: { serial_number?: string }[] }[] };
  return (j.certificates ?? []).flatMap((c) => (c.cert_chain ?? []).map((x) => (x.serial_number ?? '').toUpperCase()));
}

export { freePort };
