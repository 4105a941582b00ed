// TLS fields of three kinds: a Gateway server's `tls` (ServerTLSSettings), a DestinationRule's `trafficPolicy.tls`
// (ClientTLSSettings) and a VirtualService's `tls` routes. The combinations istiod's validation refuses
// (istio/istio 86c9f01f, pkg/config/validation/validation.go validateServerTLS/validateTLSOptions) are refused here
// with the field named; fields this server does not implement are rejected by the strict object reader.

import type { ClientTls, GatewayProtocol, RouteDestination, ServerTls, TlsRoute, TlsVersion } from './model';
import { HOST, type Path, type Reader } from './schema';

const VERSIONS = ['TLS_AUTO', 'TLSV1_0', 'TLSV1_1', 'TLSV1_2', 'TLSV1_3'] as const;
// The cipher suites istiod accepts (istio/istio 86c9f01f, pkg/config/security/security.go ValidCipherSuites: what
// Envoy's BoringSSL knows). istiod drops others with a warning; here they are refused, so none is silently lost.
const CIPHER_SUITES = new Set([
  'ECDHE-ECDSA-AES128-GCM-SHA256',
  'ECDHE-RSA-AES128-GCM-SHA256',
  'ECDHE-ECDSA-AES256-GCM-SHA384',
  'ECDHE-RSA-AES256-GCM-SHA384',
  'ECDHE-ECDSA-CHACHA20-POLY1305',
  'ECDHE-RSA-CHACHA20-POLY1305',
  'ECDHE-ECDSA-AES128-SHA',
  'ECDHE-RSA-AES128-SHA',
  'ECDHE-ECDSA-AES256-SHA',
  'ECDHE-RSA-AES256-SHA',
  'AES128-GCM-SHA256',
  'AES256-GCM-SHA384',
  'AES128-SHA',
  'AES256-SHA',
  'DES-CBC3-SHA',
]);

export function readServerTls(
  r: Reader,
  v: unknown,
  path: Path,
  protocol: GatewayProtocol | undefined,
): ServerTls | undefined {
  const o = r.object(v, path, [
    'mode',
    'httpsRedirect',
    'credentialName',
    'serverCertificate',
    'privateKey',
    'caCertificates',
    'subjectAltNames',
    'minProtocolVersion',
    'maxProtocolVersion',
    'cipherSuites',
  ]);
  if (!o) return undefined;
  // PASSTHROUGH is the enum's zero value, as in Istio's API.
  const mode =
    r.oneOf(o.mode, [...path, 'mode'], ['PASSTHROUGH', 'SIMPLE', 'MUTUAL', 'ISTIO_MUTUAL'] as const, {
      unsupported: ['AUTO_PASSTHROUGH', 'OPTIONAL_MUTUAL'],
    }) ?? 'PASSTHROUGH';
  const out: ServerTls = {
    mode,
    httpsRedirect: r.bool(o.httpsRedirect, [...path, 'httpsRedirect']) ?? false,
    subjectAltNames: strings(r, o.subjectAltNames, [...path, 'subjectAltNames']),
    cipherSuites: strings(r, o.cipherSuites, [...path, 'cipherSuites']),
  };
  out.cipherSuites.forEach((c, i) => {
    // As istiod, an expression ([a|b], -x, !x) is left to Envoy.
    if (/^[A-Za-z0-9]/.test(c) && c !== 'ALL' && !CIPHER_SUITES.has(c))
      r.fail(
        [...path, 'cipherSuites', i],
        `"${c}" is not a cipher suite Envoy supports (${[...CIPHER_SUITES].join(', ')})`,
      );
    if (out.cipherSuites.indexOf(c) !== i) r.fail([...path, 'cipherSuites', i], `"${c}" is listed twice`);
  });
  for (const k of ['credentialName', 'serverCertificate', 'privateKey', 'caCertificates'] as const) {
    const s = r.string(o[k], [...path, k], { required: o[k] !== undefined });
    if (s !== undefined) out[k] = s;
  }
  for (const k of ['minProtocolVersion', 'maxProtocolVersion'] as const) {
    const s = r.oneOf(o[k], [...path, k], VERSIONS);
    if (s !== undefined) out[k] = s as TlsVersion;
  }
  if (
    out.minProtocolVersion &&
    out.maxProtocolVersion &&
    out.maxProtocolVersion !== 'TLS_AUTO' &&
    VERSIONS.indexOf(out.minProtocolVersion) > VERSIONS.indexOf(out.maxProtocolVersion)
  ) {
    r.fail(
      [...path, 'maxProtocolVersion'],
      `${out.maxProtocolVersion} is below minProtocolVersion ${out.minProtocolVersion}`,
    );
  }
  const given = (['credentialName', 'serverCertificate', 'privateKey', 'caCertificates'] as const).filter(
    (k) => out[k] !== undefined,
  );
  const plain = protocol === 'HTTP' || protocol === 'HTTP2' || protocol === 'GRPC';
  if (plain) {
    // On a plaintext server only httpsRedirect means anything (istiod ignores the rest).
    const extra = Object.keys(o).filter((k) => k !== 'httpsRedirect');
    if (extra.length)
      r.fail([...path, extra[0]!], `is for HTTPS and TLS servers; a ${protocol} server takes only httpsRedirect`);
    return out;
  }
  if (protocol === 'TCP')
    return r.fail(path, 'a TCP server has no tls; use protocol TLS to terminate or pass TLS through');
  if (out.httpsRedirect) r.fail([...path, 'httpsRedirect'], `is for HTTP servers (this one is ${protocol})`);
  if (mode === 'SIMPLE' || mode === 'MUTUAL') {
    if (out.credentialName !== undefined) {
      for (const k of given) if (k !== 'credentialName') r.fail([...path, k], 'cannot be combined with credentialName');
    } else {
      if (out.serverCertificate === undefined)
        r.fail([...path, 'serverCertificate'], `${mode} TLS needs credentialName, or serverCertificate and privateKey`);
      if (out.privateKey === undefined)
        r.fail([...path, 'privateKey'], `${mode} TLS needs credentialName, or serverCertificate and privateKey`);
      if (mode === 'MUTUAL' && out.caCertificates === undefined)
        r.fail(
          [...path, 'caCertificates'],
          'MUTUAL TLS needs caCertificates (or credentialName with a ca.crt) to verify clients',
        );
    }
  } else {
    for (const k of given) r.fail([...path, k], `is not used in ${mode} mode`);
  }
  if (
    mode === 'PASSTHROUGH' &&
    protocol === 'HTTPS' &&
    (out.cipherSuites.length || out.minProtocolVersion || out.maxProtocolVersion)
  ) {
    r.fail(path, 'PASSTHROUGH does not terminate TLS: cipherSuites and protocol versions do not apply');
  }
  return out;
}

export function readClientTls(r: Reader, v: unknown, path: Path): ClientTls | undefined {
  const o = r.object(
    v,
    path,
    [
      'mode',
      'subjectAltNames',
      'caCertificates',
      'clientCertificate',
      'privateKey',
      'credentialName',
      'sni',
      'insecureSkipVerify',
    ],
    ['mode'],
  );
  if (!o) return undefined;
  const mode = r.oneOf(o.mode, [...path, 'mode'], ['DISABLE', 'ISTIO_MUTUAL', 'SIMPLE', 'MUTUAL'] as const, {
    required: true,
  });
  const out: ClientTls = {
    mode: mode ?? 'DISABLE',
    subjectAltNames: strings(r, o.subjectAltNames, [...path, 'subjectAltNames']),
  };
  for (const k of ['caCertificates', 'clientCertificate', 'privateKey', 'credentialName', 'sni'] as const) {
    const s = r.string(o[k], [...path, k], { required: o[k] !== undefined });
    if (s !== undefined) out[k] = s;
  }
  const skip = r.bool(o.insecureSkipVerify, [...path, 'insecureSkipVerify']);
  if (skip !== undefined) out.insecureSkipVerify = skip;
  if (!mode) return undefined;
  const files = (['caCertificates', 'clientCertificate', 'privateKey'] as const).filter((k) => out[k] !== undefined);
  if (mode === 'DISABLE' || mode === 'ISTIO_MUTUAL') {
    for (const k of [
      ...files,
      ...(['credentialName', 'sni', 'insecureSkipVerify'] as const).filter(
        (k) => out[k] !== undefined && !(k === 'sni' && mode === 'ISTIO_MUTUAL'),
      ),
    ]) {
      r.fail([...path, k], `is not used in ${mode} mode`);
    }
    return out;
  }
  if (out.credentialName !== undefined) {
    for (const k of files) r.fail([...path, k], 'cannot be combined with credentialName');
  } else if (mode === 'MUTUAL') {
    // istiod's cluster builder refuses the cluster without both (pilot/pkg/networking/core/cluster_tls.go).
    if (out.clientCertificate === undefined)
      r.fail([...path, 'clientCertificate'], 'MUTUAL TLS needs credentialName, or clientCertificate and privateKey');
    if (out.privateKey === undefined)
      r.fail([...path, 'privateKey'], 'MUTUAL TLS needs credentialName, or clientCertificate and privateKey');
  } else if (out.clientCertificate !== undefined || out.privateKey !== undefined) {
    r.fail(
      [...path, out.clientCertificate !== undefined ? 'clientCertificate' : 'privateKey'],
      'is for MUTUAL mode (SIMPLE presents no client certificate)',
    );
  }
  return out;
}

/** VirtualService `tls`: each route needs a match with sniHosts (what a passthrough filter chain matches on). */
export function readTlsRoutes(
  r: Reader,
  v: unknown,
  path: Path,
  readDestinations: (r: Reader, v: unknown, path: Path) => RouteDestination[],
): TlsRoute[] {
  const out: TlsRoute[] = [];
  r.array(v, path).forEach((t, i) => {
    const tp = [...path, i];
    const to = r.object(t, tp, ['match', 'route'], ['match', 'route']);
    if (!to) return;
    const match: TlsRoute['match'] = [];
    r.array(to.match, [...tp, 'match'], { required: true, nonEmpty: true }).forEach((m, j) => {
      const mp = [...tp, 'match', j];
      const mo = r.object(m, mp, ['sniHosts', 'port', 'gateways'], ['sniHosts']);
      if (!mo) return;
      const sniHosts = r
        .array(mo.sniHosts, [...mp, 'sniHosts'], { required: true, nonEmpty: true })
        .map((h, k) =>
          r.string(h, [...mp, 'sniHosts', k], { required: true, pattern: HOST, patternText: 'a hostname' }),
        )
        .filter((h): h is string => h !== undefined);
      const port = r.port(mo.port, [...mp, 'port']);
      const gateways = strings(r, mo.gateways, [...mp, 'gateways']);
      match.push(port === undefined ? { sniHosts, gateways } : { sniHosts, port, gateways });
    });
    out.push({ match, route: readDestinations(r, to.route, [...tp, 'route']) });
  });
  return out;
}

function strings(r: Reader, v: unknown, path: Path): string[] {
  return r
    .array(v, path)
    .map((s, i) => r.string(s, [...path, i], { required: true }))
    .filter((s): s is string => s !== undefined);
}
