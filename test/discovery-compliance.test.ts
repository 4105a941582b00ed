// COMPLIANCE_POLICY in the discovery server (issue 23): the TLS contexts it generates for Envoy carry the TLS
// parameters istiod's EnforceCompliance leaves (istio/istio 86c9f01f pkg/model/fips.go, applied in
// pilot/pkg/security/authn/utils BuildInboundTLS, pilot/pkg/networking/core/cluster_tls.go and listener.go
// BuildListenerTLSContext): inbound mesh mTLS, outbound ISTIO_MUTUAL (auto-mTLS too), DestinationRule TLS
// origination and gateway servers. Without the variable nothing changes (the discovery goldens cover that).
// Then a real Envoy under `proxy --standalone` (certificates from the embedded CA): the config dump has the
// restricted parameters, and TLS clients that the policy excludes are refused by the inbound mTLS listener.

import * as fs from 'node:fs';
import * as http from 'node:http';
import * as path from 'node:path';
import * as tls from 'node:tls';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { MemoryConfigStore } from '../lib/discovery/config-store';
import { FileConfigSource } from '../lib/discovery/file-source';
import { generate } from '../lib/discovery/generate';
import { proxyFromNode } from '../lib/discovery/proxy';
import { PushContext } from '../lib/discovery/push-context';
import { ServiceEntryRegistry } from '../lib/discovery/registry';
import { TYPE_URLS } from '../lib/discovery/resources';
import { formatIssue } from '../lib/discovery/yaml-file';
import { unpackAny } from '../lib/envoy-protos';
import { agentFixture } from './helpers/agent-fixture';
import { AdsClient } from './helpers/discovery-client';
import { discoveryListening, startDiscoveryProcess } from './helpers/discovery-process';
import { freePort, httpRequest, tempDir, waitFor } from './helpers/harness';

const MESH = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: web, namespace: shop }
spec:
  hosts: [web.shop.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{ number: 8080, name: http, protocol: HTTP }]
  endpoints:
  - { address: 10.0.0.9, ports: { http: 9080 }, labels: { security.istio.io/tlsMode: istio }, serviceAccount: web }
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: api, namespace: shop }
spec:
  hosts: [api.example.com]
  location: MESH_EXTERNAL
  resolution: DNS
  # TLS origination: the app speaks HTTP, the sidecar TLS.
  ports: [{ number: 80, name: http, protocol: HTTP }]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: { name: api, namespace: shop }
spec:
  host: api.example.com
  trafficPolicy: { tls: { mode: SIMPLE } }
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: { name: gw, namespace: shop }
spec:
  servers:
  - port: { number: 8443, name: https, protocol: HTTPS }
    hosts: [a.example.com]
    tls: { mode: SIMPLE, serverCertificate: /c.pem, privateKey: /k.pem, minProtocolVersion: TLSV1_3, cipherSuites: [ECDHE-RSA-AES128-GCM-SHA256, AES128-SHA, ECDHE-ECDSA-CHACHA20-POLY1305] }
  - port: { number: 9443, name: mtls, protocol: HTTPS }
    hosts: [b.example.com]
    tls: { mode: ISTIO_MUTUAL }
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: { name: gw, namespace: shop }
spec:
  hosts: [a.example.com, b.example.com]
  gateways: [gw]
  http: [{ route: [{ destination: { host: web.shop.local } }] }]
`;

type Params = Record<string, unknown> | undefined;

/** The tls_params of each context kind the discovery server generates, under the policy. */
async function paramsUnder(policy: string | undefined): Promise<Record<string, Params>> {
  const dir = tempDir();
  try {
    fs.writeFileSync(path.join(dir.path, 'mesh.yaml'), MESH);
    const store = new MemoryConfigStore();
    const reg = new ServiceEntryRegistry(store);
    reg.run();
    const src = new FileConfigSource({ dir: dir.path, store });
    assert.equal((await src.sync({ report: false })).issues.map(formatIssue), []);
    const push = PushContext.build('x', store, reg, undefined, undefined, { compliancePolicy: policy });
    const sidecar = proxyFromNode({ id: 'sidecar~10.0.0.9~web-1.shop~shop.svc.cluster.local' });
    const router = proxyFromNode({ id: 'router~10.0.0.5~gw-1.shop~shop.svc.cluster.local' });
    const ctx = (ts: Record<string, any>) => (unpackAny(ts.typed_config) as Record<string, any>).common_tls_context.tls_params as Params;
    const cluster = (name: string) => unpackAny(generate(push, sidecar, TYPE_URLS.cluster).get(name)!.any) as Record<string, any>;
    const inbound = unpackAny(generate(push, sidecar, TYPE_URLS.listener).get('inbound_10.0.0.9_9080')!.any) as Record<string, any>;
    const gwListener = (port: number) => unpackAny(generate(push, router, TYPE_URLS.listener).get(`0.0.0.0_${port}`)!.any) as Record<string, any>;
    return {
      inbound: ctx(inbound.filter_chains.find((c: Record<string, any>) => c.transport_socket).transport_socket),
      autoMtls: ctx(cluster('outbound|8080||web.shop.local').transport_socket_matches[0].transport_socket),
      origination: ctx(cluster('outbound|80||api.example.com').transport_socket),
      gatewaySimple: ctx(gwListener(8443).filter_chains[0].transport_socket),
      gatewayIstioMutual: ctx(gwListener(9443).filter_chains[0].transport_socket),
    };
  } finally {
    dir.cleanup();
  }
}

const V12 = 'TLSv1_2';
const V13 = 'TLSv1_3';
const ISTIOD_INBOUND = ['ECDHE-ECDSA-AES256-GCM-SHA384', 'ECDHE-RSA-AES256-GCM-SHA384', 'ECDHE-ECDSA-AES128-GCM-SHA256', 'ECDHE-RSA-AES128-GCM-SHA256', 'AES256-GCM-SHA384', 'AES128-GCM-SHA256'];
const FIPS = ['ECDHE-ECDSA-AES128-GCM-SHA256', 'ECDHE-RSA-AES128-GCM-SHA256', 'ECDHE-ECDSA-AES256-GCM-SHA384', 'ECDHE-RSA-AES256-GCM-SHA384'];

test('no COMPLIANCE_POLICY: the TLS parameters are as before (none on mesh mTLS, the gateway\'s own)', async () => {
  assert.equal(await paramsUnder(undefined), {
    inbound: undefined,
    autoMtls: undefined,
    origination: { tls_minimum_protocol_version: V12, tls_maximum_protocol_version: V13 },
    gatewaySimple: { tls_minimum_protocol_version: V13, cipher_suites: ['ECDHE-RSA-AES128-GCM-SHA256', 'AES128-SHA', 'ECDHE-ECDSA-CHACHA20-POLY1305'] },
    gatewayIstioMutual: undefined,
  });
  assert.equal(await paramsUnder('fips-140-9'), await paramsUnder(undefined), 'an unknown policy restricts nothing (warned), as istiod');
});

test('fips-140-2: TLS 1.2 only everywhere, set cipher suites filtered to the FIPS ones, ecdh_curves cleared, as istiod', async () => {
  const only12 = { tls_minimum_protocol_version: V12, tls_maximum_protocol_version: V12 };
  assert.equal(await paramsUnder('fips-140-2'), {
    // istiod's SupportedCiphers, in its order, less the two without ECDHE.
    inbound: { cipher_suites: ISTIOD_INBOUND.slice(0, 4), ...only12 },
    autoMtls: only12,
    origination: only12,
    // The server's minProtocolVersion TLSV1_3 is overridden (EnforceCompliance runs last); AES128-SHA and ChaCha20 go.
    gatewaySimple: { ...only12, cipher_suites: ['ECDHE-RSA-AES128-GCM-SHA256'] },
    gatewayIstioMutual: only12,
  });
});

test('fips-140-3: Envoy\'s FIPS_202205 compliance policy on every context, the rest as istiod has it', async () => {
  const fips = ['FIPS_202205'];
  assert.equal(await paramsUnder('fips-140-3'), {
    inbound: { cipher_suites: ISTIOD_INBOUND, tls_minimum_protocol_version: V12, tls_maximum_protocol_version: V13, compliance_policies: fips },
    autoMtls: { tls_minimum_protocol_version: V12, tls_maximum_protocol_version: V13, compliance_policies: fips },
    origination: { tls_minimum_protocol_version: V12, tls_maximum_protocol_version: V13, compliance_policies: fips },
    gatewaySimple: { tls_minimum_protocol_version: V13, cipher_suites: ['ECDHE-RSA-AES128-GCM-SHA256', 'AES128-SHA', 'ECDHE-ECDSA-CHACHA20-POLY1305'], compliance_policies: fips },
    gatewayIstioMutual: { compliance_policies: fips },
  });
});

test('pqc: at least TLS 1.3, the four FIPS suites, X25519MLKEM768, as istiod', async () => {
  const pqc = { tls_minimum_protocol_version: V13, cipher_suites: FIPS, ecdh_curves: ['X25519MLKEM768'] };
  assert.equal(await paramsUnder('pqc'), {
    inbound: { ...pqc, tls_maximum_protocol_version: V13 },
    autoMtls: { ...pqc, tls_maximum_protocol_version: V13 },
    origination: { ...pqc, tls_maximum_protocol_version: V13 },
    gatewaySimple: pqc,
    gatewayIstioMutual: pqc,
  });
});

test('`pilot-agent discovery` reads COMPLIANCE_POLICY: the clusters it serves carry fips-140-2\'s parameters', async () => {
  const dir = tempDir('pa-compliance-ds-');
  const port = await freePort();
  fs.writeFileSync(path.join(dir.path, 'mesh.yaml'), MESH);
  const d = startDiscoveryProcess(dir.path, `127.0.0.1:${port}`, { env: { COMPLIANCE_POLICY: 'fips-140-2' } });
  let c: AdsClient | undefined;
  try {
    await discoveryListening(d);
    c = AdsClient.connect(`127.0.0.1:${port}`, false);
    const CDS = 'type.googleapis.com/envoy.config.cluster.v3.Cluster';
    c.send({ node: { id: 'sidecar~10.0.0.8~app-1.shop~shop.svc.cluster.local' }, type_url: CDS });
    const r = await c.next(CDS);
    const cluster = r.resources.map((x) => unpackAny(x as never) as Record<string, any>).find((x) => x.name === 'outbound|8080||web.shop.local')!;
    const ctx = unpackAny(cluster.transport_socket_matches[0].transport_socket.typed_config).common_tls_context as Record<string, any>;
    assert.equal(ctx.tls_params, { tls_minimum_protocol_version: 'TLSv1_2', tls_maximum_protocol_version: 'TLSv1_2' });
  } finally {
    c?.close();
    await d.stop();
    dir.cleanup();
  }
});

// --- A real Envoy, through `proxy --standalone`.

interface Attempt {
  minVersion?: tls.SecureVersion;
  maxVersion?: tls.SecureVersion;
  ciphers?: string;
  ecdhCurve?: string;
}

/** One mTLS handshake with the agent's own workload certificate: `TLSv1.x CIPHER` or `refused: ...`. */
function handshake(port: number, certs: string, a: Attempt): Promise<string> {
  const read = (f: string) => fs.readFileSync(path.join(certs, f));
  return new Promise((resolve) => {
    const s = tls.connect({
      host: '127.0.0.2', port, ca: read('root-cert.pem'), cert: read('cert-chain.pem'), key: read('key.pem'),
      checkServerIdentity: () => undefined, ...a,
    }, () => {
      // TLS 1.3: the server checks the client certificate after the client's Finished; a request proves it passed.
      s.write('GET / HTTP/1.1\r\nhost: web\r\nconnection: close\r\n\r\n');
    });
    let out = '';
    let negotiated = '';
    s.once('secureConnect', () => (negotiated = `${s.getProtocol()} ${s.getCipher().standardName}`));
    s.setTimeout(5000, () => s.destroy(new Error('timeout')));
    s.on('data', (c: Buffer) => (out += c.toString()));
    s.on('error', (e) => resolve(`refused: ${e.message}`));
    s.on('close', () => resolve(/^HTTP\/1\.1 200/.test(out) ? negotiated : `refused: ${out.split('\r\n')[0] || 'closed'}`));
  });
}

const ATTEMPTS: Record<string, Attempt> = {
  tls13: { minVersion: 'TLSv1.3' },
  tls13chacha: { minVersion: 'TLSv1.3', ciphers: 'TLS_CHACHA20_POLY1305_SHA256' },
  // The workload certificate has an RSA key (the agent's default).
  tls12fips: { maxVersion: 'TLSv1.2', ciphers: 'ECDHE-RSA-AES128-GCM-SHA256' },
  tls12noEcdhe: { maxVersion: 'TLSv1.2', ciphers: 'AES128-GCM-SHA256' },
  tls12chacha: { maxVersion: 'TLSv1.2', ciphers: 'ECDHE-RSA-CHACHA20-POLY1305' },
  x25519only: { ecdhCurve: 'X25519' },
};

type Outcome = 'ok' | 'refused';
const WANT: Record<string, Record<keyof typeof ATTEMPTS, Outcome>> = {
  // Envoy's defaults (which have no suite without ECDHE).
  none: { tls13: 'ok', tls13chacha: 'ok', tls12fips: 'ok', tls12noEcdhe: 'refused', tls12chacha: 'ok', x25519only: 'ok' },
  // TLS 1.2 with istiod's four ECDHE suites; X25519 stays (Envoy's default curves: a FIPS build has only P-256).
  'fips-140-2': { tls13: 'refused', tls13chacha: 'refused', tls12fips: 'ok', tls12noEcdhe: 'refused', tls12chacha: 'refused', x25519only: 'ok' },
  // BoringSSL's FIPS_202205: TLS 1.2-1.3, AES-GCM only, P-256/P-384.
  'fips-140-3': { tls13: 'ok', tls13chacha: 'refused', tls12fips: 'ok', tls12noEcdhe: 'refused', tls12chacha: 'refused', x25519only: 'refused' },
  // X25519MLKEM768 only: Envoy takes the listener, and this client (OpenSSL 3.0, no ML-KEM) shares no group with it.
  pqc: { tls13: 'refused', tls13chacha: 'refused', tls12fips: 'refused', tls12noEcdhe: 'refused', tls12chacha: 'refused', x25519only: 'refused' },
};

for (const [policy, want] of Object.entries(WANT)) {
  test(`Envoy under COMPLIANCE_POLICY=${policy}: the config dump and the inbound mTLS listener's handshakes`, async () => {
    const agent = await agentFixture({ prefix: 'pa-compliance-' });
    const app = http.createServer((_q, r) => r.end('app'));
    try {
      const dir = agent.dir.path;
      const cfgDir = path.join(dir, 'mesh');
      agent.writeTokens(cfgDir, { web: 'web-token' }, 'web');
      const [servicePort, appPort] = [await freePort(), await freePort()];
      await new Promise<void>((r) => app.listen(appPort, '127.0.0.1', r));
      fs.writeFileSync(path.join(cfgDir, 'web.yaml'), `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: web, namespace: test }
spec:
  hosts: [web.test.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{ number: ${servicePort}, name: http, protocol: HTTP }]
  endpoints:
  - { address: 127.0.0.2, ports: { http: ${appPort} }, labels: { security.istio.io/tlsMode: istio }, serviceAccount: web }
`);
      const certs = path.join(dir, 'certs');
      await agent.start({
        args: ['proxy', 'sidecar', '--standalone', cfgDir],
        env: { POD_NAME: 'web-1', SERVICE_ACCOUNT: 'web', INSTANCE_IP: '127.0.0.2', OUTPUT_CERTS: certs, COMPLIANCE_POLICY: policy === 'none' ? undefined : policy },
      });
      const admin = `http://127.0.0.1:${agent.ports.admin}`;
      const dump = await waitFor('the inbound listener active', async () => {
        const d = JSON.parse((await httpRequest(`${admin}/config_dump?resource=dynamic_listeners`)).body) as { configs: any[] };
        const l = d.configs.find((c) => c.name === `inbound_127.0.0.2_${appPort}`);
        return l?.active_state ? l.active_state.listener : undefined;
      }, 20_000).catch(agent.withLog);
      const inboundParams = dump.filter_chains.find((c: any) => c.transport_socket).transport_socket.typed_config.common_tls_context.tls_params;
      const clusters = JSON.parse((await httpRequest(`${admin}/config_dump?resource=dynamic_active_clusters`)).body) as { configs: any[] };
      const outbound = clusters.configs.find((c) => c.cluster.name === `outbound|${servicePort}||web.test.local`).cluster;
      const outboundParams = outbound.transport_socket_matches[0].transport_socket.typed_config.common_tls_context.tls_params;
      if (policy === 'none') {
        assert.is(inboundParams, undefined);
        assert.is(outboundParams, undefined);
      } else if (policy === 'fips-140-2') {
        assert.equal(inboundParams, { tls_minimum_protocol_version: 'TLSv1_2', tls_maximum_protocol_version: 'TLSv1_2', cipher_suites: ISTIOD_INBOUND.slice(0, 4) });
        assert.equal(outboundParams, { tls_minimum_protocol_version: 'TLSv1_2', tls_maximum_protocol_version: 'TLSv1_2' });
      } else if (policy === 'pqc') {
        assert.equal([inboundParams.tls_minimum_protocol_version, inboundParams.ecdh_curves], ['TLSv1_3', ['X25519MLKEM768']]);
        assert.equal(outboundParams.ecdh_curves, ['X25519MLKEM768']);
      } else {
        assert.equal(inboundParams.compliance_policies, ['FIPS_202205']);
        assert.equal(outboundParams.compliance_policies, ['FIPS_202205']);
      }
      await waitFor('the workload certificate in OUTPUT_CERTS', () => fs.existsSync(path.join(certs, 'key.pem')), 10_000);
      const got: Record<string, string> = {};
      for (const [name, a] of Object.entries(ATTEMPTS)) got[name] = await handshake(appPort, certs, a);
      const outcome = Object.fromEntries(Object.entries(got).map(([k, v]) => [k, v.startsWith('refused') ? 'refused' : 'ok']));
      assert.equal(outcome, want, JSON.stringify(got, null, 1));
      if (policy === 'fips-140-2') assert.match(got.tls12fips!, /^TLSv1\.2 TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256$/);
    } finally {
      app.close();
      await agent.close();
    }
  });
}

test.run();
