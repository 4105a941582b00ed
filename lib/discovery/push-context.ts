// One immutable snapshot of everything a push needs, built once per debounced change and shared by every
// connection: services and instances (copied out of the registry), DestinationRules by host, VirtualServices by
// host (mesh) and by gateway, Gateways. Generated resources that do not depend on the proxy are memoised here,
// so N proxies cost one generation.

import type { ConfigStore } from './config-store';
import {
  type Config, type DestinationRuleSpec, type GatewaySpec, labelsMatch, qualifyHost, type Service, type ServiceInstance,
  type PeerAuthenticationSpec, type VirtualServiceSpec,
} from './model';
import type { Proxy } from './proxy';
import type { ServiceDiscovery } from './registry';
import { ResourceCache } from './resources';

export class PushContext {
  readonly services: readonly Service[];
  private readonly serviceByHost: ReadonlyMap<string, Service>;
  private readonly instanceMap: ReadonlyMap<string, readonly ServiceInstance[]>;
  private readonly drByHost: ReadonlyMap<string, Config<DestinationRuleSpec>>;
  private readonly meshVs: ReadonlyMap<string, Config<VirtualServiceSpec>>;
  private readonly vsByGateway: ReadonlyMap<string, readonly Config<VirtualServiceSpec>[]>;
  readonly gateways: readonly Config<GatewaySpec>[];
  readonly peerAuthentications: readonly Config<PeerAuthenticationSpec>[];
  private readonly memo = new Map<string, unknown>();

  private constructor(
    readonly version: string,
    /** Shared across push contexts; see ResourceCache. */
    readonly cache: ResourceCache,
    parts: {
      services: Service[];
      instances: Map<string, readonly ServiceInstance[]>;
      drs: Config<DestinationRuleSpec>[];
      vss: Config<VirtualServiceSpec>[];
      gateways: Config<GatewaySpec>[];
      pas: Config<PeerAuthenticationSpec>[];
    },
  ) {
    this.peerAuthentications = Object.freeze(sortByKey(parts.pas));
    this.services = Object.freeze(parts.services.sort((a, b) => (a.hostname < b.hostname ? -1 : a.hostname > b.hostname ? 1 : 0)));
    this.serviceByHost = new Map(this.services.map((s) => [s.hostname, s]));
    this.instanceMap = parts.instances;
    const drs = new Map<string, Config<DestinationRuleSpec>>();
    for (const dr of sortByKey(parts.drs)) {
      const host = this.lookupService(dr.spec.host, dr.meta.namespace)?.hostname;
      if (host && !drs.has(host)) drs.set(host, dr);
    }
    this.drByHost = drs;
    const mesh = new Map<string, Config<VirtualServiceSpec>>();
    const byGw = new Map<string, Config<VirtualServiceSpec>[]>();
    for (const vs of sortByKey(parts.vss)) {
      const gws = vs.spec.gateways.length ? vs.spec.gateways : ['mesh'];
      for (const g of gws) {
        if (g === 'mesh') {
          for (const h of vs.spec.hosts) {
            const host = this.lookupService(h, vs.meta.namespace)?.hostname;
            if (host && !mesh.has(host)) mesh.set(host, vs);
          }
        } else {
          const ref = g.includes('/') ? g : `${vs.meta.namespace}/${g}`;
          byGw.set(ref, [...(byGw.get(ref) ?? []), vs]);
        }
      }
    }
    this.meshVs = mesh;
    this.vsByGateway = byGw;
    this.gateways = Object.freeze(sortByKey(parts.gateways));
    Object.freeze(this);
  }

  static build(version: string, store: ConfigStore, registry: ServiceDiscovery, cache = new ResourceCache()): PushContext {
    const services = registry.services();
    const instances = new Map<string, readonly ServiceInstance[]>();
    for (const s of services) {
      for (const p of s.ports) instances.set(`${s.hostname}|${p.number}`, registry.instances(s.hostname, p.number));
    }
    return new PushContext(version, cache, {
      services,
      instances,
      pas: store.list('PeerAuthentication') as Config<PeerAuthenticationSpec>[],
      drs: store.list('DestinationRule') as Config<DestinationRuleSpec>[],
      vss: store.list('VirtualService') as Config<VirtualServiceSpec>[],
      gateways: store.list('Gateway') as Config<GatewaySpec>[],
    });
  }

  /** Exact host first, then the short name qualified with the namespace. */
  lookupService(host: string, namespace: string): Service | undefined {
    return this.serviceByHost.get(host) ?? this.serviceByHost.get(qualifyHost(host, namespace));
  }

  instances(hostname: string, port: number): readonly ServiceInstance[] {
    return this.instanceMap.get(`${hostname}|${port}`) ?? [];
  }

  destinationRule(hostname: string): Config<DestinationRuleSpec> | undefined {
    return this.drByHost.get(hostname);
  }

  meshVirtualService(hostname: string): Config<VirtualServiceSpec> | undefined {
    return this.meshVs.get(hostname);
  }

  virtualServicesForGateway(ref: string): readonly Config<VirtualServiceSpec>[] {
    return this.vsByGateway.get(ref) ?? [];
  }

  /** The Gateways whose selector matches a router's labels (an empty selector matches every router). */
  gatewaysFor(proxy: Proxy): Config<GatewaySpec>[] {
    return this.gateways.filter((g) => labelsMatch(g.spec.selector, proxy.labels));
  }

  /**
   * The inbound mTLS mode for a proxy, as Istio resolves it: a PeerAuthentication of its namespace selecting its
   * labels, else one of its namespace without a selector, else a mesh-wide one (istio-system), else PERMISSIVE.
   */
  peerAuthenticationMode(proxy: Proxy): PeerAuthenticationSpec['mode'] {
    const inNs = this.peerAuthentications.filter((p) => p.meta.namespace === proxy.namespace);
    const pick = inNs.find((p) => p.spec.selector && labelsMatch(p.spec.selector, proxy.labels))
      ?? inNs.find((p) => !p.spec.selector)
      ?? this.peerAuthentications.find((p) => p.meta.namespace === 'istio-system' && !p.spec.selector);
    return pick?.spec.mode ?? 'PERMISSIVE';
  }

  /** Computes once per push context; the value must not depend on anything but this context and `key`. */
  memoize<T>(key: string, fn: () => T): T {
    if (this.memo.has(key)) return this.memo.get(key) as T;
    const v = fn();
    this.memo.set(key, v);
    return v;
  }
}

function sortByKey<T extends Config>(list: T[]): T[] {
  const k = (c: Config) => `${c.meta.namespace}/${c.meta.name}`;
  return [...list].sort((a, b) => (k(a) < k(b) ? -1 : k(a) > k(b) ? 1 : 0));
}
