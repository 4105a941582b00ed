// The whole agent with the generated (Istio-style) bootstrap against a control plane written with grpc-js:
// Envoy gets its config through the agent's xDS proxy, readiness waits for it, the name table is kept by
// the agent (never sent to Envoy), and a hot restart under load fails no request.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import { agentFixture } from './helpers/agent-fixture';
import { dig } from './helpers/dns';
import { CLUSTER, ControlPlane, ENDPOINT, LISTENER, ROUTE, edsCluster, endpoints, listener, route } from './helpers/control-plane';
import { freePort, httpRequest, sleep, waitFor } from './helpers/harness';
import { startLoad } from './helpers/load';
import { encodeNameTable, NAME_TABLE_TYPE, PROXY_CONFIG_TYPE } from '../lib/xds-istio';

test('generated bootstrap + xDS proxy + control plane: ready only with config, name table kept, hot restart under load', async () => {
  const agent = await agentFixture({ prefix: 'pa-agent-xds-' });
  const { ports: { status } } = agent;
  const backend = http.createServer((req, res) => {
    req.resume();
    res.end('from-backend');
  });
  await new Promise<void>((r) => backend.listen(0, '127.0.0.1', () => r()));
  const cp = new ControlPlane();
  await cp.start();
  const listenPort = await freePort();
  const dnsPort = await freePort();
  const ready = async () => (await httpRequest(`http://127.0.0.1:${status}/healthz/ready`)).status;
  try {
    // Envoy is up and waiting for its config (its xDS stream reached the control plane through the proxy);
    // until the config arrives, Envoy is not live and the agent is not ready.
    await agent.start({
      proxyConfig: { discoveryAddress: cp.address, controlPlaneAuthPolicy: 'NONE' },
      env: { POD_NAME: 'client-1', POD_NAMESPACE: 'ns', ISTIO_META_DNS_CAPTURE: 'true', PROXY_CONFIG_XDS_AGENT: 'true', DNS_PROXY_ADDR: `127.0.0.1:${dnsPort}` },
      ready: () => cp.requests.some((r) => r.typeUrl === CLUSTER),
      readyTimeoutMs: 20_000,
    });
    assert.is(JSON.parse((await httpRequest(`http://127.0.0.1:${status}/debug/epochs`)).body).epochs[0]?.state, 'starting');
    assert.is(await ready(), 503);
    cp.set(CLUSTER, 'c1', [edsCluster('backend')]);
    cp.set(ENDPOINT, 'e1', [endpoints('backend', (backend.address() as AddressInfo).port)]);
    cp.set(LISTENER, 'l1', [listener('http', listenPort, 'local')]);
    cp.set(ROUTE, 'r1', [route('local', 'backend')]);
    cp.set(NAME_TABLE_TYPE, 'n1', [{ name: 'nds', any: { type_url: NAME_TABLE_TYPE, value: encodeNameTable({ table: { 'backend.ns.svc.cluster.local': { ips: ['127.0.0.1'], registry: 'Kubernetes', shortname: 'backend', namespace: 'ns' } } }) } }]);
    await waitFor('agent ready', async () => (await ready()) === 200, 20_000);
    const url = `http://127.0.0.1:${listenPort}/`;
    assert.is((await httpRequest(url)).body, 'from-backend');
    const nds = JSON.parse((await httpRequest(`http://127.0.0.1:${status}/debug/ndsz`)).body);
    assert.equal(nds.table['backend.ns.svc.cluster.local'].ips, ['127.0.0.1'], 'the agent holds the name table');
    for (const name of ['backend.ns.svc.cluster.local', 'backend', 'backend.ns']) {
      assert.equal((await dig(dnsPort, name)).answers.map((a) => a.data), ['127.0.0.1'], `the DNS proxy answers ${name}`);
    }
    // Proxy config (PCDS) is subscribed by the agent and acknowledged by it.
    cp.set(PROXY_CONFIG_TYPE, 'p1', [{ name: 'pc', any: { type_url: PROXY_CONFIG_TYPE, value: new Uint8Array() } }]);
    await cp.waitForRequest('the agent ACKs proxy config', (q) => q.typeUrl === PROXY_CONFIG_TYPE && q.nonce !== '' && !q.error);
    await waitFor('logged', () => /proxy config from the control plane/.test(agent.log()), 5000);

    const load = startLoad({ url, concurrency: 4, maxDurationMs: 60_000 });
    for (const epoch of [1, 2]) {
      agent.proc.kill('SIGHUP');
      await waitFor(`epoch ${epoch} live`, async () =>
        JSON.parse((await httpRequest(`http://127.0.0.1:${status}/debug/epochs`)).body).epochs.some((e: { epoch: number; state: string }) => e.epoch === epoch && e.state === 'live'), 20_000);
      await sleep(300);
    }
    const r = await load.stop();
    assert.is(r.failed, 0, `failed requests: ${r.errors.join('; ')}`);
    assert.ok(r.ok > 50);
    assert.is(await ready(), 200);
    const metrics = (await httpRequest(`http://127.0.0.1:${status}/stats/prometheus`)).body;
    assert.match(metrics, /^istio_agent_startup_duration_seconds \d+(\.\d+)?$/m, 'Istio\'s start-up metric');
    assert.match(metrics, /^istio_agent_xds_proxy_upstream_connected 1$/m, 'xDS proxy counters merged');
    // The Go agent's names, where this agent measures the same thing (istio_agent_istiod_connection_terminations has
    // Go's `type` label and, as Go's, appears once counted: test/go-metrics-xds-terminations.test.ts).
    for (const name of ['istio_agent_xds_proxy_requests', 'istio_agent_xds_proxy_responses', 'istio_agent_istiod_connection_failures',
      'istio_agent_scrapes_total', 'istio_agent_scrape_failures_total', 'istio_agent_istio_build',
      'istio_agent_process_cpu_seconds_total', 'istio_agent_process_resident_memory_bytes', 'istio_agent_process_open_fds',
      'istio_agent_process_max_fds', 'istio_agent_process_start_time_seconds', 'istio_agent_process_virtual_memory_bytes']) {
      assert.match(metrics, new RegExp(`^# TYPE ${name} `, 'm'), `${name} exported`);
    }
    assert.match(metrics, /^istio_agent_xds_proxy_requests [1-9]\d*$/m);
  } finally {
    try {
      agent.proc.kill('SIGTERM');
      await waitFor('agent exit', () => agent.exited, 15_000);
      await agent.stop();
      await cp.stop();
      backend.close();
    } finally {
      await agent.close();
    }
  }
});

test.run();
