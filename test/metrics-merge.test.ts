// Merged metrics: the agent's prom-client registry, a real Envoy's /stats/prometheus and app expositions (text and
// OpenMetrics, overlapping families, garbage) merged into one exposition that Python prometheus_client's parsers
// accept in both formats; and the app scrape (ISTIO_PROMETHEUS_ANNOTATIONS) against real servers that answer,
// fail, hang or send too much.

import { type ChildProcess, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as http from 'node:http';
import type * as net from 'node:net';
import * as path from 'node:path';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { parseAppMetricsConfig, scrapeApp } from '../lib/app-metrics';
import { AgentError } from '../lib/errors';
import { mergeExpositions, negotiateFormat, type MetricsSource } from '../lib/metrics-merge';
import { envoyBin, freePort, httpRequest, tempDir, waitFor, type TempDir } from './helpers/harness';
import { parseExposition } from './helpers/prom-parser';
import { staticBootstrap } from './helpers/static-bootstrap';

const APP_TEXT = `# HELP http_requests_total Requests the app served.
# TYPE http_requests_total counter
http_requests_total{code="200",path="/a b"} 1027 1700000000000
http_requests_total{code="500",path="q\\"uote"} 3
# TYPE app_errors counter
app_errors 7
# A comment that only the text format allows.
# TYPE rpc_duration_seconds summary
rpc_duration_seconds{quantile="0.5"} 0.05
rpc_duration_seconds{quantile="0.99"} NaN
rpc_duration_seconds_sum 17.5
rpc_duration_seconds_count 300
# TYPE process_open_fds gauge
process_open_fds 99
app_untyped_thing{x="y"} +Inf
`;

const APP_OPENMETRICS = `# TYPE jobs counter
# HELP jobs Jobs "done".
# UNIT jobs_seconds seconds
jobs_total{kind="batch"} 12 1700000000.5 # {trace_id="abc"} 1.0 1700000000.1
jobs_created{kind="batch"} 1700000000.0 1700000000.5
# TYPE build info
build_info{version="1.2.3"} 1
# TYPE latency_seconds histogram
latency_seconds_bucket{le="0.1"} 5
latency_seconds_bucket{le="+Inf"} 9
latency_seconds_sum 2.5
latency_seconds_count 9
latency_seconds_created 1700000000.0
# TYPE queue gaugehistogram
queue_bucket{le="1.0"} 3
queue_bucket{le="+Inf"} 4
queue_gcount 4
queue_gsum 7.0
# EOF
`;

let dir: TempDir;
let envoy: ChildProcess | undefined;
let envoyText = '';
let agentText = '';

test.before(async () => {
  dir = tempDir('pa-metrics-');
  const admin = await freePort();
  const listen = await freePort();
  const cfg = path.join(dir.path, 'envoy.json');
  fs.writeFileSync(cfg, JSON.stringify(staticBootstrap({ admin, listen }, 'hello', { backendPort: await freePort() })));
  envoy = spawn(envoyBin(), ['-c', cfg, '--disable-hot-restart', '--use-dynamic-base-id', '-l', 'error'], { stdio: 'ignore' });
  await waitFor('Envoy admin', async () => (await httpRequest(`http://127.0.0.1:${admin}/ready`, { timeoutMs: 500 })).status === 200, 20_000, 100);
  await httpRequest(`http://127.0.0.1:${listen}/`); // some traffic, so histograms have buckets
  envoyText = (await httpRequest(`http://127.0.0.1:${admin}/stats/prometheus`)).body;

  const reg = new Registry();
  new Counter({ name: 'istio_agent_scrape_failures_total', help: 'Scrape failures by source.', labelNames: ['type'], registers: [reg] }).inc({ type: 'application' });
  new Gauge({ name: 'process_open_fds', help: 'Open file descriptors.', registers: [reg] }).set(12);
  new Histogram({ name: 'istio_agent_xds_push_seconds', help: 'Push handling time.', buckets: [0.01, 0.1], registers: [reg] }).observe(0.05);
  agentText = await reg.metrics();
});

test.after(async () => {
  if (envoy && envoy.exitCode === null) {
    const exited = new Promise((r) => envoy!.once('exit', r));
    envoy.kill('SIGKILL');
    await exited;
  }
  dir.cleanup();
});

const sources = (): MetricsSource[] => [
  { name: 'agent', text: agentText },
  { name: 'envoy', text: envoyText },
  { name: 'app', text: APP_TEXT, format: 'text' },
  { name: 'app2', text: APP_OPENMETRICS, format: 'openmetrics' },
];

function typeLines(body: string): string[] {
  return body.split('\n').filter((l) => l.startsWith('# TYPE '));
}

function assertContiguousFamilies(body: string): void {
  // Each family's lines form one block: a name seen again after another family started is a split family.
  const done = new Set<string>();
  let current = '';
  for (const l of body.split('\n')) {
    const m = /^# (?:TYPE|HELP|UNIT) (\S+)/.exec(l);
    if (!m) continue;
    if (m[1] !== current) {
      assert.not.ok(done.has(m[1]!), `family ${m[1]} appears twice`);
      if (current) done.add(current);
      current = m[1]!;
    }
  }
}

test('text format: agent, real Envoy and app metrics merge into one exposition the reference parser accepts', () => {
  const r = mergeExpositions(sources(), 'text');
  assert.is(r.contentType, 'text/plain; version=0.0.4; charset=utf-8');
  const fams = parseExposition(r.body, 'text');
  const byName = new Map(fams.map((f) => [f.name, f]));
  assert.ok(envoyText.includes('envoy_server_live'), 'Envoy exposed its stats');
  assert.is(byName.get('envoy_server_live')?.type, 'gauge');
  assert.ok(fams.some((f) => f.name.startsWith('envoy_cluster_manager') && f.type === 'counter'));
  assert.is(byName.get('istio_agent_scrape_failures')?.type, 'counter');
  assert.is(byName.get('http_requests')?.samples.length, 2);
  assert.match(r.body, /^# TYPE app_errors counter\napp_errors 7$/m, 'a text counter keeps its name in text');
  assert.is(byName.get('app_errors')?.samples[0]?.value, 7);
  assert.is(byName.get('rpc_duration_seconds')?.type, 'summary');
  assert.is(byName.get('jobs')?.type, 'counter');
  assert.is(byName.get('jobs')?.help, 'Jobs "done".');
  assert.not.match(r.body, /# EOF/);
  assert.not.match(r.body, /^(jobs|latency_seconds)_created/m, 'the text format has no _created series');
  assert.not.match(r.body, /trace_id/, 'exemplars are OpenMetrics only');
  // process_open_fds is declared by the agent and the app: one TYPE, the agent's sample kept, the app's counted.
  const types = typeLines(r.body);
  assert.is(types.length, new Set(types.map((l) => l.split(' ')[2])).size, 'every family has one TYPE line');
  assert.equal(byName.get('process_open_fds')?.samples.map((s) => s.value), [12]);
  assert.ok(r.problems.some((p) => p.source === 'app' && /1 series already given/.test(p.problem)));
  assertContiguousFamilies(r.body);
});

test('OpenMetrics: the same sources parse with the strict OpenMetrics parser, with one # EOF at the very end', () => {
  const r = mergeExpositions(sources(), 'openmetrics');
  assert.is(r.contentType, 'application/openmetrics-text; version=1.0.0; charset=utf-8');
  const fams = parseExposition(r.body, 'openmetrics');
  const byName = new Map(fams.map((f) => [f.name, f]));
  assert.is(r.body.match(/^# EOF$/gm)?.length, 1);
  assert.ok(r.body.endsWith('\n# EOF\n'));
  assert.is(byName.get('app_errors')?.samples[0]?.name, 'app_errors_total', 'OpenMetrics counters end in _total');
  assert.is(byName.get('istio_agent_scrape_failures')?.samples[0]?.name, 'istio_agent_scrape_failures_total');
  assert.is(byName.get('build')?.type, 'info');
  assert.is(byName.get('queue')?.type, 'gaugehistogram');
  assert.is(byName.get('app_untyped_thing')?.type, 'unknown');
  assert.match(r.body, /jobs_total\{kind="batch"\} 12 1700000000\.5 # \{trace_id="abc"\} 1\.0/);
  assert.match(r.body, /http_requests_total\{code="200",path="\/a b"\} 1027 1700000000\n/, 'text ms timestamps become seconds');
  assertContiguousFamilies(r.body);
});

test('Envoy after traffic declares both x and x_total counters: both kept in text; OpenMetrics, where they would clash, keeps the first and reports the second', () => {
  const envoyAfterTraffic = [
    '# TYPE envoy_cluster_upstream_rq counter',
    'envoy_cluster_upstream_rq{envoy_response_code="200",envoy_cluster_name="b"} 7',
    '# TYPE envoy_cluster_upstream_rq_total counter',
    'envoy_cluster_upstream_rq_total{envoy_cluster_name="b"} 7',
    '',
  ].join('\n');
  const r = mergeExpositions([{ name: 'envoy', text: envoyAfterTraffic }], 'text');
  assert.equal(r.problems, []);
  assert.match(r.body, /^envoy_cluster_upstream_rq\{envoy_response_code="200",envoy_cluster_name="b"\} 7$/m);
  assert.match(r.body, /^envoy_cluster_upstream_rq_total\{envoy_cluster_name="b"\} 7$/m);
  const fams = parseExposition(r.body, 'text');
  assert.is(fams.reduce((n, f) => n + f.samples.length, 0), 2, 'the reference parser sees both series');
  const om = mergeExpositions([{ name: 'envoy', text: envoyAfterTraffic }], 'openmetrics');
  assert.is(parseExposition(om.body, 'openmetrics').reduce((n, f) => n + f.samples.length, 0), 1);
  assert.ok(om.problems.some((p) => /envoy_cluster_upstream_rq_total/.test(p.problem)), JSON.stringify(om.problems));
});

test('a source that is not Prometheus text is left out whole; a family that clashes with an earlier one is left out', () => {
  const garbage = { name: 'app', text: '<html><body>Welcome</body></html>\n' };
  const clash = { name: 'app2', text: '# TYPE envoy_server_live counter\nenvoy_server_live 5\n# TYPE fine gauge\nfine 1\n' };
  const afterEof = { name: 'app3', text: '# TYPE a gauge\na 1\n# EOF\nb 2\n', format: 'openmetrics' as const };
  for (const format of ['text', 'openmetrics'] as const) {
    const r = mergeExpositions([{ name: 'envoy', text: envoyText }, garbage, clash, afterEof], format);
    parseExposition(r.body, format);
    assert.match(r.problems.find((p) => p.source === 'app')!.problem, /not a Prometheus exposition, left out: line 1: not a metric name/);
    assert.match(r.problems.find((p) => p.source === 'app2')!.problem, /envoy_server_live is a counter here but a gauge in an earlier source/);
    assert.match(r.problems.find((p) => p.source === 'app3')!.problem, /lines after # EOF/);
    assert.match(r.body, /^fine 1$/m);
    assert.not.match(r.body, /Welcome/);
  }
});

test('no sources: an empty text exposition, or just # EOF', () => {
  assert.is(mergeExpositions([], 'text').body, '');
  assert.is(mergeExpositions([], 'openmetrics').body, '# EOF\n');
  parseExposition('# EOF\n', 'openmetrics');
});

test('the scraper\'s Accept header picks the format', () => {
  assert.is(negotiateFormat(undefined), 'text');
  assert.is(negotiateFormat('*/*'), 'text');
  // Prometheus 2.x/3.x default scrape Accept header.
  assert.is(negotiateFormat('application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1'), 'openmetrics');
  assert.is(negotiateFormat('text/plain;version=0.0.4;q=1,application/openmetrics-text;q=0.5'), 'text');
});

test('ISTIO_PROMETHEUS_ANNOTATIONS: Istio\'s defaults, scrape "false", and bad values naming the variable', () => {
  assert.equal(parseAppMetricsConfig({}, 15020), []);
  assert.equal(parseAppMetricsConfig({ ISTIO_PROMETHEUS_ANNOTATIONS: '{"scrape":"true"}' }, 15020), [{ port: 80, path: '/metrics' }]);
  assert.equal(parseAppMetricsConfig({ ISTIO_PROMETHEUS_ANNOTATIONS: '{"scrape":"true","port":"9090","path":"stats"}' }, 15020), [{ port: 9090, path: '/stats' }]);
  assert.equal(parseAppMetricsConfig({ ISTIO_PROMETHEUS_ANNOTATIONS: '{"scrape":"false","port":"9090"}' }, 15020), []);
  assert.equal(parseAppMetricsConfig({ ISTIO_PROMETHEUS_ANNOTATIONS: '{"targets":[{"port":"9090"},{"port":"9091","path":"/m"}]}' }, 15020), [{ port: 9090, path: '/metrics' }, { port: 9091, path: '/m' }]);
  const bad = (v: string, re: RegExp) => {
    try {
      parseAppMetricsConfig({ ISTIO_PROMETHEUS_ANNOTATIONS: v }, 15020);
      assert.unreachable(v);
    } catch (e) {
      assert.instance(e, AgentError);
      assert.match((e as Error).message, /ISTIO_PROMETHEUS_ANNOTATIONS/);
      assert.match((e as Error).message, re);
    }
  };
  bad('{oops', /not JSON/);
  bad('{"port":"15020"}', /status port/);
  bad('{"port":"15090"}', /reserved for Envoy Prometheus/);
  bad('{"port":"http"}', /not a port number/);
});

test('app scrape: text and OpenMetrics answers; refused, 500, hanging, oversized and binary answers come back as reasons', async () => {
  const big = Buffer.alloc(11 * 1024 * 1024, 'a');
  const server = http.createServer((req, res) => {
    if (req.url === '/metrics') return res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end('# TYPE a gauge\na 1\n');
    if (req.url === '/om') return res.writeHead(200, { 'content-type': 'application/openmetrics-text; version=1.0.0' }).end('# TYPE a gauge\na 1\n# EOF\n');
    if (req.url === '/fail') return res.writeHead(500).end('no');
    if (req.url === '/hang') return; // never answers
    if (req.url === '/big') return res.writeHead(200).end(big);
    if (req.url === '/chunked-big') {
      res.writeHead(200);
      for (let i = 0; i < 11; i++) res.write(big.subarray(0, 1024 * 1024));
      return res.end();
    }
    if (req.url === '/binary') return res.writeHead(200).end(Buffer.from([0x1f, 0x8b, 0, 0]));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const port = (server.address() as net.AddressInfo).port;
  const o = { timeoutMs: 1000, host: '127.0.0.1' };
  try {
    assert.equal(await scrapeApp({ port, path: '/metrics' }, o), { ok: true, text: '# TYPE a gauge\na 1\n', format: 'text' });
    assert.equal(await scrapeApp({ port, path: '/om' }, o), { ok: true, text: '# TYPE a gauge\na 1\n# EOF\n', format: 'openmetrics' });
    const reason = async (p: string, port2 = port) => {
      const r = await scrapeApp({ port: port2, path: p }, o);
      assert.not.ok(r.ok);
      return (r as { reason: string }).reason;
    };
    assert.match(await reason('/fail'), /answered 500/);
    const t0 = Date.now();
    assert.match(await reason('/hang'), /did not answer within 1000 ms/);
    assert.ok(Date.now() - t0 < 5000, 'a hanging app costs its timeout, not more');
    assert.match(await reason('/big'), /more than the 10485760/);
    assert.match(await reason('/chunked-big'), /more than the 10485760 bytes allowed/);
    assert.match(await reason('/binary'), /binary data/);
    assert.match(await reason('/metrics', await freePort()), /ECONNREFUSED/);
  } finally {
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  }
});

test.run();
