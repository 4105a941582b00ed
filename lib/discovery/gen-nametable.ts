// NDS: the name table for the agent's DNS proxy (istio.networking.nds.v1.NameTable), one resource per push and
// proxy scope: like its clusters and routes, it holds only the hosts the proxy sees (exportTo, its Sidecar's egress
// hosts), as istiod builds it from the proxy's SidecarScope (istio/istio 86c9f01f pkg/dns/server/name_table.go).
//
// Every ServiceEntry host is in it with the ServiceEntry's IP addresses (CIDRs are left out, as Istio does), or with
// an auto-allocated VIP when it lists none (./auto-vip.ts). Instances (inline endpoints and the WorkloadEntries a
// ServiceEntry selects) do not change a host's entry: only a headless (resolution NONE) service resolves to them
// in Istio, and this server has none. A host named like a Kubernetes service of its ServiceEntry's namespace
// (`reviews.bookinfo.svc.cluster.local` in `bookinfo`) is marked as one, so the DNS proxy on a VM also answers
// `reviews.bookinfo` and, in the same namespace, `reviews`, as it would in a cluster (Istio marks only real
// Kubernetes services so; in standalone mode the ServiceEntry stands in for one).

import { createHash } from 'node:crypto';
import * as net from 'node:net';
import { encodeNameTable, NAME_TABLE_TYPE, type NameInfo, type NameTable } from '../xds-istio';
import { allocateVips } from './auto-vip';
import type { Proxy } from './proxy';
import type { ProxyScope, PushContext } from './push-context';
import type { Resource } from './resources';

/** The single resource's name (Istio's agent does not look at it). */
export const NAME_TABLE_RESOURCE = 'nametable';

/** The table for one proxy scope (every service when none is given). VIPs are allocated over every service, so a
 * host's VIP does not depend on who asks. */
export function buildNameTable(push: PushContext, scope?: ProxyScope): NameTable {
  const vips = push.memoize('auto-vips', () => allocateVips(push.services));
  const table: Record<string, NameInfo> = {};
  for (const svc of scope?.services ?? push.services) {
    const ips = svc.addresses.filter((a) => net.isIP(a));
    const vip = vips.get(svc.hostname);
    if (!ips.length && vip) ips.push(vip);
    if (!ips.length) continue;
    const short = svc.hostname.slice(0, svc.hostname.indexOf('.'));
    const kube = svc.hostname === `${short}.${svc.namespace}.svc.cluster.local`;
    table[svc.hostname] = {
      ips,
      registry: kube ? 'Kubernetes' : 'External',
      shortname: kube ? short : '',
      namespace: kube ? svc.namespace : '',
    };
  }
  return { table };
}

export function buildNameTableResources(push: PushContext, proxy: Proxy): ReadonlyMap<string, Resource> {
  const scope = push.scopeFor(proxy);
  return push.memoize(`nds-map|${scope.key}`, () => {
    const value = encodeNameTable(buildNameTable(push, scope));
    const r: Resource = Object.freeze({
      name: NAME_TABLE_RESOURCE,
      any: { type_url: NAME_TABLE_TYPE, value },
      hash: createHash('sha256').update(value).digest('base64url').slice(0, 16),
    });
    return new Map([[r.name, r]]);
  });
}
