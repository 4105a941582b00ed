// The TLS checks that need the whole config set: a credentialName must name a Secret of the right namespace
// holding what the mode needs (a certificate and key; a CA too for MUTUAL), and a VirtualService bound to a
// PASSTHROUGH server needs `tls` routes (its http routes would never see a request: the stream stays encrypted).

import { CA_SUFFIX } from './gen-secrets';
import type { Config, DestinationRuleSpec, GatewaySpec, SecretSpec, TrafficPolicy, VirtualServiceSpec } from './model';
import { serverHostAccepts } from './gateway-hosts';
import type { Path } from './schema';

export interface TlsIssue {
  config: Config;
  path: Path;
  message: string;
}

export function credentialIssues(configs: readonly Config[]): TlsIssue[] {
  const out: TlsIssue[] = [];
  const secrets = new Map(
    configs
      .filter((c) => c.meta.kind === 'Secret')
      .map((c) => [`${c.meta.namespace}/${c.meta.name}`, c as Config<SecretSpec>]),
  );
  const check = (c: Config, path: Path, ns: string, name: string, needCert: boolean, needCa: boolean) => {
    const s = secrets.get(`${ns}/${name}`);
    const ca = s?.spec.ca ?? secrets.get(`${ns}/${name}${CA_SUFFIX}`)?.spec.ca;
    if (!s)
      out.push({
        config: c,
        path,
        message: `no Secret "${name}" in namespace ${ns} (credentialName names a kind: Secret of the same namespace)`,
      });
    else if (needCert && !s.spec.cert)
      out.push({
        config: c,
        path,
        message: `Secret ${ns}/${name} has no certificate and key (tls.crt and tls.key, or cert and key)`,
      });
    else if (needCa && !ca)
      out.push({
        config: c,
        path,
        message: `MUTUAL TLS needs a CA to verify the peer: Secret ${ns}/${name} has no ca.crt (or cacert), and there is no Secret ${name}${CA_SUFFIX}`,
      });
  };
  for (const c of configs) {
    if (c.meta.kind === 'Gateway') {
      (c.spec as GatewaySpec).servers.forEach((srv, i) => {
        const t = srv.tls;
        if (t?.credentialName !== undefined)
          check(
            c,
            ['spec', 'servers', i, 'tls', 'credentialName'],
            c.meta.namespace,
            t.credentialName,
            true,
            t.mode === 'MUTUAL',
          );
      });
    } else if (c.meta.kind === 'DestinationRule') {
      const dr = c.spec as DestinationRuleSpec;
      const policies: [Path, TrafficPolicy | undefined][] = [[['spec', 'trafficPolicy'], dr.trafficPolicy]];
      dr.trafficPolicy?.portLevelSettings?.forEach((pl, i) =>
        policies.push([['spec', 'trafficPolicy', 'portLevelSettings', i], pl.policy]),
      );
      dr.subsets.forEach((s, i) => policies.push([['spec', 'subsets', i, 'trafficPolicy'], s.trafficPolicy]));
      for (const [p, tp] of policies) {
        const t = tp?.tls;
        if (t?.credentialName === undefined) continue;
        // The CA is needed unless verification is skipped; the client certificate only for MUTUAL.
        check(
          c,
          [...p, 'tls', 'credentialName'],
          c.meta.namespace,
          t.credentialName,
          t.mode === 'MUTUAL',
          !t.insecureSkipVerify,
        );
      }
    }
  }
  return out;
}

export function tlsIssues(
  vs: Config<VirtualServiceSpec>,
  gateways: readonly Config<GatewaySpec>[],
): { path: Path; message: string }[] {
  const out: { path: Path; message: string }[] = [];
  const ns = vs.meta.namespace;
  const forMesh = vs.spec.gateways.length === 0 || vs.spec.gateways.includes('mesh');
  if (vs.spec.tls?.length && forMesh)
    out.push({
      path: ['spec', 'tls'],
      message: 'tls routes are supported on Gateways (PASSTHROUGH servers) only, not for the mesh',
    });
  if (vs.spec.tls?.length || !vs.spec.http.length) return out;
  for (const ref of vs.spec.gateways) {
    if (ref === 'mesh') continue;
    const full = ref.includes('/') ? ref : `${ns}/${ref}`;
    const gw = gateways.find((g) => `${g.meta.namespace}/${g.meta.name}` === full);
    const srv = gw?.spec.servers.find(
      (s) =>
        s.tls?.mode === 'PASSTHROUGH' &&
        s.port.protocol !== 'HTTP' &&
        vs.spec.hosts.some((h) => s.hosts.some((sh) => serverHostAccepts(sh, gw.meta.namespace, h, ns))),
    );
    // Only when no other server of the Gateway could take the http routes.
    const httpServer = gw?.spec.servers.some(
      (s) =>
        s.tls?.mode !== 'PASSTHROUGH' &&
        s.port.protocol !== 'TCP' &&
        s.port.protocol !== 'TLS' &&
        vs.spec.hosts.some((h) => s.hosts.some((sh) => serverHostAccepts(sh, gw.meta.namespace, h, ns))),
    );
    if (srv && !httpServer) {
      out.push({
        path: ['spec', 'http'],
        message: `Gateway ${full} serves these hosts with tls.mode PASSTHROUGH on port ${srv.port.number}: the traffic stays encrypted, so http routes never match; route it with tls (match.sniHosts)`,
      });
    }
  }
  return out;
}
