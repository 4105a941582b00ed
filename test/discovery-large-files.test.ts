// Large and hostile config files for the discovery server: a file above DISCOVERY_MAX_FILE_BYTES or with more
// than DISCOVERY_MAX_DOCUMENTS documents is refused with a short message and its last good content kept; a file at
// the limit loads while the process keeps answering (the status server and ADS share its event loop).

import * as fs from 'node:fs';
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { DiscoveryServer } from '../lib/discovery/index';
import { DEFAULT_MAX_FILE_BYTES } from '../lib/discovery/file-source';
import { encodeResource, encodeRouteConfigSteps, ROUTE, TYPE_URLS } from '../lib/discovery/resources';
import { configureLogging, resetLogging } from '../lib/log';
import { AdsClient } from './helpers/discovery-client';
import { serviceEntry } from './helpers/discovery-fixtures';
import { manyServices } from './helpers/large-config';
import { httpRequest, sleep, tempDir, waitFor } from './helpers/harness';

const NODE = { id: 'sidecar~192.0.2.1~app-1.test~test.svc.cluster.local' };

/** Service clusters in a CDS response: istiod's fixed PassthroughCluster and BlackHoleCluster come with them. */
// Besides the services' clusters: PassthroughCluster and BlackHoleCluster. The proxy's address (TEST-NET) is no
// service's endpoint, so it gets no inbound cluster.
const outbound = (r: { resources: unknown[] }) => r.resources.length - 2;

async function withServer(fn: (s: DiscoveryServer, dir: string, lines: string[]) => Promise<void>, opts: { maxFileBytes?: number } = {}): Promise<void> {
  const dir = tempDir('pa-disc-big-');
  const lines: string[] = [];
  configureLogging({ write: (l) => lines.push(l) });
  fs.writeFileSync(path.join(dir.path, 'a.yaml'), serviceEntry(18080, [{ port: 19001, version: 'v1' }]));
  const s = new DiscoveryServer({ configDir: dir.path, listen: '127.0.0.1:0', debounceMs: 10, ...opts });
  try {
    await s.start();
    await fn(s, dir.path, lines);
  } finally {
    await s.close();
    resetLogging();
    dir.cleanup();
  }
}

test('a 50 MB file is refused unread, in one short line, and the last good content of that file stays', () =>
  withServer(async (s, dir, lines) => {
    const file = path.join(dir, 'a.yaml');
    fs.writeFileSync(file, Buffer.alloc(50 * 1024 * 1024, 'x'));
    await s.reload();
    const issues = s.status().issues;
    assert.is(issues.length, 1);
    assert.match(issues[0]!, /a\.yaml: is 52428800 bytes, above the limit of 4194304 \(DISCOVERY_MAX_FILE_BYTES\); not read/);
    assert.is(s.status().services, 1, 'the service of the last good a.yaml is still served');
    const errors = lines.filter((l) => l.includes('\terror\t'));
    assert.ok(errors.length >= 1 && errors.every((l) => l.length < 600), errors.map((l) => l.length).join(','));
    // At startup the same file is a startup error that says the same.
    const s2 = new DiscoveryServer({ configDir: dir, listen: '127.0.0.1:0' });
    try {
      await s2.start();
      assert.unreachable('started');
    } catch (e) {
      assert.match((e as Error).message, /a\.yaml: is 52428800 bytes, above the limit/);
      assert.ok((e as Error).message.length < 600);
    }
  }));

test('at DISCOVERY_MAX_FILE_BYTES a file loads; one byte more is refused', () =>
  withServer(async (s, dir) => {
    const limit = 8192;
    const base = serviceEntry(18081, [{ port: 19002, version: 'v1' }], 'b.test.local');
    const at = base + '#'.repeat(limit - Buffer.byteLength(base) - 1) + '\n';
    assert.is(Buffer.byteLength(at), limit);
    fs.writeFileSync(path.join(dir, 'b.yaml'), at);
    await s.reload();
    assert.equal(s.status().issues, []);
    await waitFor('b pushed', () => s.status().services === 2);
    fs.writeFileSync(path.join(dir, 'b.yaml'), at + '\n');
    await s.reload();
    assert.match(s.status().issues.join('\n'), /b\.yaml: is 8193 bytes, above the limit of 8192/);
    assert.is(s.status().services, 2, 'b.yaml\'s last good content stays');
  }, { maxFileBytes: 8192 }));

test('more than DISCOVERY_MAX_DOCUMENTS documents in one file are refused; exactly that many load', () =>
  withServer(async (s, dir) => {
    fs.writeFileSync(path.join(dir, 'docs.yaml'), '---\n# nothing\n'.repeat(10_000));
    await s.reload();
    assert.equal(s.status().issues, []);
    fs.writeFileSync(path.join(dir, 'docs.yaml'), '---\n# nothing\n'.repeat(10_001));
    await s.reload();
    assert.match(s.status().issues.join('\n'), /docs\.yaml: has more than 10000 documents \(DISCOVERY_MAX_DOCUMENTS\)/);
  }));

test('a 3 MB junk scalar gives a short message, not a 3 MB one', () =>
  withServer(async (s, dir, lines) => {
    fs.writeFileSync(path.join(dir, 'junk.yaml'), 'j'.repeat(3_000_000));
    await s.reload();
    const issues = s.status().issues;
    assert.is(issues.length, 1);
    // Not a word of it: a file in the directory may be a key (issue 20 item 9).
    assert.match(issues[0]!, /junk\.yaml:1:1: document 1: is not a config: must be a mapping with apiVersion and kind, not a string \(3000000 characters\)/);
    assert.ok(lines.every((l) => l.length < 1000), `longest log line: ${Math.max(0, ...lines.map((l) => l.length))}`);
    fs.writeFileSync(path.join(dir, 'junk.yaml'), `kind: ServiceEntry\napiVersion: networking.istio.io/v1\nmetadata: {name: ${'n'.repeat(2_000_000)}}\nspec: {}\n`);
    await s.reload();
    assert.ok(s.status().issues.every((i) => i.length < 2000), `longest issue: ${s.status().issues.map((i) => i.length)}`);
  }));

test(`a file at the default limit (${DEFAULT_MAX_FILE_BYTES} bytes) loads while probes and a new ADS client are answered throughout`, () =>
  withServer(async (s, dir) => {
    const probe = http.createServer((_q, r) => r.end('ok'));
    await new Promise<void>((r) => probe.listen(0, '127.0.0.1', r));
    const url = `http://127.0.0.1:${(probe.address() as AddressInfo).port}/`;
    const c = AdsClient.connect(s.address, false);
    try {
      const { text, count } = manyServices(DEFAULT_MAX_FILE_BYTES);
      assert.ok(count > 5000, `${count} services`);
      fs.writeFileSync(path.join(dir, 'big.yaml'), text);
      let loaded = false;
      const loading = s.reload().then(() => (loaded = true));
      // Probe as a kubelet would: the latency includes any time this event loop was blocked.
      const latencies: number[] = [];
      let adsAnsweredWhileLoading = false;
      const ads = (async () => {
        c.send({ node: NODE, type_url: TYPE_URLS.cluster });
        const r = await c.next(TYPE_URLS.cluster, 30_000);
        adsAnsweredWhileLoading = !loaded && outbound(r) === 1;
        c.send({ type_url: TYPE_URLS.cluster, version_info: r.version_info, response_nonce: r.nonce });
      })();
      // Until the new set is loaded and pushed to the connected client: the push is built on the same loop.
      let pushed = false;
      let pushError: unknown;
      const pushedAll = (async () => {
        await loading;
        for (;;) {
          const r = await c.next(TYPE_URLS.cluster, 60_000);
          if (outbound(r) === 1 + count) return (pushed = true);
        }
      })().catch((e: unknown) => (pushError = e));
      while (!pushed && pushError === undefined) {
        const t0 = performance.now();
        const r = await httpRequest(url, { timeoutMs: 30_000 });
        latencies.push(performance.now() - t0);
        assert.is(r.status, 200);
        await sleep(50);
      }
      await loading;
      await ads;
      await pushedAll;
      if (pushError !== undefined) throw pushError;
      assert.ok(adsAnsweredWhileLoading, 'the ADS server answered a new client from the previous config while the file loaded');
      const worst = latencies.reduce((a, b) => Math.max(a, b), 0);
      // Kubelet's default probe timeout is 1 s; before this change the loop was blocked for the whole load (> 10 s).
      assert.ok(latencies.length >= 5, `${latencies.length} probes`);
      assert.ok(worst < 3000, `slowest probe ${Math.round(worst)} ms over ${latencies.length} probes`);
      assert.equal(s.status().issues, []);
      assert.is(s.status().services, 1 + count);
    } finally {
      c.close();
      probe.close();
    }
  }));

test('a route configuration encoded a virtual host at a time is byte for byte the one-shot encoding', () => {
  const vhosts = Array.from({ length: 300 }, (_, i) => ({
    name: `h${i}:80`,
    domains: [`h${i}`, `h${i}:80`],
    routes: [{ match: { prefix: '/' }, route: { cluster: `outbound|80||h${i}`, timeout: { seconds: 0, nanos: 0 } }, name: 'x'.repeat(i) }],
  }));
  const route = { name: '80', virtual_hosts: vhosts, validate_clusters: { value: false }, ignore_port_in_host_matching: true };
  const steps = encodeRouteConfigSteps(route);
  let r = steps.next();
  let n = 0;
  for (; !r.done; r = steps.next()) n++;
  assert.is(n, 300);
  const whole = encodeResource(ROUTE, '80', route);
  assert.equal(Buffer.from(r.value.any.value), Buffer.from(whole.any.value));
  assert.is(r.value.hash, whole.hash);
});

test.run();
