// Resources of one type for one proxy, by name: the single entry point the connections use.

import { buildClusters, buildEndpoints } from './gen-clusters';
import { captureClusters } from './gen-capture-listeners';
import { inboundClusters, inboundListeners } from './gen-inbound';
import { buildListeners } from './gen-listeners';
import { GRPC_GENERATOR, generateGrpc } from './gen-grpc';
import { buildNameTableResources } from './gen-nametable';
import { buildRoutes } from './gen-routes';
import { buildSecrets } from './gen-secrets';
import { buildExtensionConfigs } from './gen-wasm';
import type { Proxy } from './proxy';
import type { ProxyScope, PushContext } from './push-context';
import { type Resource, TYPE_URLS } from './resources';

export const SUPPORTED_TYPES: ReadonlySet<string> = new Set(Object.values(TYPE_URLS));

/** `names`: what the proxy subscribed to; only the gRPC generator builds by name (its clients never ask for all). */
export function generate(
  push: PushContext,
  proxy: Proxy,
  typeUrl: string,
  names: ReadonlySet<string> = new Set(),
): ReadonlyMap<string, Resource> {
  // As istiod: a node whose metadata names the grpc generator gets that generator's LDS, RDS, CDS and EDS.
  if (proxy.generator === GRPC_GENERATOR && typeUrl !== TYPE_URLS.secret && typeUrl !== TYPE_URLS.nameTable)
    return generateGrpc(push, proxy, typeUrl, names);
  switch (typeUrl) {
    case TYPE_URLS.cluster: {
      const inbound = inboundClusters(push, proxy);
      const outbound = cdsFor(push, push.scopeFor(proxy), proxy.type === 'sidecar' && proxy.capture);
      return inbound.length ? new Map([...outbound, ...inbound.map((r) => [r.name, r] as const)]) : outbound;
    }
    case TYPE_URLS.endpoint:
      return buildEndpoints(push);
    case TYPE_URLS.listener: {
      const inbound = inboundListeners(push, proxy);
      const outbound = buildListeners(push, proxy);
      return inbound.length ? new Map([...outbound, ...inbound.map((r) => [r.name, r] as const)]) : outbound;
    }
    case TYPE_URLS.route:
      return buildRoutes(push, proxy);
    case TYPE_URLS.secret:
      return buildSecrets(push, proxy);
    case TYPE_URLS.nameTable:
      return buildNameTableResources(push, proxy);
    case TYPE_URLS.extensionConfig:
      return buildExtensionConfigs(push, proxy);
    default:
      return new Map();
  }
}

function cdsFor(push: PushContext, scope: ProxyScope, capture: boolean): ReadonlyMap<string, Resource> {
  const extra = capture ? captureClusters() : [];
  return push.memoize(
    `cds-map|${scope.key}|${capture}`,
    () => new Map([...buildClusters(push, scope), ...extra].map((r) => [r.name, r])),
  );
}
