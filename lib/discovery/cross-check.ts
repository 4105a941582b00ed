// Checks that need the whole config set at once: duplicate names, hosts defined twice, and references (routes to
// unknown hosts, ports or subsets; unknown gateways). A set with any issue is never applied.

import {
  type Config,
  type DestinationRuleSpec,
  describe,
  type GatewaySpec,
  keyOf,
  qualifyHost,
  type ServiceEntrySpec,
  type VirtualServiceSpec,
} from './model';
import { hostCovers } from './visibility';
import { credentialIssues, tlsIssues } from './cross-check-tls';
import { formatPath, type Path } from './schema';
import type { ConfigIssue } from './yaml-file';

export function crossCheck(configs: readonly Config[]): ConfigIssue[] {
  const issues: ConfigIssue[] = [];
  const issue = (c: Config, path: Path, message: string) => {
    const src = c.meta.source;
    const i: ConfigIssue = {
      file: src?.file ?? '(api)',
      subject: `${c.meta.kind} ${c.meta.namespace}/${c.meta.name}`,
      message,
    };
    if (src) {
      i.doc = src.doc;
      Object.assign(i, src.locate?.(path));
    }
    if (path.length) i.field = formatPath(path);
    issues.push(i);
  };

  const seen = new Map<string, Config>();
  for (const c of configs) {
    const prev = seen.get(keyOf(c));
    if (prev)
      issue(
        c,
        ['metadata', 'name'],
        `duplicate name: ${c.meta.kind} ${c.meta.namespace}/${c.meta.name} is also defined in ${describe(prev)}`,
      );
    else seen.set(keyOf(c), c);
  }
  const unique = [...seen.values()];
  const of = <S>(kind: Config['meta']['kind']) => unique.filter((c) => c.meta.kind === kind) as Config<S>[];

  const hosts = new Map<string, Config<ServiceEntrySpec>>();
  for (const se of of<ServiceEntrySpec>('ServiceEntry')) {
    se.spec.hosts.forEach((h, i) => {
      const prev = hosts.get(h);
      if (prev) issue(se, ['spec', 'hosts', i], `host "${h}" is already defined by ${describe(prev)}`);
      else hosts.set(h, se);
    });
  }
  const lookup = (host: string, ns: string) => hosts.get(host) ?? hosts.get(qualifyHost(host, ns));

  const subsets = new Map<string, Set<string>>();
  const drByHost = new Map<string, Config<DestinationRuleSpec>>();
  const wildDrs: Config<DestinationRuleSpec>[] = [];
  for (const dr of of<DestinationRuleSpec>('DestinationRule')) {
    if (dr.spec.host.includes('*')) {
      const prev = wildDrs.find((w) => w.spec.host === dr.spec.host);
      if (prev) issue(dr, ['spec', 'host'], `host "${dr.spec.host}" already has a DestinationRule: ${describe(prev)}`);
      else wildDrs.push(dr);
      continue;
    }
    const se = lookup(dr.spec.host, dr.meta.namespace);
    if (!se) {
      issue(dr, ['spec', 'host'], `unknown host "${dr.spec.host}": no ServiceEntry defines it`);
      continue;
    }
    const host = se.spec.hosts.includes(dr.spec.host) ? dr.spec.host : qualifyHost(dr.spec.host, dr.meta.namespace);
    const prev = drByHost.get(host);
    if (prev) issue(dr, ['spec', 'host'], `host "${host}" already has a DestinationRule: ${describe(prev)}`);
    else {
      drByHost.set(host, dr);
      subsets.set(host, new Set(dr.spec.subsets.map((s) => s.name)));
    }
  }

  const gatewayConfigs = of<GatewaySpec>('Gateway');
  const gateways = new Set(gatewayConfigs.map((g) => `${g.meta.namespace}/${g.meta.name}`));
  for (const x of credentialIssues(unique)) issue(x.config, x.path, x.message);
  const meshHosts = new Map<string, Config<VirtualServiceSpec>>();
  for (const vs of of<VirtualServiceSpec>('VirtualService')) {
    const ns = vs.meta.namespace;
    const forMesh = vs.spec.gateways.length === 0 || vs.spec.gateways.includes('mesh');
    vs.spec.gateways.forEach((g, i) => {
      if (g === 'mesh') return;
      const ref = g.includes('/') ? g : `${ns}/${g}`;
      if (!gateways.has(ref)) issue(vs, ['spec', 'gateways', i], `unknown Gateway "${ref}"`);
    });
    if (forMesh) {
      vs.spec.hosts.forEach((h, i) => {
        const se = lookup(h, ns);
        if (h.includes('*') && !se) {
          // A wildcard applies to the services it covers; it need not name one itself.
          const prev = meshHosts.get(h);
          if (prev) issue(vs, ['spec', 'hosts', i], `host "${h}" is already routed for the mesh by ${describe(prev)}`);
          else meshHosts.set(h, vs);
          return;
        }
        if (!se)
          return issue(
            vs,
            ['spec', 'hosts', i],
            `unknown host "${h}": sidecars route only hosts that a ServiceEntry defines`,
          );
        const fq = se.spec.hosts.includes(h) ? h : qualifyHost(h, ns);
        const prev = meshHosts.get(fq);
        if (prev) issue(vs, ['spec', 'hosts', i], `host "${fq}" is already routed for the mesh by ${describe(prev)}`);
        else meshHosts.set(fq, vs);
      });
    }
    const routes = [
      ...vs.spec.http.map((route, ri) => {
        const dests = route.route.map((d, di) => ({
          d,
          path: ['spec', 'http', ri, 'route', di, 'destination'] as Path,
        }));
        if (route.mirror) dests.push({ d: { ...route.mirror, weight: 0 }, path: ['spec', 'http', ri, 'mirror'] });
        return dests;
      }),
      ...vs.spec.tcp.map((route, ri) =>
        route.route.map((d, di) => ({ d, path: ['spec', 'tcp', ri, 'route', di, 'destination'] as Path })),
      ),
    ];
    for (const x of tlsIssues(vs, gatewayConfigs)) issue(vs, x.path, x.message);
    (vs.spec.tls ?? []).forEach((route, ri) =>
      routes.push(route.route.map((d, di) => ({ d, path: ['spec', 'tls', ri, 'route', di, 'destination'] as Path }))),
    );
    routes.forEach((dests) => {
      dests.forEach(({ d, path }) => {
        const se = lookup(d.host, ns);
        if (!se) return issue(vs, [...path, 'host'], `route to unknown host "${d.host}": no ServiceEntry defines it`);
        const fq = se.spec.hosts.includes(d.host) ? d.host : qualifyHost(d.host, ns);
        if (d.port !== undefined && !se.spec.ports.some((p) => p.number === d.port)) {
          issue(
            vs,
            [...path, 'port', 'number'],
            `host "${fq}" has no port ${d.port} (ports: ${se.spec.ports.map((p) => p.number).join(', ')})`,
          );
        } else if (d.port === undefined && se.spec.ports.length > 1 && !forMesh) {
          issue(vs, [...path, 'port'], `host "${fq}" has several ports; say which one`);
        }
        // Subsets come from the host's own DestinationRule, else from the most specific wildcard one covering it.
        const wild = wildDrs
          .filter((w) => hostCovers(w.spec.host, fq))
          .sort((a, b) => b.spec.host.length - a.spec.host.length)[0];
        const known = subsets.get(fq) ?? (wild ? new Set(wild.spec.subsets.map((x) => x.name)) : undefined);
        if (d.subset !== undefined && !known?.has(d.subset)) {
          issue(
            vs,
            [...path, 'subset'],
            `unknown subset "${d.subset}" of host "${fq}" (define it in a DestinationRule)`,
          );
        }
      });
    });
  }
  return issues;
}
