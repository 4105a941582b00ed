// Who is on an ADS stream (lib/discovery/xds-auth.ts) and the token files behind it (lib/discovery/identities.ts),
// with a bare client on real sockets: SotW and Delta streams authenticated by a token or the in-process token,
// refusals with their gRPC codes, counted in status() and the metrics, and each reason logged once; a server that
// takes no tokens ignores them; and the start-up rule for the files (owner-only, the target of a symbolic link
// counts, directories not writable by others).

import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { TokenIdentities } from '../lib/discovery/identities';
import { DiscoveryServer } from '../lib/discovery/index';
import { TYPE_URLS } from '../lib/discovery/resources';
import { configureLogging, resetLogging } from '../lib/log';
import { newRegistry } from '../lib/metrics';
import { AdsClient } from './helpers/discovery-client';
import { serviceEntry } from './helpers/discovery-fixtures';
import { tempDir, waitFor } from './helpers/harness';

const CDS = TYPE_URLS.cluster;
const node = (ns: string) => ({ id: `router~10.0.0.1~gw-1.${ns}~${ns}.svc.cluster.local` });

function meshDir(dir: string): string {
  const cfg = path.join(dir, 'mesh');
  fs.mkdirSync(path.join(cfg, 'ca', 'identities', 'test'), { recursive: true });
  fs.writeFileSync(path.join(cfg, 'ca', 'identities', 'test', 'gw'), 'gw-token\n', { mode: 0o600 });
  fs.writeFileSync(path.join(cfg, 'a.yaml'), serviceEntry(18080, [{ port: 19001, version: 'v1' }]));
  return cfg;
}

/** The stream's end: its gRPC code, or 'served' when a CDS response came. */
async function outcome(c: AdsClient, delta: boolean, ns: string): Promise<number | 'served'> {
  const code = new Promise<number>((r) => (c as unknown as { call: { on(e: string, f: (x: { code: number }) => void): void } }).call.on('error', (e) => r(e.code)));
  c.send(delta ? { node: node(ns), type_url: CDS, resource_names_subscribe: ['*'] } : { node: node(ns), type_url: CDS });
  return Promise.race([code, c.next(CDS, 5000).then(() => 'served' as const)]);
}

test('tokens on SotW and Delta streams: identities, the in-process token, refusals with their codes, counted and logged once', async () => {
  const dir = tempDir('pa-disc-auth-');
  const lines: string[] = [];
  configureLogging({ write: (l) => lines.push(l) });
  const sock = path.join(dir.path, 'd.sock');
  const s = new DiscoveryServer({ configDir: meshDir(dir.path), listen: `unix:${sock}`, inProcess: { namespace: 'test', serviceAccount: 'ingress' } });
  const clients: AdsClient[] = [];
  const open = (delta: boolean, token?: string) => {
    const c = AdsClient.connect(`unix:${sock}`, delta, token ? { authorization: `Bearer ${token}` } : {});
    clients.push(c);
    return c;
  };
  try {
    await s.start();
    assert.ok(s.inProcessToken && s.inProcessToken.length >= 40, 'a random in-process token');
    for (const delta of [false, true]) {
      assert.is(await outcome(open(delta, 'gw-token'), delta, 'test'), 'served');
      assert.is(await outcome(open(delta, s.inProcessToken), delta, 'test'), 'served');
      assert.is(await outcome(open(delta), delta, 'test'), 'served');
      assert.is(await outcome(open(delta, 'nope'), delta, 'test'), 16);
      assert.is(await outcome(open(delta, 'gw-token'), delta, 'other'), 7);
      assert.is(await outcome(open(delta, s.inProcessToken), delta, 'other'), 7, 'the in-process token is bound to its namespace too');
    }
    const ids = s.status().connections.map((c) => c.identity).sort();
    assert.equal(ids, ['anonymous', 'anonymous', 'test/gw (token)', 'test/gw (token)', 'test/ingress (in-process)', 'test/ingress (in-process)']);
    assert.equal(s.status().refused, { xds_stream: 6, health_report: 0 });
    const registry = newRegistry({ defaultMetrics: false });
    s.registerMetrics(registry);
    assert.match(await registry.metrics(), /^istio_agent_discovery_refused_xds_streams_total 6$/m);
    const refusedLines = lines.filter((l) => l.includes('refused an xDS stream'));
    assert.is(refusedLines.length, 3, `each reason once: ${refusedLines.join('\n')}`);
    assert.not.ok(lines.some((l) => l.includes('gw-token') || l.includes(s.inProcessToken!)), 'no token in the log');
  } finally {
    for (const c of clients) c.close();
    await s.close();
    resetLogging();
    dir.cleanup();
  }
});

test('a server that takes no tokens (a network address) ignores them: the proxy is anonymous', async () => {
  const dir = tempDir('pa-disc-auth-');
  configureLogging({ write: () => {} });
  const s = new DiscoveryServer({ configDir: meshDir(dir.path), listen: '0.0.0.0:0' });
  let c: AdsClient | undefined;
  try {
    await s.start();
    c = AdsClient.connect(`127.0.0.1:${s.address.split(':').pop()}`, false, { authorization: 'Bearer gw-token' });
    assert.is(await outcome(c, false, 'test'), 'served');
    await waitFor('the connection', () => s.status().connections.length === 1);
    assert.is(s.status().connections[0]!.identity, 'anonymous');
  } finally {
    c?.close();
    await s.close();
    resetLogging();
    dir.cleanup();
  }
});

test('token files: owner-only (a symbolic link\'s target counts), regular files, directories not writable by others', () => {
  const dir = tempDir('pa-disc-ids-');
  try {
    const ids = path.join(dir.path, 'ca', 'identities');
    fs.mkdirSync(path.join(ids, 'shop'), { recursive: true, mode: 0o755 });
    const web = path.join(ids, 'shop', 'web');
    fs.writeFileSync(web, 'web-token\n', { mode: 0o600 });
    const t = new TokenIdentities(ids);
    t.check();
    assert.equal(t.identityForToken('web-token'), { namespace: 'shop', serviceAccount: 'web' });
    assert.is(t.identityForToken('web'), undefined);

    const loose = path.join(dir.path, 'loose-token');
    fs.writeFileSync(loose, 'db-token\n', { mode: 0o644 });
    fs.chmodSync(loose, 0o644);
    fs.symlinkSync(loose, path.join(ids, 'shop', 'db'));
    assert.throws(() => t.check(), (e: Error) => e.message.includes(`${path.join(ids, 'shop', 'db')} is readable or writable by group or others (mode 0644); want 0600`));
    assert.is(t.identityForToken('db-token'), undefined, 'a loose target proves nothing');
    fs.chmodSync(loose, 0o600);
    t.check();
    assert.equal(t.identityForToken('db-token'), { namespace: 'shop', serviceAccount: 'db' });

    fs.mkdirSync(path.join(ids, 'shop', 'dir'));
    assert.throws(() => t.check(), /shop\/dir is not a regular file/);
    fs.rmdirSync(path.join(ids, 'shop', 'dir'));
    fs.chmodSync(path.join(ids, 'shop'), 0o775);
    assert.throws(() => t.check(), /shop is writable by group or others \(mode 0775\)/);
    fs.chmodSync(path.join(ids, 'shop'), 0o755);
    fs.chmodSync(path.join(dir.path, 'ca'), 0o757);
    assert.throws(() => t.check(), (e: Error) => e.message.includes(`${path.join(dir.path, 'ca')} is writable by group or others`));
  } finally {
    dir.cleanup();
  }
});

test.run();
