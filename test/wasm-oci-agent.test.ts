// WasmPlugin end to end from a real OCI registry: the standalone agent's discovery server sends a plugin whose url is
// oci://<registry>/<repo>:<tag>, the agent's xDS proxy pulls the image from Debian's docker-registry (images pushed
// with skopeo, test/helpers/oci-registry.ts), checks the manifest digest, caches the module and gives the real
// Envoy a local file; the module (wat2wasm, test/helpers/wasm-module.ts) adds a response header. Then the ways it
// fails, each with the plugin's failStrategy: a wrong sha256, a module over ISTIO_WASM_MAX_BINARY_SIZE_BYTES, the
// registry down. Envoy's epoch stays 0 throughout: a plugin change is an ECDS update, never a restart.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';
import { agentFixture } from './helpers/agent-fixture';
import { freePort, httpRequest, waitFor } from './helpers/harness';
import { startOciRegistry } from './helpers/oci-registry';
import { headerModule } from './helpers/wasm-module';

interface Plugin {
  url: string;
  sha256?: string;
  failStrategy: 'FAIL_CLOSE' | 'FAIL_OPEN';
}

function meshYaml(servicePort: number, backendPort: number, p: Plugin): string {
  return `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: web, namespace: test }
spec:
  hosts: [web.test.local]
  ports: [{ number: ${servicePort}, name: http, protocol: HTTP }]
  endpoints: [{ address: 127.0.0.1, ports: { http: ${backendPort} } }]
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: { name: header, namespace: istio-system }
spec:
  url: "${p.url}"
${p.sha256 ? `  sha256: "${p.sha256}"\n` : ''}  failStrategy: ${p.failStrategy}
  phase: STATS
`;
}

test('a WasmPlugin pulled from a real OCI registry runs in Envoy; wrong sha256, over the cap and registry down follow failStrategy; no new epoch', async () => {
  const reg = await startOciRegistry();
  const backend = http.createServer((req, res) => {
    req.resume();
    res.end('backend');
  });
  await new Promise<void>((r) => backend.listen(0, '127.0.0.1', r));
  const backendPort = (backend.address() as AddressInfo).port;
  const agent = await agentFixture({ prefix: 'pa-wasm-oci-' });
  try {
    const a = await reg.push({ repo: 'plugins/header', tag: 'one', module: headerModule('x-wasm', 'one'), layout: 'compat' });
    const b = await reg.push({ repo: 'plugins/header', tag: 'two', module: headerModule('x-wasm', 'two'), layout: 'artifact' });
    const big = await reg.push({
      repo: 'plugins/big', tag: 'v1', module: headerModule('x-wasm', 'big', 200_000), layout: 'artifact',
    });
    const later = await reg.push({ repo: 'plugins/later', tag: 'v1', module: headerModule('x-wasm', 'later'), layout: 'compat' });
    const servicePort = await freePort();
    const cfgDir = path.join(agent.dir.path, 'mesh');
    fs.mkdirSync(cfgDir);
    const file = path.join(cfgDir, 'mesh.yaml');
    const set = (p: Plugin) => fs.writeFileSync(file, meshYaml(servicePort, backendPort, p));
    const hex = (digest: string) => digest.slice('sha256:'.length);
    set({ url: a.ref, sha256: hex(a.manifestDigest), failStrategy: 'FAIL_CLOSE' });

    await agent.start({
      args: ['proxy', 'sidecar', '--standalone', cfgDir],
      env: { POD_NAME: 'web-client', WASM_INSECURE_REGISTRIES: reg.host, ISTIO_WASM_MAX_BINARY_SIZE_BYTES: '100000' },
    });
    const get = () => httpRequest(`http://127.0.0.1:${servicePort}/`, { headers: { host: 'web.test.local' } });
    const until = (what: string, ok: (r: Awaited<ReturnType<typeof get>>) => boolean) =>
      waitFor(what, async () => ok(await get()), 30_000, 200).catch(agent.withLog);
    const epochs = async () =>
      (JSON.parse((await agent.status('/debug/epochs')).body) as { epochs: { epoch: number }[] }).epochs.map(
        (e) => e.epoch,
      );

    await until('the compat image\'s module runs', (r) => r.status === 200 && r.headers['x-wasm'] === 'one');
    assert.equal(await epochs(), [0]);

    set({ url: b.refByDigest, sha256: hex(b.manifestDigest), failStrategy: 'FAIL_CLOSE' });
    await until('the artifact image\'s module replaces it', (r) => r.status === 200 && r.headers['x-wasm'] === 'two');

    set({ url: a.ref, sha256: 'ab'.repeat(32), failStrategy: 'FAIL_CLOSE' });
    await until('wrong sha256, FAIL_CLOSE: denied', (r) => r.status === 403);
    set({ url: a.ref, sha256: 'ab'.repeat(32), failStrategy: 'FAIL_OPEN' });
    await until('wrong sha256, FAIL_OPEN: served without the plugin', (r) => r.status === 200 && !r.headers['x-wasm']);

    set({ url: big.ref, sha256: hex(big.manifestDigest), failStrategy: 'FAIL_CLOSE' });
    await until('over ISTIO_WASM_MAX_BINARY_SIZE_BYTES, FAIL_CLOSE: denied', (r) => r.status === 403);

    set({ url: a.ref, sha256: hex(a.manifestDigest), failStrategy: 'FAIL_CLOSE' });
    await until('back to the first module', (r) => r.status === 200 && r.headers['x-wasm'] === 'one');
    await reg.stop();
    set({ url: later.ref, sha256: hex(later.manifestDigest), failStrategy: 'FAIL_OPEN' });
    await until('registry down, FAIL_OPEN: served without the plugin', (r) => r.status === 200 && !r.headers['x-wasm']);

    assert.equal(await epochs(), [0], 'every plugin change reached the same Envoy');
    const metrics = (await agent.status('/stats/prometheus')).body;
    assert.match(metrics, /istio_agent_wasm_remote_fetch_count\{result="success"\} [2-9]/);
    assert.match(metrics, /istio_agent_wasm_remote_fetch_count\{result="checksum_mismatched"\} [1-9]/);
    assert.match(metrics, /istio_agent_wasm_remote_fetch_count\{result="download_failure"\} [1-9]/);
  } finally {
    await agent.close();
    await reg.stop();
    await new Promise((r) => backend.close(r));
  }
});

test.run();
