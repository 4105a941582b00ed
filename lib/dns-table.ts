// The DNS proxy's lookup structure, built from the NameTable the control plane sends (NDS). Pure: values in,
// values out. Every name is stored lowercase and dot-terminated, with Istio's expansions precomputed:
//   - every host: its FQDN (`reviews.bookinfo.svc.cluster.local.`, `*.example.com.`);
//   - Kubernetes hosts inside the proxy's domain: `name.ns.`, `name.ns.svc.`, and `name.` in the proxy's namespace;
//   - every name above + the first search domain (`api.example.com.ns.svc.cluster.local.`) as a CNAME to the name,
//     because resolvers try the search domains first: one round trip instead of a walk down the search list
//     (not for names already ending in that domain).
// A name the table knows but without addresses of the asked family answers NOERROR with no records.

import * as net from 'node:net';
import type { NameTable } from './xds-istio';

export interface TableOptions {
  /** The proxy's namespace: short names (`reviews.`) resolve only for hosts in it. */
  proxyNamespace: string;
  /** The proxy's DNS domain (`ns.svc.cluster.local` or `svc.cluster.local`); a leading namespace is dropped. */
  proxyDomain: string;
  /** resolv.conf `search` list; only the first one gets the CNAME shortcut, as in Istio. */
  searchDomains: readonly string[];
}

export interface DnsTable {
  /** Every name answered locally (lowercase, dot-terminated), including CNAME aliases. */
  readonly names: ReadonlySet<string>;
  readonly v4: ReadonlyMap<string, readonly string[]>;
  readonly v6: ReadonlyMap<string, readonly string[]>;
  /** Alias -> the name it points to. */
  readonly cname: ReadonlyMap<string, string>;
  /** Hosts in the NameTable it was built from. */
  readonly hosts: number;
}

export type Answer = { type: 'A' | 'AAAA'; name: string; data: string } | { type: 'CNAME'; name: string; data: string };

export interface LookupResult {
  /** CNAME first, then the addresses (in table order; the server shuffles them). */
  answers: Answer[];
}

const LABEL = /^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$/;

/** A host name as the table keys it: lowercase and dot-terminated; undefined when it is not a valid DNS name. */
export function normalizeName(name: string): string | undefined {
  let n = name.toLowerCase();
  if (!n.endsWith('.')) n += '.';
  if (n === '.' || n.length > 254) return undefined;
  const labels = n.slice(0, -1).split('.');
  for (let i = 0; i < labels.length; i++) {
    if (labels[i] === '*' && i === 0 && labels.length > 1) continue;
    if (!LABEL.test(labels[i]!)) return undefined;
  }
  return n;
}

/** What is wrong with a NameTable, one line per bad entry; empty when it can be used. */
export function validateNameTable(nt: NameTable): string[] {
  const problems: string[] = [];
  if (!nt || typeof nt.table !== 'object' || nt.table === null) return ['the name table has no table'];
  for (const [host, info] of Object.entries(nt.table)) {
    const where = `host "${host}"`;
    if (!normalizeName(host)) {
      problems.push(`${where}: not a valid DNS name`);
      continue;
    }
    const ips = info?.ips ?? [];
    if (!ips.length) problems.push(`${where}: no IP addresses`);
    for (const ip of ips) if (!net.isIP(ip)) problems.push(`${where}: "${ip}" is not an IP address`);
    for (const [field, v] of [
      ['shortname', info?.shortname],
      ['namespace', info?.namespace],
    ] as const) {
      if (v && !v.split('.').every((l) => LABEL.test(l.toLowerCase())))
        problems.push(`${where}: ${field} "${v}" is not a DNS name`);
    }
  }
  return problems;
}

/** The proxy domain without its leading namespace, as Istio keeps it (`ns.svc.cluster.local` -> `svc.cluster.local`). */
export function domainSuffix(proxyDomain: string, proxyNamespace: string): string {
  const parts = proxyDomain.split('.').filter(Boolean);
  if (parts[0] === proxyNamespace) parts.shift();
  return parts.join('.');
}

/** The names a host answers to, FQDN first. */
export function expandHost(host: string, info: NameTable['table'][string], opts: TableOptions): string[] {
  // Istio gives a Kubernetes host written with a trailing dot no name at all.
  if (info.registry === 'Kubernetes' && host.endsWith('.')) return [];
  const fqdn = normalizeName(host)!;
  const out = [fqdn];
  const domain = domainSuffix(opts.proxyDomain, opts.proxyNamespace);
  if (info.registry !== 'Kubernetes' || !info.shortname || !info.namespace || !domain) return out;
  if (!fqdn.endsWith(`.${domain}.`)) return out;
  const short = info.shortname.toLowerCase();
  const ns = info.namespace.toLowerCase();
  out.push(`${short}.${ns}.`);
  if (ns === opts.proxyNamespace.toLowerCase()) out.push(`${short}.`);
  // Only the first part of the domain (normally `svc`): longer variants are rare and cost a name each.
  out.push(`${short}.${ns}.${domain.split('.')[0]}.`);
  return [...new Set(out)];
}

/**
 * Builds the lookup structure. Throws an Error listing every bad entry (the caller keeps its last good table).
 * When two hosts claim the same name, a host's own FQDN wins over another's expansion, and an address wins over a
 * CNAME alias; otherwise the host that sorts first wins, so the result does not depend on map order.
 */
export function buildDnsTable(nt: NameTable, opts: TableOptions): DnsTable {
  const problems = validateNameTable(nt);
  if (problems.length) throw new Error(`name table rejected: ${problems.join('; ')}`);
  const v4 = new Map<string, string[]>();
  const v6 = new Map<string, string[]>();
  const cname = new Map<string, string>();
  const hosts = Object.keys(nt.table).sort();
  const expanded = hosts.map((h) => ({ info: nt.table[h]!, names: expandHost(h, nt.table[h]!, opts) }));
  const assign = (name: string, ips: readonly string[]) => {
    if (v4.has(name) || v6.has(name)) return;
    v4.set(
      name,
      ips.filter((ip) => net.isIPv4(ip)),
    );
    v6.set(
      name,
      ips.filter((ip) => net.isIPv6(ip)),
    );
  };
  for (const e of expanded) if (e.names.length) assign(e.names[0]!, e.info.ips);
  for (const e of expanded) for (const n of e.names.slice(1)) assign(n, e.info.ips);
  const search = opts.searchDomains[0] ? normalizeName(opts.searchDomains[0].replace(/^\.+/, '')) : undefined;
  if (search) {
    for (const e of expanded) {
      for (const n of e.names) {
        // A name already under the search domain gets no alias (Istio: a plain suffix test).
        if (n.endsWith(search)) continue;
        const alias = n + search;
        if (alias.length > 254 || v4.has(alias) || cname.has(alias)) continue;
        cname.set(alias, n);
      }
    }
  }
  for (const m of [v4, v6]) for (const [k, v] of m) if (!v.length) m.delete(k);
  const names = new Set<string>([...v4.keys(), ...v6.keys(), ...cname.keys()]);
  // A name listed with only one family still counts as known, so the other family gets NOERROR, not a forward.
  for (const e of expanded) for (const n of e.names) names.add(n);
  return Object.freeze({ names, v4, v6, cname, hosts: hosts.length });
}

/**
 * Answers an A or AAAA question from the table. Undefined means the name is not ours (or the type is not A/AAAA):
 * forward it upstream. Answers carry the question's own spelling of the name.
 */
export function lookup(table: DnsTable, type: string, qname: string): LookupResult | undefined {
  if (type !== 'A' && type !== 'AAAA') return undefined;
  const asked = qname.endsWith('.') ? qname : qname + '.';
  let key = asked.toLowerCase();
  let wildcardSuffix: string | undefined;
  if (!table.names.has(key)) {
    const labels = key.slice(0, -1).split('.');
    key = '';
    for (let i = 1; i < labels.length; i++) {
      const w = `*.${labels.slice(i).join('.')}.`;
      if (table.names.has(w)) {
        key = w;
        wildcardSuffix = w.slice(1);
        break;
      }
    }
    if (!key) return undefined;
  }
  const answers: Answer[] = [];
  let target = key;
  let owner = asked;
  const alias = table.cname.get(key);
  if (alias) {
    let concrete = alias;
    // `*.example.com.<search>.` -> `*.example.com.`: point at the asked name's own label under the target.
    if (wildcardSuffix && alias.startsWith('*.'))
      concrete = asked.slice(0, asked.length - wildcardSuffix.length) + alias.slice(1);
    answers.push({ type: 'CNAME', name: asked, data: concrete });
    target = alias;
    owner = concrete;
  }
  const ips = (type === 'A' ? table.v4 : table.v6).get(target) ?? [];
  if (!ips.length) return { answers: [] };
  for (const ip of ips) answers.push({ type, name: owner, data: ip });
  return { answers };
}
