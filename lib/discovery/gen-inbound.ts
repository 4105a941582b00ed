// Inbound side of a sidecar, for its own workload: the service instances whose address is the proxy's IP.
// With no traffic capture, each such endpoint port is an Envoy listener on <workload address>:<port> that
// terminates Istio's mTLS (workload certificate and ROOTCA over SDS, the caller's SPIFFE id required) and
// forwards to the app on 127.0.0.1:<port> (cluster `inbound|<port>||`). PeerAuthentication decides the mode:
// STRICT accepts only mTLS; PERMISSIVE (the default) also plaintext, told apart by the TLS inspector; DISABLE
// only plaintext. The caller's identity reaches the app in x-forwarded-client-cert (APPEND_FORWARD, as istiod).
// Under COMPLIANCE_POLICY the mTLS context gets istiod's TLS parameters (pilot/pkg/security/authn/utils
// BuildInboundTLS: its SupportedCiphers, TLS 1.2-1.3) as its EnforceCompliance restricts them; without, none
// (Envoy's defaults).

import { packAny } from '../envoy-protos';
import { isHttp, type ServiceInstance } from './model';
import type { Proxy } from './proxy';
import type { PushContext } from './push-context';
import { CLUSTER, dur, encodeResource, LISTENER, type Resource } from './resources';
import { SDS_SOURCE } from './gen-secrets';
import { hcmTracing, tracingKey } from './gen-tracing';
import { type ProxyWasm, proxyWasm } from './gen-wasm';

const HCM = 'envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager';
const ROUTER = 'envoy.extensions.filters.http.router.v3.Router';
const TCP_PROXY = 'envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy';
const DOWNSTREAM_TLS = 'envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext';
const TLS_INSPECTOR = 'envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector';
/** Where the app listens behind its sidecar. */
export const APP_BIND = '127.0.0.1';

export const inboundClusterName = (port: number) => `inbound|${port}||`;

/** istiod's SupportedCiphers for inbound mesh mTLS, in its order. */
const ISTIOD_INBOUND_CIPHERS = [
  'ECDHE-ECDSA-AES256-GCM-SHA384',
  'ECDHE-RSA-AES256-GCM-SHA384',
  'ECDHE-ECDSA-AES128-GCM-SHA256',
  'ECDHE-RSA-AES128-GCM-SHA256',
  'AES256-GCM-SHA384',
  'AES128-GCM-SHA256',
];

function inboundTlsParams(push: PushContext): Record<string, unknown> | undefined {
  return push.tlsCompliance?.({
    cipher_suites: ISTIOD_INBOUND_CIPHERS,
    tls_minimum_protocol_version: 'TLSv1_2',
    tls_maximum_protocol_version: 'TLSv1_3',
  });
}

/** One entry per workload port of this proxy (the first instance wins a port two services share). */
function ownPorts(push: PushContext, proxy: Proxy): ServiceInstance[] {
  if (proxy.type !== 'sidecar' || !proxy.ip || proxy.ip === APP_BIND) return [];
  const byPort = new Map<number, ServiceInstance>();
  for (const svc of push.services) {
    if (svc.location !== 'MESH_INTERNAL') continue;
    for (const p of svc.ports) {
      for (const i of push.instances(svc.hostname, p.number)) {
        if (i.address === proxy.ip && !byPort.has(i.port)) byPort.set(i.port, i);
      }
    }
  }
  return [...byPort.values()].sort((a, b) => a.port - b.port);
}

export function inboundClusters(push: PushContext, proxy: Proxy): Resource[] {
  return push.memoize(`inbound-cds|${proxy.ip}|${proxy.type}`, () =>
    ownPorts(push, proxy).map((i) => {
      const name = inboundClusterName(i.port);
      return encodeResource(CLUSTER, name, {
        name,
        type: 'STATIC',
        connect_timeout: dur(10_000),
        load_assignment: {
          cluster_name: name,
          endpoints: [
            {
              lb_endpoints: [{ endpoint: { address: { socket_address: { address: APP_BIND, port_value: i.port } } } }],
            },
          ],
        },
      });
    }),
  );
}

export function inboundListeners(push: PushContext, proxy: Proxy): Resource[] {
  // In capture mode the same chains sit on virtualInbound (inboundCaptureChains): the rules send every inbound
  // connection to 15006, and the app keeps its own port on the host's address.
  if (proxy.capture) return [];
  const mode = push.peerAuthenticationMode(proxy);
  const wasm = proxyWasm(push, proxy);
  return push.memoize(`inbound-lds|${proxy.ip}|${proxy.type}|${mode}|${tracingKey(push, proxy)}|${wasm.key}`, () =>
    ownPorts(push, proxy).map((i) => {
      const name = `inbound_${proxy.ip}_${i.port}`;
      return encodeResource(LISTENER, name, {
        name,
        address: { socket_address: { address: proxy.ip, port_value: i.port } },
        traffic_direction: 'INBOUND',
        listener_filters:
          mode === 'PERMISSIVE'
            ? [{ name: 'envoy.filters.listener.tls_inspector', typed_config: packAny(TLS_INSPECTOR, {}) }]
            : [],
        filter_chains: portChains(i, mode, hcmTracing(push, proxy, 'inbound'), wasm, inboundTlsParams(push)),
      });
    }),
  );
}

/** Capture mode: each workload port's chains for virtualInbound, matched by the original destination port. */
export function inboundCaptureChains(push: PushContext, proxy: Proxy): Record<string, unknown>[] {
  const mode = push.peerAuthenticationMode(proxy);
  const tracing = hcmTracing(push, proxy, 'inbound');
  const wasm = proxyWasm(push, proxy);
  const params = inboundTlsParams(push);
  return ownPorts(push, proxy).flatMap((i) =>
    portChains(i, mode, tracing, wasm, params).map((c) => ({
      ...c,
      name: `${inboundClusterName(i.port)}${c.transport_socket ? 'mtls' : ''}`,
      filter_chain_match: { destination_port: { value: i.port }, ...(c.filter_chain_match as object | undefined) },
    })),
  );
}

/** STRICT accepts only mTLS; DISABLE only plaintext; PERMISSIVE both, told apart by the TLS inspector. */
function portChains(
  i: ServiceInstance,
  mode: string,
  tracing: Record<string, unknown> | undefined,
  wasm: ProxyWasm,
  tlsParams: Record<string, unknown> | undefined,
): Record<string, unknown>[] {
  const filters = isHttp(i.servicePort.protocol)
    ? [filter(i, tracing, wasm)]
    : [...wasm.network('inbound', i.port), filter(i, tracing, wasm)];
  const mtls = { filters, transport_socket: downstreamTls(tlsParams) };
  if (mode === 'STRICT') return [mtls];
  if (mode === 'DISABLE') return [{ filters }];
  return [{ ...mtls, filter_chain_match: { transport_protocol: 'tls' } }, { filters }];
}

function filter(
  i: ServiceInstance,
  tracing: Record<string, unknown> | undefined,
  wasm: ProxyWasm,
): Record<string, unknown> {
  const cluster = inboundClusterName(i.port);
  if (!isHttp(i.servicePort.protocol)) {
    return {
      name: 'envoy.filters.network.tcp_proxy',
      typed_config: packAny(TCP_PROXY, { stat_prefix: cluster, cluster }),
    };
  }
  return {
    name: 'envoy.filters.network.http_connection_manager',
    typed_config: packAny(HCM, {
      stat_prefix: cluster,
      codec_type: 'AUTO',
      route_config: {
        name: cluster,
        virtual_hosts: [
          {
            name: 'inbound',
            domains: ['*'],
            routes: [{ match: { prefix: '/' }, route: { cluster, timeout: dur(0) } }],
          },
        ],
      },
      http_filters: [
        ...wasm.http('inbound', i.port),
        { name: 'envoy.filters.http.router', typed_config: packAny(ROUTER, {}) },
      ],
      // As istiod's inbound HCM (listener_inbound.go buildSidecarInboundHTTPOpts, util.GetProxyHeaders): the
      // caller's certificate details (subject, SPIFFE URI, DNS SANs) are appended to any x-forwarded-client-cert
      // already there, for the app.
      forward_client_cert_details: 'APPEND_FORWARD',
      set_current_client_cert_details: { subject: { value: true }, dns: true, uri: true },
      server_name: 'istio-envoy',
      normalize_path: { value: true },
      ...(tracing && { tracing }),
    }),
  };
}

function downstreamTls(tlsParams: Record<string, unknown> | undefined): Record<string, unknown> {
  return {
    name: 'envoy.transport_sockets.tls',
    typed_config: packAny(DOWNSTREAM_TLS, {
      require_client_certificate: { value: true },
      common_tls_context: {
        ...(tlsParams && { tls_params: tlsParams }),
        tls_certificate_sds_secret_configs: [{ name: 'default', sds_config: SDS_SOURCE }],
        combined_validation_context: {
          // Any workload of the mesh (the root pins the trust domain); authorization is not this server's job.
          default_validation_context: {
            match_typed_subject_alt_names: [{ san_type: 'URI', matcher: { prefix: 'spiffe://' } }],
          },
          validation_context_sds_secret_config: { name: 'ROOTCA', sds_config: SDS_SOURCE },
        },
      },
    }),
  };
}
