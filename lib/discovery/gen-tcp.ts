// A sidecar's TCP port: a tcp_proxy to the port's service, or to the destinations of the first `tcp` route of the
// service's mesh VirtualService that matches the port (weighted clusters when there are several), as istiod's
// buildSidecarOutboundTCPTCPFilterChainOpts does (istio/istio 86c9f01f, pilot/pkg/networking/core/tcp.go).

import { packAny } from '../envoy-protos';
import type { RouteDestination, Service } from './model';
import type { PushContext } from './push-context';
import { clusterName } from './resources';

const TCP_PROXY = 'envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy';

export function tcpProxyFilter(
  push: PushContext,
  svc: Service,
  port: number,
  namespace: string,
): Record<string, unknown> {
  const vs = push.meshVirtualService(svc.hostname, namespace);
  const route = vs?.spec.tcp.find(
    (t) => !t.match.length || t.match.some((m) => m.port === undefined || m.port === port),
  );
  const dests = (route?.route ?? [])
    .filter((d) => d.weight > 0 || route!.route.length === 1)
    .map((d) => ({ cluster: destinationCluster(push, d, vs!.meta.namespace, port), weight: d.weight }))
    .filter((d): d is { cluster: string; weight: number } => d.cluster !== undefined);
  const config: Record<string, unknown> = { stat_prefix: `outbound|${port}` };
  if (dests.length > 1)
    config.weighted_clusters = { clusters: dests.map((d) => ({ name: d.cluster, weight: d.weight })) };
  else config.cluster = dests[0]?.cluster ?? clusterName(port, '', svc.hostname);
  return { name: 'envoy.filters.network.tcp_proxy', typed_config: packAny(TCP_PROXY, config) };
}

function destinationCluster(
  push: PushContext,
  d: RouteDestination,
  namespace: string,
  port: number,
): string | undefined {
  const svc = push.lookupService(d.host, namespace);
  if (!svc) return undefined;
  const p = d.port ?? (svc.ports.some((sp) => sp.number === port) ? port : svc.ports[0]!.number);
  return clusterName(p, d.subset ?? '', svc.hostname);
}
