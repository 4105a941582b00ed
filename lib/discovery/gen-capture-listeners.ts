// LDS and the extra CDS of a sidecar whose host's traffic is captured by `istio-iptables` (proxy.capture): Istio's
// sidecar listeners instead of loopback ones, in the shape istiod gives them (istio/istio, pilot/pkg/networking/core
// listener.go, listener_builder.go, listener_inbound.go; the code here is this project's own).
//
// - `virtualOutbound` on 0.0.0.0:15001 receives every captured outbound connection and, with use_original_dst,
//   hands it to the listener of its original destination: `0.0.0.0_<port>` for each service port (bind_to_port
//   false). An HTTP port routes by Host through RDS `<port>` (the same route configuration as loopback mode, whose
//   catch-all virtual host sends unknown Hosts to PassthroughCluster or a 502); a TCP port picks the service by the
//   destination address (its ServiceEntry addresses, or its auto-allocated VIP, the one the DNS proxy answers).
//   A destination no listener or service matches passes through to where it was going (outboundTrafficPolicy
//   ALLOW_ANY: PassthroughCluster, ORIGINAL_DST) or is closed (REGISTRY_ONLY: BlackHoleCluster).
// - `virtualInbound` on 0.0.0.0:15006 receives captured inbound connections and passes each to its original
//   destination (the app on the host's address) from 127.0.0.6, the source the capture rules never redirect.
// Envoy's own upstream connections are not captured again because it runs as the uid/gid the rules exclude.

import type { ProxyWasm } from './gen-wasm';
import { type AnyMessage, packAny, typeUrl } from '../envoy-protos';
import { allocateVips } from './auto-vip';
import { tcpProxyFilter } from './gen-tcp';
import { BLACKHOLE_CLUSTER, hcmFilter, PASSTHROUGH_CLUSTER, sidecarRouteName } from './gen-common';
import { isHttp, type MeshConfig, type Service } from './model';
import type { ProxyScope, PushContext } from './push-context';
import { CLUSTER, dur, encodeResource, LISTENER, type Resource } from './resources';

export const VIRTUAL_OUTBOUND = 'virtualOutbound';
export const VIRTUAL_INBOUND = 'virtualInbound';
export const OUTBOUND_CAPTURE_PORT = 15001;
export const INBOUND_CAPTURE_PORT = 15006;
export const INBOUND_PASSTHROUGH_CLUSTER = 'InboundPassthroughCluster';
/** The source address of Envoy's connections to the local app; istio-iptables returns it unredirected. */
export const INBOUND_PASSTHROUGH_BIND = '127.0.0.6';

const TCP_PROXY = 'envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy';
// Listener filters with an empty config message, packed by hand so the committed Envoy descriptor
// (proto/envoy.json) needs no new type for them.
const emptyFilter = (name: string, type: string): { name: string; typed_config: AnyMessage } => ({
  name,
  typed_config: { type_url: typeUrl(type), value: new Uint8Array() },
});
const ORIGINAL_DST = emptyFilter(
  'envoy.filters.listener.original_dst',
  'envoy.extensions.filters.listener.original_dst.v3.OriginalDst',
);
const TLS_INSPECTOR = emptyFilter(
  'envoy.filters.listener.tls_inspector',
  'envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector',
);

/** Filter chains another generator adds to virtualInbound (e.g. per-port mTLS), matched before the passthrough. */
export type InboundChains = readonly Record<string, unknown>[];

export function captureListeners(
  push: PushContext,
  scope: ProxyScope,
  inbound: InboundChains = [],
  tracing?: Record<string, unknown>,
  wasm?: ProxyWasm,
): Map<string, Resource> {
  const out = new Map<string, Resource>();
  const add = (l: Record<string, unknown>) => out.set(l.name as string, encodeResource(LISTENER, l.name as string, l));
  add(virtualOutbound(scope.outboundTrafficPolicy));
  add(virtualInbound(inbound));
  for (const l of outboundListeners(push, scope, tracing, wasm)) add(l);
  return out;
}

/** The clusters capture mode needs besides the outbound ones (PassthroughCluster and BlackHoleCluster are in CDS always). */
export function captureClusters(): Resource[] {
  return [INBOUND_PASSTHROUGH];
}

const INBOUND_PASSTHROUGH = encodeResource(CLUSTER, INBOUND_PASSTHROUGH_CLUSTER, {
  name: INBOUND_PASSTHROUGH_CLUSTER,
  type: 'ORIGINAL_DST',
  lb_policy: 'CLUSTER_PROVIDED',
  connect_timeout: dur(10_000),
  upstream_bind_config: { source_address: { address: INBOUND_PASSTHROUGH_BIND, port_value: 0 } },
});

function tcpTo(cluster: string, statPrefix = cluster): Record<string, unknown> {
  return {
    name: 'envoy.filters.network.tcp_proxy',
    typed_config: packAny(TCP_PROXY, { stat_prefix: statPrefix, cluster }),
  };
}

/** What an outbound connection nobody claims gets. */
function passthroughChain(policy: MeshConfig['outboundTrafficPolicy']): Record<string, unknown> {
  return {
    name: 'PassthroughFilterChain',
    filters: [tcpTo(policy === 'REGISTRY_ONLY' ? BLACKHOLE_CLUSTER : PASSTHROUGH_CLUSTER)],
  };
}

function virtualOutbound(policy: MeshConfig['outboundTrafficPolicy']): Record<string, unknown> {
  return {
    name: VIRTUAL_OUTBOUND,
    address: { socket_address: { address: '0.0.0.0', port_value: OUTBOUND_CAPTURE_PORT } },
    use_original_dst: { value: true },
    // A connection made to 15001 itself (not redirected) would loop back into this listener.
    filter_chains: [
      {
        name: 'virtualOutbound-blackhole',
        filter_chain_match: { destination_port: { value: OUTBOUND_CAPTURE_PORT } },
        filters: [tcpTo(BLACKHOLE_CLUSTER)],
      },
    ],
    default_filter_chain: passthroughChain(policy),
    traffic_direction: 'OUTBOUND',
  };
}

function virtualInbound(chains: InboundChains): Record<string, unknown> {
  const tls = chains.some(
    (c) => (c.filter_chain_match as { transport_protocol?: string } | undefined)?.transport_protocol,
  );
  return {
    name: VIRTUAL_INBOUND,
    address: { socket_address: { address: '0.0.0.0', port_value: INBOUND_CAPTURE_PORT } },
    // Not use_original_dst: the outbound listeners must not see inbound connections; the filter only restores the
    // destination for the filter chain match and the passthrough cluster.
    listener_filters: tls ? [ORIGINAL_DST, TLS_INSPECTOR] : [ORIGINAL_DST],
    // A server-first protocol sends nothing for the TLS inspector to read: go on without it, as istiod does.
    ...(tls ? { continue_on_listener_filters_timeout: true } : {}),
    filter_chains: [
      {
        name: 'virtualInbound-blackhole',
        filter_chain_match: { destination_port: { value: INBOUND_CAPTURE_PORT } },
        filters: [tcpTo(BLACKHOLE_CLUSTER)],
      },
      ...chains,
    ],
    default_filter_chain: { name: 'virtualInbound', filters: [tcpTo(INBOUND_PASSTHROUGH_CLUSTER)] },
    traffic_direction: 'INBOUND',
  };
}

/** The addresses a service is called at: its ServiceEntry addresses (IPs and CIDRs), else its auto-allocated VIP. */
export function serviceAddresses(push: PushContext, svc: Service): string[] {
  if (svc.addresses.length) return [...svc.addresses];
  const vip = push.memoize('auto-vips', () => allocateVips(push.services)).get(svc.hostname);
  return vip ? [vip] : [];
}

function prefixRange(addr: string): Record<string, unknown> {
  const slash = addr.indexOf('/');
  if (slash >= 0) return { address_prefix: addr.slice(0, slash), prefix_len: { value: Number(addr.slice(slash + 1)) } };
  return { address_prefix: addr, prefix_len: { value: addr.includes(':') ? 128 : 32 } };
}

function outboundListeners(
  push: PushContext,
  scope: ProxyScope,
  tracing?: Record<string, unknown>,
  wasm?: ProxyWasm,
): Record<string, unknown>[] {
  const http = new Set<number>();
  const tcp = new Map<number, Service[]>();
  for (const svc of scope.services) {
    for (const p of svc.ports) {
      if (isHttp(p.protocol)) http.add(p.number);
      else tcp.set(p.number, [...(tcp.get(p.number) ?? []), svc]);
    }
  }
  const out: Record<string, unknown>[] = [];
  for (const port of [...new Set([...http, ...tcp.keys()])].sort((a, b) => a - b)) {
    if (port === OUTBOUND_CAPTURE_PORT || port === INBOUND_CAPTURE_PORT) continue;
    const name = `0.0.0.0_${port}`;
    const base = {
      name,
      address: { socket_address: { address: '0.0.0.0', port_value: port } },
      bind_to_port: { value: false },
      traffic_direction: 'OUTBOUND',
    };
    // A port with both HTTP and TCP services is served as HTTP, as in loopback mode.
    if (http.has(port)) {
      out.push({
        ...base,
        filter_chains: [
          { filters: [hcmFilter(name, sidecarRouteName(port), false, tracing, wasm?.http('outbound', port))] },
        ],
      });
      continue;
    }
    const used = new Set<string>(); // Envoy rejects two chains with the same match: the first service keeps an address
    const chains: Record<string, unknown>[] = [];
    for (const svc of tcp.get(port)!) {
      const addrs = serviceAddresses(push, svc).filter((a) => !used.has(a) && used.add(a));
      if (!addrs.length) continue;
      const filters = [...(wasm?.network('outbound', port) ?? []), tcpProxyFilter(push, svc, port, scope.namespace)];
      chains.push({
        name: `${port}|${svc.hostname}`,
        filter_chain_match: { prefix_ranges: addrs.map(prefixRange) },
        filters,
      });
    }
    out.push({ ...base, filter_chains: chains, default_filter_chain: passthroughChain(scope.outboundTrafficPolicy) });
  }
  return out;
}
