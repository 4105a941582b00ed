// The Go agent's metrics and status-port knobs (issue 23), each checked in Istio's source first:
// - METRICS_LOCALHOST_ACCESS_ONLY (pkg/features/telemetry.go; status/server.go handleStats): the status port's
//   /stats/prometheus answers a non-loopback peer 403.
// - PILOT_AGENT_MERGE_ENVOY_STATS=false (pilot/pkg/features/telemetry.go): Envoy's stats are left out of it.
// - ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL (pilot/pkg/features/experimental.go, the template's 15021 listener): a
//   probe that starts with a PROXY protocol header is answered, one without it too.
// - ISTIO_META_ENABLE_SELF_DISCOVERY (options.go, the template's local_cluster): Envoy's local cluster by EDS.
// - statsCompression: false (ProxyConfig): Envoy's 15090 answers uncompressed even to Accept-Encoding: gzip.
// The whole agent and the real Envoy (proxy --standalone with an empty config directory).

import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { RunningAgent } from './helpers/agent';
import { type AgentFixture, agentFixture } from './helpers/agent-fixture';
import { httpRequest, type TempDir } from './helpers/harness';

interface Running {
  fixture: AgentFixture;
  agent: RunningAgent;
  dir: TempDir;
  status: number;
  envoyStatus: number;
  envoyProm: number;
  adminPort: number;
}

async function start(env: Record<string, string>, proxyConfig: Record<string, unknown> = {}): Promise<Running> {
  const fixture = await agentFixture({ prefix: 'pa-knobs-metrics-' });
  const { dir, ports: { status, envoyStatus, prometheus: envoyProm, admin: adminPort } } = fixture;
  const cfgDir = path.join(dir.path, 'mesh');
  fs.mkdirSync(cfgDir);
  try {
    await fixture.start({ args: ['proxy', 'sidecar', '--standalone', cfgDir], proxyConfig, env: { POD_NAME: 'web-1', ...env } });
  } catch (e) {
    await fixture.close();
    throw e;
  }
  return { fixture, agent: fixture.agent, dir, status, envoyStatus, envoyProm, adminPort };
}

async function stop(r: Running): Promise<void> {
  await r.agent.stop();
  await r.fixture.close();
}

/** This host's address that is not loopback: a peer from there is "not localhost" to the status server. */
function nonLoopbackIp(): string {
  const ip = Object.values(os.networkInterfaces()).flat().find((a) => a && a.family === 'IPv4' && !a.internal)?.address;
  if (!ip) throw new Error('this test needs a non-loopback IPv4 address on the host');
  return ip;
}

/** One raw HTTP/1.1 exchange, optionally with bytes before it (a PROXY protocol header); the status line, or ''. */
function rawGet(port: number, pathName: string, o: { host?: string; localAddress?: string; preface?: string } = {}): Promise<string> {
  return new Promise((resolve) => {
    const s = net.connect({ host: o.host ?? '127.0.0.1', port, localAddress: o.localAddress }, () => {
      s.write(`${o.preface ?? ''}GET ${pathName} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
    });
    let got = '';
    s.on('data', (c: Buffer) => (got += c.toString('latin1')));
    s.on('error', () => resolve(got.split('\r\n')[0] ?? ''));
    s.on('close', () => resolve(got.split('\r\n')[0] ?? ''));
    s.setTimeout(5000, () => s.destroy());
  });
}

test('defaults: 15020 merges Envoy\'s stats and answers any peer; 15021 refuses a PROXY protocol header; no local_cluster', async () => {
  const r = await start({});
  try {
    const scrape = await httpRequest(`http://127.0.0.1:${r.status}/stats/prometheus`);
    assert.match(scrape.body, /^envoy_server_live/m);
    const ip = nonLoopbackIp();
    assert.match(await rawGet(r.status, '/stats/prometheus', { host: ip, localAddress: ip }), /^HTTP\/1\.1 200/);
    assert.not.match(await rawGet(r.envoyStatus, '/healthz/ready', { preface: 'PROXY TCP4 10.0.0.1 10.0.0.2 40000 15021\r\n' }), /^HTTP\/1\.1 200/);
    const clusters = (await httpRequest(`http://127.0.0.1:${r.adminPort}/clusters?format=json`)).body;
    assert.not.match(clusters, /"local_cluster"/);
  } finally {
    await stop(r);
  }
});

test('METRICS_LOCALHOST_ACCESS_ONLY, PILOT_AGENT_MERGE_ENVOY_STATS=false, ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL, ISTIO_META_ENABLE_SELF_DISCOVERY', async () => {
  const r = await start({
    METRICS_LOCALHOST_ACCESS_ONLY: 'true', PILOT_AGENT_MERGE_ENVOY_STATS: 'false',
    ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL: 'true', ISTIO_META_ENABLE_SELF_DISCOVERY: 'true',
  });
  try {
    const scrape = await httpRequest(`http://127.0.0.1:${r.status}/stats/prometheus`);
    assert.is(scrape.status, 200);
    assert.match(scrape.body, /^istio_agent_/m, 'the agent\'s own metrics stay');
    assert.not.match(scrape.body, /^envoy_/m, 'Envoy\'s are not merged');
    const ip = nonLoopbackIp();
    assert.match(await rawGet(r.status, '/stats/prometheus', { host: ip, localAddress: ip }), /^HTTP\/1\.1 403/);
    assert.match(await rawGet(r.status, '/metrics', { host: ip, localAddress: ip }), /^HTTP\/1\.1 403/);
    // Readiness is not a metrics path: kubelet still reaches it from the node's address.
    assert.match(await rawGet(r.status, '/healthz/ready', { host: ip, localAddress: ip }), /^HTTP\/1\.1 200/);
    assert.match(await rawGet(r.envoyStatus, '/healthz/ready', { preface: 'PROXY TCP4 10.0.0.1 10.0.0.2 40000 15021\r\n' }), /^HTTP\/1\.1 200/);
    assert.match(await rawGet(r.envoyStatus, '/healthz/ready'), /^HTTP\/1\.1 200/, 'without the header too');
    const dump = JSON.parse((await httpRequest(`http://127.0.0.1:${r.adminPort}/config_dump`)).body) as { configs: Record<string, any>[] };
    const of = (t: string) => dump.configs.find((c) => c['@type'].endsWith(t))!;
    assert.is(of('BootstrapConfigDump').bootstrap.cluster_manager.local_cluster_name, 'local_cluster');
    const local = of('ClustersConfigDump').static_clusters.find((c: { cluster: { name: string } }) => c.cluster.name === 'local_cluster');
    assert.is(local?.cluster.eds_cluster_config.service_name, 'local_cluster', 'Envoy runs local_cluster by EDS');
  } finally {
    await stop(r);
  }
});

test('statsCompression: false: Envoy\'s 15090 answers a gzip-asking scrape uncompressed', async () => {
  const r = await start({}, { statsCompression: false });
  try {
    const got = await new Promise<string>((resolve, reject) => {
      const s = net.connect(r.envoyProm, '127.0.0.1', () => s.write('GET /stats/prometheus HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n'));
      let text = '';
      s.on('data', (c: Buffer) => (text += c.toString('latin1')));
      s.on('end', () => resolve(text));
      s.on('error', reject);
    });
    const head = got.slice(0, got.indexOf('\r\n\r\n'));
    assert.match(head, /^HTTP\/1\.1 200/);
    assert.not.match(head, /content-encoding/i);
    assert.match(got, /envoy_server_live/);
  } finally {
    await stop(r);
  }
});

test.run();
