// Symlinks in the config directory (how ConfigMap-style mounts and hand-made setups look): a dangling link or a
// link loop is an error naming the file and the link's target, and that file's last good content stays in force.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { MemoryConfigStore } from '../lib/discovery/config-store';
import { FileConfigSource } from '../lib/discovery/file-source';
import { DiscoveryServer } from '../lib/discovery/index';
import { formatIssue } from '../lib/discovery/yaml-file';
import { configureLogging, resetLogging } from '../lib/log';
import { serviceEntry } from './helpers/discovery-fixtures';
import { tempDir } from './helpers/harness';

async function withSource(fn: (src: FileConfigSource, store: MemoryConfigStore, dir: string, lines: string[]) => Promise<void>): Promise<void> {
  const dir = tempDir('pa-disc-links-');
  const lines: string[] = [];
  configureLogging({ write: (l) => lines.push(l) });
  try {
    const store = new MemoryConfigStore();
    await fn(new FileConfigSource({ dir: dir.path, store }), store, dir.path, lines);
  } finally {
    resetLogging();
    dir.cleanup();
  }
}

test('a symlink whose target disappears is an error, keeps its services, and is not "resolved"', () =>
  withSource(async (src, store, dir, lines) => {
    const real = path.join(dir, 'real');
    fs.mkdirSync(real);
    fs.writeFileSync(path.join(real, 'web.yaml'), serviceEntry(18080, [{ port: 19001, version: 'v1' }]));
    fs.writeFileSync(path.join(dir, 'bad.yaml'), 'kind: [');
    fs.symlinkSync(path.join(real, 'web.yaml'), path.join(dir, 'web.yaml'));
    await src.sync();
    assert.is(store.list('ServiceEntry').length, 1);
    fs.rmSync(path.join(real, 'web.yaml'));
    fs.rmSync(path.join(dir, 'bad.yaml')); // the only other error goes away in the same round
    const r = await src.sync();
    assert.is(r.changed, false);
    assert.equal(r.issues.map(formatIssue), [`${path.join(dir, 'web.yaml')}: is a symbolic link to ${path.join(real, 'web.yaml')}, which does not exist; not read`]);
    assert.is(store.list('ServiceEntry').length, 1, 'the last good content stays');
    assert.not.ok(lines.some((l) => l.includes('config errors resolved')), lines.join('\n'));
    assert.ok(lines.some((l) => /\terror\t.*web\.yaml: is a symbolic link to .*which does not exist/.test(l)));
    // The target comes back: the file is read again and the error is resolved.
    fs.writeFileSync(path.join(real, 'web.yaml'), serviceEntry(18080, [{ port: 19002, version: 'v1' }]));
    const back = await src.sync();
    assert.equal(back.issues, []);
    assert.is(back.changed, true);
    assert.ok(lines.some((l) => l.includes('config errors resolved')));
  }));

test('a symlink loop is an error naming the link, not a file silently skipped', () =>
  withSource(async (src, _store, dir) => {
    fs.symlinkSync('loop-b.yaml', path.join(dir, 'loop-a.yaml'));
    fs.symlinkSync('loop-a.yaml', path.join(dir, 'loop-b.yaml'));
    const r = await src.sync({ report: false });
    assert.equal(r.issues.map(formatIssue), [
      `${path.join(dir, 'loop-a.yaml')}: is a symbolic link loop (-> loop-b.yaml); not read`,
      `${path.join(dir, 'loop-b.yaml')}: is a symbolic link loop (-> loop-a.yaml); not read`,
    ]);
  }));

test('a FIFO named *.yaml is an error, not a reader blocked forever', () =>
  withSource(async (src, _store, dir) => {
    const { execFileSync } = await import('node:child_process');
    execFileSync('mkfifo', [path.join(dir, 'pipe.yaml')]);
    const r = await src.sync({ report: false });
    assert.equal(r.issues.map(formatIssue), [`${path.join(dir, 'pipe.yaml')}: is not a regular file; not read`]);
  }));

test('the discovery server does not start on a dangling symlink or a loop', async () => {
  const dir = tempDir('pa-disc-links-');
  try {
    fs.symlinkSync('/nonexistent/web.yaml', path.join(dir.path, 'web.yaml'));
    fs.symlinkSync('self.yaml', path.join(dir.path, 'self.yaml'));
    const s = new DiscoveryServer({ configDir: dir.path, listen: '127.0.0.1:0' });
    try {
      await s.start();
      assert.unreachable('started');
    } catch (e) {
      assert.match((e as Error).message, /self\.yaml: is a symbolic link loop/);
      assert.match((e as Error).message, /web\.yaml: is a symbolic link to \/nonexistent\/web\.yaml, which does not exist/);
    } finally {
      await s.close();
    }
  } finally {
    dir.cleanup();
  }
});

test.run();
