// Scrapes are compressed as with the Go agent: Envoy's Prometheus listener (15090) answers brotli, zstd or gzip
// as the client asks (the real Envoy, running the listener this agent generates).

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as path from 'node:path';
import * as zlib from 'node:zlib';
import { buildConfig } from '../lib/config';
import { buildNodeIdentity } from '../lib/node-identity';
import { buildBootstrap } from '../lib/bootstrap';
import { envoyBin, freePort, tempDir, waitFor } from './helpers/harness';

function get(url: string, acceptEncoding?: string): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const req = http.get(url, { headers: acceptEncoding ? { 'accept-encoding': acceptEncoding } : {}, timeout: 5000 }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
    });
    req.on('timeout', () => req.destroy(new Error(`timeout: ${url}`)));
    req.on('error', reject);
  });
}

test('Envoy\'s Prometheus listener compresses with brotli, zstd or gzip, as the client asks', async () => {
  const [admin, prom, status, ready] = await Promise.all([freePort(), freePort(), freePort(), freePort()]);
  const env = {
    POD_NAME: 'web-1', POD_NAMESPACE: 'shop', INSTANCE_IP: '127.0.0.1',
    ENVOY_PROMETHEUS_PORT: String(prom), ENVOY_STATUS_PORT: String(ready),
    PROXY_CONFIG: JSON.stringify({ proxyAdminPort: admin, statusPort: status }),
  };
  const cfg = buildConfig({ flags: {}, env, readFile: () => undefined });
  const b = buildBootstrap({ cfg, node: buildNodeIdentity(cfg, env, [], 'test') });
  // No control plane here: without ADS the static listeners serve at once.
  delete b.dynamic_resources;
  const dir = tempDir();
  const file = path.join(dir.path, 'bootstrap.json');
  fs.writeFileSync(file, JSON.stringify(b));
  const envoy = spawn(envoyBin(), ['-c', file, '--disable-hot-restart', '-l', 'error', '--skip-deprecated-logs'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  envoy.stderr!.on('data', (c: Buffer) => (log += c.toString()));
  const exited = new Promise((r) => envoy.once('exit', r));
  try {
    const url = `http://127.0.0.1:${prom}/stats/prometheus`;
    const plain = await waitFor('Envoy serving /stats/prometheus', async () => {
      if (envoy.exitCode !== null) throw new Error(`Envoy exited: ${log}`);
      const r = await get(url).catch(() => undefined);
      return r?.status === 200 ? r : undefined;
    }, 30_000, 200);
    assert.is(plain.headers['content-encoding'], undefined);
    const decode: Record<string, (b: Buffer) => Buffer> = { br: zlib.brotliDecompressSync, gzip: zlib.gunzipSync };
    for (const enc of ['br', 'zstd', 'gzip']) {
      const r = await get(url, enc);
      assert.is(r.headers['content-encoding'], enc, `Accept-Encoding: ${enc}`);
      assert.ok(r.body.length < plain.body.length / 2, `${enc}: ${r.body.length} bytes vs ${plain.body.length} plain`);
      if (decode[enc]) assert.match(decode[enc]!(r.body).toString(), /# TYPE envoy_server_live gauge/);
    }
  } finally {
    envoy.kill('SIGKILL');
    await exited;
    dir.cleanup();
  }
});

test.run();
