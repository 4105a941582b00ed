// Issue 20 item 8: the app's metrics are merged into /stats/prometheus beside Envoy's and the agent's, and the app
// must not be able to speak for them. A real Envoy and the agent's registry behind a real StatusServer; the app
// (a local HTTP server, as ISTIO_PROMETHEUS_ANNOTATIONS points at) sends envoy_server_live 0 in every spelling,
// the agent's counters and families, and its own metrics. Only its own are merged; the rest is counted and
// logged once per family. Series are compared parsed, so `x{} 1` and `x 0` are the same series.

import { type ChildProcess, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as http from 'node:http';
import type * as net from 'node:net';
import * as path from 'node:path';
import { Gauge } from 'prom-client';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { appMetricsSources } from '../lib/app-metrics';
import { configureLogging, resetLogging } from '../lib/log';
import { newRegistry, type MetricsSource } from '../lib/metrics';
import { mergeExpositions } from '../lib/metrics-merge';
import { StatusServer } from '../lib/status-server';
import { envoyBin, freePort, httpRequest, tempDir, waitFor, type TempDir } from './helpers/harness';
import { parseExposition } from './helpers/prom-parser';
import { staticBootstrap } from './helpers/static-bootstrap';

const SPOOF_TEXT = `# TYPE envoy_server_live gauge
envoy_server_live 0
envoy_server_live{} 0
envoy_server_live{extra="x"} 0
# TYPE envoy_cluster_manager_cluster_added counter
envoy_cluster_manager_cluster_added 999
# TYPE istio_agent_scrape_failures_total counter
istio_agent_scrape_failures_total{type="envoy"} 0
# TYPE agent_owned_gauge gauge
agent_owned_gauge{from="app"} 5
# TYPE envoy_made_up_by_the_app gauge
envoy_made_up_by_the_app 1
# TYPE app_requests_total counter
app_requests_total{code="200"} 42
`;

let dir: TempDir;
let envoy: ChildProcess | undefined;
let envoyAdmin: number;
let app: http.Server;
let status: StatusServer;
const lines: string[] = [];

test.before(async () => {
  configureLogging({ write: (l) => lines.push(l) });
  dir = tempDir('pa-sec-metrics-');
  envoyAdmin = await freePort();
  const cfg = path.join(dir.path, 'envoy.json');
  fs.writeFileSync(cfg, JSON.stringify(staticBootstrap({ admin: envoyAdmin, listen: await freePort() }, 'hello', { backendPort: await freePort() })));
  envoy = spawn(envoyBin(), ['-c', cfg, '--disable-hot-restart', '--use-dynamic-base-id', '-l', 'error'], { stdio: 'ignore' });
  await waitFor('Envoy admin', async () => (await httpRequest(`http://127.0.0.1:${envoyAdmin}/ready`, { timeoutMs: 500 })).status === 200, 20_000, 100);
  app = http.createServer((_req, res) => res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end(SPOOF_TEXT));
  const appPort = await new Promise<number>((r) => app.listen(0, '127.0.0.1', () => r((app.address() as net.AddressInfo).port)));
  const registry = newRegistry({ defaultMetrics: false });
  new Gauge({ name: 'agent_owned_gauge', help: 'A family of the agent.', registers: [registry] }).set(1);
  const envoySource: MetricsSource = {
    name: 'envoy',
    type: 'envoy',
    scrape: async () => ({ ok: true, text: (await httpRequest(`http://127.0.0.1:${envoyAdmin}/stats/prometheus`)).body }),
  };
  status = new StatusServer({ port: 0, host: '127.0.0.1', metrics: { registry, sources: [envoySource, ...appMetricsSources([{ port: appPort, path: '/metrics' }])] } });
  await status.start();
});

test.after(async () => {
  await status.close();
  await new Promise((r) => app.close(r));
  if (envoy && envoy.exitCode === null) {
    const exited = new Promise((r) => envoy!.once('exit', r));
    envoy.kill('SIGKILL');
    await exited;
  }
  dir.cleanup();
  resetLogging();
});

test('the app cannot add series to Envoy\'s or the agent\'s families in the merged /stats/prometheus', async () => {
  const scrape = async () => (await httpRequest(`http://127.0.0.1:${status.port}/stats/prometheus`)).body;
  const body = await scrape();
  const fams = new Map(parseExposition(body, 'text').map((f) => [f.name, f]));
  assert.equal(fams.get('envoy_server_live')?.samples.map((s) => [s.labels, s.value]), [[{}, 1]], 'only Envoy\'s own envoy_server_live');
  assert.ok(fams.get('envoy_cluster_manager_cluster_added')!.samples.every((s) => s.value !== 999));
  assert.equal(fams.get('agent_owned_gauge')?.samples.map((s) => s.value), [1]);
  assert.ok(fams.get('istio_agent_scrape_failures')!.samples.every((s) => s.labels.type !== 'envoy'));
  assert.not.ok(fams.has('envoy_made_up_by_the_app'), 'envoy_* is Envoy\'s even where Envoy has no such family');
  assert.equal(fams.get('app_requests')?.samples.map((s) => s.value), [42], 'the app\'s own metrics are merged');
  // Counted as the app's merge problems, and each family logged once, however many scrapes.
  const again = new Map(parseExposition(await scrape(), 'text').map((f) => [f.name, f]));
  const failures = again.get('istio_agent_scrape_failures')!.samples.find((s) => s.labels.type === 'application');
  assert.ok(failures && failures.value! >= 5, JSON.stringify(failures));
  const warned = lines.filter((l) => l.includes('envoy_server_live is a family of Envoy or the agent'));
  assert.is(warned.length, 1, warned.join('\n'));
});

test('with Envoy\'s scrape failed, the app still cannot claim envoy_* or istio_agent_* families', () => {
  const r = mergeExpositions([{ name: 'agent', text: '' }, { name: 'app', text: SPOOF_TEXT, untrusted: true }], 'openmetrics');
  const fams = new Map(parseExposition(r.body, 'openmetrics').map((f) => [f.name, f]));
  assert.equal([...fams.keys()].sort(), ['agent_owned_gauge', 'app_requests']);
  assert.ok(r.problems.some((p) => p.ownedFamily === 'envoy_server_live'));
});

test('series are compared parsed: x{} 1, x 0 and x{a="",b="\\\\x"} are spellings of one series or of another', () => {
  const r = mergeExpositions([
    { name: 'app', text: '# TYPE x gauge\nx{} 1\nx{b="\\\\x",a="1"} 2\n' },
    { name: 'app2', text: '# TYPE x gauge\nx 0\nx{a="1",b="\\\\x",c=""} 3\nx{a="2"} 4\n' },
  ], 'text');
  assert.equal(parseExposition(r.body, 'text')[0]!.samples.map((s) => s.value), [1, 2, 4]);
  assert.ok(r.problems.some((p) => p.source === 'app2' && /2 series already given/.test(p.problem)), JSON.stringify(r.problems));
});

test.run();
