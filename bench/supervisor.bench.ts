// Benchmark: the agent's overhead before Envoy is spawned, agent start -> Envoy live vs Envoy started directly,
// and the hot-restart handoff time (trigger -> new epoch live) for SIGHUP and for a file change.
// Run: npx tsx bench/supervisor.bench.ts [rounds]   (needs dist/pilot-agent; `npm run build`)

import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { removeShm } from '../lib/hot-restart-shm';
import { envoyBin, freePort, httpRequest, tempDir, waitFor } from '../test/helpers/harness';
import { debugEpochs, startAgent, waitLiveEpoch } from '../test/helpers/agent';
import { staticBootstrap } from '../test/helpers/static-bootstrap';

const ROUNDS = Number(process.argv[2] ?? 10);

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};
const fmt = (xs: number[]) => `median ${median(xs).toFixed(1)} ms (min ${xs.reduce((a, b) => Math.min(a, b)).toFixed(1)}, max ${xs.reduce((a, b) => Math.max(a, b)).toFixed(1)}, n=${xs.length})`;

const bootstrap = (admin: number, listen: number, body: string) => staticBootstrap({ admin, listen }, body);

async function envoyDirect(): Promise<number> {
  const dir = tempDir('pa-bench-');
  const admin = await freePort();
  const file = path.join(dir.path, 'b.json');
  fs.writeFileSync(file, JSON.stringify(bootstrap(admin, await freePort(), 'x')));
  const t0 = performance.now();
  const idFile = path.join(dir.path, 'base-id');
  const p = spawn(envoyBin(), ['-c', file, '--use-dynamic-base-id', '--base-id-path', idFile, '-l', 'error'], { stdio: 'ignore' });
  try {
    await waitFor('envoy ready', async () => (await httpRequest(`http://127.0.0.1:${admin}/ready`, { timeoutMs: 500 })).status === 200, 20_000, 5);
    return performance.now() - t0;
  } finally {
    p.kill('SIGKILL');
    await new Promise((r) => p.once('exit', r));
    // Envoy leaves its hot-restart shared memory behind however it exits; the agent removes it, so must this.
    const id = fs.existsSync(idFile) ? Number(fs.readFileSync(idFile, 'utf8').trim()) : NaN;
    if (Number.isInteger(id)) removeShm(id);
    dir.cleanup();
  }
}

async function agentRun(handoffs: { hup: number[]; file: number[] }, withHandoffs: boolean): Promise<{ live: number; overhead: number }> {
  const dir = tempDir('pa-bench-');
  const admin = await freePort();
  const status = await freePort();
  const listen = await freePort();
  const custom = path.join(dir.path, 'custom.json');
  fs.writeFileSync(custom, JSON.stringify(bootstrap(admin, listen, 'v0')));
  const t0 = Date.now();
  const p0 = performance.now();
  const agent = startAgent(['proxy'], {
    PROXY_CONFIG: JSON.stringify({ configPath: path.join(dir.path, 'proxy'), binaryPath: envoyBin(), customConfigFile: custom, statusPort: status, proxyAdminPort: admin, drainDuration: '1s', parentShutdownDuration: '2s' }),
    POD_NAME: 'bench', POD_NAMESPACE: 'bench', INSTANCE_IP: '127.0.0.1',
  }, dir.path);
  try {
    await waitLiveEpoch(status, 0, 20_000).catch(() => undefined);
    await waitFor('ready', async () => (await httpRequest(`http://127.0.0.1:${status}/healthz/ready`, { timeoutMs: 500 })).status === 200, 20_000, 5);
    const live = performance.now() - p0;
    const m = /^(\S+)\tinfo\tsupervisor\tepoch 0 started/m.exec(agent.log());
    const overhead = m ? Date.parse(m[1]!.replace(/(\.\d{3})\d+Z$/, '$1Z')) - t0 : NaN;
    if (withHandoffs) {
      for (let i = 1; i <= ROUNDS * 2; i++) {
        const t = performance.now();
        if (i % 2) agent.proc.kill('SIGHUP');
        else fs.writeFileSync(custom, JSON.stringify(bootstrap(admin, listen, `v${i}`)));
        await waitFor(`epoch ${i} live`, async () => (await debugEpochs(status)).epochs.some((e) => e.epoch === i && e.state === 'live'), 20_000, 5);
        (i % 2 ? handoffs.hup : handoffs.file).push(performance.now() - t);
        await new Promise((r) => setTimeout(r, 300));
      }
    }
    return { live, overhead };
  } finally {
    agent.proc.kill('SIGTERM');
    await agent.exited;
    dir.cleanup();
  }
}

async function main() {
  const direct: number[] = [];
  const viaAgent: number[] = [];
  const overhead: number[] = [];
  const handoffs = { hup: [] as number[], file: [] as number[] };
  for (let i = 0; i < ROUNDS; i++) {
    direct.push(await envoyDirect());
    const r = await agentRun(handoffs, i === 0);
    viaAgent.push(r.live);
    overhead.push(r.overhead);
  }
  console.log(`supervisor benchmark, ${new Date().toISOString().slice(0, 10)}, Envoy ${envoyBin()}`);
  console.log(`Envoy started directly -> /ready:               ${fmt(direct)}`);
  console.log(`agent started -> Envoy live and agent ready:    ${fmt(viaAgent)}  ratio ${(median(viaAgent) / median(direct)).toFixed(2)}x`);
  console.log(`agent overhead before Envoy is spawned:         ${fmt(overhead)}`);
  console.log(`hot-restart handoff, SIGHUP -> new epoch live:  ${fmt(handoffs.hup)}`);
  console.log(`hot-restart handoff, file change -> new live:   ${fmt(handoffs.file)} (includes the 100 ms debounce)`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
