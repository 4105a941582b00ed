// Sidecar reader: which services a namespace's (or selected workloads') sidecars see, by egress hosts.
// Supported: `workloadSelector`, one `egress` entry's `hosts`, `outboundTrafficPolicy.mode`; egress ports, bind,
// capture modes, egressProxy and ingress are rejected.

import type { SidecarSpec } from './model';
import { HOST, type Path, type Reader } from './schema';

export function readSidecar(r: Reader, v: unknown, path: Path): SidecarSpec | undefined {
  const o = r.object(v, path, ['workloadSelector', 'egress', 'outboundTrafficPolicy'], ['egress']);
  if (!o) return undefined;
  const out: SidecarSpec = { egressHosts: [] };
  const ws = r.object(o.workloadSelector, [...path, 'workloadSelector'], ['labels'], ['labels']);
  if (ws) out.workloadSelector = r.stringMap(ws.labels, [...path, 'workloadSelector', 'labels']);
  const egress = r.array(o.egress, [...path, 'egress'], { required: true, nonEmpty: true });
  if (egress.length > 1) r.fail([...path, 'egress'], 'only one egress listener (hosts only, no port) is supported');
  egress.forEach((e, i) => {
    const ep = [...path, 'egress', i];
    const eo = r.object(e, ep, ['hosts'], ['hosts']);
    r.array(eo?.hosts, [...ep, 'hosts'], { required: true, nonEmpty: true }).forEach((h, j) => {
      const s = r.string(h, [...ep, 'hosts', j], { required: true });
      if (s === undefined) return;
      const slash = s.indexOf('/');
      const ns = s.slice(0, slash);
      const host = s.slice(slash + 1);
      if (slash < 0 || !/^(\*|\.|~|[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)$/.test(ns) || !HOST.test(host)) {
        r.fail(
          [...ep, 'hosts', j],
          `"${s}" is not namespace/host (namespace "*", ".", "~" or a name; host "*", "*.suffix" or a name)`,
        );
      } else out.egressHosts.push(s);
    });
  });
  const otp = r.object(o.outboundTrafficPolicy, [...path, 'outboundTrafficPolicy'], ['mode'], ['mode']);
  const mode = r.oneOf(otp?.mode, [...path, 'outboundTrafficPolicy', 'mode'], ['ALLOW_ANY', 'REGISTRY_ONLY'] as const);
  if (mode) out.outboundTrafficPolicy = mode;
  return out;
}
