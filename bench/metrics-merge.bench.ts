// Benchmark of merging metrics: a real Envoy holding 1,000 clusters; scraping its /stats/prometheus (15090's
// source) directly, against merging that text with the agent's and an app's into one exposition, in the text
// format and in OpenMetrics. Prints medians; asserts nothing.
// Run: npx tsx bench/metrics-merge.bench.ts [rounds] [clusters]

import { type ChildProcess, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { Counter, Registry } from 'prom-client';
import { mergeExpositions } from '../lib/metrics-merge';
import { envoyBin, freePort, httpRequest, tempDir, waitFor } from '../test/helpers/harness';

const ROUNDS = Number(process.argv[2] ?? 10);
const CLUSTERS = Number(process.argv[3] ?? 1000);

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

async function main(): Promise<void> {
  const dir = tempDir('pa-bench-metrics-');
  let envoy: ChildProcess | undefined;
  try {
    const admin = await freePort();
    const clusters = Array.from({ length: CLUSTERS }, (_, i) => ({
      name: `outbound|8080||svc-${i}.default.svc.cluster.local`,
      type: 'STATIC',
      connect_timeout: '1s',
      load_assignment: { cluster_name: `c${i}`, endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: '127.0.0.1', port_value: 10_000 + i } } } }] }] },
    }));
    const cfg = path.join(dir.path, 'envoy.json');
    fs.writeFileSync(cfg, JSON.stringify({ admin: { address: { socket_address: { address: '127.0.0.1', port_value: admin } } }, static_resources: { clusters } }));
    envoy = spawn(envoyBin(), ['-c', cfg, '--disable-hot-restart', '--use-dynamic-base-id', '-l', 'error'], { stdio: 'ignore' });
    await waitFor('Envoy admin', async () => (await httpRequest(`http://127.0.0.1:${admin}/ready`, { timeoutMs: 1000 })).status === 200, 60_000, 200);

    const reg = new Registry();
    new Counter({ name: 'istio_agent_scrape_failures_total', help: 'x', labelNames: ['type'], registers: [reg] }).inc({ type: 'envoy' });
    const agentText = await reg.metrics();
    const appText = Array.from({ length: 200 }, (_, i) => `# TYPE app_metric_${i} gauge\napp_metric_${i}{k="v"} ${i}`).join('\n') + '\n';

    const scrape: number[] = [];
    const merge: Record<'text' | 'openmetrics', number[]> = { text: [], openmetrics: [] };
    let envoyText = '';
    let sizes: Record<string, number> = {};
    for (let r = 0; r < ROUNDS; r++) {
      const t0 = performance.now();
      envoyText = (await httpRequest(`http://127.0.0.1:${admin}/stats/prometheus`, { timeoutMs: 30_000 })).body;
      scrape.push(performance.now() - t0);
      for (const format of ['text', 'openmetrics'] as const) {
        const t1 = performance.now();
        const out = mergeExpositions([{ name: 'agent', text: agentText }, { name: 'envoy', text: envoyText }, { name: 'app', text: appText }], format);
        merge[format].push(performance.now() - t1);
        sizes[format] = out.body.length;
      }
    }
    const mb = (n: number) => `${(n / 1024 / 1024).toFixed(2)} MiB`;
    console.log(`Envoy with ${CLUSTERS} clusters: /stats/prometheus ${mb(envoyText.length)}, ${envoyText.split('\n').length} lines`);
    console.log(`  scrape Envoy directly:          median ${median(scrape).toFixed(1)} ms over ${ROUNDS} rounds`);
    console.log(`  merge agent+Envoy+app, text:    median ${median(merge.text).toFixed(1)} ms, ${mb(sizes.text!)}`);
    console.log(`  merge agent+Envoy+app, OpenMetrics: median ${median(merge.openmetrics).toFixed(1)} ms, ${mb(sizes.openmetrics!)}`);
  } finally {
    if (envoy && envoy.exitCode === null) {
      const exited = new Promise((r) => envoy!.once('exit', r));
      envoy.kill('SIGKILL');
      await exited;
    }
    dir.cleanup();
  }
}

void main();
