// The whole agent with the embedded CA (proxy --standalone, an identity declared): ECC_SIGNATURE_ALGORITHM=ECDSA
// with ECC_CURVE=P384 gives a P-384 workload key whose certificate a real Envoy serves over SDS; OUTPUT_CERTS
// files are 0600, and 0644 when KUBERNETES_SERVICE_HOST is set, as Istio's OutputKeyCertToDir makes them so that
// the pod's other containers (Prometheus scraping with Istio certificates) can read them.

import { X509Certificate } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as tls from 'node:tls';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { agentFixture } from './helpers/agent-fixture';
import { freePort, httpRequest, waitFor } from './helpers/harness';
import { startSdsEnvoy } from './helpers/sds-envoy';

function peerCert(port: number, ca: string): Promise<X509Certificate> {
  return new Promise((resolve, reject) => {
    const s = tls.connect({ host: '127.0.0.1', port, ca, checkServerIdentity: () => undefined }, () => {
      const c = s.getPeerX509Certificate();
      s.destroy();
      c ? resolve(c) : reject(new Error('no peer certificate'));
    });
    s.on('error', reject);
  });
}

async function runCase(extraEnv: Record<string, string>, check: (out: string, served: X509Certificate, metrics: string) => void): Promise<void> {
  const agent = await agentFixture({ prefix: 'pa-knobs-certs-' });
  const { dir, ports: { status } } = agent;
  const cfgDir = path.join(dir.path, 'mesh');
  agent.writeTokens(cfgDir, { web: 'web-token' }, 'web');
  const out = path.join(dir.path, 'out-certs');
  let envoy: Awaited<ReturnType<typeof startSdsEnvoy>> | undefined;
  try {
    await agent.start({
      args: ['proxy', 'sidecar', '--standalone', cfgDir],
      env: { POD_NAME: 'web-1', SERVICE_ACCOUNT: 'web', ECC_SIGNATURE_ALGORITHM: 'ECDSA', ECC_CURVE: 'P384', OUTPUT_CERTS: out, ...extraEnv },
    });
    const port = await freePort();
    envoy = await startSdsEnvoy({ sdsSocket: path.join(dir.path, 'var/run/secrets/workload-spiffe-uds/socket'), inbound: { port, backendPort: await freePort() } });
    const root = fs.readFileSync(path.join(cfgDir, 'ca', 'root-cert.pem'), 'utf8');
    const served = await waitFor('Envoy to serve the workload certificate', () => peerCert(port, root).catch(() => undefined), 20_000, 200);
    await waitFor('OUTPUT_CERTS written', () => fs.existsSync(path.join(out, 'root-cert.pem')), 10_000);
    check(out, served, (await httpRequest(`http://127.0.0.1:${status}/stats/prometheus`)).body);
  } finally {
    await envoy?.stop();
    await agent.close();
  }
}

const mode = (f: string) => (fs.statSync(f).mode & 0o777).toString(8);

test('ECC_CURVE=P384: Envoy serves a certificate for a P-384 key; OUTPUT_CERTS files are 0600 off Kubernetes', async () => {
  await runCase({}, (out, served, metrics) => {
    // The Go agent's names for the CA call (issue 23); one CSR, answered.
    assert.match(metrics, /^istio_agent_num_outgoing_requests\{request_type="csr"\} 1$/m);
    assert.match(metrics, /^istio_agent_num_failed_outgoing_requests\{request_type="csr"\} 0$/m);
    assert.match(metrics, /^istio_agent_num_outgoing_retries\{request_type="csr"\} 0$/m);
    assert.match(metrics, /^istio_agent_outgoing_latency\{request_type="csr"\} [0-9.e+-]+$/m);
    assert.is(served.publicKey.asymmetricKeyDetails?.namedCurve, 'secp384r1');
    assert.match(served.subjectAltName ?? '', /URI:spiffe:\/\/cluster\.local\/ns\/test\/sa\/web/);
    const written = new X509Certificate(fs.readFileSync(path.join(out, 'cert-chain.pem')));
    assert.is(written.serialNumber, served.serialNumber);
    assert.match(fs.readFileSync(path.join(out, 'key.pem'), 'utf8'), /BEGIN EC PRIVATE KEY/);
    for (const f of ['key.pem', 'cert-chain.pem', 'root-cert.pem']) assert.is(mode(path.join(out, f)), '600', f);
    assert.is(mode(out), '700');
  });
});

test('KUBERNETES_SERVICE_HOST set: OUTPUT_CERTS files are 0644 (the key too, as Istio) in a 0755 directory', async () => {
  await runCase({ KUBERNETES_SERVICE_HOST: '10.96.0.1' }, (out) => {
    for (const f of ['key.pem', 'cert-chain.pem', 'root-cert.pem']) assert.is(mode(path.join(out, f)), '644', f);
    assert.is(mode(out), '755');
  });
});

test.run();
