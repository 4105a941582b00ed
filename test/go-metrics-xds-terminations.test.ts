// istio_agent_envoy_connection_terminations under the Go agent's name, label and type (pkg/istio-agent/metrics/
// metrics.go: a counter with type="cancelled" | "error", counted by xds_proxy.go's downstreamErr when Envoy's
// stream ends): the real Envoy killed (its connection gone) counts cancelled; a malformed request, which the proxy
// answers by ending that stream, counts error. The proxy's own shutdown counts neither. And its sibling
// istio_agent_istiod_connection_terminations{type}: a control plane restart counts cancelled.

import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { configureLogging, resetLogging } from '../lib/log';
import { newRegistry } from '../lib/metrics';
import { XdsProxy } from '../lib/xds-proxy';
import { adsBootstrap } from './helpers/ads-bootstrap';
import { CLUSTER, ControlPlane, edsCluster, FakeEnvoy, NODE_ID } from './helpers/control-plane';
import { envoyBin, freePort, tempDir, waitFor } from './helpers/harness';

const terminations = (text: string, type: string): number | undefined => {
  const m = new RegExp(`^istio_agent_envoy_connection_terminations\\{type="${type}"\\} (\\d+)$`, 'm').exec(text);
  return m ? Number(m[1]) : undefined;
};

test('the real Envoy killed counts type="cancelled"; a malformed request counts type="error"; the family is a counter', async () => {
  const bin = envoyBin();
  const dir = tempDir('pa-xds-term-');
  configureLogging({ write: () => undefined });
  const cp = new ControlPlane();
  await cp.start(0);
  const socket = path.join(dir.path, 'XDS');
  const proxy = new XdsProxy({ socketPath: socket, upstream: { address: cp.address, tls: false }, backoff: { initialMs: 50, maxMs: 400 } });
  const registry = newRegistry({ defaultMetrics: false });
  proxy.registerMetrics(registry);
  let envoy: ReturnType<typeof spawn> | undefined;
  const fakes: FakeEnvoy[] = [];
  try {
    await proxy.start();
    cp.set(CLUSTER, 'v1', [edsCluster('a')]);
    const admin = await freePort();
    const file = path.join(dir.path, 'envoy.json');
    fs.writeFileSync(file, JSON.stringify(adsBootstrap({ nodeId: NODE_ID, adminPort: admin, delta: true, xdsAddress: socket })));
    envoy = spawn(bin, ['-c', file, '--disable-hot-restart', '--concurrency', '1', '-l', 'warning'], { cwd: dir.path, stdio: 'ignore' });
    const exited = new Promise<void>((r) => envoy!.once('exit', () => r()));
    await waitFor('Envoy\'s stream through the proxy', () => proxy.metrics().xds_proxy_downstream_streams === 1 && cp.requests.length > 0, 20_000);
    let text = await registry.metrics();
    assert.match(text, /^# TYPE istio_agent_envoy_connection_terminations counter$/m);
    assert.is(terminations(text, 'cancelled'), undefined, 'nothing ended yet');

    // The control plane restarts. Its end of the upstream stream is istiod_connection_terminations{type="cancelled"},
    // as the Go agent counted it against this project's discovery server restarted (checked with /root/go/bin/
    // pilot-agent). Envoy's stream stays open here, so no Envoy termination (Go closes it, and counts one).
    const istiod = (t: string, type: string) => new RegExp(`^istio_agent_istiod_connection_terminations\\{type="${type}"\\} (\\d+)$`, 'm').exec(t)?.[1];
    await cp.stop();
    await cp.start();
    await waitFor('the upstream reconnect', () => proxy.metrics().xds_proxy_upstream_connects_total === 2 && proxy.metrics().xds_proxy_upstream_connected === 1, 20_000);
    text = await registry.metrics();
    assert.match(text, /^# TYPE istio_agent_istiod_connection_terminations counter$/m);
    assert.is(istiod(text, 'cancelled'), '1', text);
    assert.is(istiod(text, 'error'), undefined, text);
    assert.is(terminations(text, 'cancelled'), undefined, 'Envoy\'s stream stayed open');

    envoy.kill('SIGKILL');
    await exited;
    await waitFor('the stream to end', () => proxy.metrics().xds_proxy_downstream_streams === 0);
    text = await registry.metrics();
    assert.is(terminations(text, 'cancelled'), 1, text);
    assert.is(terminations(text, 'error'), undefined, text);

    const garbage = new FakeEnvoy(`unix://${socket}`, 'sotw');
    fakes.push(garbage);
    garbage.sendRaw(Buffer.from([0x0a, 0xff, 0xff, 0xff, 0x0f, 0x01, 0x02]));
    assert.is((await garbage.waitForStatus()).code, 3);
    text = await registry.metrics();
    assert.is(terminations(text, 'error'), 1, text);
    assert.is(terminations(text, 'cancelled'), 1, text);

    // The proxy ending a live stream itself (shutdown) is not one of Envoy's terminations.
    const live = new FakeEnvoy(`unix://${socket}`, 'sotw');
    fakes.push(live);
    live.request({ typeUrl: CLUSTER });
    await live.waitForResponse('CDS', (x) => x.typeUrl === CLUSTER);
    await proxy.close();
    text = await registry.metrics();
    assert.is(terminations(text, 'cancelled'), 1, text);
    assert.is(terminations(text, 'error'), 1, text);
  } finally {
    if (envoy && envoy.exitCode === null && envoy.signalCode === null) envoy.kill('SIGKILL');
    for (const f of fakes) f.close();
    await proxy.close();
    await cp.stop();
    resetLogging();
    dir.cleanup();
  }
});

test.run();
