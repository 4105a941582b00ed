// Who sees what, as Istio decides it: `exportTo` on a ServiceEntry, VirtualService or DestinationRule (`*` every
// namespace, `.` its own, `~` none, or namespace names), and a Sidecar's egress hosts (`namespace/host`, with
// `*`, `.` and `~` for the namespace and `*` or `*.suffix` for the host) narrowing what a sidecar's proxy sees.

import { type Path, type Reader } from './schema';

/** exportTo as written, checked: empty means every namespace. */
export function readExportTo(r: Reader, v: unknown, path: Path): string[] | undefined {
  if (v === undefined || v === null) return undefined;
  const out: string[] = [];
  r.array(v, path).forEach((x, i) => {
    const s = r.string(x, [...path, i], {
      required: true,
      pattern: /^(\*|\.|~|[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)$/,
      patternText: '"*", ".", "~" or a namespace name',
    });
    if (s !== undefined) out.push(s);
  });
  if (out.length > 1 && (out.includes('*') || out.includes('~'))) r.fail(path, '"*" and "~" must be the only entry');
  return out;
}

/** Is a config of namespace `configNs` with this exportTo visible to a proxy in `proxyNs`? */
export function exportedTo(exportTo: readonly string[] | undefined, configNs: string, proxyNs: string): boolean {
  if (!exportTo?.length) return true;
  return exportTo.some((e) => e === '*' || (e === '.' ? configNs : e) === proxyNs);
}

/** Does a Sidecar egress host (`ns/host`) written in `sidecarNs` admit a service? */
export function egressAdmits(egressHost: string, sidecarNs: string, serviceHost: string, serviceNs: string): boolean {
  const slash = egressHost.indexOf('/');
  const ns = egressHost.slice(0, slash);
  const host = egressHost.slice(slash + 1);
  if (ns === '~') return false;
  if (ns !== '*' && (ns === '.' ? sidecarNs : ns) !== serviceNs) return false;
  return hostCovers(host, serviceHost);
}

/** Does a host pattern (`*`, `*.suffix` or a name) cover a hostname (itself possibly `*.suffix`)? */
export function hostCovers(pattern: string, host: string): boolean {
  if (pattern === '*' || pattern === host) return true;
  return pattern.startsWith('*.') && host.endsWith(pattern.slice(1));
}
