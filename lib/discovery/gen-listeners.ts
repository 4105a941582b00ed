// LDS. With no traffic capture on the host, a sidecar exposes each service port on a loopback listener the app
// calls (Istio's Sidecar egress listener with a bind address): HTTP ports route by Host through RDS `<port>`, TCP
// ports proxy to the one service on that port. A router binds the ports of the Gateways that select it.
// If a port is taken on the host, Envoy NACKs that listener; the server reports it and does not retry it.

import { isHttp, type Service } from './model';
import { tcpProxyFilter } from './gen-tcp';
import type { Proxy } from './proxy';
import type { ProxyScope, PushContext } from './push-context';
import { encodeResource, LISTENER, type Resource } from './resources';
import { hcmFilter, SIDECAR_BIND, sidecarRouteName } from './gen-common';
import { captureListeners } from './gen-capture-listeners';
import { inboundCaptureChains } from './gen-inbound';
import { routerListeners } from './gen-gateway-tls';
import { hcmTracing, tracingKey } from './gen-tracing';
import { type ProxyWasm, proxyWasm } from './gen-wasm';

export function buildListeners(push: PushContext, proxy: Proxy): ReadonlyMap<string, Resource> {
  if (proxy.type === 'sidecar') {
    const scope = push.scopeFor(proxy);
    const tk = tracingKey(push, proxy);
    const wasm = proxyWasm(push, proxy);
    if (proxy.capture) {
      // The workload's own ports (inbound mTLS) depend on the proxy's address and PeerAuthentication mode.
      const key = `lds|sidecar-capture|${scope.key}|${proxy.ip}|${push.peerAuthenticationMode(proxy)}|${tk}|${wasm.key}`;
      return push.memoize(key, () =>
        captureListeners(push, scope, inboundCaptureChains(push, proxy), hcmTracing(push, proxy, 'outbound'), wasm),
      );
    }
    return push.memoize(`lds|sidecar|${scope.key}|${tk}|${wasm.key}`, () =>
      sidecarListeners(push, scope, hcmTracing(push, proxy, 'outbound'), wasm),
    );
  }
  const gws = push.gatewaysFor(proxy);
  const wasm = proxyWasm(push, proxy);
  // Plaintext, HTTPS, TLS and TCP servers: ./gen-gateway-tls.ts.
  const key = `lds|router|${proxy.namespace}|${gws.map((g) => `${g.meta.namespace}/${g.meta.name}`).join(',')}|${tracingKey(push, proxy)}|${wasm.key}`;
  return push.memoize(key, () => routerListeners(push, gws, proxy.namespace, hcmTracing(push, proxy, 'gateway'), wasm));
}

function sidecarListeners(
  push: PushContext,
  scope: ProxyScope,
  tracing: Record<string, unknown> | undefined,
  wasm: ProxyWasm,
): Map<string, Resource> {
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
    const filters = http.has(port)
      ? [hcmFilter(name, sidecarRouteName(port), false, tracing, wasm.http('outbound', port))]
      : [...wasm.network('outbound', port), tcpProxyFilter(push, tcp.get(port)!, port, scope.namespace)];
    out.set(name, encodeResource(LISTENER, name, listener(name, SIDECAR_BIND, port, filters, 'OUTBOUND')));
  }
  return out;
}

function listener(
  name: string,
  address: string,
  port: number,
  filters: Record<string, unknown>[],
  direction: string,
): Record<string, unknown> {
  return {
    name,
    address: { socket_address: { address, port_value: port } },
    filter_chains: [{ filters }],
    traffic_direction: direction,
  };
}
