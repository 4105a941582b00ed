// Fetching a Wasm module from a real OCI registry (Debian's docker-registry on loopback, images pushed with skopeo):
// time from fetchOciModule() to the module in memory (manifest, layer, digest checks, gunzip and tar for the
// "compat" layout), by layout and size, anonymous and with token auth (one extra round trip to the token service).
// Loopback only: this measures the client's own cost, not a network. Figures are noisy on a shared machine;
// compare rows of one run.
//   npx tsx bench/wasm-oci.bench.ts [runs]

import { randomBytes } from 'node:crypto';
import { fetchOciModule } from '../lib/wasm-oci';
import { configureLogging } from '../lib/log';
import { startOciRegistry } from '../test/helpers/oci-registry';

const RUNS = Number(process.argv[2] ?? 7);

async function main(): Promise<void> {
  configureLogging({ outputLevel: 'wasm:warn' });
  const rows: string[] = [];
  for (const auth of ['none', 'token'] as const) {
    const reg = await startOciRegistry({ auth });
    try {
      for (const size of [64 << 10, 1 << 20, 8 << 20]) {
        // Random bytes: gzip cannot shrink them, so the compat layer is as large as the module.
        const module = Buffer.concat([Buffer.from('\0asm\x01\0\0\0', 'latin1'), randomBytes(size)]);
        for (const layout of ['compat', 'artifact'] as const) {
          const pushed = await reg.push({ repo: `bench/${layout}`, tag: `s${size}`, module, layout });
          const times: number[] = [];
          for (let i = 0; i < RUNS; i++) {
            const t0 = process.hrtime.bigint();
            const got = await fetchOciModule(pushed.ref, {
              insecure: true, timeoutMs: 30_000, maxRetries: 1, maxBytes: 64 << 20, isBlocked: () => false,
              pullSecret: auth === 'none' ? undefined : reg.pullSecret(),
            });
            times.push(Number(process.hrtime.bigint() - t0) / 1e6);
            if (!got.module.equals(module)) throw new Error('wrong module');
          }
          times.sort((a, b) => a - b);
          const med = times[Math.floor(times.length / 2)]!;
          const what = `${auth.padEnd(6)} ${layout.padEnd(9)} ${(size >> 10).toString().padStart(6)} KiB`;
          const rate = (size / 1048576 / (med / 1000)).toFixed(0).padStart(5);
          rows.push(`${what}  median ${med.toFixed(1).padStart(7)} ms  min ${times[0]!.toFixed(1).padStart(7)} ms  ${rate} MiB/s`);
        }
      }
    } finally {
      await reg.stop();
    }
  }
  console.log(`wasm-oci fetch, ${RUNS} runs each (auth, layout, module size):`);
  for (const r of rows) console.log(`  ${r}`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
