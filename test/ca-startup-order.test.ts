// Start-up with a CA (issue 23): the workload certificate is asked for just after Envoy's spawn, before the rest of
// the agent loads, on a transport that does not need grpc-js (lib/grpc-unary.ts), so the CA's answer overlaps
// Envoy's start as the Go agent's pre-generated certificate does. Shown here: what the CA path loads (no grpc-js, no
// protobufjs), and with the real agent, a real Envoy, an in-test control plane and a TLS CA, that the CSR is on its way
// before the status server and the xDS proxy have even loaded, and that the certificate is the one Envoy is served.

import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { agentFixture } from './helpers/agent-fixture';
import { ControlPlane } from './helpers/control-plane';
import { REPO, waitFor } from './helpers/harness';
import { startStubCa } from './helpers/stub-ca';

test("the CA path's modules (secret cache, CA client, SDS server, xDS upstream options) load without grpc-js or protobufjs", () => {
  const code = `
    import('${path.join(REPO, 'lib', 'workload-identity.ts')}').then(() => {
      const loaded = Object.keys(require.cache);
      console.log(JSON.stringify({
        grpc: loaded.filter((k) => k.includes('@grpc/grpc-js')).length,
        protobufjs: loaded.filter((k) => k.includes('/protobufjs/')).length,
        promIndex: loaded.filter((k) => /prom-client\\/index\\.js$/.test(k)).length,
      }));
    });`;
  const r = spawnSync(process.execPath, ['--import', 'tsx', '-e', code], { cwd: REPO, encoding: 'utf8' });
  assert.is(r.status, 0, r.stderr);
  assert.equal(JSON.parse(r.stdout.trim()), { grpc: 0, protobufjs: 0, promIndex: 0 });
});

test('the CSR goes out before the status server and the xDS proxy start, and its certificate reaches Envoy', async () => {
  const ca = await startStubCa();
  const cp = new ControlPlane();
  await cp.start();
  const agent = await agentFixture({ prefix: 'pa-ca-order-' });
  try {
    const root = path.join(agent.dir.path, 'ca-root.pem');
    fs.writeFileSync(root, ca.serverRoot.pem);
    fs.mkdirSync(path.join(agent.dir.path, 'var/run/secrets/tokens'), { recursive: true });
    fs.writeFileSync(path.join(agent.dir.path, 'var/run/secrets/tokens/istio-token'), 'the-jwt\n', { mode: 0o600 });
    await agent.start({
      proxyConfig: { discoveryAddress: cp.address, controlPlaneAuthPolicy: 'NONE' },
      // ECDSA: the key is made at once, so the order below does not depend on an RSA key's time on the thread pool.
      env: { CA_ADDR: ca.address, CA_ROOT_CA: root, ECC_SIGNATURE_ALGORITHM: 'ECDSA' },
      ready: 'none',
    });
    await waitFor('the certificate from the CA', async () => /workload certificate ready/.test(agent.log()), 20_000);
    await waitFor('Envoy on the control plane', async () => cp.streamsOpened > 0, 20_000);
    // The status server may start after Envoy's first stream and the CA's answer (it loads in a later turn).
    await waitFor('the status server', async () => /status server listening/.test(agent.log()), 20_000);
    const log = agent.log();
    const at = (re: RegExp) => {
      const i = log.split('\n').findIndex((l) => re.test(l));
      assert.ok(i >= 0, `${re} not in the log:\n${log}`);
      return i;
    };
    const asked = at(/workload certificate for spiffe:\/\/cluster\.local\/ns\/test\/sa\/default from CA .*asked for at start/);
    assert.ok(asked > at(/epoch 0 started/), 'asked for after Envoy was spawned');
    assert.ok(asked < at(/status server listening/), 'asked for before the status server started');
    assert.ok(asked < at(/xDS proxy listening/), 'asked for before the xDS proxy started');
    assert.is(ca.calls.length, 1, 'one CSR');
    assert.is(ca.calls[0]!.token, 'Bearer the-jwt');
    // Envoy asks for it over SDS once it has config that names it: /debug/certs shows what the cache holds.
    const certs = await fetch(`http://127.0.0.1:${agent.ports.status}/debug/certs`).then((r) => r.text());
    assert.match(certs, /spiffe:\/\/cluster\.local\/ns\/test\/sa\/default/);
  } finally {
    await agent.close();
    await cp.stop();
    await ca.close();
  }
});

test.run();
