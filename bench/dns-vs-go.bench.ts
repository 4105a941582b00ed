// Benchmark: the agents' DNS proxies side by side, this agent's executable and Istio's Go pilot-agent.
// Each agent runs `proxy sidecar` with ISTIO_META_DNS_CAPTURE=true in its own network namespace (`ip netns exec`,
// so /etc/netns/<ns>/resolv.conf points both at dnsmasq on 127.0.0.1:53 inside it), with the real Envoy and the
// same control plane (this project's `pilot-agent discovery`, 1,000 ServiceEntries -> the same NDS name table).
// The same load generator (bench/dns-load.ts, run inside the namespace) asks 127.0.0.1:15053 for table hits and
// for names dnsmasq answers (forwarded). Prints queries/s and p50/p99, medians over rounds.
// Run as root: npx tsx bench/dns-vs-go.bench.ts [queries-per-round=10000] [rounds=3] [in-flight=16]
// Agents: $GO_PILOT_AGENT (else $(go env GOPATH)/bin/pilot-agent, see bench/vs-go.bench.ts), $TS_PILOT_AGENT.

import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { envoyBin, REPO, sleep, tempDir, waitFor } from '../test/helpers/harness';
import type { Result } from './dns-load';

const QUERIES = Number(process.argv[2] ?? 10_000);
const ROUNDS = Number(process.argv[3] ?? 3);
const IN_FLIGHT = Number(process.argv[4] ?? 16);
const HOSTS = 1000;
const ISTIO_VERSION = 'v0.0.0-20260827124520-eed52ebb66ad';
const TS_AGENT = process.env.TS_PILOT_AGENT ?? path.join(REPO, 'dist', 'pilot-agent');
const goEnv = (k: string) => execFileSync('go', ['env', k], { encoding: 'utf8' }).trim().split(':')[0]!;
const GO_AGENT = process.env.GO_PILOT_AGENT ?? path.join(goEnv('GOPATH'), 'bin', 'pilot-agent');
const TEMPLATE = path.join(goEnv('GOMODCACHE'), `istio.io/istio@${ISTIO_VERSION}`, 'tools/packaging/common/envoy_bootstrap.json');

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const exited = (p: ChildProcess) => (p.exitCode !== null || p.signalCode !== null ? Promise.resolve() : new Promise<void>((r) => p.once('exit', () => r())));

const config = () => Array.from({ length: HOSTS }, (_, i) => `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: svc${i}, namespace: bench}
spec:
  hosts: [svc${i}.bench.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 8080, name: http, protocol: HTTP}]
  endpoints: [{address: 127.0.0.1}]
`).join('---\n');

interface Side { label: string; ns: string; procs: ChildProcess[]; results: Map<string, Result[]> }

function inNs(ns: string, cmd: string, args: string[], opts: Parameters<typeof spawn>[2]): ChildProcess {
  return spawn('ip', ['netns', 'exec', ns, cmd, ...args], opts);
}

async function startSide(label: string, bin: string, dir: string, discoveryBin: string): Promise<Side> {
  const ns = `pa-dnsgo-${label}-${process.pid}`;
  spawnSync('ip', ['netns', 'del', ns]);
  execFileSync('ip', ['netns', 'add', ns]);
  execFileSync('ip', ['-n', ns, 'link', 'set', 'lo', 'up']);
  fs.mkdirSync(`/etc/netns/${ns}`, { recursive: true });
  fs.writeFileSync(`/etc/netns/${ns}/resolv.conf`, 'nameserver 127.0.0.1\n');
  const side: Side = { label, ns, procs: [], results: new Map() };
  const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: '/root' };
  side.procs.push(inNs(ns, 'dnsmasq', ['--keep-in-foreground', '--port=53', '--listen-address=127.0.0.1', '--bind-interfaces',
    '--no-resolv', '--no-hosts', '--address=/fwd.test/10.9.9.9', '--cache-size=1000', '--user=root'], { stdio: 'ignore', env }));
  fs.mkdirSync(path.join(dir, 'config'), { recursive: true });
  fs.writeFileSync(path.join(dir, 'config', 'services.yaml'), config());
  side.procs.push(inNs(ns, discoveryBin, ['discovery', '--config-dir', path.join(dir, 'config'), '--grpc-addr', '127.0.0.1:15010'], { stdio: 'ignore', env }));
  await sleep(1500);
  fs.mkdirSync(path.join(dir, 'var/lib/istio/envoy'), { recursive: true });
  fs.copyFileSync(TEMPLATE, path.join(dir, 'var/lib/istio/envoy/envoy_bootstrap_tmpl.json'));
  const agentEnv = {
    ...env,
    PROXY_CONFIG: JSON.stringify({ discoveryAddress: '127.0.0.1:15010', controlPlaneAuthPolicy: 'NONE', binaryPath: envoyBin(), configPath: path.join(dir, 'proxy'), drainDuration: '1s', terminationDrainDuration: '1s', concurrency: 2 }),
    POD_NAME: 'bench-1', POD_NAMESPACE: 'bench', INSTANCE_IP: '127.0.0.1', SERVICE_ACCOUNT: 'default', ISTIO_META_DNS_CAPTURE: 'true',
  };
  let log = '';
  const agent = inNs(ns, bin, ['proxy', 'sidecar'], { cwd: dir, env: agentEnv, stdio: ['ignore', 'pipe', 'pipe'] });
  agent.stdout!.on('data', (d) => (log += d));
  agent.stderr!.on('data', (d) => (log += d));
  side.procs.push(agent);
  await waitFor(`${label} DNS proxy answers a table name`, async () => {
    const r = spawnSync('ip', ['netns', 'exec', ns, 'dig', '@127.0.0.1', '-p', '15053', '+short', '+time=1', '+tries=1', 'svc7.bench.svc.cluster.local'], { encoding: 'utf8' });
    return /^\d+\.\d+\.\d+\.\d+$/m.test(r.stdout);
  }, 60_000, 250).catch((e: Error) => { throw new Error(`${e.message}\n${log.slice(-3000)}`); });
  return side;
}

function runLoad(side: Side, names: string[], total: number): Result {
  const r = spawnSync('ip', ['netns', 'exec', side.ns, process.execPath, '--require', 'tsx/cjs', path.join(__dirname, 'dns-load.ts'),
    '15053', String(total), String(IN_FLIGHT), names.join(',')], { encoding: 'utf8', cwd: REPO, maxBuffer: 1 << 20 });
  if (r.status !== 0) throw new Error(`load in ${side.ns} failed: ${r.stderr}`);
  return JSON.parse(r.stdout) as Result;
}

async function stopSide(side: Side): Promise<void> {
  for (const p of [...side.procs].reverse()) {
    p.kill('SIGTERM');
    await Promise.race([exited(p), sleep(5000)]);
    if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
  }
  for (const pid of spawnSync('ip', ['netns', 'pids', side.ns], { encoding: 'utf8' }).stdout.split('\n').filter(Boolean)) {
    try { process.kill(Number(pid), 'SIGKILL'); } catch { /* gone */ }
  }
  spawnSync('ip', ['netns', 'del', side.ns]);
  fs.rmSync(`/etc/netns/${side.ns}`, { recursive: true, force: true });
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new Error('run as root (network namespaces)');
  const tmp = tempDir('pa-dnsgo-');
  const discoveryBin = path.join(tmp.path, 'pilot-agent-discovery');
  fs.copyFileSync(TS_AGENT, discoveryBin);
  const sides: Side[] = [];
  const hit = Array.from({ length: 200 }, (_, i) => `svc${i * 5}.bench.svc.cluster.local`);
  const fwd = Array.from({ length: 200 }, (_, i) => `n${i}.fwd.test`);
  const cases: [string, string[]][] = [['table hit', hit], ['forwarded to dnsmasq', fwd]];
  try {
    for (const [label, bin] of [['go', GO_AGENT], ['ts', TS_AGENT]] as const) {
      fs.mkdirSync(path.join(tmp.path, label));
      sides.push(await startSide(label, bin, path.join(tmp.path, label), discoveryBin));
    }
    for (const s of sides) for (const [, names] of cases) runLoad(s, names, 2000); // warm-up
    for (let r = 0; r < ROUNDS; r++) {
      for (const s of r % 2 ? [...sides].reverse() : sides) {
        for (const [name, names] of cases) s.results.set(name, [...(s.results.get(name) ?? []), runLoad(s, names, QUERIES)]);
      }
      process.stderr.write(`round ${r + 1}/${ROUNDS}\n`);
    }
    console.log(`DNS proxies side by side: ${QUERIES} A queries per round, ${ROUNDS} rounds, ${IN_FLIGHT} in flight; ${HOSTS}-host name table from NDS`);
    console.log('| case | Go agent q/s | p50 | p99 | this agent q/s | p50 | p99 | ratio q/s |');
    console.log('|---|---|---|---|---|---|---|---|');
    const [g, t] = sides as [Side, Side];
    for (const [name] of cases) {
      const f = (s: Side, k: keyof Result) => median(s.results.get(name)!.map((x) => x[k]));
      console.log(`| ${name} | ${Math.round(f(g, 'qps')).toLocaleString('en-US')} | ${f(g, 'p50').toFixed(3)} ms | ${f(g, 'p99').toFixed(3)} ms | ${Math.round(f(t, 'qps')).toLocaleString('en-US')} | ${f(t, 'p50').toFixed(3)} ms | ${f(t, 'p99').toFixed(3)} ms | ${(f(t, 'qps') / f(g, 'qps')).toFixed(2)}x |`);
    }
    const lost = sides.map((s) => `${s.label} ${[...s.results.values()].flat().reduce((a, x) => a + x.lost, 0)}`).join(', ');
    console.log(`lost: ${lost}`);
  } finally {
    for (const s of sides) await stopSide(s);
    tmp.cleanup();
  }
}

main().catch((e: Error) => {
  process.stderr.write(`${e.stack ?? e.message}\n`);
  process.exit(1);
});
