// VirtualService HTTP match conditions on the caller rather than the request: sourceLabels, sourceNamespace and
// gateways decide which proxies get the route at all (istio/istio 86c9f01f, pilot/pkg/networking/core/route/
// route.go sourceMatchHTTP: a match naming gateways applies to those only, without looking at sourceLabels;
// otherwise the proxy's labels must include sourceLabels and its namespace be sourceNamespace). statPrefix is
// read here too: it names the route's stats.

import type { Config, HttpMatch, VirtualServiceSpec } from './model';
import { labelsMatch } from './model';
import type { Path, Reader } from './schema';

export const SOURCE_MATCH_FIELDS = ['sourceLabels', 'sourceNamespace', 'gateways', 'statPrefix'];

export function readSourceMatch(r: Reader, mo: Record<string, unknown>, mp: Path, match: HttpMatch): void {
  const labels = r.stringMap(mo.sourceLabels, [...mp, 'sourceLabels']);
  if (Object.keys(labels).length) match.sourceLabels = labels;
  const ns = r.string(mo.sourceNamespace, [...mp, 'sourceNamespace'], {
    pattern: /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/,
    patternText: 'a namespace name',
  });
  if (ns !== undefined) match.sourceNamespace = ns;
  const gws = r.array(mo.gateways, [...mp, 'gateways']).map((g, i) =>
    r.string(g, [...mp, 'gateways', i], {
      required: true,
      pattern: /^(mesh|([a-z0-9-]+\/)?[a-z0-9.-]+)$/,
      patternText: 'mesh, a Gateway name, or namespace/name',
    }),
  );
  if (gws.length) match.gateways = gws.filter((g): g is string => g !== undefined);
  const sp = r.string(mo.statPrefix, [...mp, 'statPrefix'], { required: mo.statPrefix !== undefined });
  if (sp !== undefined) match.statPrefix = sp;
}

/** The proxy a route is built for: its labels and namespace, and `mesh` (a sidecar) or the Gateway (`ns/name`). */
export interface RouteSource {
  labels: Readonly<Record<string, string>>;
  namespace: string;
  gateway: string;
}

/** Does a match apply to routes built for this proxy? (A short Gateway name is of the VirtualService's namespace.) */
export function sourceMatches(m: HttpMatch, vs: Config<VirtualServiceSpec>, src: RouteSource): boolean {
  if (m.gateways?.length)
    return m.gateways.some((g) => (g === 'mesh' || g.includes('/') ? g : `${vs.meta.namespace}/${g}`) === src.gateway);
  if (m.sourceLabels && !labelsMatch(m.sourceLabels, src.labels)) return false;
  return m.sourceNamespace === undefined || m.sourceNamespace === src.namespace;
}

/** Whether any VirtualService has a sourceLabels match: routes then depend on the proxy's labels. */
export function usesSourceLabels(vss: readonly Config<VirtualServiceSpec>[]): boolean {
  return vss.some((vs) => vs.spec.http.some((h) => h.match.some((m) => m.sourceLabels && !m.gateways?.length)));
}
