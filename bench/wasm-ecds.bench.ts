// What the ECDS Wasm rewrite costs the agent, in-process: (1) one resource whose module is cached (read the
// TypedExtensionConfig, look the module up, rewrite to a local file), per resource; (2) a cold fetch of a module of
// 1 and 16 MiB from a loopback HTTP server (round 1 also writes it to the cache; later rounds, pull policy Always
// with a new resourceVersion, fetch and hash it again and find it cached). Figures are
// noisy on a shared machine; compare within one run.
//   npx tsx bench/wasm-ecds.bench.ts

import { createHash } from 'node:crypto';
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';
import { configureLogging } from '../lib/log';
import { lenField } from '../lib/wasm-config';
import { WasmEcds } from '../lib/wasm-ecds';
import { blockList } from '../lib/wasm-fetch';
import { tempDir } from '../test/helpers/harness';
import { wasmPluginResource } from '../test/helpers/wasm-module';

async function main(): Promise<void> {
  configureLogging({ write: () => undefined });
  const dir = tempDir('pa-wasm-bench-');
  const modules = new Map<string, Buffer>();
  const wasm = (n: number) => Buffer.concat([Buffer.from([0, 0x61, 0x73, 0x6d, 1, 0, 0, 0]), Buffer.alloc(n - 8, 7)]);
  modules.set('/small.wasm', wasm(4096));
  modules.set('/1m.wasm', wasm(1 << 20));
  modules.set('/16m.wasm', wasm(16 << 20));
  const server = http.createServer((req, res) => res.end(modules.get(req.url!) ?? ''));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const url = (p: string) => `http://127.0.0.1:${(server.address() as AddressInfo).port}${p}`;
  const ecds = new WasmEcds({
    dir: path.join(dir.path, 'wasm'), moduleExpiryMs: 3600_000, purgeIntervalMs: 3600_000, httpTimeoutMs: 10_000,
    httpMaxRetries: 1, maxBytes: 64 << 20, insecureRegistries: new Set(), isBlocked: blockList('169.254.169.254/32'),
  });
  await ecds.start();
  try {
    const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
    const res = wasmPluginResource('ns.p', {
      url: url('/small.wasm'), sha256: sha(modules.get('/small.wasm')!), failurePolicy: 'FAIL_CLOSED',
      env: { ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION: '1', KEEP: 'x' },
    });
    const any = Buffer.concat([lenField(1, res.any.type_url), lenField(2, Buffer.from(res.any.value))]);
    await Promise.all(ecds.rewrite([any]));
    for (let round = 0; round < 3; round++) {
      const n = 20_000;
      const t0 = performance.now();
      for (let i = 0; i < n; i++) await Promise.all(ecds.rewrite([any]));
      const us = ((performance.now() - t0) * 1000) / n;
      console.log(`cached resource, round ${round + 1}: ${us.toFixed(1)} us per resource (${n} rewrites)`);
    }
    for (const p of ['/1m.wasm', '/16m.wasm']) {
      for (let round = 0; round < 3; round++) {
        const t0 = performance.now();
        await ecds.cache.get(url(p), {
          checksum: '', resourceName: `r${round}`, resourceVersion: String(round), requestTimeoutMs: 30_000,
          pullPolicy: 'Always',
        });
        console.log(`cold fetch ${p} round ${round + 1}: ${(performance.now() - t0).toFixed(1)} ms`);
      }
    }
  } finally {
    await ecds.close();
    server.close();
    dir.cleanup();
  }
}

void main();
