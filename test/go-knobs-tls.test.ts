// The Go agent's TLS knobs (issue 23, identity part):
// - ISTIO_META_TLS_CLIENT_KEY / _CERT_CHAIN / _ROOT_CERT: with mounted certificates (FILE_MOUNTED_CERTS, or all three
//   files in workload-spiffe-credentials) and no PROV_CERT, the xDS connection presents that client certificate and
//   verifies the server with that root (Go's GetKeyCertsForXDS / FindRootCAForXDS); a TLS gRPC control plane that
//   requires client certificates accepts the agent. The CA connection does not use them (Go: PROV_CERT only).
// - COMPLIANCE_POLICY: the agent's TLS clients (xDS, CA) negotiate only what the policy allows, as Go's
//   EnforceGoCompliance; Envoy runs with GRPC_SSL_CIPHER_SUITES under fips-140-2 / fips-140-3, as Go sets it.

import 'reflect-metadata';
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as tls from 'node:tls';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { CaClient } from '../lib/ca-client';
import { startupRootCheck } from '../lib/cert-provider';
import { buildConfig } from '../lib/config';
import { generateKeyAndCsr } from '../lib/csr';
import { envoyEnvironment, FIPS_TLS12_CIPHERS, tlsRestriction } from '../lib/tls-policy';
import { openUpstream, upstreamFromConfig, type UpstreamOptions } from '../lib/xds-upstream';
import { agentFixture } from './helpers/agent-fixture';
import { CLUSTER, ControlPlane } from './helpers/control-plane';
import { httpRequest, tempDir, waitFor } from './helpers/harness';
import { makeLeaf, makeRoot } from './helpers/test-ca';

function cfg(env: Record<string, string>) {
  return buildConfig({ flags: {}, env, readFile: () => undefined });
}

test('ISTIO_META_TLS_CLIENT_*: used for xDS only with mounted certificates and no PROV_CERT, as Go', () => {
  const meta = { ISTIO_META_TLS_CLIENT_KEY: '/k.pem', ISTIO_META_TLS_CLIENT_CERT_CHAIN: '/c.pem', ISTIO_META_TLS_CLIENT_ROOT_CERT: '/r.pem' };
  const on = { ...meta, FILE_MOUNTED_CERTS: 'true' };
  const o = upstreamFromConfig(cfg(on), on);
  assert.equal([o.clientKeyFile, o.clientCertFile, o.clientRootFile, o.clientCertDir], ['/k.pem', '/c.pem', '/r.pem', undefined]);
  const off = upstreamFromConfig(cfg(meta), meta);
  assert.equal([off.clientKeyFile, off.clientRootFile], [undefined, undefined], 'without mounted certificates: ignored');
  const prov = { ...on, PROV_CERT: '/prov' };
  const p = upstreamFromConfig(cfg(prov), prov);
  assert.equal([p.clientCertDir, p.clientKeyFile], ['/prov', undefined], 'PROV_CERT wins');
  // Also from proxyMetadata (which acts as the environment here; Go reads them there).
  const pm = { FILE_MOUNTED_CERTS: 'true', PROXY_CONFIG: JSON.stringify({ proxyMetadata: meta }) };
  const c = cfg(pm);
  assert.is(upstreamFromConfig(c, { ...c.proxy.proxyMetadata, ...pm }).clientCertFile, '/c.pem');
});

test('PILOT_CERT_PROVIDER=none: ISTIO_META_TLS_CLIENT_ROOT_CERT of mounted certificates is a root for XDS, as Go looks at it first', () => {
  const none = { PILOT_CERT_PROVIDER: 'none' };
  assert.throws(() => startupRootCheck(none, true, () => false), /root CA file for XDS is required/);
  const env = { ...none, FILE_MOUNTED_CERTS: 'true', ISTIO_META_TLS_CLIENT_ROOT_CERT: '/r.pem' };
  startupRootCheck(env, true, () => false);
  assert.throws(() => startupRootCheck({ ...none, ISTIO_META_TLS_CLIENT_ROOT_CERT: '/r.pem' }, true, () => false), /is required/);
});

interface Pki { serverRoot: string; clientRoot: string; server: { certPem: string; keyPem: string }; client: { certPem: string; keyPem: string } }

async function pki(): Promise<Pki> {
  const [sr, cr] = [await makeRoot('control plane root'), await makeRoot('client root')];
  return {
    serverRoot: sr.pem, clientRoot: cr.pem,
    server: await makeLeaf(sr, { dns: ['istiod.istio-system.svc'], ip: ['127.0.0.1'] }),
    client: await makeLeaf(cr, { uri: 'spiffe://cluster.local/ns/vm/sa/vm' }),
  };
}

/** One ADS call; resolves with the status it ends with (the control plane holds a stream open: cancelled after 1 s). */
function adsStatus(o: UpstreamOptions): Promise<{ code: number; details: string }> {
  return new Promise((resolve) => {
    const call = openUpstream(o, 'sotw', 4 << 20, { onMessage: () => undefined, onStatus: (s) => { clearTimeout(t); call.close(); resolve(s); } });
    const t = setTimeout(() => call.cancel('test done'), 1000);
    call.startRead();
  });
}

test('xDS client certificate files: a control plane that requires client certificates takes the stream only with them', async () => {
  const k = await pki();
  const dir = tempDir('pa-knobs-tlsc-');
  const cp = new ControlPlane({ tls: { key: Buffer.from(k.server.keyPem), cert: Buffer.from(k.server.certPem), clientCa: Buffer.from(k.clientRoot) } });
  try {
    await cp.start();
    const f = (n: string, t: string) => (fs.writeFileSync(path.join(dir.path, n), t), path.join(dir.path, n));
    const base: UpstreamOptions = { address: cp.address, tls: true, serverName: 'istiod.istio-system.svc', clientRootFile: f('root.pem', k.serverRoot), rootCaFile: undefined };
    // rootCaFile unset: the ./etc/certs root does not exist here (cwd is the repo), so clientRootFile verifies istiod.
    assert.is((await adsStatus({ ...base, clientKeyFile: f('key.pem', k.client.keyPem), clientCertFile: f('cert.pem', k.client.certPem) })).details, 'test done', 'the stream was open until the test cancelled it');
    assert.is(cp.streamsOpened, 1);
    const refused = await adsStatus(base);
    assert.is(refused.code, 14, `without a client certificate: UNAVAILABLE (${refused.details})`);
    assert.is(cp.streamsOpened, 1);
  } finally {
    await cp.stop();
    dir.cleanup();
  }
});

test('the agent with workload-spiffe-credentials and ISTIO_META_TLS_CLIENT_*: its Envoy subscribes through a control plane requiring client certificates', async () => {
  const k = await pki();
  const dir = tempDir('pa-knobs-tlsa-');
  const creds = path.join(dir.path, 'var/run/secrets/workload-spiffe-credentials');
  fs.mkdirSync(creds, { recursive: true });
  const wroot = await makeRoot('workload root');
  const wl = await makeLeaf(wroot, { uri: 'spiffe://cluster.local/ns/vm/sa/vm' });
  fs.writeFileSync(path.join(creds, 'cert-chain.pem'), wl.certPem);
  fs.writeFileSync(path.join(creds, 'key.pem'), wl.keyPem, { mode: 0o600 });
  fs.writeFileSync(path.join(creds, 'root-cert.pem'), wroot.pem);
  const tlsDir = path.join(dir.path, 'xds-tls');
  fs.mkdirSync(tlsDir);
  for (const [n, t] of [['key.pem', k.client.keyPem], ['cert.pem', k.client.certPem], ['root.pem', k.serverRoot]]) fs.writeFileSync(path.join(tlsDir, n!), t!);
  const cp = new ControlPlane({ tls: { key: Buffer.from(k.server.keyPem), cert: Buffer.from(k.server.certPem), clientCa: Buffer.from(k.clientRoot) } });
  const agent = await agentFixture({ dir });
  const { status } = agent.ports;
  try {
    await cp.start();
    await agent.start({
      proxyConfig: {
        discoveryAddress: cp.address,
        proxyMetadata: {
          ISTIO_META_TLS_CLIENT_KEY: path.join(tlsDir, 'key.pem'),
          ISTIO_META_TLS_CLIENT_CERT_CHAIN: path.join(tlsDir, 'cert.pem'),
        },
      },
      env: {
        ISTIO_META_TLS_CLIENT_ROOT_CERT: path.join(tlsDir, 'root.pem'), COMPLIANCE_POLICY: 'fips-140-3',
        POD_NAME: 'vm-1', POD_NAMESPACE: 'vm',
      },
      ready: 'none',
    });
    await waitFor('Envoy\'s CDS request reaches the control plane', () => cp.requests.some((r) => r.typeUrl === CLUSTER), 20_000)
      .catch((e: Error) => { throw new Error(`${e.message}\n${agent.log()}`); });
    // Envoy got GRPC_SSL_CIPHER_SUITES (fips-140-3), as Go appends it to Envoy's environment.
    const pid = JSON.parse((await httpRequest(`http://127.0.0.1:${status}/debug/epochs`)).body).epochs[0].pid as number;
    const environ = fs.readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0');
    assert.ok(environ.includes(`GRPC_SSL_CIPHER_SUITES=${FIPS_TLS12_CIPHERS}`), 'Envoy has GRPC_SSL_CIPHER_SUITES');
  } finally {
    await agent.close();
    await cp.stop();
  }
});

test('COMPLIANCE_POLICY values as Go\'s EnforceGoCompliance; Envoy\'s environment gets the cipher list under fips-*', () => {
  assert.is(tlsRestriction(undefined), undefined);
  assert.is(tlsRestriction(''), undefined);
  assert.is(tlsRestriction('fips-140-9'), undefined, 'unknown: warned, not restricted');
  assert.equal(tlsRestriction('fips-140-2'), { minVersion: 'TLSv1.2', maxVersion: 'TLSv1.2', ciphers: FIPS_TLS12_CIPHERS, ecdhCurve: 'P-256' });
  const f3 = tlsRestriction('fips-140-3')!;
  assert.equal([f3.minVersion, f3.maxVersion, f3.ecdhCurve], ['TLSv1.2', 'TLSv1.3', 'P-256:P-384']);
  assert.equal(tlsRestriction('pqc')!.ecdhCurve, 'X25519MLKEM768');
  for (const p of ['fips-140-2', 'fips-140-3']) assert.is(envoyEnvironment(p, { GRPC_SSL_CIPHER_SUITES: 'x', A: 'b' }).GRPC_SSL_CIPHER_SUITES, FIPS_TLS12_CIPHERS);
  for (const p of ['', 'pqc', undefined]) assert.equal(envoyEnvironment(p, { A: 'b' }), { A: 'b' });
});

/** A TLS server that records each handshake (protocol and cipher) or why it failed; it speaks nothing after. */
async function handshakeRecorder(k: Pki, o: tls.TlsOptions): Promise<{ port: number; seen: string[]; close(): void }> {
  const seen: string[] = [];
  const srv = tls.createServer({ key: k.server.keyPem, cert: k.server.certPem, ALPNProtocols: ['h2'], ...o }, (s) => {
    seen.push(`${s.getProtocol()} ${s.getCipher().standardName}`);
    s.destroy();
  });
  srv.on('tlsClientError', (e) => seen.push(`refused: ${e.message}`));
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  return { port: (srv.address() as { port: number }).port, seen, close: () => srv.close() };
}

const CASES: [string, string | undefined, tls.TlsOptions, RegExp][] = [
  ['no policy: TLS 1.3', undefined, {}, /^TLSv1\.3 /],
  ['fips-140-2: TLS 1.2 with a FIPS suite', 'fips-140-2', {}, /^TLSv1\.2 TLS_ECDHE_ECDSA_WITH_AES_(128|256)_GCM_SHA(256|384)$/],
  ['fips-140-3: TLS 1.3 with AES-GCM', 'fips-140-3', {}, /^TLSv1\.3 TLS_AES_(128|256)_GCM_SHA(256|384)$/],
  ['fips-140-3 against a server offering only ChaCha20 on TLS 1.2: refused', 'fips-140-3', { maxVersion: 'TLSv1.2', ciphers: 'ECDHE-ECDSA-CHACHA20-POLY1305' }, /^refused/],
  ['fips-140-3 against a server offering only X25519: refused', 'fips-140-3', { ecdhCurve: 'X25519' }, /^refused/],
  ['fips-140-2 against a TLS 1.3-only server: refused', 'fips-140-2', { minVersion: 'TLSv1.3' }, /^refused/],
];

for (const [name, policy, serverOpts, want] of CASES) {
  test(`COMPLIANCE_POLICY, xDS and CA clients: ${name}`, async () => {
    const k = await pki();
    const srv = await handshakeRecorder(k, serverOpts);
    const dir = tempDir('pa-knobs-fips-');
    try {
      const root = path.join(dir.path, 'root.pem');
      fs.writeFileSync(root, k.serverRoot);
      await adsStatus({ address: `127.0.0.1:${srv.port}`, tls: true, serverName: 'istiod.istio-system.svc', rootCaFile: root, compliancePolicy: policy });
      const ca = new CaClient({ address: `127.0.0.1:${srv.port}`, tls: true, rootCaFile: root, serverName: 'istiod.istio-system.svc', headers: {}, timeoutMs: 2000, compliancePolicy: policy });
      const { csrPem } = await generateKeyAndCsr({ identity: 'spiffe://cluster.local/ns/a/sa/b', algorithm: { kind: 'ECDSA' } });
      await ca.sign(csrPem, 3600).then(() => assert.unreachable('no CA there'), () => undefined);
      await waitFor('both handshakes', () => srv.seen.length >= 2, 5000);
      for (const s of srv.seen) assert.match(s, want);
    } finally {
      srv.close();
      dir.cleanup();
    }
  });
}

test.run();
