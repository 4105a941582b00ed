// The Envoy fields the discovery server generates for TLS, checked against what istiod generates for the same
// YAML (istio/istio 86c9f01f: pilot/pkg/networking/core/gateway.go, listener.go BuildListenerTLSContext,
// cluster_tls.go, pilot/pkg/security/model/authentication.go, pilot/pkg/xds/sds.go). The corpus
// (discovery-corpus.test.ts) proves the behaviour with a real Envoy; these pin the fields and the messages.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { MemoryConfigStore } from '../lib/discovery/config-store';
import { FileConfigSource } from '../lib/discovery/file-source';
import { generate } from '../lib/discovery/generate';
import { proxyFromNode, withIdentity } from '../lib/discovery/proxy';
import { PushContext } from '../lib/discovery/push-context';
import { ServiceEntryRegistry } from '../lib/discovery/registry';
import { TYPE_URLS } from '../lib/discovery/resources';
import { formatIssue } from '../lib/discovery/yaml-file';
import { unpackAny } from '../lib/envoy-protos';
import { tempDir } from './helpers/harness';
import { makeCerts, type TestCert } from './helpers/test-certs';

type Obj = Record<string, any>;
const b64 = (s: string) => Buffer.from(s).toString('base64');
const ANON_ROUTER = proxyFromNode({ id: 'router~10.0.0.9~gw-0.test~test.svc.cluster.local' });
// As the ADS server leaves it once the stream's token proved an identity of the router's namespace.
const ROUTER = withIdentity(ANON_ROUTER, { namespace: 'test', serviceAccount: 'ingress', via: 'token' });
const SIDECAR = proxyFromNode({ id: 'sidecar~10.0.0.8~app-0.test~test.svc.cluster.local' });
const OTHER_NS_ROUTER = withIdentity(proxyFromNode({ id: 'router~10.0.0.7~gw-0.other~other.svc.cluster.local' }), { namespace: 'other', serviceAccount: 'ingress', via: 'token' });

let certs: Record<string, TestCert>;
const certDir = tempDir('pa-gwtls-certs-');
test.before(async () => {
  certs = await makeCerts(certDir.path, { ca: {}, a: { ca: 'ca', hosts: ['a.example.com'] }, b: { ca: 'ca', hosts: ['b.example.com'] } });
});

const SE = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: app, namespace: test}
spec:
  hosts: [app.example.local]
  ports: [{number: 8080, name: http, protocol: HTTP}, {number: 9000, name: tcp, protocol: TCP}]
  endpoints: [{address: 10.0.0.1}]
`;
const secret = (name: string, cert: string | undefined, ca?: string, key = cert) => `apiVersion: v1
kind: Secret
metadata: {name: ${name}, namespace: test}
${cert ? `type: kubernetes.io/tls\n` : ''}data:
${cert ? `  tls.crt: ${b64(certs[cert]!.cert)}\n  tls.key: ${b64(certs[key!]!.key)}\n` : ''}${ca ? `  ca.crt: ${b64(certs[ca]!.cert)}\n` : ''}`;

async function load(files: Record<string, string>, opts: { servePrivateKeys?: boolean } = {}): Promise<{ push?: PushContext; issues: string[] }> {
  const dir = tempDir();
  try {
    for (const [n, t] of Object.entries(files)) fs.writeFileSync(path.join(dir.path, n), t);
    const store = new MemoryConfigStore();
    const reg = new ServiceEntryRegistry(store);
    reg.run();
    const issues = (await new FileConfigSource({ dir: dir.path, store }).sync({ report: false })).issues.map(formatIssue);
    return { push: issues.length ? undefined : PushContext.build('x', store, reg, undefined, undefined, opts), issues };
  } finally {
    dir.cleanup();
  }
}

const resources = (push: PushContext, proxy: ReturnType<typeof proxyFromNode>, type: string) =>
  new Map([...generate(push, proxy, type)].map(([n, r]) => [n, unpackAny(r.any) as Obj]));
const any = (x: Obj) => unpackAny(x as never) as Obj;

const GATEWAY = `apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: ingress, namespace: test}
spec:
  servers:
  - port: {number: 443, name: https-a, protocol: HTTPS}
    hosts: [test/a.example.com]
    tls: {mode: SIMPLE, credentialName: a-cred, minProtocolVersion: TLSV1_2, maxProtocolVersion: TLSV1_3, cipherSuites: [ECDHE-ECDSA-AES128-GCM-SHA256]}
  - port: {number: 443, name: https-b, protocol: HTTPS}
    hosts: [b.example.com]
    tls: {mode: MUTUAL, serverCertificate: /certs/b.crt, privateKey: /certs/b.key, caCertificates: /certs/ca.crt, subjectAltNames: [client.example.com]}
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: [a.example.com]
    tls: {httpsRedirect: true}
  - port: {number: 15443, name: mtls, protocol: TLS}
    hosts: ["*"]
    tls: {mode: ISTIO_MUTUAL}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: app, namespace: test}
spec:
  hosts: [a.example.com, b.example.com]
  gateways: [ingress]
  http:
  - route: [{destination: {host: app.example.local, port: {number: 8080}}}]
  tcp:
  - route: [{destination: {host: app.example.local, port: {number: 9000}}}]
`;

test('HTTPS servers on one port become SNI filter chains with their own routes and certificates (Secret over ADS, files over the agent SDS), as istiod', async () => {
  const { push, issues } = await load({ 'se.yaml': SE, 's.yaml': secret('a-cred', 'a'), 'gw.yaml': GATEWAY });
  assert.equal(issues, []);
  const lds = resources(push!, ROUTER, TYPE_URLS.listener);
  const l443 = lds.get('0.0.0.0_443')!;
  assert.equal(l443.listener_filters.map((f: Obj) => f.name), ['envoy.filters.listener.tls_inspector']);
  const [a, b] = l443.filter_chains as Obj[];
  assert.equal(a!.filter_chain_match, { server_names: ['a.example.com'] });
  assert.equal(b!.filter_chain_match, { server_names: ['b.example.com'] });
  const rds = (c: Obj) => any(c.filters[0].typed_config).rds.route_config_name;
  assert.is(rds(a!), 'https.443.https-a.ingress.test');
  assert.is(rds(b!), 'https.443.https-b.ingress.test');

  const ta = any(a!.transport_socket.typed_config);
  assert.equal(ta.require_client_certificate, { value: false });
  assert.equal(ta.common_tls_context.alpn_protocols, ['h2', 'http/1.1']);
  assert.equal(ta.common_tls_context.tls_certificate_sds_secret_configs, [{ name: 'kubernetes://a-cred', sds_config: { ads: {}, resource_api_version: 'V3' } }]);
  assert.equal(ta.common_tls_context.tls_params, { tls_minimum_protocol_version: 'TLSv1_2', tls_maximum_protocol_version: 'TLSv1_3', cipher_suites: ['ECDHE-ECDSA-AES128-GCM-SHA256'] });

  const tb = any(b!.transport_socket.typed_config);
  assert.equal(tb.require_client_certificate, { value: true });
  const sdsGrpc = (c: Obj) => c.sds_config.api_config_source.grpc_services[0].envoy_grpc.cluster_name;
  assert.is(tb.common_tls_context.tls_certificate_sds_secret_configs[0].name, 'file-cert:/certs/b.crt~/certs/b.key');
  assert.is(sdsGrpc(tb.common_tls_context.tls_certificate_sds_secret_configs[0]), 'sds-grpc');
  const cvc = tb.common_tls_context.combined_validation_context;
  assert.equal(cvc.default_validation_context.match_subject_alt_names, [{ exact: 'client.example.com' }]);
  assert.is(cvc.validation_context_sds_secret_config.name, 'file-root:/certs/ca.crt');

  // A TLS server terminating ISTIO_MUTUAL: the workload certificate, istio ALPNs, and the tcp route.
  const [m] = lds.get('0.0.0.0_15443')!.filter_chains as Obj[];
  assert.is(m!.filter_chain_match, undefined, 'hosts ["*"]: no SNI match');
  const tm = any(m!.transport_socket.typed_config);
  assert.is(tm.common_tls_context.tls_certificate_sds_secret_configs[0].name, 'default');
  assert.is(tm.common_tls_context.combined_validation_context.validation_context_sds_secret_config.name, 'ROOTCA');
  assert.equal(tm.common_tls_context.alpn_protocols, ['istio-peer-exchange', 'istio', 'h2', 'http/1.1']);
  assert.is(any(m!.filters[0].typed_config).cluster, 'outbound|9000||app.example.local');

  // Plaintext HTTP with httpsRedirect: one chain, no TLS; its virtual host requires TLS (301 to https).
  assert.is(lds.get('0.0.0.0_80')!.listener_filters, undefined);
  const routes = resources(push!, ROUTER, TYPE_URLS.route);
  assert.equal([...routes.keys()].sort(), ['http.80', 'https.443.https-a.ingress.test', 'https.443.https-b.ingress.test']);
  assert.is(routes.get('http.80')!.virtual_hosts[0].require_tls, 'ALL');
  assert.equal(routes.get('https.443.https-a.ingress.test')!.virtual_hosts.map((v: Obj) => v.domains[0]), ['a.example.com']);
  assert.is(routes.get('https.443.https-a.ingress.test')!.virtual_hosts[0].require_tls, undefined);
});

test('Secrets go to the routers of their namespace only (kubernetes://<name>, <name>-cacert), keys only to an authenticated one over a local address', async () => {
  const files = { 'se.yaml': SE, 's.yaml': `${secret('a-cred', 'a', 'ca')}---\n${secret('b-cred', 'b')}---\n${secret('b-cred-cacert', undefined, 'ca')}` };
  const { push } = await load(files);
  const sds = resources(push!, ROUTER, TYPE_URLS.secret);
  assert.equal([...sds.keys()].sort(), ['kubernetes://a-cred', 'kubernetes://a-cred-cacert', 'kubernetes://b-cred', 'kubernetes://b-cred-cacert', 'kubernetes://b-cred-cacert-cacert']);
  const a = sds.get('kubernetes://a-cred')!;
  assert.is(Buffer.from(a.tls_certificate.certificate_chain.inline_bytes).toString(), certs.a!.cert);
  assert.is(Buffer.from(a.tls_certificate.private_key.inline_bytes).toString(), certs.a!.key);
  assert.is(Buffer.from(sds.get('kubernetes://b-cred-cacert')!.validation_context.trusted_ca.inline_bytes).toString(), certs.ca!.cert, 'the CA of the Secret named <name>-cacert');
  assert.equal(resources(push!, SIDECAR, TYPE_URLS.secret).size, 0, 'sidecars get no credentials');
  assert.equal(resources(push!, OTHER_NS_ROUTER, TYPE_URLS.secret).size, 0, 'nor routers of another namespace');
  const caOnly = ['kubernetes://a-cred-cacert', 'kubernetes://b-cred-cacert', 'kubernetes://b-cred-cacert-cacert'];
  assert.equal([...resources(push!, ANON_ROUTER, TYPE_URLS.secret).keys()].sort(), caOnly, 'an anonymous router gets the CA bundles only');
  assert.equal(resources(push!, ROUTER, TYPE_URLS.secret).size, 5, 'and the authenticated one still its keys (no shared memo)');
  const remote = (await load(files, { servePrivateKeys: false })).push!;
  assert.equal([...resources(remote, ROUTER, TYPE_URLS.secret).keys()].sort(), caOnly);
});

test('DestinationRule SIMPLE and MUTUAL originate TLS as istiod: files over the agent SDS, credentialName on routers only, auto SNI', async () => {
  const dr = (tls: string) => ({ 'se.yaml': SE, 's.yaml': secret('up', 'a', 'ca'), 'dr.yaml': `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: app, namespace: test}
spec:
  host: app.example.local
  trafficPolicy: {tls: ${tls}}
` });
  const cluster = async (tls: string, proxy = ROUTER) => {
    const { push, issues } = await load(dr(tls));
    assert.equal(issues, []);
    return resources(push!, proxy, TYPE_URLS.cluster).get('outbound|8080||app.example.local')!;
  };
  const ctx = (c: Obj) => any(c.transport_socket.typed_config);
  const httpOpts = (c: Obj) => any(c.typed_extension_protocol_options['envoy.extensions.upstreams.http.v3.HttpProtocolOptions']).upstream_http_protocol_options;

  const simple = await cluster('{mode: SIMPLE}');
  const s = ctx(simple);
  assert.equal(s.common_tls_context.tls_params, { tls_minimum_protocol_version: 'TLSv1_2', tls_maximum_protocol_version: 'TLSv1_3' });
  assert.is(s.common_tls_context.combined_validation_context.validation_context_sds_secret_config.name, 'file-root:system');
  assert.is(s.sni, undefined);
  assert.equal(httpOpts(simple), { auto_sni: true, auto_san_validation: true });

  const mutual = await cluster('{mode: MUTUAL, clientCertificate: /c/cert.pem, privateKey: /c/key.pem, caCertificates: /c/ca.pem, sni: app.example.com, subjectAltNames: [app.example.com]}');
  const m = ctx(mutual);
  assert.is(m.sni, 'app.example.com');
  assert.is(m.common_tls_context.tls_certificate_sds_secret_configs[0].name, 'file-cert:/c/cert.pem~/c/key.pem');
  assert.is(m.common_tls_context.combined_validation_context.validation_context_sds_secret_config.name, 'file-root:/c/ca.pem');
  assert.equal(m.common_tls_context.combined_validation_context.default_validation_context.match_subject_alt_names, [{ exact: 'app.example.com' }]);
  assert.is(mutual.typed_extension_protocol_options, undefined, 'sni and SANs given: no auto SNI or SAN validation');

  const skip = ctx(await cluster('{mode: SIMPLE, insecureSkipVerify: true, sni: x}'));
  assert.equal(skip.common_tls_context.validation_context, {});

  const cred = ctx(await cluster('{mode: MUTUAL, credentialName: up}'));
  assert.equal(cred.common_tls_context.tls_certificate_sds_secret_configs, [{ name: 'kubernetes://up', sds_config: { ads: {}, resource_api_version: 'V3' } }]);
  assert.is(cred.common_tls_context.combined_validation_context.validation_context_sds_secret_config.name, 'kubernetes://up-cacert');
  assert.is((await cluster('{mode: MUTUAL, credentialName: up}', SIDECAR)).transport_socket, undefined, 'istiod gives a sidecar no TLS for credentialName');
});

test('TLS mistakes are refused with the field, and a Secret\'s key never appears in a message', async () => {
  const gw = (tls: string, proto = 'HTTPS') => `apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: ingress, namespace: test}
spec:
  servers:
  - port: {number: 443, name: https, protocol: ${proto}}
    hosts: [a.example.com]
    tls: ${tls}
`;
  const cases: [Record<string, string>, RegExp][] = [
    [{ 'g.yaml': gw('{mode: SIMPLE}') }, /field spec\.servers\[0\]\.tls\.serverCertificate: SIMPLE TLS needs credentialName/],
    [{ 'g.yaml': gw('{mode: MUTUAL, serverCertificate: /a, privateKey: /b}') }, /tls\.caCertificates: MUTUAL TLS needs caCertificates/],
    [{ 'g.yaml': gw('{mode: SIMPLE, credentialName: x, privateKey: /b}') }, /tls\.privateKey: cannot be combined with credentialName/],
    [{ 'g.yaml': gw('{mode: PASSTHROUGH, credentialName: x}') }, /tls\.credentialName: is not used in PASSTHROUGH mode/],
    [{ 'g.yaml': gw('{mode: SIMPLE}', 'TCP') }, /field spec\.servers\[0\]\.tls: a TCP server has no tls/],
    [{ 'g.yaml': gw('{mode: SIMPLE, credentialName: x, minProtocolVersion: TLSV1_3, maxProtocolVersion: TLSV1_2}') }, /maxProtocolVersion: TLSV1_2 is below minProtocolVersion TLSV1_3/],
    [{ 'g.yaml': gw('{mode: SIMPLE, credentialName: nope}') }, /tls\.credentialName: no Secret "nope" in namespace test/],
    [{ 'g.yaml': gw('{mode: SIMPLE, credentialName: x, cipherSuites: [AES128-SHA, RC4-MD5, AES128-SHA]}') }, /cipherSuites\[1\]: "RC4-MD5" is not a cipher suite Envoy supports/],
    [{ 'g.yaml': gw('{mode: SIMPLE, credentialName: x, cipherSuites: [AES128-SHA, RC4-MD5, AES128-SHA]}') }, /cipherSuites\[2\]: "AES128-SHA" is listed twice/],
    [{ 'g.yaml': gw('{mode: MUTUAL, credentialName: a-cred}'), 's.yaml': secret('a-cred', 'a') }, /MUTUAL TLS needs a CA to verify the peer/],
    [{ 'g.yaml': gw('{httpsRedirect: true, mode: SIMPLE}', 'HTTP') }, /tls\.mode: is for HTTPS and TLS servers; a HTTP server takes only httpsRedirect/],
  ];
  for (const [files, re] of cases) {
    const { issues } = await load(files);
    assert.ok(issues.some((i) => re.test(i)), `${re} in:\n${issues.join('\n')}`);
  }
  const bad = await load({ 's.yaml': secret('a-cred', 'a', undefined, 'b') });
  assert.match(bad.issues.join('\n'), /s\.yaml:\d+:\d+: document 1 \(Secret test\/a-cred\): field data\.tls\.key: does not match the certificate in data\.tls\.crt/);
  const garbage = await load({ 's.yaml': `apiVersion: v1\nkind: Secret\nmetadata: {name: g, namespace: test}\nstringData:\n  tls.crt: not a cert\n  tls.key: "secret-key-material"\n` });
  assert.match(garbage.issues.join('\n'), /field stringData\.tls\.key: is not a PEM private key/);
  for (const i of [...bad.issues, ...garbage.issues]) {
    assert.not.match(i, /PRIVATE KEY|secret-key-material/, 'no key material in messages');
    assert.not.ok(i.includes(b64(certs.b!.key).slice(0, 40)), 'no base64 key in messages');
  }
});

test.after(() => certDir.cleanup());

test.run();
