// /debug/pprof on a real StatusServer: a sampling heap profile, a CPU profile and an allocation profile of the
// running process in V8's formats, one profile at a time per profiler, heap snapshots only when turned on, bad
// parameters refused, loopback peers only.

import * as http from 'node:http';
import * as os from 'node:os';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { configureLogging, resetLogging } from '../lib/log';
import { Profiling } from '../lib/profiling';
import { StatusServer } from '../lib/status-server';
import { httpRequest } from './helpers/harness';

let status: StatusServer;
let prof: Profiling;
let base: string;
let withSnapshots: { prof: Profiling; status: StatusServer; base: string };

test.before(async () => {
  configureLogging({ write: () => {} });
  const p = new Profiling({ heapSnapshots: true });
  const s = new StatusServer({ port: 0, host: '127.0.0.1' }).addRoutes(p.routes());
  await s.start();
  withSnapshots = { prof: p, status: s, base: `http://127.0.0.1:${s.port}` };
  prof = new Profiling();
  // All interfaces, so a peer on a non-loopback address can be shown the door.
  status = new StatusServer({ port: 0, host: '0.0.0.0' });
  for (const r of prof.routes()) status.route(r.method, r.path, r.handler, { localOnly: r.localOnly });
  await prof.start();
  await status.start();
  base = `http://127.0.0.1:${status.port}`;
});

test.after(async () => {
  await withSnapshots.prof.close();
  await withSnapshots.status.close();
  await prof.close();
  await status.close();
  resetLogging();
});

function getBuffer(url: string): Promise<{ status: number; body: Buffer }> {
  return new Promise((resolve, reject) => {
    http.get(url, { agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks) }));
    }).on('error', reject);
  });
}

test('heap: live allocations sampled over the window, no memory contents', async () => {
  const marker = `held-by-the-test-${Date.now()}`;
  const pending = getBuffer(`${base}/debug/pprof/heap?seconds=1`);
  const held: Array<{ marker: string; i: number }> = [];
  const t0 = Date.now();
  while (Date.now() - t0 < 500) {
    for (let i = 0; i < 10_000; i++) held.push({ marker: marker + i, i });
    await new Promise((r) => setImmediate(r));
  }
  const r = await pending;
  assert.is(r.status, 200);
  assert.ok(held.length);
  const p = JSON.parse(r.body.toString('utf8')) as { head: { children: unknown[] }; samples: unknown[] };
  assert.ok(p.head.children.length > 0 && p.samples.length > 0, `${p.samples.length} samples`);
  assert.not.ok(r.body.includes(marker), 'a string of the process is in the profile');
});

test('heapsnapshot: refused unless turned on', async () => {
  const off = await getBuffer(`${base}/debug/pprof/heapsnapshot`);
  assert.is(off.status, 403);
  assert.match(off.body.toString(), /PILOT_AGENT_HEAP_SNAPSHOTS=true/);
  const r = await getBuffer(`${withSnapshots.base}/debug/pprof/heapsnapshot`);
  assert.is(r.status, 200);
  const snap = JSON.parse(r.body.toString('utf8')) as { snapshot: { node_count: number }; nodes: number[]; strings: string[] };
  assert.ok(snap.snapshot.node_count > 1000);
  assert.ok(snap.strings.includes('Profiling'), 'the snapshot is of this process');
});

test('profile: a CPU profile over the asked seconds; a second one meanwhile is refused', async () => {
  const pending = httpRequest(`${base}/debug/pprof/profile?seconds=1`, { timeoutMs: 20_000 });
  await new Promise((r) => setTimeout(r, 200));
  const busy = await httpRequest(`${base}/debug/pprof/profile?seconds=1`);
  assert.is(busy.status, 429);
  assert.match(busy.body, /CPU profile is already running/);
  // Another profiler is free meanwhile.
  assert.is((await httpRequest(`${base}/debug/pprof/heap?seconds=0.1`)).status, 200);
  const r = await pending;
  assert.is(r.status, 200);
  const p = JSON.parse(r.body) as { nodes: Array<{ callFrame: { functionName: string } }>; startTime: number; endTime: number; samples: number[] };
  assert.ok(p.nodes.length > 1);
  assert.ok(p.endTime - p.startTime >= 900_000, `profiled ${(p.endTime - p.startTime) / 1000} ms, want about 1 s`);
});

test('allocs: a sampling heap profile of what was allocated meanwhile, collected or not', async () => {
  const pending = httpRequest(`${base}/debug/pprof/allocs?seconds=1`, { timeoutMs: 20_000 });
  const t0 = Date.now();
  let kept = 0;
  while (Date.now() - t0 < 500) {
    const garbage = Array.from({ length: 10_000 }, (_, i) => ({ allocatedByTheTest: i }));
    kept += garbage.length;
    await new Promise((r) => setImmediate(r));
  }
  const r = await pending;
  assert.is(r.status, 200);
  assert.ok(kept > 0);
  const p = JSON.parse(r.body) as { head: { children: unknown[] }; samples: unknown[] };
  assert.ok(p.head.children.length > 0);
  assert.ok(p.samples.length > 10, `${p.samples.length} samples`);
});

test('index, unknown profiles and bad seconds', async () => {
  const idx = await httpRequest(`${base}/debug/pprof/`);
  assert.is(idx.status, 200);
  assert.match(idx.body, /profile\?seconds=N/);
  assert.is((await httpRequest(`${base}/debug/pprof/goroutine`)).status, 404);
  const bad = await httpRequest(`${base}/debug/pprof/profile?seconds=forever`);
  assert.is(bad.status, 400);
  assert.match(bad.body, /seconds must be a number/);
  assert.is((await httpRequest(`${base}/debug/pprof/profile?seconds=601`)).status, 400);
  assert.is((await httpRequest(`${base}/debug/pprof/cmdline`)).status, 200);
});

test('every profiling route answers loopback peers only', async () => {
  assert.ok(prof.routes().every((r) => r.localOnly));
  const ext = Object.values(os.networkInterfaces()).flat().find((i) => i && i.family === 'IPv4' && !i.internal);
  assert.ok(ext, 'this test needs a non-loopback IPv4 address to call from');
  const r = await httpRequest(`http://${ext!.address}:${status.port}/debug/pprof/heap`);
  assert.is(r.status, 403);
});

test.run();
