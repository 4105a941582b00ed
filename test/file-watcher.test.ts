import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { FileWatcher, referencedFiles } from '../lib/file-watcher';
import { sleep, tempDir, waitFor } from './helpers/harness';

test('a content change is reported once, debounced; a touch without a change is not', async () => {
  const dir = tempDir();
  const events: string[][] = [];
  const w = new FileWatcher((c) => events.push(c), { debounceMs: 50, pollMs: 60_000 });
  try {
    const f = path.join(dir.path, 'mesh.yaml');
    fs.writeFileSync(f, 'a: 1\n');
    w.watch([{ path: f, mode: 'content' }]);
    const now = new Date();
    fs.utimesSync(f, now, now);
    fs.writeFileSync(f, 'a: 1\n');
    await sleep(200);
    assert.equal(events, [], 'same content, no event');
    for (let i = 0; i < 5; i++) fs.writeFileSync(f, `a: ${i + 2}\n`);
    await waitFor('event', () => events.length > 0, 3000);
    await sleep(150);
    assert.equal(events, [[f]], 'a burst of writes is one event');
  } finally {
    w.close();
    dir.cleanup();
  }
});

test('a file replaced by rename (atomic write, ..data symlink swap) is seen', async () => {
  const dir = tempDir();
  const events: string[][] = [];
  const w = new FileWatcher((c) => events.push(c), { debounceMs: 20, pollMs: 60_000 });
  try {
    const data1 = path.join(dir.path, '..2026_1');
    const data2 = path.join(dir.path, '..2026_2');
    fs.mkdirSync(data1);
    fs.mkdirSync(data2);
    fs.writeFileSync(path.join(data1, 'cert-chain.pem'), 'one');
    fs.writeFileSync(path.join(data2, 'cert-chain.pem'), 'two');
    fs.symlinkSync('..2026_1', path.join(dir.path, '..data'));
    fs.symlinkSync('..data/cert-chain.pem', path.join(dir.path, 'cert-chain.pem'));
    const cert = path.join(dir.path, 'cert-chain.pem');
    w.watch([{ path: cert, mode: 'content' }]);
    fs.symlinkSync('..2026_2', path.join(dir.path, '..data_tmp'));
    fs.renameSync(path.join(dir.path, '..data_tmp'), path.join(dir.path, '..data'));
    await waitFor('cert swap seen', () => events.length > 0, 3000);
    assert.equal(events[0], [cert]);
  } finally {
    w.close();
    dir.cleanup();
  }
});

test('a removed file is reported', async () => {
  const dir = tempDir();
  const events: string[][] = [];
  const w = new FileWatcher((c) => events.push(c), { debounceMs: 10, pollMs: 100 });
  try {
    const f = path.join(dir.path, 'x');
    fs.writeFileSync(f, '1');
    w.watch([{ path: path.join(dir.path, 'x'), mode: 'stat' }]);
    fs.rmSync(f);
    await waitFor('removal seen', () => events.length > 0, 3000);
  } finally {
    w.close();
    dir.cleanup();
  }
});

test('add/remove are counted per file; a FIFO among the watched files is only stat()ed, never opened or read', async () => {
  const dir = tempDir();
  const events: string[][] = [];
  const w = new FileWatcher((c) => events.push(c), { debounceMs: 10, pollMs: 50 });
  try {
    const fifo = path.join(dir.path, 'fifo');
    execFileSync('mkfifo', [fifo]);
    const f = path.join(dir.path, 'f');
    fs.writeFileSync(f, '1');
    w.add({ path: fifo, mode: 'content' });
    w.add({ path: f, mode: 'content' });
    w.add({ path: f, mode: 'content' });
    assert.is(w.size, 2);
    await sleep(300); // several polls over the FIFO
    fs.writeFileSync(f, '2');
    await waitFor('the change', () => events.some((e) => e.includes(f)), 3000);
    assert.ok(events.every((e) => !e.includes(fifo)));
    w.remove(f);
    assert.is(w.size, 2, 'still added once more');
    w.remove(f);
    w.remove(fifo);
    assert.is(w.size, 0);
  } finally {
    w.close();
    dir.cleanup();
  }
});

test('referencedFiles finds the certificate files a bootstrap reads', () => {
  const b = {
    static_resources: {
      listeners: [{ filter_chains: [{ transport_socket: { typed_config: { common_tls_context: { tls_certificates: [{ certificate_chain: { filename: '/etc/certs/cert-chain.pem' }, private_key: { filename: '/etc/certs/key.pem' } }] } } } }] }],
    },
    admin: { access_log: [{ typed_config: { path: '/dev/null' } }] },
  };
  assert.equal([...referencedFiles(b)].sort(), ['/etc/certs/cert-chain.pem', '/etc/certs/key.pem']);
});

test.run();
