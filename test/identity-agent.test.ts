// The whole agent with workload identity: dist/pilot-agent proxy --standalone DIR, whose config directory declares
// an identity for the embedded CA. The agent's SDS socket (./var/run/secrets/workload-spiffe-uds/socket, as the
// bootstrap names it) feeds a real Envoy's TLS listener with a certificate for spiffe://cluster.local/ns/test/sa/web
// signed by the CA's on-disk root; with a 6 s SECRET_TTL it is rotated and Envoy serves the new serial;
// /debug/certs and the metrics show it, never the key.

import * as fs from 'node:fs';
import * as path from 'node:path';
import * as tls from 'node:tls';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { agentFixture } from './helpers/agent-fixture';
import { freePort, httpRequest, waitFor } from './helpers/harness';
import { startSdsEnvoy } from './helpers/sds-envoy';

const ID = 'spiffe://cluster.local/ns/test/sa/web';

function peerCert(port: number, ca: string): Promise<{ serial: string; san: string }> {
  return new Promise((resolve, reject) => {
    const s = tls.connect({ host: '127.0.0.1', port, ca, checkServerIdentity: () => undefined }, () => {
      const c = s.getPeerX509Certificate();
      s.destroy();
      c ? resolve({ serial: c.serialNumber, san: c.subjectAltName ?? '' }) : reject(new Error('no peer certificate'));
    });
    s.on('error', reject);
  });
}

test('standalone agent: the embedded CA signs the declared identity, the SDS socket serves it to Envoy, rotation follows SECRET_TTL', async () => {
  const agent = await agentFixture({ prefix: 'pa-identity-' });
  const { dir, ports: { status } } = agent;
  const cfgDir = path.join(dir.path, 'mesh');
  agent.writeTokens(cfgDir, { web: 'web-bootstrap-token' }, 'web');
  let envoy: Awaited<ReturnType<typeof startSdsEnvoy>> | undefined;
  try {
    await agent.start({
      args: ['proxy', 'sidecar', '--standalone', cfgDir],
      env: { POD_NAME: 'web-1', SERVICE_ACCOUNT: 'web', SECRET_TTL: '6s' },
    });
    const sock = path.join(dir.path, 'var/run/secrets/workload-spiffe-uds/socket');
    assert.is((fs.statSync(sock).mode & 0o777).toString(8), '660');
    const port = await freePort();
    envoy = await startSdsEnvoy({ sdsSocket: sock, inbound: { port, backendPort: await freePort() } });
    const root = fs.readFileSync(path.join(cfgDir, 'ca', 'root-cert.pem'), 'utf8');
    assert.is(fs.statSync(path.join(cfgDir, 'ca', 'root-key.pem')).mode & 0o777, 0o600);
    const first = await waitFor('Envoy to serve the workload certificate', () => peerCert(port, root).catch(() => undefined), 20_000, 200);
    assert.is(first.san, `URI:${ID}`);
    const certs = JSON.parse((await httpRequest(`http://127.0.0.1:${status}/debug/certs`)).body);
    assert.is(certs.identity, ID);
    assert.match(certs.source, /CA unix:/);
    assert.ok(certs.nextRotation && certs.certificate.notAfter);
    assert.not.match(JSON.stringify(certs), /PRIVATE KEY/);
    await waitFor('a rotated certificate served by Envoy', async () => (await peerCert(port, root)).serial !== first.serial, 20_000, 300);
    const metrics = (await httpRequest(`http://127.0.0.1:${status}/stats/prometheus`)).body;
    assert.match(metrics, /istio_agent_certificates_rotated_total [1-9]/);
    assert.match(metrics, /istio_agent_sds_pushes_total [1-9]/);
    assert.not.match(agent.log(), /PRIVATE KEY/);
  } finally {
    try {
      await envoy?.stop();
      agent.proc.kill('SIGTERM');
      const exit = await waitFor('agent exit', () => agent.exited, 15_000);
      await agent.stop();
      assert.is(exit.code, 0, agent.log().slice(-2000));
      const sockLeft = fs.existsSync(path.join(dir.path, 'var/run/secrets/workload-spiffe-uds/socket'));
      assert.not.ok(sockLeft, 'the SDS socket is removed');
    } finally {
      await agent.close();
    }
  }
});

test.run();
