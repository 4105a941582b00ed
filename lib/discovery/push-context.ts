// One immutable snapshot of everything a push needs, built once per debounced change and shared by every
// connection: services and instances (copied out of the registry), DestinationRules by host, VirtualServices by
// host (mesh) and by gateway, Gateways. Generated resources that do not depend on the proxy are memoised here,
// so N proxies cost one generation.

import type { ConfigStore } from './config-store';
import {
  type Config,
  DEFAULT_MESH,
  type DestinationRuleSpec,
  type MeshConfig,
  type GatewaySpec,
  labelsMatch,
  qualifyHost,
  type Service,
  type ServiceInstance,
  type PeerAuthenticationSpec,
  type SecretSpec,
  type SidecarSpec,
  type VirtualServiceSpec,
  type WasmPluginSpec,
} from './model';
import { egressAdmits, exportedTo, hostCovers } from './visibility';
import { usesSourceLabels } from './source-match';
import type { Proxy } from './proxy';
import type { ServiceDiscovery } from './registry';
import { ResourceCache } from './resources';
import { envoyCompliance, type EnvoyTlsParams } from '../tls-policy';

/** What one proxy sees: the services exported to its namespace and admitted by its Sidecar. Proxies with the
 * same key see the same, so resources are generated once per key. */
export interface ProxyScope {
  readonly key: string;
  readonly namespace: string;
  /** A router (gateway): DestinationRule credentialName applies to routers only, as in istiod. */
  readonly router: boolean;
  readonly services: readonly Service[];
  /** The Sidecar's outboundTrafficPolicy, else meshConfig's. */
  readonly outboundTrafficPolicy: MeshConfig['outboundTrafficPolicy'];
}

/** Istio's root namespace: a Sidecar without selector there applies to every namespace that has none. */
export const ROOT_NAMESPACE = 'istio-system';

export class PushContext {
  readonly services: readonly Service[];
  private readonly serviceByHost: ReadonlyMap<string, Service>;
  private readonly instanceMap: ReadonlyMap<string, readonly ServiceInstance[]>;
  private readonly drByHost: ReadonlyMap<string, Config<DestinationRuleSpec>>;
  private readonly meshVs: ReadonlyMap<string, Config<VirtualServiceSpec>>;
  private readonly vsByGateway: ReadonlyMap<string, readonly Config<VirtualServiceSpec>[]>;
  readonly gateways: readonly Config<GatewaySpec>[];
  private readonly sidecars: readonly Config<SidecarSpec>[];
  readonly peerAuthentications: readonly Config<PeerAuthenticationSpec>[];
  /** credentialName Secrets (./gen-secrets.ts). */
  readonly secrets: readonly Config<SecretSpec>[];
  /** WasmPlugins (./gen-wasm.ts), by namespace and name. */
  readonly wasmPlugins: readonly Config<WasmPluginSpec>[];
  /** Are Secrets' private keys sent to routers? Not over a plaintext connection that leaves the host. */
  readonly servePrivateKeys: boolean;
  /**
   * COMPLIANCE_POLICY's restriction of the TLS parameters of every mesh mTLS, origination and gateway TLS context
   * (istiod's EnforceCompliance, ../tls-policy.ts); undefined: none.
   */
  readonly tlsCompliance: ((params: EnvoyTlsParams) => EnvoyTlsParams) | undefined;
  /** Does any DestinationRule originate TLS with a credentialName? */
  private readonly credentialDrs: boolean;
  /** Some VirtualService route matches sourceLabels: routes then depend on the proxy's labels. */
  readonly sourceLabelRoutes: boolean;
  private readonly memo = new Map<string, unknown>();

  private constructor(
    readonly version: string,
    /** Shared across push contexts; see ResourceCache. */
    readonly cache: ResourceCache,
    readonly mesh: MeshConfig,
    parts: {
      services: Service[];
      instances: Map<string, readonly ServiceInstance[]>;
      drs: Config<DestinationRuleSpec>[];
      vss: Config<VirtualServiceSpec>[];
      gateways: Config<GatewaySpec>[];
      sidecars: Config<SidecarSpec>[];
      pas: Config<PeerAuthenticationSpec>[];
      secrets?: Config<SecretSpec>[];
      wasmPlugins?: Config<WasmPluginSpec>[];
      servePrivateKeys?: boolean;
      compliancePolicy?: string;
    },
  ) {
    this.tlsCompliance = envoyCompliance(parts.compliancePolicy);
    this.wasmPlugins = Object.freeze(sortByKey(parts.wasmPlugins ?? []));
    this.peerAuthentications = Object.freeze(sortByKey(parts.pas));
    this.secrets = Object.freeze(sortByKey(parts.secrets ?? []));
    this.servePrivateKeys = parts.servePrivateKeys ?? true;
    this.credentialDrs = parts.drs.some((d) =>
      [
        d.spec.trafficPolicy,
        ...(d.spec.trafficPolicy?.portLevelSettings ?? []).map((p) => p.policy),
        ...d.spec.subsets.map((x) => x.trafficPolicy),
      ].some((tp) => tp?.tls?.credentialName !== undefined),
    );
    this.services = Object.freeze(
      parts.services.sort((a, b) => (a.hostname < b.hostname ? -1 : a.hostname > b.hostname ? 1 : 0)),
    );
    this.serviceByHost = new Map(this.services.map((s) => [s.hostname, s]));
    this.instanceMap = parts.instances;
    const drs = new Map<string, Config<DestinationRuleSpec>>();
    const wildDrs: [string, Config<DestinationRuleSpec>][] = [];
    for (const dr of sortByKey(parts.drs)) {
      if (dr.spec.host.includes('*')) {
        wildDrs.push([dr.spec.host, dr]);
        continue;
      }
      const host = this.lookupService(dr.spec.host, dr.meta.namespace)?.hostname;
      if (host && !drs.has(host)) drs.set(host, dr);
    }
    this.drByHost = drs;
    const meshVs = new Map<string, Config<VirtualServiceSpec>>();
    const wildVs: [string, Config<VirtualServiceSpec>][] = [];
    const byGw = new Map<string, Config<VirtualServiceSpec>[]>();
    for (const vs of sortByKey(parts.vss)) {
      const gws = vs.spec.gateways.length ? vs.spec.gateways : ['mesh'];
      for (const g of gws) {
        if (g === 'mesh') {
          for (const h of vs.spec.hosts) {
            if (h.includes('*')) {
              wildVs.push([h, vs]);
              continue;
            }
            const host = this.lookupService(h, vs.meta.namespace)?.hostname;
            if (host && !meshVs.has(host)) meshVs.set(host, vs);
          }
        } else {
          const ref = g.includes('/') ? g : `${vs.meta.namespace}/${g}`;
          byGw.set(ref, [...(byGw.get(ref) ?? []), vs]);
        }
      }
    }
    // A wildcard VirtualService or DestinationRule host applies to the services it covers that have no exact one;
    // the most specific wildcard wins, as in Istio.
    for (const svc of this.services) {
      if (!meshVs.has(svc.hostname)) {
        const w = mostSpecific(wildVs, svc.hostname);
        if (w) meshVs.set(svc.hostname, w);
      }
      if (!drs.has(svc.hostname)) {
        const w = mostSpecific(wildDrs, svc.hostname);
        if (w) drs.set(svc.hostname, w);
      }
    }
    this.meshVs = meshVs;
    this.vsByGateway = byGw;
    this.gateways = Object.freeze(sortByKey(parts.gateways));
    this.sidecars = Object.freeze(sortByKey(parts.sidecars));
    this.sourceLabelRoutes = usesSourceLabels(parts.vss);
    Object.freeze(this);
  }

  static build(
    version: string,
    store: ConfigStore,
    registry: ServiceDiscovery,
    cache = new ResourceCache(),
    mesh: MeshConfig = DEFAULT_MESH,
    opts: { servePrivateKeys?: boolean; compliancePolicy?: string } = {},
  ): PushContext {
    const services = registry.services();
    const instances = new Map<string, readonly ServiceInstance[]>();
    for (const s of services) {
      for (const p of s.ports) instances.set(`${s.hostname}|${p.number}`, registry.instances(s.hostname, p.number));
    }
    return new PushContext(version, cache, mesh, {
      services,
      instances,
      pas: store.list('PeerAuthentication') as Config<PeerAuthenticationSpec>[],
      drs: store.list('DestinationRule') as Config<DestinationRuleSpec>[],
      vss: store.list('VirtualService') as Config<VirtualServiceSpec>[],
      gateways: store.list('Gateway') as Config<GatewaySpec>[],
      sidecars: store.list('Sidecar') as Config<SidecarSpec>[],
      secrets: store.list('Secret') as Config<SecretSpec>[],
      wasmPlugins: store.list('WasmPlugin') as Config<WasmPluginSpec>[],
      servePrivateKeys: opts.servePrivateKeys,
      compliancePolicy: opts.compliancePolicy,
    });
  }

  /** Exact host first, then the short name qualified with the namespace. */
  lookupService(host: string, namespace: string): Service | undefined {
    return this.serviceByHost.get(host) ?? this.serviceByHost.get(qualifyHost(host, namespace));
  }

  instances(hostname: string, port: number): readonly ServiceInstance[] {
    return this.instanceMap.get(`${hostname}|${port}`) ?? [];
  }

  /** The host's DestinationRule, if it is exported to `namespace` (any namespace when not given). */
  destinationRule(hostname: string, namespace?: string): Config<DestinationRuleSpec> | undefined {
    const dr = this.drByHost.get(hostname);
    return dr && (namespace === undefined || exportedTo(dr.spec.exportTo, dr.meta.namespace, namespace))
      ? dr
      : undefined;
  }

  /** The host's mesh VirtualService, if it is exported to `namespace` (any namespace when not given). */
  meshVirtualService(hostname: string, namespace?: string): Config<VirtualServiceSpec> | undefined {
    const vs = this.meshVs.get(hostname);
    return vs && (namespace === undefined || exportedTo(vs.spec.exportTo, vs.meta.namespace, namespace))
      ? vs
      : undefined;
  }

  /** The Sidecar that applies to a sidecar proxy: its namespace's selecting one, else its namespace's default,
   * else the root namespace's default. Routers have none. */
  sidecarFor(proxy: Proxy): Config<SidecarSpec> | undefined {
    if (proxy.type !== 'sidecar') return undefined;
    const own = this.sidecars.filter((s) => s.meta.namespace === proxy.namespace);
    return (
      own.find((s) => s.spec.workloadSelector && labelsMatch(s.spec.workloadSelector, proxy.labels)) ??
      own.find((s) => !s.spec.workloadSelector) ??
      this.sidecars.find((s) => s.meta.namespace === ROOT_NAMESPACE && !s.spec.workloadSelector)
    );
  }

  scopeFor(proxy: Proxy): ProxyScope {
    const sc = this.sidecarFor(proxy);
    // Routers see other clusters than sidecars only when a DestinationRule has a credentialName (gen-upstream-tls.ts).
    const router = proxy.type === 'router' && this.credentialDrs;
    const key = `${router ? 'router|' : ''}${proxy.namespace}|${sc ? `${sc.meta.namespace}/${sc.meta.name}` : '-'}`;
    return this.memoize(`scope|${key}`, () =>
      Object.freeze({
        key,
        namespace: proxy.namespace,
        router,
        outboundTrafficPolicy: sc?.spec.outboundTrafficPolicy ?? this.mesh.outboundTrafficPolicy,
        services: Object.freeze(
          this.services.filter(
            (svc) =>
              exportedTo(svc.exportTo, svc.namespace, proxy.namespace) &&
              (!sc || sc.spec.egressHosts.some((h) => egressAdmits(h, sc.meta.namespace, svc.hostname, svc.namespace))),
          ),
        ),
      }),
    );
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
    const pick =
      inNs.find((p) => p.spec.selector && labelsMatch(p.spec.selector, proxy.labels)) ??
      inNs.find((p) => !p.spec.selector) ??
      this.peerAuthentications.find((p) => p.meta.namespace === ROOT_NAMESPACE && !p.spec.selector);
    return pick?.spec.mode ?? 'PERMISSIVE';
  }

  /** Computes once per push context; the value must not depend on anything but this context and `key`. */
  /** Stores a value computed ahead (a step at a time) where memoize(key) will find it. */
  prime<T>(key: string, value: T): void {
    if (!this.memo.has(key)) this.memo.set(key, value);
  }

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

function mostSpecific<T>(list: readonly [string, T][], host: string): T | undefined {
  let best: [string, T] | undefined;
  for (const e of list) if (hostCovers(e[0], host) && (!best || e[0].length > best[0].length)) best = e;
  return best?.[1];
}
