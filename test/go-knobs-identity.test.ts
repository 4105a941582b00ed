// The Go agent's identity knobs (issue 23): ECC_CURVE picks the workload key's curve and the CSR's hash as Go's
// pkiutil.GenCSR and x509.CreateCertificateRequest do; CA_PROVIDER names the CA client (only Istio's "Citadel");
// PILOT_CERT_PROVIDER says where the root that verifies istiod is. What the agent does not support is refused at
// start with one line naming the variable.

import { execFile, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { checkCaProvider, defaultRoot, pilotCertProvider } from '../lib/cert-provider';
import { generateKeyAndCsr, keyAlgorithm, spiffeId } from '../lib/csr';
import { agentBin } from './helpers/agent';
import { envoyBin, freePort, tempDir } from './helpers/harness';

const ID = spiffeId('cluster.local', 'ns1', 'sa1');

function opensslText(csrPem: string): string {
  const r = spawnSync('openssl', ['req', '-noout', '-verify', '-text'], { input: csrPem, encoding: 'utf8' });
  assert.is(r.status, 0, r.stderr);
  return r.stdout;
}

test('ECC_CURVE=P384: a P-384 key and an ecdsa-with-SHA384 CSR; P256 (the default) stays ecdsa-with-SHA256', async () => {
  const p384 = await generateKeyAndCsr({ identity: ID, algorithm: keyAlgorithm('ECDSA', 2048, 'P384') });
  const t384 = opensslText(p384.csrPem);
  assert.match(t384, /NIST CURVE: P-384/);
  assert.match(t384, /Signature Algorithm: ecdsa-with-SHA384/);
  assert.match(p384.keyPem, /BEGIN EC PRIVATE KEY/);
  for (const algorithm of [keyAlgorithm('ECDSA', 2048, 'P256'), keyAlgorithm('ECDSA', 2048)]) {
    const t256 = opensslText((await generateKeyAndCsr({ identity: ID, algorithm })).csrPem);
    assert.match(t256, /NIST CURVE: P-256/);
    assert.match(t256, /Signature Algorithm: ecdsa-with-SHA256/);
  }
  assert.equal(keyAlgorithm('ECDSA', 2048, 'p384'), { kind: 'ECDSA', curve: 'P384' });
});

test('ECC_CURVE: a curve Go would not honour is refused; with RSA keys the curve is ignored, as in Go', () => {
  assert.throws(() => keyAlgorithm('ECDSA', 2048, 'P521'), /invalid ECC_CURVE "P521" \(want P256 or P384\)/);
  assert.equal(keyAlgorithm('', 2048, 'P521'), { kind: 'RSA', bits: 2048 });
});

test('CA_PROVIDER: Citadel is the one CA client; others, GKE workload certificates and Google\'s CA are refused', () => {
  checkCaProvider('Citadel', 'istiod.istio-system.svc:15012');
  assert.throws(() => checkCaProvider('Vault', 'istiod:15012'), /CA provider "Vault" \(CA_PROVIDER\) is not registered/);
  assert.throws(() => checkCaProvider('citadel', 'istiod:15012'), /not registered/);
  assert.throws(() => checkCaProvider('GkeWorkloadCertificate', 'istiod:15012'), /FILE_MOUNTED_CERTS=true/);
  assert.throws(() => checkCaProvider('Citadel', 'meshca.googleapis.com:443'), /Google's CA/);
});

test('PILOT_CERT_PROVIDER picks the default root as Go\'s FindRootCAForCA / FindRootCAForXDS', () => {
  assert.is(pilotCertProvider('k8s.io/my-signer'), 'kubernetes');
  assert.throws(() => pilotCertProvider('citadel'), /invalid PILOT_CERT_PROVIDER "citadel"/);
  const d = { provCert: '', mounted: './etc/certs/root-cert.pem', mountedExists: false, istiod: './var/run/secrets/istio/root-cert.pem' };
  assert.is(defaultRoot('istiod', d, 'CA'), d.istiod);
  assert.is(defaultRoot('kubernetes', d, 'XDS'), d.istiod);
  assert.is(defaultRoot('custom', d, 'CA'), d.mounted);
  assert.is(defaultRoot('custom', d, 'XDS'), d.istiod); // Go's XDS lookup takes the mounted root only if it exists
  assert.is(defaultRoot('istiod', { ...d, mountedExists: true }, 'XDS'), d.mounted);
  assert.is(defaultRoot('none', { ...d, provCert: '/prov' }, 'CA'), '/prov/root-cert.pem');
  assert.throws(() => defaultRoot('none', d, 'CA'), /set CA_ROOT_CA\) but PILOT_CERT_PROVIDER is none/);
  assert.throws(() => defaultRoot('none', d, 'XDS'), /set XDS_ROOT_CA\) but PILOT_CERT_PROVIDER is none/);
});

function run(env: Record<string, string>, cwd: string): Promise<{ code: number | string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(agentBin(), ['proxy'], { cwd, env, timeout: 20_000, killSignal: 'SIGKILL' }, (err, _stdout, stderr) => {
      const e = err as (Error & { code?: number; signal?: string }) | null;
      resolve({ code: e ? (e.signal ?? e.code ?? 1) : 0, stderr });
    });
  });
}

const REFUSED: [string, Record<string, string>, RegExp][] = [
  ['an unregistered CA_PROVIDER', { CA_PROVIDER: 'Vault' }, /^error: CA provider "Vault" \(CA_PROVIDER\) is not registered/],
  ['ECC_CURVE=P521', { ECC_SIGNATURE_ALGORITHM: 'ECDSA', ECC_CURVE: 'P521' }, /^error: invalid ECC_CURVE "P521"/],
  ['an unknown PILOT_CERT_PROVIDER', { PILOT_CERT_PROVIDER: 'vault' }, /^error: invalid PILOT_CERT_PROVIDER "vault"/],
  ['PILOT_CERT_PROVIDER=none without XDS_ROOT_CA', { PILOT_CERT_PROVIDER: 'none' }, /^error: a root CA file for XDS is required/],
];

for (const [name, extra, want] of REFUSED) {
  test(`the agent refuses ${name} at start, in one line, before writing anything`, async () => {
    const dir = tempDir('pa-knobs-');
    try {
      const configPath = path.join(dir.path, 'proxy');
      const pc = { configPath, binaryPath: envoyBin(), statusPort: await freePort(), proxyAdminPort: await freePort(), discoveryAddress: '127.0.0.1:15012' };
      const r = await run({
        PROXY_CONFIG: JSON.stringify(pc), POD_NAME: 'p', POD_NAMESPACE: 'ns',
        ENVOY_STATUS_PORT: String(await freePort()), ENVOY_PROMETHEUS_PORT: String(await freePort()), ...extra,
      }, dir.path);
      assert.is(r.code, 1, r.stderr);
      const lines = r.stderr.trim().split('\n');
      assert.is(lines.length, 1, r.stderr);
      assert.match(lines[0]!, want);
      assert.equal(fs.existsSync(configPath) ? fs.readdirSync(configPath) : [], [], 'nothing written');
    } finally {
      dir.cleanup();
    }
  });
}

test.run();
