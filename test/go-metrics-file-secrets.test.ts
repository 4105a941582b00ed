// The secret cache's file metrics under the Go agent's names and types (security/pkg/nodeagent/cache/monitoring.go,
// exported with the istio_agent_ prefix, no labels): num_file_secret_failures_total counts certificate files that
// could not be made into a secret (a file-root: not there yet, a file-cert: whose key is not the certificate's, bad
// mounted certificates); num_file_watcher_failures_total counts watches that could not be added (here: the
// directory of a file-root: that is not mounted yet, which is then polled until the file appears).

import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { configureLogging, resetLogging } from '../lib/log';
import { newRegistry } from '../lib/metrics';
import { SecretCache } from '../lib/secret-cache';
import { tempDir, waitFor } from './helpers/harness';
import { makeLeaf, makeRoot } from './helpers/test-ca';

const ID = 'spiffe://cluster.local/ns/vm/sa/app';

function value(text: string, name: string): number | undefined {
  const m = new RegExp(`^${name} (\\d+)$`, 'm').exec(text);
  return m ? Number(m[1]) : undefined;
}

test('a file-root: in a directory not mounted yet: a watcher failure and secret failures, then served once it appears', async () => {
  const dir = tempDir('pa-file-metrics-');
  configureLogging({ write: () => undefined });
  const c = new SecretCache({ identity: ID, algorithm: { kind: 'ECDSA' }, ttlMs: 3600_000, graceRatio: 0.5, graceJitter: 0, debounceMs: 50 });
  const registry = newRegistry({ defaultMetrics: false });
  c.registerMetrics(registry);
  const pushed: string[] = [];
  c.onUpdate((n) => pushed.push(n));
  try {
    await c.start();
    let text = await registry.metrics();
    assert.match(text, /^# TYPE istio_agent_num_file_watcher_failures_total counter$/m);
    assert.match(text, /^# TYPE istio_agent_num_file_secret_failures_total counter$/m);
    assert.is(value(text, 'istio_agent_num_file_watcher_failures_total'), 0);
    assert.is(value(text, 'istio_agent_num_file_secret_failures_total'), 0);

    const mount = path.join(dir.path, 'not-mounted-yet');
    const ca = path.join(mount, 'ca.pem');
    const name = `file-root:${ca}`;
    c.requested(name);
    await waitFor('a secret failure', async () => (value(await registry.metrics(), 'istio_agent_num_file_secret_failures_total') ?? 0) >= 1);
    text = await registry.metrics();
    assert.is(value(text, 'istio_agent_num_file_watcher_failures_total'), 1, 'the missing directory could not be watched');

    const root = await makeRoot();
    fs.mkdirSync(mount);
    fs.writeFileSync(ca, root.pem);
    await waitFor('the root to be served once its directory appears', () => pushed.includes(name), 15_000);
    const failed = value(await registry.metrics(), 'istio_agent_num_file_secret_failures_total');
    await new Promise((r) => setTimeout(r, 300));
    text = await registry.metrics();
    assert.is(value(text, 'istio_agent_num_file_secret_failures_total'), failed, 'no more failures once it is served');
    assert.is(value(text, 'istio_agent_num_file_watcher_failures_total'), 1);
  } finally {
    await c.close();
    resetLogging();
    dir.cleanup();
  }
});

test('a file-cert: whose key is not the certificate\'s, and bad mounted certificates, count secret failures, not watcher ones', async () => {
  const dir = tempDir('pa-file-metrics-');
  configureLogging({ write: () => undefined });
  const root = await makeRoot();
  const [a, b] = [await makeLeaf(root, { dns: ['a.example.com'] }), await makeLeaf(root, { dns: ['b.example.com'] })];
  const cert = path.join(dir.path, 'a.pem');
  const key = path.join(dir.path, 'b.key');
  fs.writeFileSync(cert, a.certPem);
  fs.writeFileSync(key, b.keyPem);
  const mounted = path.join(dir.path, 'certs');
  fs.mkdirSync(mounted);
  fs.writeFileSync(path.join(mounted, 'cert-chain.pem'), 'not a certificate\n');
  fs.writeFileSync(path.join(mounted, 'key.pem'), a.keyPem);
  const c = new SecretCache({ identity: ID, algorithm: { kind: 'ECDSA' }, ttlMs: 3600_000, graceRatio: 0.5, graceJitter: 0, mountedDir: mounted, debounceMs: 50 });
  const registry = newRegistry({ defaultMetrics: false });
  c.registerMetrics(registry);
  try {
    await c.start();
    let text = await registry.metrics();
    assert.is(value(text, 'istio_agent_num_file_secret_failures_total'), 1, 'the mounted cert-chain.pem is not a certificate');
    c.requested(`file-cert:${cert}~${key}`);
    await waitFor('the mismatched pair to fail', async () => (value(await registry.metrics(), 'istio_agent_num_file_secret_failures_total') ?? 0) >= 2);
    text = await registry.metrics();
    assert.is(value(text, 'istio_agent_num_file_watcher_failures_total'), 0);
  } finally {
    await c.close();
    resetLogging();
    dir.cleanup();
  }
});

test.run();
