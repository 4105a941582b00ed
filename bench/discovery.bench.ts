// Benchmark of the embedded discovery server.
// 1. File change -> a real Envoy serving the new route (SotW and Delta), with the default debounce
//    (50 ms file quiet period + 100 ms push quiet period), and with both at their floor (5 ms) to show the rest.
// 2. For 1,000 and 10,000 services: loading the files, building the push context and every resource, a full push
//    to a fresh connection (a bare ADS client playing Envoy, and a real Envoy until it ACKs everything), and an
//    incremental push after one endpoint changes.
// Run: npx tsx bench/discovery.bench.ts [rounds] [sizes, e.g. 1000,10000]

import * as fs from 'node:fs';
import * as path from 'node:path';
import { generate } from '../lib/discovery/generate';
import { DiscoveryServer } from '../lib/discovery/index';
import { proxyFromNode } from '../lib/discovery/proxy';
import { PushContext } from '../lib/discovery/push-context';
import { TYPE_URLS } from '../lib/discovery/resources';
import { configureLogging } from '../lib/log';
import { AdsClient, type Response } from '../test/helpers/discovery-client';
import { fetchText, startEnvoy } from '../test/helpers/discovery-envoy';
import { destinationRule, serviceEntry, startStack, virtualService } from '../test/helpers/discovery-fixtures';
import { sleep, tempDir, waitFor } from '../test/helpers/harness';

const ROUNDS = Number(process.argv[2] ?? 10);
const SIZES = (process.argv[3] ?? '1000,10000').split(',').map(Number);

configureLogging({ outputLevel: 'discovery:warn' });

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};
const fmt = (xs: number[]) => `median ${median(xs).toFixed(1)} ms (min ${xs.reduce((a, b) => Math.min(a, b)).toFixed(1)}, max ${xs.reduce((a, b) => Math.max(a, b)).toFixed(1)}, n=${xs.length})`;

async function fileChangeToEnvoy(delta: boolean, fast: boolean): Promise<number[]> {
  const stack = await startStack(['v1', 'v2'], ({ servicePort, backends }) => ({
    'service.yaml': serviceEntry(servicePort, [{ port: backends.v1!.port, version: 'v1' }, { port: backends.v2!.port, version: 'v2' }]),
    'dr.yaml': destinationRule(['v1', 'v2']),
    'vs.yaml': virtualService({ v1: 100 }),
  }), fast ? { debounceMs: 5, fileDebounceMs: 5 } : {});
  const out: number[] = [];
  try {
    await stack.addEnvoy('sidecar', delta);
    const url = `http://127.0.0.1:${stack.servicePort}/`;
    await waitFor('v1', async () => (await fetchText(url)) === 'v1');
    for (let i = 0; i < ROUNDS; i++) {
      const want = i % 2 === 0 ? 'v2' : 'v1';
      const t0 = performance.now();
      stack.write('vs.yaml', virtualService({ [want]: 100 }));
      await waitFor(want, async () => (await fetchText(url)) === want, 10_000, 1);
      out.push(performance.now() - t0);
      await sleep(fast ? 50 : 250);
    }
  } finally {
    await stack.stop();
  }
  return out;
}

/** N services on port 8080, 2 endpoints each; every 10th with subsets and an 80/20 VirtualService. */
function writeServices(dir: string, n: number, endpointBase = 1): void {
  const perFile = 1000;
  for (let f = 0; f * perFile < n; f++) {
    const docs: string[] = [];
    for (let i = f * perFile; i < Math.min(n, (f + 1) * perFile); i++) {
      const host = `svc-${i}.bench.local`;
      const a = `10.${(i >> 8) & 255}.${i & 255}`;
      docs.push(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: svc-${i}, namespace: bench}
spec:
  hosts: [${host}]
  ports: [{number: 8080, name: http, protocol: HTTP}]
  endpoints:
  - {address: ${a}.${endpointBase}, labels: {version: v1}}
  - {address: ${a}.${endpointBase + 1}, labels: {version: v2}}
`);
      if (i % 10 === 0) {
        docs.push(`apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: svc-${i}, namespace: bench}
spec:
  host: ${host}
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
`);
        docs.push(`apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: svc-${i}, namespace: bench}
spec:
  hosts: [${host}]
  http:
  - route:
    - {destination: {host: ${host}, subset: v1}, weight: 80}
    - {destination: {host: ${host}, subset: v2}, weight: 20}
`);
      }
    }
    fs.writeFileSync(path.join(dir, `services-${f}.yaml`), docs.join('---\n'));
  }
}

/** Plays Envoy over Delta: wildcard CDS and LDS, then EDS and RDS for what they name; resolves when all arrived. */
async function fullPushToClient(address: string): Promise<{ ms: number; resources: number }> {
  const t0 = performance.now();
  const c = AdsClient.connect(address, true);
  try {
    const node = { id: 'sidecar~10.0.0.1~bench-client.bench~bench.svc.cluster.local' };
    const ack = (r: Response) => c.send({ type_url: r.type_url, response_nonce: r.nonce });
    c.send({ node, type_url: TYPE_URLS.cluster });
    const cds = await c.next(TYPE_URLS.cluster, 120_000);
    ack(cds);
    c.send({ type_url: TYPE_URLS.endpoint, resource_names_subscribe: cds.resources.map((r) => r.name!) });
    c.send({ type_url: TYPE_URLS.listener });
    const eds = await c.next(TYPE_URLS.endpoint, 120_000);
    ack(eds);
    const lds = await c.next(TYPE_URLS.listener, 120_000);
    ack(lds);
    c.send({ type_url: TYPE_URLS.route, resource_names_subscribe: ['8080'] });
    const rds = await c.next(TYPE_URLS.route, 120_000);
    ack(rds);
    return { ms: performance.now() - t0, resources: cds.resources.length + eds.resources.length + lds.resources.length + rds.resources.length };
  } finally {
    c.close();
  }
}

async function scale(n: number): Promise<void> {
  const dir = tempDir('pa-bench-disc-');
  const server = new DiscoveryServer({ configDir: dir.path, listen: `unix:${path.join(dir.path, 'xds.sock')}` });
  try {
    writeServices(dir.path, n);
    let t0 = performance.now();
    await server.start();
    console.log(`  load + validate ${n} services from files, first push context: ${(performance.now() - t0).toFixed(0)} ms`);

    const sidecar = proxyFromNode({ id: 'sidecar~10.0.0.1~x.bench~bench.svc.cluster.local' });
    const builds: number[] = [];
    for (let i = 0; i < 3; i++) {
      t0 = performance.now();
      const push = PushContext.build(`b${i}`, server.store, server.registry);
      let count = 0;
      for (const t of Object.values(TYPE_URLS)) count += generate(push, sidecar, t).size;
      builds.push(performance.now() - t0);
      if (i === 0) console.log(`  resources per sidecar: ${count}`);
    }
    console.log(`  push context + every resource generated and encoded (cold): ${fmt(builds)}`);

    const full: number[] = [];
    for (let i = 0; i < 3; i++) full.push((await fullPushToClient(server.address)).ms);
    console.log(`  full push to a new Delta connection (bare client, all 4 types): ${fmt(full)}`);

    // Incremental: one service's endpoints change; measure flush -> the connection finished its push.
    const c = AdsClient.connect(server.address, true);
    c.send({ node: { id: 'sidecar~10.0.0.2~inc.bench~bench.svc.cluster.local' }, type_url: TYPE_URLS.cluster });
    const cds = await c.next(TYPE_URLS.cluster, 120_000);
    c.send({ type_url: TYPE_URLS.cluster, response_nonce: cds.nonce });
    c.send({ type_url: TYPE_URLS.endpoint, resource_names_subscribe: cds.resources.map((r) => r.name!) });
    const eds = await c.next(TYPE_URLS.endpoint, 120_000);
    c.send({ type_url: TYPE_URLS.endpoint, response_nonce: eds.nonce });
    const inc: number[] = [];
    const pushMs: number[] = [];
    server.onPushed = (_p, _v, ms) => pushMs.push(ms);
    let build = 0;
    server.onPushContext = (_p, _r, ms) => (build = ms);
    for (let i = 0; i < 5; i++) {
      const file = path.join(dir.path, 'services-0.yaml');
      const text = fs.readFileSync(file, 'utf8').replace(/address: (10\.0\.0)\.(\d+), labels: \{version: v1\}/, (_m, a, b) => `address: ${a}.${Number(b) + 10}, labels: {version: v1}`);
      fs.writeFileSync(file, text);
      t0 = performance.now();
      await server.reload();
      server.flush();
      const r = await c.next(TYPE_URLS.endpoint, 60_000);
      inc.push(performance.now() - t0);
      c.send({ type_url: TYPE_URLS.endpoint, response_nonce: r.nonce });
      if (i === 0) console.log(`  incremental EDS push carries ${r.resources.length} of ${eds.resources.length} endpoint resources`);
    }
    c.close();
    console.log(`  one endpoint change -> Delta client has it (re-read the changed 1,000-document file, build, push): ${fmt(inc)}; build alone last ${build.toFixed(1)} ms; per-connection push ${fmt(pushMs)}`);

    // A real Envoy: connect -> every type ACKed at the current version.
    t0 = performance.now();
    const envoy = await startEnvoy({ xdsAddress: server.address, nodeId: 'sidecar~127.0.0.1~envoy.bench~bench.svc.cluster.local', delta: true });
    try {
      const version = server.status().version;
      await waitFor('Envoy to ACK everything', () => {
        const conn = server.status().connections.find((x) => x.proxy.includes('envoy.bench'));
        return conn && conn.subscriptions.length === 4 && conn.subscriptions.every((s) => s.acked === version);
      }, 600_000, 20);
      console.log(`  real Envoy (Delta): process start -> all 4 types ACKed: ${(performance.now() - t0).toFixed(0)} ms`);
    } finally {
      await envoy.stop();
    }
  } finally {
    await server.close();
    dir.cleanup();
  }
}

async function main(): Promise<void> {
  console.log(`discovery benchmark, ${new Date().toISOString()}`);
  for (const delta of [false, true]) {
    console.log(`file change -> Envoy serves the new route (${delta ? 'Delta' : 'SotW'}, default debounce 50+100 ms): ${fmt(await fileChangeToEnvoy(delta, false))}`);
  }
  console.log(`file change -> Envoy serves the new route (Delta, debounce 5+5 ms): ${fmt(await fileChangeToEnvoy(true, true))}`);
  for (const n of SIZES) {
    console.log(`${n} services:`);
    await scale(n);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
