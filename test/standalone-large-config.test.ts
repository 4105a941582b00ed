// The whole agent in standalone mode with a config file at DISCOVERY_MAX_FILE_BYTES: readiness probes are answered
// throughout start-up and throughout a reload of that file (the status server shares the discovery server's event
// loop), and a file above the limit is refused while Envoy keeps serving.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';
import { spawn } from 'node:child_process';
import { DEFAULT_MAX_FILE_BYTES } from '../lib/discovery/file-source';
import { agentFixture } from './helpers/agent-fixture';
import { freePort, httpRequest, pidAlive, sleep, waitFor } from './helpers/harness';
import { manyServices } from './helpers/large-config';

function webYaml(port: number, backend: number): string {
  return `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: web, namespace: test }
spec:
  hosts: [web.test.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{ number: ${port}, name: http, protocol: HTTP }]
  endpoints:
  - { address: 127.0.0.1, ports: { http: ${backend} } }
`;
}

/**
 * Probes every 200 ms from a separate process (so that this test's own work never delays a probe) until stopped;
 * a probe not answered within `timeoutMs` after the first answer is a failure.
 */
function prober(url: string, timeoutMs: number) {
  const script = `
    const http = require('node:http');
    let stop = false;
    process.on('SIGTERM', () => (stop = true));
    (async () => {
      while (!stop) {
        const t0 = performance.now();
        const status = await new Promise((resolve) => {
          const req = http.get(${JSON.stringify(url)}, { agent: false, timeout: ${timeoutMs} }, (res) => { res.resume(); res.on('end', () => resolve(res.statusCode)); });
          req.on('timeout', () => { req.destroy(); resolve('timeout'); });
          req.on('error', () => resolve('refused'));
        });
        process.stdout.write(JSON.stringify({ status, ms: Math.round(performance.now() - t0), at: new Date().toISOString().slice(11, 23) }) + '\\n');
        await new Promise((r) => setTimeout(r, 200));
      }
    })();`;
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout!.on('data', (c: Buffer) => (out += c.toString()));
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  return {
    async stop() {
      if (child.exitCode === null) child.kill('SIGTERM');
      await exited;
      const all = out.trim().split('\n').filter(Boolean).map((l) => JSON.parse(l) as { status: number | 'timeout' | 'refused'; ms: number });
      const first = all.findIndex((s) => typeof s.status === 'number');
      return { answered: first < 0 ? [] : all.slice(first), all };
    },
  };
}

const stat = async (admin: number, name: string): Promise<number> => {
  const esc = name.replace(/[.|]/g, (c) => `\\${c}`);
  const r = await httpRequest(`http://127.0.0.1:${admin}/stats?filter=^${encodeURIComponent(esc)}$`);
  return Number(/: (\d+)$/m.exec(r.body)?.[1] ?? 0);
};

test('readiness probes are answered while a config at the size limit loads and reloads; a larger file is refused and Envoy keeps serving', async () => {
  const agent = await agentFixture({ prefix: 'pa-standalone-big-' });
  const { dir, ports: { status, admin } } = agent;
  const server = http.createServer((req, res) => {
    req.resume();
    res.end('web');
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const [servicePort, bigPort] = [await freePort(), await freePort()];
  const cfgDir = path.join(dir.path, 'mesh');
  fs.mkdirSync(cfgDir);
  fs.writeFileSync(path.join(cfgDir, 'web.yaml'), webYaml(servicePort, (server.address() as AddressInfo).port));
  const big = manyServices(DEFAULT_MAX_FILE_BYTES, bigPort);
  fs.writeFileSync(path.join(cfgDir, 'big.yaml'), big.text);
  // Two probes: /debug/epochs is the agent alone (its event loop must stay free: 2 s is twice kubelet's default
  // timeout); /healthz/ready also asks Envoy's admin, which is itself busy while it applies thousands of clusters.
  const loop = prober(`http://127.0.0.1:${status}/debug/epochs`, 2000);
  const probes = prober(`http://127.0.0.1:${status}/healthz/ready`, 5000);
  const url = `http://127.0.0.1:${servicePort}/`;
  let pids: number[] = [];
  try {
    await agent.start({ args: ['proxy', 'sidecar', '--standalone', cfgDir], env: { POD_NAME: 'web-client' }, readyTimeoutMs: 120_000 });
    await waitFor('web served', async () => (await httpRequest(url)).body === 'web', 20_000);
    const clusters = await stat(admin, 'cluster_manager.active_clusters');
    assert.ok(clusters >= big.count, `Envoy has the big file's ${big.count} clusters (${clusters})`);
    // Envoy keeps no per-cluster stats here (Istio's stats matcher); the xDS proxy shows what Envoy ACKed.
    const eds = async () => {
      const d = JSON.parse((await httpRequest(`http://127.0.0.1:${status}/debug/xds`)).body);
      const t = d.streams[0].types['type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment'];
      return { sent: t.upstream.nonce as string, acked: t.envoy.nonce === t.upstream.nonce };
    };
    const edsBefore = (await eds()).sent;

    // A reload of the whole file (every endpoint moves) while Envoy serves: readiness stays 200 and answered.
    fs.writeFileSync(path.join(cfgDir, 'big.yaml'), big.text.replace(/address: 10\./g, 'address: 11.'));
    await waitFor('the reload pushed and ACKed', async () => {
      const e = await eds();
      return e.sent !== edsBefore && e.acked;
    }, 120_000);
    await sleep(500);
    // Above the limit: refused unread, logged in one short line; Envoy keeps its config and keeps serving.
    fs.writeFileSync(path.join(cfgDir, 'big.yaml'), Buffer.alloc(DEFAULT_MAX_FILE_BYTES + 1, '#'));
    await waitFor('the refusal logged', () => /big\.yaml: is 4194305 bytes, above the limit of 4194304 \(DISCOVERY_MAX_FILE_BYTES\)/.test(agent.log()), 20_000);
    await sleep(500);
    assert.is((await httpRequest(url)).body, 'web');
    for (const [name, p] of [['/debug/epochs', loop], ['/healthz/ready', probes]] as const) {
      const { answered, all } = await p.stop();
      const missed = answered.filter((s) => s.status === 'timeout' || s.status === 'refused');
      assert.is(missed.length, 0, `${name} probes not answered after the first answer: ${JSON.stringify(missed)} of ${all.length}; slow: ${answered.map((p, i) => `${i}:${p.status}:${p.ms}@${(p as { at?: string }).at}`).filter((x) => +x.split(':')[2]!.split('@')[0]! > 300).join(' ')}\n${agent.log().split('\n').filter((l) => /discovery|push|live|invalid|error/.test(l)).map((l) => l.slice(0, 160)).join('\n')}`);
      assert.ok(answered.length >= 10, `${answered.length} ${name} probes`);
    }
    const { answered } = await probes.stop();
    // Answered is the point; while Envoy applies 10,000 endpoint updates its own /ready may be slow to answer, which
    // readiness reports as a 503 for that probe (kubelet needs three in a row to act).
    assert.ok(answered.some((s) => s.status === 200), 'ready at some point');
    assert.is(answered[answered.length - 1]!.status, 200, 'ready at the end');
    assert.ok(agent.log().split('\n').every((l) => l.length < 2000), 'no huge log line');
    pids = JSON.parse((await httpRequest(`http://127.0.0.1:${status}/debug/epochs`)).body).epochs.map((e: { pid: number }) => e.pid);
  } finally {
    try {
      await Promise.all([probes.stop(), loop.stop()]);
      agent.proc.kill('SIGTERM');
      const exit = await waitFor('agent exit', () => agent.exited, 30_000);
      await agent.stop();
      server.close();
      for (const pid of pids) assert.not.ok(pidAlive(pid));
      assert.is(exit.code, 0);
    } finally {
      await agent.close();
    }
  }
});

test.run();
