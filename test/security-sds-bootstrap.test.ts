// The bootstrap's own SDS names count as referenced: a zipkin tracer with TLS (ProxyConfig tracing.tlsSettings)
// makes the bootstrap name `file-root:<caCertificates>`, and the real Envoy, started by the whole agent, gets that
// root from the agent's SDS server with no control plane at all (the xDS upstream here goes nowhere).

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import { agentFixture } from './helpers/agent-fixture';
import { freePort } from './helpers/harness';
import { makeCerts } from './helpers/test-certs';

test('a file the bootstrap names (tracer TLS roots) is served to Envoy without any xDS config', async () => {
  const agent = await agentFixture({ prefix: 'pa-sds-boot-' });
  const certs = await makeCerts(agent.dir.path, { ca: {} });
  const zipkin = await freePort();
  try {
    await agent.start({
      proxyConfig: {
        discoveryAddress: '127.0.0.1:1',
        tracing: { zipkin: { address: `127.0.0.1:${zipkin}` }, tlsSettings: { mode: 'SIMPLE', caCertificates: certs.ca!.certPath } },
      },
      env: { POD_NAME: 'app-0' },
      ready: () => agent.log().includes(`SDS: sent file-root:${certs.ca!.certPath}@`),
    });
    assert.not.match(agent.log(), /does not reference: not served/);
    assert.ok(fs.existsSync(certs.ca!.certPath));
  } finally {
    await agent.close();
  }
});

test.run();
