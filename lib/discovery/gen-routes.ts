// RDS. Sidecar: one RouteConfiguration per service port (`<port>`), a virtual host per service on that port, routes
// from the service's mesh VirtualService or a default route to its cluster. Router: one per Gateway port
// (`http.<port>`), virtual hosts from the VirtualServices bound to the Gateways whose hosts the server accepts.

import { headerFields, mirrorPolicies, perFilterConfig, retryPolicy } from './gen-http-policy';
import { hashPolicy } from './gen-lb-policy';
import { allocateVips } from './auto-vip';
import type {
  Config,
  GatewaySpec,
  HttpMatch,
  HttpRoute,
  MeshConfig,
  RouteDestination,
  StringMatch,
  VirtualServiceSpec,
} from './model';
import { isHttp } from './model';
import { exportedTo } from './visibility';
import { gatewayServerRouteName, PASSTHROUGH_CLUSTER, SIDECAR_BIND, sidecarRouteName } from './gen-common';
import { serverHostAccepts } from './gateway-hosts';
import type { Proxy } from './proxy';
import { type RouteSource, sourceMatches } from './source-match';
import type { ProxyScope, PushContext } from './push-context';
import { clusterName, dur, encodeResource, encodeRouteConfigSteps, type Resource, ROUTE } from './resources';

// Moved to a leaf module the config checks can load without the generators; re-exported for existing importers.
export { serverHostAccepts };

export function buildRoutes(push: PushContext, proxy: Proxy): ReadonlyMap<string, Resource> {
  // A sourceLabels match makes the routes depend on the proxy's labels too.
  const labels = push.sourceLabelRoutes ? JSON.stringify(Object.entries(proxy.labels).sort()) : '';
  if (proxy.type === 'sidecar') {
    const scope = push.scopeFor(proxy);
    const vips = !!proxy.dnsCapture;
    return push.memoize(`rds|sidecar|${scope.key}${vips ? '|vips' : ''}${labels && `|${labels}`}`, () =>
      sidecarRoutes(push, scope, proxy.labels, vips),
    );
  }
  const gws = push.gatewaysFor(proxy);
  return push.memoize(
    `rds|router|${proxy.namespace}|${gws.map((g) => `${g.meta.namespace}/${g.meta.name}`).join(',')}|${labels}`,
    () => routerRoutes(push, gws, proxy),
  );
}

/** Route configuration name of a sidecar port and of a gateway port. */

function sidecarRoutes(
  push: PushContext,
  scope: ProxyScope,
  labels: Readonly<Record<string, string>>,
  vips: boolean,
): Map<string, Resource> {
  const steps = sidecarRouteSteps(push, scope, labels, vips);
  for (let r = steps.next(); ; r = steps.next()) if (r.done) return r.value;
}

/**
 * A new push context's sidecar routes for one scope built a virtual host at a time, `breathe` called in between,
 * and memoised where buildRoutes() looks, so the connections then only look them up.
 */
export async function warmSidecarRoutes(
  push: PushContext,
  scope: ProxyScope,
  breathe: () => Promise<void>,
): Promise<void> {
  if (push.sourceLabelRoutes) return; // built per proxy's labels, on demand
  const steps = sidecarRouteSteps(push, scope, {}, false);
  for (let r = steps.next(); ; r = steps.next()) {
    if (r.done) return push.prime(`rds|sidecar|${scope.key}`, r.value);
    await breathe();
  }
}

/** `vips`: the proxy uses auto-allocated VIPs (DNS capture), so a service's VIP is one of its domains. */
function* sidecarRouteSteps(
  push: PushContext,
  scope: ProxyScope,
  labels: Readonly<Record<string, string>>,
  vips: boolean,
): Generator<void, Map<string, Resource>> {
  const src: RouteSource = { labels, namespace: scope.namespace, gateway: 'mesh' };
  const autoVips = vips ? push.memoize('auto-vips', () => allocateVips(push.services)) : undefined;
  const byPort = new Map<number, Record<string, unknown>[]>();
  for (const svc of scope.services) {
    for (const port of svc.ports) {
      if (!isHttp(port.protocol)) continue;
      const vs = push.meshVirtualService(svc.hostname, scope.namespace);
      // A VirtualService with only `tcp` routes leaves the service's HTTP ports on the default route.
      const routes = vs?.spec.http.length
        ? vsRoutes(push, vs, port.number, true, src, scope.namespace)
        : [defaultRoute(push, svc.hostname, port.number, scope.namespace)];
      const list = byPort.get(port.number) ?? [];
      // The port is ignored when matching (ignore_port_in_host_matching), so no `host:port` domains; the absolute
      // name `host.` is served too (istiod's PILOT_ENABLE_ABSOLUTE_FQDN_VHOST_DOMAIN, on by default).
      // The service's addresses too (IPs, not CIDRs), as istiod's generateVirtualHostDomains adds them; without
      // any, its auto-allocated VIP when the proxy uses those (istiod's getAllAddressesForProxy: DNS capture).
      const own = svc.addresses.filter((x) => !x.includes('/'));
      const vip = own.length || svc.addresses.length ? undefined : autoVips?.get(svc.hostname);
      const ips = [...own, ...(vip ? [vip] : [])].map((x) => (x.includes(':') ? `[${x}]` : x));
      const domains = [svc.hostname, `${svc.hostname}.`, ...kubeAltHosts(svc.hostname, scope.namespace), ...ips];
      list.push({ name: `${svc.hostname}:${port.number}`, domains, routes });
      byPort.set(port.number, list);
    }
    yield;
  }
  const out = new Map<string, Resource>();
  for (const [port, vhosts] of byPort) {
    // Envoy rejects a domain listed by two virtual hosts: the first service keeps a shared address.
    const used = new Set<string>();
    for (const vh of vhosts) vh.domains = (vh.domains as string[]).filter((d) => !used.has(d) && used.add(d));
    // istiod also matches a service's addresses. Here the app reaches a service at the loopback listener, so the
    // listener's address is the service's address when the service is alone on the port (`curl 127.0.0.1:port`).
    if (vhosts.length === 1) (vhosts[0]!.domains as string[]).push(SIDECAR_BIND);
    const name = sidecarRouteName(port);
    const route = {
      name,
      virtual_hosts: [...vhosts, catchAllVirtualHost(scope.outboundTrafficPolicy)],
      validate_clusters: { value: false },
      ignore_port_in_host_matching: true,
    };
    out.set(name, yield* encodeRouteConfigSteps(route));
  }
  return out;
}

/** The short names a Kubernetes-style host answers to from a proxy in `proxyNs` (istiod's
 * generateAltVirtualHostsForKubernetesService): `name`, `name.ns.svc` and `name.ns` in its own namespace,
 * `name.ns` and `name.ns.svc` from another. */
function kubeAltHosts(hostname: string, proxyNs: string): string[] {
  if (!hostname.endsWith('.svc.cluster.local')) return [];
  const ih = hostname.indexOf('.svc.');
  const dot = hostname.indexOf('.');
  if (dot + 1 >= ih) return [];
  const nsName = hostname.slice(0, ih);
  return hostname.slice(dot + 1, ih) === proxyNs
    ? [hostname.slice(0, dot), `${nsName}.svc`, nsName]
    : [nsName, `${nsName}.svc`];
}

/** istiod's last virtual host of a sidecar route: unknown Hosts pass through (ALLOW_ANY) or get 502 (REGISTRY_ONLY). */
function catchAllVirtualHost(policy: MeshConfig['outboundTrafficPolicy']): Record<string, unknown> {
  if (policy === 'REGISTRY_ONLY') {
    return {
      name: 'block_all',
      domains: ['*'],
      routes: [{ name: 'block_all', match: { prefix: '/' }, direct_response: { status: 502 } }],
    };
  }
  // The loopback listeners restore no original destination (no capture, no original_dst listener filter), so
  // PassthroughCluster has no host to pick here and Envoy answers 503 "no healthy upstream".
  return {
    name: 'allow_any',
    domains: ['*'],
    routes: [
      {
        name: 'allow_any',
        match: { prefix: '/' },
        route: { cluster: PASSTHROUGH_CLUSTER, timeout: dur(0), max_grpc_timeout: dur(0) },
      },
    ],
  };
}

function routerRoutes(
  push: PushContext,
  gateways: readonly Config<GatewaySpec>[],
  proxy: Proxy,
): Map<string, Resource> {
  const proxyNs = proxy.namespace;
  // route name (`http.<port>`, or one per HTTPS server: ./gen-gateway-tls.ts) -> host -> routes, in Gateway then
  // VirtualService order; hosts of servers with httpsRedirect get require_tls ALL (a 301 to https), as istiod.
  const byRoute = new Map<
    string,
    { port: number; hosts: Map<string, Record<string, unknown>[]>; redirect: Set<string> }
  >();
  const added = new Set<string>();
  for (const gw of gateways) {
    const ref = `${gw.meta.namespace}/${gw.meta.name}`;
    for (const server of gw.spec.servers) {
      const routeName = gatewayServerRouteName(gw, server);
      if (!routeName) continue; // TCP, TLS and passthrough servers have no routes
      const port = server.port.number;
      const entry = byRoute.get(routeName) ?? {
        port,
        hosts: new Map<string, Record<string, unknown>[]>(),
        redirect: new Set<string>(),
      };
      byRoute.set(routeName, entry);
      const hosts = entry.hosts;
      const redirect = server.tls?.httpsRedirect === true;
      // As istiod, a gateway uses only the VirtualServices exported to its own namespace.
      for (const vs of push
        .virtualServicesForGateway(ref)
        .filter((v) => exportedTo(v.spec.exportTo, v.meta.namespace, proxyNs))) {
        for (const h of vs.spec.hosts) {
          if (!server.hosts.some((sh) => serverHostAccepts(sh, gw.meta.namespace, h, vs.meta.namespace))) continue;
          if (redirect) entry.redirect.add(h);
          const once = `${routeName}|${h}|${vs.meta.namespace}/${vs.meta.name}`;
          if (added.has(once)) continue;
          added.add(once);
          const routes = hosts.get(h) ?? [];
          const src = { labels: proxy.labels, namespace: proxyNs, gateway: ref };
          // istiod's IsTLS for redirects: any server `tls` (an httpsRedirect one too) makes https the default scheme.
          for (const r of vsRoutes(push, vs, port, false, src, undefined, server.tls !== undefined)) routes.push(r); // not push(...): one VS may hold 100,000 routes
          hosts.set(h, routes);
        }
      }
      // A redirecting server's own hosts answer the redirect even with no VirtualService.
      if (redirect) {
        for (const sh of server.hosts) {
          const h = sh.includes('/') ? sh.slice(sh.indexOf('/') + 1) : sh;
          entry.redirect.add(h);
          if (!hosts.has(h)) hosts.set(h, []);
        }
      }
    }
  }
  const out = new Map<string, Resource>();
  for (const [name, { port, hosts, redirect }] of byRoute) {
    const vhosts: Record<string, unknown>[] = [...hosts].map(([h, routes]) => ({
      name: `${h}:${port}`,
      // As istiod: the host alone, the port being ignored by ignore_port_in_host_matching (`Host: h:8080` matches).
      domains: [h],
      routes,
      ...(redirect.has(h) ? { require_tls: 'ALL' } : {}),
    }));
    // istiod's answer when no VirtualService binds to the port: a virtual host with no route (404).
    if (!vhosts.length) vhosts.push({ name: `blackhole:${port}`, domains: ['*'], routes: [] });
    out.set(
      name,
      encodeResource(ROUTE, name, {
        name,
        virtual_hosts: vhosts,
        validate_clusters: { value: false },
        ignore_port_in_host_matching: true,
      }),
    );
  }
  return out;
}

/** The routes of one service port as a sidecar in `namespace` gets them (the proxyless generator's: ./gen-grpc.ts). */
export function meshServiceRoutes(
  push: PushContext,
  hostname: string,
  port: number,
  namespace: string,
  labels: Readonly<Record<string, string>>,
): Record<string, unknown>[] {
  const vs = push.meshVirtualService(hostname, namespace);
  return vs?.spec.http.length
    ? vsRoutes(push, vs, port, true, { labels, namespace, gateway: 'mesh' }, namespace)
    : [defaultRoute(push, hostname, port, namespace)];
}

function defaultRoute(push: PushContext, hostname: string, port: number, namespace: string): Record<string, unknown> {
  const hash = hashPolicy(push, hostname, undefined, namespace, port);
  const action: Record<string, unknown> = {
    cluster: clusterName(port, '', hostname),
    timeout: dur(0),
    retry_policy: retryPolicy(undefined, !!hash),
    max_grpc_timeout: dur(0),
  };
  if (hash) action.hash_policy = hash;
  return { name: 'default', match: { prefix: '/' }, route: action };
}

/** `namespace`: the sidecar's, whose visible DestinationRule decides consistent hashing (a router sees every one).
 * `tls`: the routes serve a Gateway server with TLS settings (redirects then default to https). */
function vsRoutes(
  push: PushContext,
  vs: Config<VirtualServiceSpec>,
  port: number,
  mesh: boolean,
  src: RouteSource,
  namespace?: string,
  tls = false,
): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  for (const r of vs.spec.http) {
    const matches = r.match.length
      ? r.match.filter((m) => (m.port === undefined || m.port === port) && sourceMatches(m, vs, src))
      : [undefined];
    if (!matches.length) continue;
    const action = r.redirect
      ? { redirect: redirectAction(r.redirect, port, tls) }
      : r.directResponse
        ? { direct_response: directResponse(r.directResponse) }
        : routeAction(push, vs, r, port, mesh, namespace);
    if (!action) continue;
    const pfc = perFilterConfig(r);
    // One destination's headers join the route's (istiod's processDestination); weighted ones sit on each cluster.
    const hdrs = mergeHeaderFields(
      headerFields(r.headers),
      r.route.length === 1 && !r.redirect && !r.directResponse ? headerFields(r.route[0]!.headers) : {},
    );
    for (const m of matches) {
      const route: Record<string, unknown> = {
        match: routeMatch(m),
        ...('redirect' in action || 'direct_response' in action ? action : { route: action }),
        ...hdrs,
      };
      if (r.name) route.name = r.name;
      if (m?.statPrefix) route.stat_prefix = m.statPrefix;
      if (pfc) route.typed_per_filter_config = pfc;
      out.push(route);
    }
  }
  return out;
}

function routeMatch(m: HttpMatch | undefined): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  const uri = m?.uri;
  if (!uri) out.prefix = '/';
  else if ('exact' in uri) out.path = uri.exact;
  else if ('prefix' in uri) out.prefix = uri.prefix;
  else out.safe_regex = { regex: uri.regex };
  if (m?.ignoreUriCase) out.case_sensitive = { value: false };
  // method, authority and scheme are pseudo-headers to Envoy; withoutHeaders are inverted header matches.
  const headers = [
    ...Object.entries(m?.headers ?? {}).map(([name, sm]) => ({ name, string_match: stringMatcher(sm) })),
    ...(['method', 'authority', 'scheme'] as const)
      .filter((k) => m?.[k])
      .map((k) => ({ name: `:${k}`, string_match: stringMatcher(m![k]!) })),
    // As istiod: a request without the header matches withoutHeaders too.
    ...Object.entries(m?.withoutHeaders ?? {}).map(([name, sm]) => ({
      name,
      string_match: stringMatcher(sm),
      invert_match: true,
      treat_missing_header_as_empty: true,
    })),
  ].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  if (headers.length) out.headers = headers;
  const qp = Object.entries(m?.queryParams ?? {}).map(([name, sm]) => ({ name, string_match: stringMatcher(sm) }));
  if (qp.length) out.query_parameters = qp;
  return out;
}

const REDIRECT_CODE: Record<number, string> = {
  301: 'MOVED_PERMANENTLY',
  302: 'FOUND',
  303: 'SEE_OTHER',
  307: 'TEMPORARY_REDIRECT',
  308: 'PERMANENT_REDIRECT',
};

/** `port`: the listener's, which derivePort FROM_REQUEST_PORT stands for (istiod's ApplyRedirect: Envoy cannot
 * derive it, and routes are built per port). A port that is the scheme's default (the redirect's scheme, else
 * https on a TLS server and http elsewhere) is left out of the Location. */
function redirectAction(rd: NonNullable<HttpRoute['redirect']>, port: number, tls: boolean): Record<string, unknown> {
  const out: Record<string, unknown> = { response_code: REDIRECT_CODE[rd.redirectCode ?? 301] };
  if (rd.uri !== undefined) out.path_redirect = rd.uri;
  if (rd.authority !== undefined) out.host_redirect = rd.authority;
  const p = rd.port ?? (rd.derivePort === 'FROM_REQUEST_PORT' ? port : undefined);
  const scheme = rd.scheme ?? (tls ? 'https' : 'http');
  if (p !== undefined && !(p === 80 && scheme === 'http') && !(p === 443 && scheme === 'https')) out.port_redirect = p;
  if (rd.scheme !== undefined) out.scheme_redirect = rd.scheme;
  return out;
}

function directResponse(d: NonNullable<HttpRoute['directResponse']>): Record<string, unknown> {
  if (d.bodyBytes !== undefined) return { status: d.status, body: { inline_bytes: d.bodyBytes } };
  return d.body === undefined ? { status: d.status } : { status: d.status, body: { inline_string: d.body } };
}

function mergeHeaderFields(a: Record<string, unknown>, b: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = { ...a };
  for (const [k, v] of Object.entries(b)) out[k] = [...((a[k] as unknown[] | undefined) ?? []), ...(v as unknown[])];
  return out;
}

function stringMatcher(sm: StringMatch): Record<string, unknown> {
  if ('exact' in sm) return { exact: sm.exact };
  if ('prefix' in sm) return { prefix: sm.prefix };
  return { safe_regex: { regex: sm.regex } };
}

function destinationCluster(
  push: PushContext,
  vs: Config<VirtualServiceSpec>,
  d: RouteDestination,
  port: number,
  mesh: boolean,
): string | undefined {
  const svc = push.lookupService(d.host, vs.meta.namespace);
  if (!svc) return undefined; // the cross check keeps such configs out; this is the last line of defence
  const p = d.port ?? (mesh && svc.ports.some((sp) => sp.number === port) ? port : svc.ports[0]!.number);
  return clusterName(p, d.subset ?? '', svc.hostname);
}

function routeAction(
  push: PushContext,
  vs: Config<VirtualServiceSpec>,
  r: HttpRoute,
  port: number,
  mesh: boolean,
  namespace?: string,
): Record<string, unknown> | undefined {
  const dests = r.route
    .filter((d) => d.weight > 0 || r.route.length === 1)
    .map((d) => ({ cluster: destinationCluster(push, vs, d, port, mesh), weight: d.weight, headers: d.headers }))
    .filter(
      (d): d is { cluster: string; weight: number; headers: RouteDestination['headers'] } => d.cluster !== undefined,
    );
  if (!dests.length) return undefined;
  // As istiod: several destinations are weighted clusters even when only one has weight left.
  const action: Record<string, unknown> =
    r.route.length === 1
      ? { cluster: dests[0]!.cluster }
      : {
          weighted_clusters: {
            clusters: dests.map((d) => ({ name: d.cluster, weight: { value: d.weight }, ...headerFields(d.headers) })),
          },
        };
  action.timeout = dur(r.timeoutMs ?? 0);
  const first = push.lookupService(r.route[0]!.host, vs.meta.namespace);
  const hash = first ? hashPolicy(push, first.hostname, r.route[0]!.subset, namespace) : undefined;
  if (hash) action.hash_policy = hash;
  const retry = retryPolicy(r.retries, !!hash);
  if (retry) action.retry_policy = retry;
  if (r.mirror) {
    const mc = destinationCluster(push, vs, { ...r.mirror, weight: 100 }, port, mesh);
    if (mc) action.request_mirror_policies = mirrorPolicies(mc, r.mirrorPercentage);
  }
  action.max_grpc_timeout = dur(r.timeoutMs ?? 0);
  if (r.rewrite?.uri !== undefined) action.prefix_rewrite = r.rewrite.uri;
  if (r.rewrite?.authority !== undefined) action.host_rewrite_literal = r.rewrite.authority;
  return action;
}
