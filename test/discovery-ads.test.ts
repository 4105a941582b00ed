// The ADS protocol as the discovery server speaks it, driven by a bare client: versions and nonces, ACKs, stale
// requests, NACKs (not re-sent until the config changes), Delta subscriptions, bad node ids; and the server's
// lifecycle (start fails on invalid config, close twice, the CLI entry point).

import * as fs from 'node:fs';
import * as path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { DiscoveryServer, runDiscoveryCommand } from '../lib/discovery/index';
import { TYPE_URLS } from '../lib/discovery/resources';
import { configureLogging, resetLogging } from '../lib/log';
import { AdsClient } from './helpers/discovery-client';
import { serviceEntry } from './helpers/discovery-fixtures';
import { freePort, sleep, tempDir, waitFor } from './helpers/harness';

const NODE = { id: 'sidecar~10.0.0.1~app-1.test~test.svc.cluster.local' };
const CDS = TYPE_URLS.cluster;
const EDS = TYPE_URLS.endpoint;
const ADS_SERVICE = '/envoy.service.discovery.v3.AggregatedDiscoveryService';

async function withServer(fn: (s: DiscoveryServer, dir: string) => Promise<void>): Promise<void> {
  const dir = tempDir('pa-disc-ads-');
  const lines: string[] = [];
  configureLogging({ write: (l) => lines.push(l) });
  fs.writeFileSync(path.join(dir.path, 'a.yaml'), serviceEntry(18080, [{ port: 19001, version: 'v1' }]));
  const s = new DiscoveryServer({ configDir: dir.path, listen: '127.0.0.1:0', debounceMs: 10 });
  try {
    await s.start();
    await fn(s, dir.path);
  } finally {
    await s.close();
    resetLogging();
    dir.cleanup();
  }
}

test('SotW: a response carries the push version and a nonce; an ACK is recorded; an unchanged push sends nothing', () =>
  withServer(async (s, dir) => {
    const c = AdsClient.connect(s.address, false);
    try {
      c.send({ node: NODE, type_url: CDS });
      const r1 = await c.next(CDS);
      assert.is(r1.version_info, s.status().version);
      assert.ok(r1.nonce);
      assert.is(r1.resources.length, 3, 'the service and istiod\'s PassthroughCluster and BlackHoleCluster');
      c.send({ type_url: CDS, version_info: r1.version_info, response_nonce: r1.nonce });
      await waitFor('the ACK', () => s.status().connections[0]?.subscriptions[0]?.acked === r1.version_info);
      // A change that does not touch clusters (a new file with only a WorkloadEntry) pushes no CDS.
      fs.writeFileSync(path.join(dir, 'we.yaml'), 'apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {name: w, namespace: test}\nspec: {address: 10.9.9.9}\n');
      await s.reload();
      await waitFor('a push', () => s.status().pushes > 0);
      assert.ok(await c.quiet(CDS, 200));
      // A changed cluster set is pushed with a new version and nonce.
      fs.writeFileSync(path.join(dir, 'b.yaml'), serviceEntry(18081, [{ port: 19002, version: 'v1' }], 'other.test.local'));
      await s.reload();
      const r2 = await c.next(CDS);
      assert.is(r2.resources.length, 4);
      assert.is.not(r2.nonce, r1.nonce);
      assert.is.not(r2.version_info, r1.version_info);
    } finally {
      c.close();
    }
  }));

test('SotW: a request with an old nonce is ignored; a NACK is not answered and the rejected set is not re-sent', () =>
  withServer(async (s, dir) => {
    const c = AdsClient.connect(s.address, false);
    try {
      c.send({ node: NODE, type_url: EDS, resource_names: ['outbound|18080||web.test.local'] });
      const r1 = await c.next(EDS);
      assert.is(r1.resources.length, 1);
      fs.writeFileSync(path.join(dir, 'a.yaml'), serviceEntry(18080, [{ port: 19001, version: 'v1' }, { port: 19003, version: 'v2' }]));
      await s.reload();
      const r2 = await c.next(EDS);
      // Envoy answering the first response after the second went out: stale, so not taken as a change of names.
      c.send({ type_url: EDS, version_info: r1.version_info, response_nonce: r1.nonce, resource_names: [] });
      assert.ok(await c.quiet(EDS, 200));
      c.send({ type_url: EDS, version_info: r1.version_info, response_nonce: r2.nonce, resource_names: ['outbound|18080||web.test.local'], error_detail: { code: 3, message: 'endpoint rejected' } });
      await waitFor('the NACK to be recorded', () => s.status().nacks.length === 1);
      assert.equal(s.status().nacks[0]!.names, []);
      assert.ok(await c.quiet(EDS, 200), 'no answer to a NACK');
      // A push with the same content is not sent again; a real change is.
      fs.writeFileSync(path.join(dir, 'we.yaml'), 'apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {name: w, namespace: test}\nspec: {address: 10.9.9.9}\n');
      await s.reload();
      assert.ok(await c.quiet(EDS, 300));
      fs.writeFileSync(path.join(dir, 'a.yaml'), serviceEntry(18080, [{ port: 19004, version: 'v1' }]));
      await s.reload();
      const r3 = await c.next(EDS);
      assert.is(r3.resources.length, 1);
    } finally {
      c.close();
    }
  }));

test('Delta: wildcard CDS, initial versions skip what the proxy has, unsubscribe and removal', () =>
  withServer(async (s, dir) => {
    const c = AdsClient.connect(s.address, true);
    try {
      c.send({ node: NODE, type_url: CDS });
      const r1 = await c.next(CDS);
      assert.is(r1.resources.length, 3);
      const cluster = r1.resources.find((r) => r.name!.startsWith('outbound|'))!;
      assert.is(cluster.name, 'outbound|18080||web.test.local');
      c.send({ type_url: CDS, response_nonce: r1.nonce });
      // EDS: subscribing to an unknown name is answered as removed, so the proxy stops waiting for it.
      c.send({ type_url: EDS, resource_names_subscribe: ['outbound|18080||web.test.local', 'outbound|1||nope'] });
      const e1 = await c.next(EDS);
      assert.equal(e1.resources.map((r) => r.name), ['outbound|18080||web.test.local']);
      assert.equal(e1.removed_resources, ['outbound|1||nope']);
      c.send({ type_url: EDS, response_nonce: e1.nonce, resource_names_unsubscribe: ['outbound|18080||web.test.local'] });
      // A change that reaches the server before the unsubscribe is rightly pushed; wait until it has been read.
      const edsHeld = () => s.status().connections[0]?.subscriptions.find((w) => w.typeUrl === EDS)?.resources;
      await waitFor('the unsubscribe to be read', () => edsHeld() === 0);
      fs.writeFileSync(path.join(dir, 'a.yaml'), serviceEntry(18080, [{ port: 19005, version: 'v1' }]));
      await s.reload();
      assert.ok(await c.quiet(EDS, 300), 'nothing sent for an unsubscribed name');
      fs.rmSync(path.join(dir, 'a.yaml'));
      await s.reload();
      const r2 = await c.next(CDS);
      assert.equal(r2.removed_resources, ['outbound|18080||web.test.local']);
      assert.is(r2.resources.length, 0);
      // A reconnecting proxy that already holds the current cluster is not sent it again.
      fs.writeFileSync(path.join(dir, 'a.yaml'), serviceEntry(18080, [{ port: 19005, version: 'v1' }]));
      await s.reload();
      const r3 = await c.next(CDS);
      const c2 = AdsClient.connect(s.address, true);
      try {
        const held = Object.fromEntries([...r1.resources, ...r3.resources].map((r) => [r.name!, r.version!]));
        c2.send({ node: NODE, type_url: CDS, initial_resource_versions: held });
        const again = await c2.next(CDS);
        assert.is(again.resources.length, 0);
        c2.send({ type_url: EDS, resource_names_subscribe: ['outbound|18080||web.test.local'] });
        const eds = (await c2.next(EDS)).resources[0]!;
        const c3 = AdsClient.connect(s.address, true);
        try {
          // Envoy reconnecting: it subscribes to its EDS names and says which versions it holds.
          c3.send({ node: NODE, type_url: EDS, resource_names_subscribe: [eds.name!], initial_resource_versions: { [eds.name!]: eds.version! } });
          assert.is((await c3.next(EDS)).resources.length, 0);
        } finally {
          c3.close();
        }
      } finally {
        c2.close();
      }
    } finally {
      c.close();
    }
  }));

test('a stream whose node id is not a proxy id is refused with a clear error', () =>
  withServer(async (s) => {
    const c = AdsClient.connect(s.address, false);
    try {
      c.send({ node: { id: 'not-a-node-id' }, type_url: CDS });
      await rejects(c.next(CDS, 2000), /stream ended|no /);
      assert.is(s.status().connections.length, 0);
    } finally {
      c.close();
    }
  }));

test('a request over 4 MiB (istiod\'s limit) ends its stream with RESOURCE_EXHAUSTED; one of 3 MiB is served', () =>
  withServer(async (s) => {
    const client = new grpc.Client(s.address, grpc.credentials.createInsecure());
    try {
      const raw = (b: Buffer) => b;
      const call = client.makeBidiStreamRequest(`${ADS_SERVICE}/DeltaAggregatedResources`, raw, raw, new grpc.Metadata());
      const status = new Promise<grpc.StatusObject>((r) => call.on('status', r));
      call.on('error', () => undefined);
      call.on('data', () => undefined);
      // Never decoded: the size alone ends the stream, before the server holds more than the limit.
      call.write(Buffer.alloc(5 * 1024 * 1024));
      const st = await status;
      assert.is(st.code, grpc.status.RESOURCE_EXHAUSTED, st.details);
    } finally {
      client.close();
    }
    const c = AdsClient.connect(s.address, true);
    try {
      c.send({ node: NODE, type_url: CDS });
      await c.next(CDS);
      const unknown = Array.from({ length: 30_000 }, (_, i) => `outbound|${i}||${'x'.repeat(80)}.test.local`);
      c.send({ type_url: EDS, resource_names_subscribe: ['outbound|18080||web.test.local', ...unknown] });
      const e = await c.next(EDS, 10_000);
      assert.equal(e.resources.map((r) => r.name), ['outbound|18080||web.test.local']);
      assert.is(e.removed_resources?.length, unknown.length);
    } finally {
      c.close();
    }
  }));

test('start() fails on an invalid initial config, naming file, document and field, and leaves nothing listening', async () => {
  const dir = tempDir('pa-disc-bad-');
  const port = await freePort();
  try {
    fs.writeFileSync(path.join(dir.path, 'a.yaml'), serviceEntry(18080, [{ port: 19001, version: 'v1' }]).replace('protocol: HTTP', 'protocol: SCTP'));
    const s = new DiscoveryServer({ configDir: dir.path, listen: `127.0.0.1:${port}` });
    await rejects(s.start(), /a\.yaml:\d+:\d+: document 1 \(ServiceEntry test\/web\): field spec\.ports\[0\]\.protocol: "SCTP" is not one of/);
    assert.instance(await s.closed, Error);
    await s.close();
    await s.close();
    assert.is(await freePortIsFree(port), true);
  } finally {
    dir.cleanup();
  }
});

test('runDiscoveryCommand: exit code 1 on invalid config, 0 after SIGTERM', async () => {
  const dir = tempDir('pa-disc-cli-');
  const lines: string[] = [];
  configureLogging({ write: (l) => lines.push(l) });
  try {
    fs.writeFileSync(path.join(dir.path, 'a.yaml'), 'kind: Nope\n');
    assert.is(await runDiscoveryCommand({ configDir: dir.path, grpcAddr: '127.0.0.1:0' }, {}), 1);
    assert.ok(lines.some((l) => l.includes('a.yaml') && l.includes('unknown or unsupported kind')));
    fs.writeFileSync(path.join(dir.path, 'a.yaml'), serviceEntry(18080, [{ port: 19001, version: 'v1' }]));
    const sock = path.join(dir.path, 'xds.sock');
    const running = runDiscoveryCommand({ configDir: dir.path, grpcAddr: sock }, {});
    await waitFor('the socket', () => fs.existsSync(sock));
    await sleep(50);
    process.emit('SIGTERM', 'SIGTERM');
    assert.is(await running, 0);
    assert.is(fs.existsSync(sock), false, 'the socket file is removed');
  } finally {
    resetLogging();
    dir.cleanup();
  }
});

async function rejects(p: Promise<unknown>, re: RegExp): Promise<void> {
  try {
    await p;
  } catch (e) {
    assert.match((e as Error).message, re);
    return;
  }
  assert.unreachable(`expected a rejection matching ${re}`);
}

async function freePortIsFree(port: number): Promise<boolean> {
  const net = await import('node:net');
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.once('error', () => resolve(false));
    srv.listen(port, '127.0.0.1', () => srv.close(() => resolve(true)));
  });
}

test.run();
