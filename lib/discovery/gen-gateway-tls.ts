// A router's listeners, one per bind address and port of the Gateways that select it, as istiod builds them
// (istio/istio 86c9f01f, pilot/pkg/networking/core/gateway.go buildGatewayListeners, listener.go
// BuildListenerTLSContext, pilot/pkg/security/model/authentication.go):
// - plaintext HTTP servers share one filter chain, an HTTP connection manager on RDS `http.<port>`;
// - HTTPS servers that terminate TLS get a filter chain each, matched by SNI (the server's hosts, none for `*`),
//   with a DownstreamTlsContext and RDS `https.<port>.<portName>.<gateway>.<namespace>`;
// - TLS servers that terminate TLS, and TCP servers, proxy the connection (tcp_proxy) to the first matching `tcp`
//   route of the VirtualServices bound to the Gateway;
// - PASSTHROUGH servers get a filter chain per `tls` route match, by SNI, proxying the still encrypted stream;
// - a tls_inspector listener filter reads the SNI whenever a chain matches on it or terminates TLS.
// Certificates come over SDS: `kubernetes://<credentialName>` over ADS from this server, or the agent's own SDS
// (`file-cert:<cert>~<key>`, `file-root:<ca>`, and `default`/`ROOTCA` for ISTIO_MUTUAL) through `sds-grpc`.

import { packAny } from '../envoy-protos';
import type { EnvoyTlsParams } from '../tls-policy';
import { gatewayServerRouteName, hcmFilter, isPlainHttp, terminatesHttps } from './gen-common';
import { serverHostAccepts } from './gateway-hosts';
import { credentialCaResource, credentialResource, SDS_SOURCE } from './gen-secrets';
import type {
  Config,
  GatewayServer,
  GatewaySpec,
  RouteDestination,
  ServerTls,
  TlsVersion,
  VirtualServiceSpec,
} from './model';
import type { PushContext } from './push-context';
import { ADS_SOURCE, clusterName, encodeResource, LISTENER, type Resource } from './resources';
import { exportedTo } from './visibility';
import type { ProxyWasm } from './gen-wasm';

const DOWNSTREAM_TLS = 'envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext';
const TCP_PROXY = 'envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy';
const TLS_INSPECTOR = 'envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector';
const ALPN_HTTP = ['h2', 'http/1.1'];
const ALPN_ISTIO_TCP = ['istio-peer-exchange', 'istio', 'h2', 'http/1.1'];

type Entry = { gw: Config<GatewaySpec>; server: GatewayServer };

/** `tracing`: the gateway HCMs' tracing block (./gen-tracing.ts), when tracing is configured. */
export function routerListeners(
  push: PushContext,
  gws: readonly Config<GatewaySpec>[],
  proxyNs: string,
  tracing: Record<string, unknown> | undefined,
  wasm?: ProxyWasm,
): Map<string, Resource> {
  // One listener per port, named by the first server's bind address (two binds of one port would not both bind).
  const byPort = new Map<number, { bind: string; port: number; entries: Entry[] }>();
  for (const gw of gws) {
    for (const server of gw.spec.servers) {
      const l = byPort.get(server.port.number) ?? {
        bind: server.bind ?? '0.0.0.0',
        port: server.port.number,
        entries: [],
      };
      // One kind of server a port, as istiod: the first server's kind decides, the others are left out.
      if (l.entries.length && isPlainHttp(l.entries[0]!.server) !== isPlainHttp(server)) continue;
      l.entries.push({ gw, server });
      byPort.set(server.port.number, l);
    }
  }
  const out = new Map<string, Resource>();
  for (const l of byPort.values()) {
    const name = `${l.bind}_${l.port}`;
    const chains = isPlainHttp(l.entries[0]!.server)
      ? [{ filters: [hcmFilter(name, `http.${l.port}`, true, tracing, wasm?.http('gateway', l.port))] }]
      : tlsChains(push, l.entries, name, proxyNs, tracing, wasm);
    if (!chains.length) continue; // a TCP or TLS server no route binds: istiod leaves the listener out too
    const listener: Record<string, unknown> = {
      name,
      address: { socket_address: { address: l.bind, port_value: l.port } },
      filter_chains: chains,
      traffic_direction: 'OUTBOUND',
    };
    if (chains.some((c) => c.filter_chain_match || c.transport_socket)) {
      listener.listener_filters = [
        { name: 'envoy.filters.listener.tls_inspector', typed_config: packAny(TLS_INSPECTOR, {}) },
      ];
    }
    out.set(name, encodeResource(LISTENER, name, listener));
  }
  return out;
}

interface Chain {
  filter_chain_match?: Record<string, unknown>;
  transport_socket?: Record<string, unknown>;
  filters: Record<string, unknown>[];
}

function tlsChains(
  push: PushContext,
  entries: readonly Entry[],
  listenerName: string,
  proxyNs: string,
  tracing: Record<string, unknown> | undefined,
  wasm?: ProxyWasm,
): Chain[] {
  const chains: Chain[] = [];
  const sniSeen = new Set<string>();
  for (const { gw, server } of entries) {
    const vss = push
      .virtualServicesForGateway(`${gw.meta.namespace}/${gw.meta.name}`)
      .filter((v) => exportedTo(v.spec.exportTo, v.meta.namespace, proxyNs));
    const tls = server.tls;
    const sni = sniHosts(server);
    const match = sni.length ? { server_names: sni } : undefined;
    if (terminatesHttps(server)) {
      const hcm = hcmFilter(
        listenerName,
        gatewayServerRouteName(gw, server)!,
        true,
        tracing,
        wasm?.http('gateway', server.port.number),
      );
      const chain: Chain = { transport_socket: downstreamTls(tls!, false, push.tlsCompliance), filters: [hcm] };
      if (match) chain.filter_chain_match = match;
      chains.push(chain);
    } else if (!tls || tls.mode !== 'PASSTHROUGH') {
      // TCP, or TLS terminated here: the first `tcp` route of a bound VirtualService whose hosts the server takes.
      const route = tcpRouteFor(vss, gw, server);
      if (!route) continue;
      const chain: Chain = {
        filters: [...(wasm?.network('gateway', server.port.number) ?? []), tcpProxy(push, route.vs, route.dests)],
      };
      if (tls) {
        chain.transport_socket = downstreamTls(tls, true, push.tlsCompliance);
        if (match) chain.filter_chain_match = match;
      }
      chains.push(chain);
    } else {
      for (const vs of vss) {
        if (
          !vs.spec.hosts.some((h) =>
            server.hosts.some((sh) => serverHostAccepts(sh, gw.meta.namespace, h, vs.meta.namespace)),
          )
        )
          continue;
        for (const t of vs.spec.tls ?? []) {
          for (const m of t.match) {
            if (m.port !== undefined && m.port !== server.port.number) continue;
            if (m.gateways.length && !m.gateways.some((g) => sameGateway(g, vs.meta.namespace, gw))) continue;
            // Envoy refuses two chains with one match: the first route to claim an SNI host keeps it, as istiod.
            if (m.sniHosts.some((h) => sniSeen.has(h))) continue;
            for (const h of m.sniHosts) sniSeen.add(h);
            const filters = [...(wasm?.network('gateway', server.port.number) ?? []), tcpProxy(push, vs, t.route)];
            chains.push({ filter_chain_match: { server_names: m.sniHosts }, filters });
          }
        }
      }
    }
  }
  return chains;
}

/** The server's hosts without namespace, sorted and unique; none when one is `*` (then every SNI matches). */
function sniHosts(server: GatewayServer): string[] {
  const hosts = [...new Set(server.hosts.map((h) => (h.includes('/') ? h.slice(h.indexOf('/') + 1) : h)))].sort();
  return hosts.includes('*') ? [] : hosts;
}

function sameGateway(ref: string, vsNs: string, gw: Config<GatewaySpec>): boolean {
  return (ref.includes('/') ? ref : `${vsNs}/${ref}`) === `${gw.meta.namespace}/${gw.meta.name}`;
}

function tcpRouteFor(
  vss: readonly Config<VirtualServiceSpec>[],
  gw: Config<GatewaySpec>,
  server: GatewayServer,
): { vs: Config<VirtualServiceSpec>; dests: RouteDestination[] } | undefined {
  for (const vs of vss) {
    if (
      !vs.spec.hosts.some((h) =>
        server.hosts.some((sh) => serverHostAccepts(sh, gw.meta.namespace, h, vs.meta.namespace)),
      )
    )
      continue;
    const t = vs.spec.tcp.find(
      (r) =>
        r.route.length &&
        (!r.match.length || r.match.some((m) => m.port === undefined || m.port === server.port.number)),
    );
    if (t) return { vs, dests: t.route };
  }
  return undefined;
}

function tcpProxy(
  push: PushContext,
  vs: Config<VirtualServiceSpec>,
  route: readonly RouteDestination[],
): Record<string, unknown> {
  const dests = route
    .filter((d) => d.weight > 0 || route.length === 1)
    .map((d) => {
      const svc = push.lookupService(d.host, vs.meta.namespace);
      return svc
        ? { cluster: clusterName(d.port ?? svc.ports[0]!.number, d.subset ?? '', svc.hostname), weight: d.weight }
        : undefined;
    })
    .filter((d): d is { cluster: string; weight: number } => d !== undefined);
  const config: Record<string, unknown> =
    dests.length > 1
      ? {
          stat_prefix: 'tcp',
          weighted_clusters: { clusters: dests.map((d) => ({ name: d.cluster, weight: d.weight })) },
        }
      : { stat_prefix: dests[0]?.cluster ?? 'BlackHoleCluster', cluster: dests[0]?.cluster ?? 'BlackHoleCluster' };
  return { name: 'envoy.filters.network.tcp_proxy', typed_config: packAny(TCP_PROXY, config) };
}

const ENVOY_VERSION: Record<TlsVersion, string> = {
  TLS_AUTO: 'TLS_AUTO',
  TLSV1_0: 'TLSv1_0',
  TLSV1_1: 'TLSv1_1',
  TLSV1_2: 'TLSv1_2',
  TLSV1_3: 'TLSv1_3',
};

/** istiod's BuildListenerTLSContext for one Gateway server. `tcp`: a TLS (not HTTPS) server terminating here. */
export function downstreamTls(
  tls: ServerTls,
  tcp: boolean,
  compliance?: (params: EnvoyTlsParams) => EnvoyTlsParams,
): Record<string, unknown> {
  const mutual = tls.mode === 'MUTUAL' || tls.mode === 'ISTIO_MUTUAL';
  const sans = tls.subjectAltNames.map((s) => ({ exact: s }));
  const common: Record<string, unknown> = {
    alpn_protocols: tcp && tls.mode === 'ISTIO_MUTUAL' ? ALPN_ISTIO_TCP : ALPN_HTTP,
  };
  if (tls.credentialName !== undefined) {
    common.tls_certificate_sds_secret_configs = [
      { name: credentialResource(tls.credentialName), sds_config: ADS_SOURCE },
    ];
    if (mutual) {
      common.combined_validation_context = {
        default_validation_context: { match_subject_alt_names: sans },
        validation_context_sds_secret_config: {
          name: credentialCaResource(tls.credentialName),
          sds_config: ADS_SOURCE,
        },
      };
    } else if (sans.length) common.validation_context = { match_subject_alt_names: sans };
  } else {
    // Files (or, for ISTIO_MUTUAL, the workload certificate) from the agent's SDS server.
    const cert = tls.mode === 'ISTIO_MUTUAL' ? 'default' : `file-cert:${tls.serverCertificate}~${tls.privateKey}`;
    common.tls_certificate_sds_secret_configs = [{ name: cert, sds_config: SDS_SOURCE }];
    if (mutual) {
      common.combined_validation_context = {
        default_validation_context: { match_subject_alt_names: sans },
        validation_context_sds_secret_config: {
          name: tls.mode === 'ISTIO_MUTUAL' ? 'ROOTCA' : `file-root:${tls.caCertificates}`,
          sds_config: SDS_SOURCE,
        },
      };
    }
  }
  if (tls.mode === 'SIMPLE' || tls.mode === 'MUTUAL') {
    const params: Record<string, unknown> = {};
    if (tls.minProtocolVersion && tls.minProtocolVersion !== 'TLS_AUTO')
      params.tls_minimum_protocol_version = ENVOY_VERSION[tls.minProtocolVersion];
    if (tls.maxProtocolVersion && tls.maxProtocolVersion !== 'TLS_AUTO')
      params.tls_maximum_protocol_version = ENVOY_VERSION[tls.maxProtocolVersion];
    if (tls.cipherSuites.length) params.cipher_suites = tls.cipherSuites;
    if (Object.keys(params).length) common.tls_params = params;
  }
  // COMPLIANCE_POLICY, last as in istiod's BuildListenerTLSContext: over the server's own settings too.
  if (compliance) common.tls_params = compliance((common.tls_params as EnvoyTlsParams | undefined) ?? {});
  return {
    name: 'envoy.transport_sockets.tls',
    typed_config: packAny(DOWNSTREAM_TLS, {
      common_tls_context: common,
      require_client_certificate: { value: mutual },
    }),
  };
}
