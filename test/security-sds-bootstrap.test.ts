// The bootstrap's own SDS names count as referenced: a zipkin tracer with TLS (ProxyConfig tracing.tlsSettings)
// makes the bootstrap name `file-root:<caCertificates>`, and the real Envoy, started by the whole agent, gets that
// root from the agent's SDS server with no control plane at all (the xDS upstream here goes nowhere).

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { startAgent } from './helpers/agent';
import { envoyBin, freePort, tempDir, waitFor } from './helpers/harness';
import { makeCerts } from './helpers/test-certs';

test('a file the bootstrap names (tracer TLS roots) is served to Envoy without any xDS config', async () => {
  const dir = tempDir('pa-sds-boot-');
  const certs = await makeCerts(dir.path, { ca: {} });
  const [status, admin, zipkin] = [await freePort(), await freePort(), await freePort()];
  const agent = startAgent(['proxy', 'sidecar'], {
    PROXY_CONFIG: JSON.stringify({
      configPath: path.join(dir.path, 'proxy'), binaryPath: envoyBin(), statusPort: status, proxyAdminPort: admin,
      discoveryAddress: '127.0.0.1:1', drainDuration: '1s', parentShutdownDuration: '2s', terminationDrainDuration: '1s',
      tracing: { zipkin: { address: `127.0.0.1:${zipkin}` }, tlsSettings: { mode: 'SIMPLE', caCertificates: certs.ca!.certPath } },
    }),
    POD_NAME: 'app-0', POD_NAMESPACE: 'test', INSTANCE_IP: '127.0.0.1',
    ENVOY_STATUS_PORT: String(await freePort()), ENVOY_PROMETHEUS_PORT: String(await freePort()),
  }, dir.path);
  try {
    await waitFor('the tracer roots sent to Envoy', () => agent.log().includes(`SDS: sent file-root:${certs.ca!.certPath}@`), 30_000)
      .catch((e: Error) => { throw new Error(`${e.message}\n${agent.log().slice(-3000)}`); });
    assert.not.match(agent.log(), /does not reference: not served/);
    assert.ok(fs.existsSync(certs.ca!.certPath));
  } finally {
    agent.proc.kill('SIGTERM');
    await waitFor('agent exit', () => agent.exited, 15_000).catch(() => undefined);
    await agent.stop();
    dir.cleanup();
  }
});

test.run();
