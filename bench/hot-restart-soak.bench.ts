// Soak: many hot restarts under steady load (keep-alive and new-connection clients side by side), printing
// requests served and failed, and the handoff time per restart. Run: npx tsx bench/hot-restart-soak.bench.ts [restarts]
// (needs dist/pilot-agent; `npm run build`).

import * as fs from 'node:fs';
import * as path from 'node:path';
import { envoyBin, freePort, httpRequest, sleep, tempDir, waitFor } from '../test/helpers/harness';
import { debugEpochs, startAgent } from '../test/helpers/agent';
import { startLoad } from '../test/helpers/load';
import { staticBootstrap } from '../test/helpers/static-bootstrap';
import { formatMem, procMemKiB } from './proc-mem';

const RESTARTS = Number(process.argv[2] ?? 50);

const bootstrap = (admin: number, listen: number, body: string) => staticBootstrap({ admin, listen }, body);

const pct = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))]!;

async function main() {
  const dir = tempDir('pa-soak-');
  const admin = await freePort();
  const status = await freePort();
  const listen = await freePort();
  const custom = path.join(dir.path, 'custom.json');
  fs.writeFileSync(custom, JSON.stringify(bootstrap(admin, listen, 'v0')));
  const agent = startAgent(['proxy'], {
    PROXY_CONFIG: JSON.stringify({ configPath: path.join(dir.path, 'proxy'), binaryPath: envoyBin(), customConfigFile: custom, statusPort: status, proxyAdminPort: admin, drainDuration: '1s', parentShutdownDuration: '2s', terminationDrainDuration: '1s' }),
    POD_NAME: 'soak', POD_NAMESPACE: 'soak', INSTANCE_IP: '127.0.0.1',
  }, dir.path);
  try {
    await waitFor('ready', async () => (await httpRequest(`http://127.0.0.1:${status}/healthz/ready`)).status === 200, 20_000);
    const url = `http://127.0.0.1:${listen}/`;
    const memBefore = procMemKiB(agent.pid);
    const kept = startLoad({ url, concurrency: 4, maxDurationMs: 30 * 60_000 });
    const fresh = startLoad({ url, concurrency: 2, keepAlive: false, maxDurationMs: 30 * 60_000 });
    const handoffs: number[] = [];
    const t0 = Date.now();
    for (let i = 1; i <= RESTARTS; i++) {
      const t = performance.now();
      agent.proc.kill('SIGHUP');
      await waitFor(`epoch ${i} live`, async () => (await debugEpochs(status)).epochs.some((e) => e.epoch === i && e.state === 'live'), 30_000, 5);
      handoffs.push(performance.now() - t);
      await sleep(200);
    }
    const memAfter = procMemKiB(agent.pid);
    const a = await kept.stop();
    const b = await fresh.stop();
    const secs = (Date.now() - t0) / 1000;
    console.log(`hot-restart soak, ${new Date().toISOString().slice(0, 10)}: ${RESTARTS} hot restarts in ${secs.toFixed(1)} s under load`);
    console.log(`keep-alive clients:      ${a.ok} ok, ${a.failed} failed${a.errors.length ? ` (${a.errors.slice(0, 3).join('; ')})` : ''}`);
    console.log(`new-connection clients:  ${b.ok} ok, ${b.failed} failed${b.errors.length ? ` (${b.errors.slice(0, 3).join('; ')})` : ''}`);
    console.log(`handoff SIGHUP -> live:  median ${pct(handoffs, 50).toFixed(1)} ms, p90 ${pct(handoffs, 90).toFixed(1)} ms, max ${handoffs.reduce((a, b) => Math.max(a, b)).toFixed(1)} ms`);
    console.log(`agent memory:            ${formatMem(memBefore)} before; ${formatMem(memAfter)} after`);
    if (a.failed + b.failed > 0) process.exitCode = 1;
  } finally {
    agent.proc.kill('SIGTERM');
    await agent.exited;
    dir.cleanup();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
