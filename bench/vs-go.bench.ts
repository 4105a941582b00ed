// Benchmark: this agent against Istio's Go pilot-agent, side by side, alternating runs, same inputs.
// Each agent runs `proxy sidecar` in its own network namespace (the fixed ports 15000/15020/15021/15090 live
// there) with the same env, the real Envoy, and the same control plane: this project's `pilot-agent discovery`
// on 127.0.0.1:15010 inside the namespace (plaintext, controlPlaneAuthPolicy NONE), started before the clock.
// NODE_EXTRA_CA_CERTS and the rest of the caller's environment are not passed on.
//
// Printed (medians): `version` wall; start -> Envoy spawned (binaryPath is a wrapper that stamps the time it is
// exec'd, then execs Envoy); start -> 15021 /healthz/ready 200; the agent's CPU until ready (utime+stime of
// /proc/<pid>/stat); idle VmRSS, RssAnon and PSS (/proc/<pid>/smaps_rollup: pods of one image on a node share the
// executable's file-backed pages, so PSS is what a node pays per pod) 3 s after ready; binary size.
//
// Run as root: npx tsx bench/vs-go.bench.ts [rounds=7]   (needs dist/pilot-agent: `npm run build`)
// Several builds side by side: TS_PILOT_AGENT=/tmp/before/pilot-agent,dist/pilot-agent npx tsx bench/vs-go.bench.ts
// The Go agent: $GO_PILOT_AGENT, else $(go env GOPATH)/bin/pilot-agent, built once from the Go module proxy;
// GO_PILOT_AGENT=none: TS builds only (ratios to the first). VS_GO_CA=1: with a CA (see WITH_CA). VS_GO_SMAPS=<dir>: each agent's /proc/<pid>/smaps at
// idle is saved there (<label>-<round>.smaps), to see where the memory goes. VS_GO_TIMELINE=1: each round's log of each
// agent, its lines at ms from the start, with the spawn and ready times (where the time between them goes).
// VS_GO_POLLER=sequential: 15021 probed one probe at a time instead of every 5 ms (see POLLER). VS_GO_ENVOY_LOG=<levels>:
// both agents get --proxyComponentLogLevel=<levels> (e.g. init:debug,main:debug: Envoy's own steps in the timeline).

import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { envoyBin, REPO, sleep, tempDir, waitFor } from '../test/helpers/harness';
import { procMemKiB } from './proc-mem';

const ROUNDS = Number(process.argv[2] ?? 7);
const ISTIO_VERSION = 'v0.0.0-20260827124520-eed52ebb66ad';
// VS_GO_IDLE_MS: how long after ready the idle memory is read (V8's memory reducer first acts ~8 s after start-up).
const IDLE_MS = Number(process.env.VS_GO_IDLE_MS ?? 3000);
const ENVOY_LOG = process.env.VS_GO_ENVOY_LOG ? [`--proxyComponentLogLevel=${process.env.VS_GO_ENVOY_LOG}`] : [];
// VS_GO_TS_ARGS: more arguments for this project's agents only, space-separated (e.g. --log_output_level=sds:debug).
const TS_ARGS = (process.env.VS_GO_TS_ARGS ?? '').split(' ').filter(Boolean);
// VS_GO_GO_ARGS: the same for the Go agent (e.g. --log_output_level=xdsproxy:debug,cache:debug).
const GO_ARGS = (process.env.VS_GO_GO_ARGS ?? '').split(' ').filter(Boolean);
// TS_PILOT_AGENT: one executable, or several separated by commas (each gets its own column, e.g. before/after).
const TS_AGENTS = (process.env.TS_PILOT_AGENT ?? path.join(REPO, 'dist', 'pilot-agent')).split(',').filter(Boolean);
const TS_AGENT = TS_AGENTS[0]!;
const WITH_GO = process.env.GO_PILOT_AGENT !== 'none';
// VS_GO_CA=1: with a CA. The discovery server is also the embedded CA (an identity bench/default with its token);
// the workload's endpoint is labelled for Istio mTLS, so Envoy's cluster waits for the workload certificate and
// 15021 is ready only once each agent has had its CSR signed (CA_ADDR defaults to the discovery address for both).
const WITH_CA = process.env.VS_GO_CA === '1';
const TOKEN = 'bench-token';

const median = (xs: number[]) => {
  const s = [...xs].filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (!s.length) return NaN;
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

function go(args: string[]): string {
  return execFileSync('go', args, { encoding: 'utf8', env: { ...process.env, GOFLAGS: '-mod=mod' } }).trim();
}

/** The Go agent and Istio's bootstrap template, built / downloaded from the Go module proxy once (cached). */
function goAgent(): { bin: string; template: string } {
  let bin = process.env.GO_PILOT_AGENT ?? '';
  if (!bin) {
    bin = path.join(go(['env', 'GOPATH']).split(':')[0]!, 'bin', 'pilot-agent');
    if (!fs.existsSync(bin)) {
      process.stderr.write(`building the Go agent: go install istio.io/istio/pilot/cmd/pilot-agent@${ISTIO_VERSION}\n`);
      execFileSync('go', ['install', `istio.io/istio/pilot/cmd/pilot-agent@${ISTIO_VERSION}`], { stdio: 'inherit', env: { ...process.env, GOFLAGS: '-mod=mod' } });
    }
  }
  let modDir = path.join(go(['env', 'GOMODCACHE']), `istio.io/istio@${ISTIO_VERSION}`);
  if (!fs.existsSync(modDir)) modDir = JSON.parse(go(['mod', 'download', '-json', `istio.io/istio@${ISTIO_VERSION}`])).Dir;
  return { bin, template: path.join(modDir, 'tools/packaging/common/envoy_bootstrap.json') };
}

/** Istio's bootstrap template without the Go agent: from the module cache, else this project's copy of it. */
function istioTemplate(): string {
  try {
    const modDir = path.join(go(['env', 'GOMODCACHE']), `istio.io/istio@${ISTIO_VERSION}`);
    const t = path.join(modDir, 'tools/packaging/common/envoy_bootstrap.json');
    if (fs.existsSync(t)) return t;
  } catch {
    // no Go
  }
  return path.join(REPO, 'test', 'fixtures', 'istio', 'envoy_bootstrap.json');
}

const CONFIG = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: web, namespace: bench }
spec:
  hosts: [web.bench.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{ number: 8080, name: http, protocol: HTTP }]
  endpoints:
  - { address: 127.0.0.1, ports: { http: 9080 }${process.env.VS_GO_CA === '1' ? ', labels: { security.istio.io/tlsMode: istio }, serviceAccount: default' : ''} }
`;

/**
 * Polls 15021 inside the namespace from a process started before the clock; prints the wall time of the first 200.
 * A new probe every 5 ms whatever the earlier ones do (200 ms timeout): the first 200 is the earliest a probe could
 * have seen it, to 5 ms. While Envoy's workers have not started, the probes wait in 15021's backlog (up to ~40) and
 * all reach the agent's status server as they start, a load no prober makes. VS_GO_POLLER=sequential: one probe at a
 * time, as kubelet probes a container (the next 5 ms after the answer or the 1 s timeout); a probe that gets a 503
 * just before the agent is ready then costs its round trip and the 5 ms, and the Go agent measured 20-130 ms later
 * to ready that way (2026-12-03), this agent about the same as with overlapping probes.
 */
const POLLER_SEQUENTIAL = `
const http = require('http');
process.stdout.write('armed\\n');
const probe = () => {
  const r = http.get({ host: '127.0.0.1', port: 15021, path: '/healthz/ready', timeout: 1000, agent: false }, (res) => {
    res.resume();
    if (res.statusCode === 200) { process.stdout.write(String(performance.timeOrigin + performance.now()) + '\\n'); process.exit(0); }
    res.on('end', () => setTimeout(probe, 5));
  });
  r.on('error', () => setTimeout(probe, 5));
  r.on('timeout', () => r.destroy());
};
probe();
`;
const POLLER_OVERLAPPING = `
const http = require('http');
process.stdout.write('armed\\n');
const t = setInterval(() => {
  const r = http.get({ host: '127.0.0.1', port: 15021, path: '/healthz/ready', timeout: 200 }, (res) => {
    res.resume();
    if (res.statusCode === 200) { clearInterval(t); process.stdout.write(String(performance.timeOrigin + performance.now()) + '\\n'); process.exit(0); }
  });
  r.on('error', () => {});
  r.on('timeout', () => r.destroy());
}, 5);
`;
const POLLER = process.env.VS_GO_POLLER === 'sequential' ? POLLER_SEQUENTIAL : POLLER_OVERLAPPING;

interface Netns {
  name: string;
  spawn(cmd: string, args: string[], opts: Parameters<typeof spawn>[2]): ChildProcess;
  pids(): number[];
  remove(): void;
}

function netns(name: string): Netns {
  spawnSync('ip', ['netns', 'del', name]);
  execFileSync('ip', ['netns', 'add', name]);
  execFileSync('ip', ['-n', name, 'link', 'set', 'lo', 'up']);
  return {
    name,
    spawn: (cmd, args, opts) => spawn('nsenter', [`--net=/run/netns/${name}`, cmd, ...args], opts),
    pids: () => spawnSync('ip', ['netns', 'pids', name], { encoding: 'utf8' }).stdout.split('\n').filter(Boolean).map(Number),
    remove: () => {
      for (const pid of spawnSync('ip', ['netns', 'pids', name], { encoding: 'utf8' }).stdout.split('\n').filter(Boolean)) {
        try { process.kill(Number(pid), 'SIGKILL'); } catch { /* gone */ }
      }
      spawnSync('ip', ['netns', 'del', name]);
    },
  };
}

const exited = (p: ChildProcess) => (p.exitCode !== null || p.signalCode !== null ? Promise.resolve() : new Promise<void>((r) => p.once('exit', () => r())));

async function stop(p: ChildProcess, ns: Netns, keep: Set<number>): Promise<void> {
  p.kill('SIGTERM');
  await Promise.race([exited(p), sleep(10_000)]);
  if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
  await exited(p);
  // Envoy (and its hot-restart children) must be gone before the next run reuses the namespace's ports.
  for (const pid of ns.pids()) if (!keep.has(pid)) try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ }
  await waitFor('namespace quiet', async () => ns.pids().every((pid) => keep.has(pid)), 10_000, 20);
}

/**
 * Envoy never unlinks its hot-restart shared memory and the Go agent does not remove it (this agent does): the
 * segments created since `sinceMs` (epoch ms) that no process maps any more are removed after each run.
 */
function removeOrphanedShm(sinceMs: number): void {
  const mapped = new Set<string>();
  for (const pid of fs.readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    try {
      for (const line of fs.readFileSync(`/proc/${pid}/maps`, 'utf8').split('\n')) {
        const i = line.indexOf('/dev/shm/envoy_shared_memory_');
        if (i >= 0) mapped.add(line.slice(i).trim());
      }
    } catch {
      // gone, or not ours to read
    }
  }
  for (const f of fs.readdirSync('/dev/shm').filter((n) => n.startsWith('envoy_shared_memory_'))) {
    const p = `/dev/shm/${f}`;
    try {
      if (fs.statSync(p).mtimeMs >= sinceMs - 1000 && !mapped.has(p)) fs.rmSync(p, { force: true });
    } catch {
      // gone
    }
  }
}

interface Side {
  label: string;
  bin: string;
  ns: Netns;
  keep: Set<number>;
  discovery: ChildProcess;
  dir: string;
  figures: { spawned: number[]; ready: number[]; cpu: number[]; rss: number[]; anon: number[]; pss: number[]; version: number[] };
}

const CLK_TCK = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout.trim() || 100);

function cpuMs(pid: number): number {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return ((Number(f[11]) + Number(f[12])) * 1000) / CLK_TCK; // utime, stime (fields 14, 15)
}


const baseEnv = (): Record<string, string> => ({ PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: '/root' });

/** One round's agent log, each timestamped line (Istio's format, both agents) at ms from the start. */
function timeline(label: string, round: number, log: string, t0: number, spawned: number, readyAt: number): string {
  const lines = [`--- ${label} round ${round}: Envoy spawned at ${spawned.toFixed(1)}, ready at ${(readyAt - t0).toFixed(1)}`];
  for (const l of log.split('\n')) {
    const m = /^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z\s+(.*)$/.exec(l);
    if (!m) continue;
    const at = Date.parse(`${m[1]}Z`) + Number(`0${m[2] ?? ''}`) * 1000 - t0;
    lines.push(`${at.toFixed(1).padStart(8)}  ${m[3]!.slice(0, 160)}`);
  }
  return lines.join('\n') + '\n';
}

async function oneRun(side: Side, template: string, round: number): Promise<void> {
  const run = path.join(side.dir, `run-${round}`);
  fs.mkdirSync(path.join(run, 'var/lib/istio/envoy'), { recursive: true });
  fs.copyFileSync(template, path.join(run, 'var/lib/istio/envoy/envoy_bootstrap_tmpl.json'));
  const stamps = path.join(run, 'envoy-exec.log');
  const wrapper = path.join(run, 'envoy');
  fs.writeFileSync(wrapper, `#!/bin/sh\necho "$(date +%s%N) $*" >> ${stamps}\nexec ${envoyBin()} "$@"\n`, { mode: 0o755 });
  if (WITH_CA) {
    fs.mkdirSync(path.join(run, 'var/run/secrets/tokens'), { recursive: true });
    fs.writeFileSync(path.join(run, 'var/run/secrets/tokens/istio-token'), TOKEN, { mode: 0o600 });
  }
  const env = {
    ...baseEnv(),
    PROXY_CONFIG: JSON.stringify({
      discoveryAddress: '127.0.0.1:15010', controlPlaneAuthPolicy: 'NONE', binaryPath: wrapper, configPath: path.join(run, 'proxy'),
      drainDuration: '1s', terminationDrainDuration: '1s', concurrency: 2,
    }),
    POD_NAME: 'bench-1', POD_NAMESPACE: 'bench', INSTANCE_IP: '127.0.0.1', SERVICE_ACCOUNT: 'default',
    ...(process.env.VS_GO_CPU_PROFILES && TS_AGENTS.includes(side.bin)
      ? { PILOT_AGENT_CPU_PROFILE: path.join(process.env.VS_GO_CPU_PROFILES, `${side.label}-${round}.cpuprofile`) }
      : {}),
  };
  const poller = side.ns.spawn(process.execPath, ['-e', POLLER], { stdio: ['ignore', 'pipe', 'ignore'], env: baseEnv() });
  let pollOut = '';
  poller.stdout!.on('data', (d) => (pollOut += d));
  await waitFor('poller armed', async () => pollOut.startsWith('armed'), 10_000, 5);
  const keep = new Set([...side.keep, ...side.ns.pids()]);
  let log = '';
  const t0 = performance.timeOrigin + performance.now();
  const extra = TS_AGENTS.includes(side.bin) ? TS_ARGS : GO_ARGS;
  const agent = side.ns.spawn(side.bin, ['proxy', 'sidecar', ...ENVOY_LOG, ...extra], { cwd: run, env, stdio: ['ignore', 'pipe', 'pipe'] });
  agent.stdout!.on('data', (d) => (log += d));
  agent.stderr!.on('data', (d) => (log += d));
  try {
    await waitFor(`${side.label} ready`, async () => pollOut.split('\n').length > 2, 30_000, 2).catch((e: Error) => {
      throw new Error(`${e.message}\n${log.slice(-3000)}`);
    });
    const cpu = cpuMs(agent.pid!);
    const readyAt = Number(pollOut.split('\n')[1]);
    const first = fs.readFileSync(stamps, 'utf8').split('\n').find((l) => / -c /.test(l) && !/--mode validate/.test(l));
    const spawned = first ? Number(first.split(' ')[0]) / 1e6 - t0 : NaN;
    side.figures.ready.push(readyAt - t0);
    if (process.env.VS_GO_TIMELINE === '1') process.stdout.write(timeline(side.label, round, log, t0, spawned, readyAt));
    side.figures.cpu.push(cpu);
    side.figures.spawned.push(spawned);
    await sleep(IDLE_MS);
    const m = procMemKiB(agent.pid!);
    side.figures.rss.push(m.rss / 1024);
    side.figures.anon.push(m.anon / 1024);
    side.figures.pss.push(m.pss / 1024);
    if (process.env.VS_GO_SMAPS) fs.writeFileSync(path.join(process.env.VS_GO_SMAPS, `${side.label}-${round}.smaps`), fs.readFileSync(`/proc/${agent.pid}/smaps`));
  } finally {
    poller.kill('SIGKILL');
    await exited(poller);
    await stop(agent, side.ns, keep);
    removeOrphanedShm(t0);
  }
}

function versionWall(bin: string): number {
  const t = performance.now();
  const r = spawnSync(bin, ['version'], { env: baseEnv(), stdio: 'ignore' });
  if (r.status !== 0) throw new Error(`${bin} version exited ${r.status}`);
  return performance.now() - t;
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new Error('run as root (network namespaces)');
  if (!fs.existsSync(TS_AGENT)) throw new Error(`${TS_AGENT} is missing: npm run build`);
  const { bin: goBin, template } = WITH_GO ? goAgent() : { bin: '', template: istioTemplate() };
  const tmp = tempDir('pa-vsgo-');
  const sides: Side[] = [];
  // The control plane runs from a copy: page-cache pages of the file the discovery servers run would otherwise be
  // shared with the first agent measured and halve its PSS.
  const discoveryBin = path.join(tmp.path, 'pilot-agent-discovery');
  fs.copyFileSync(TS_AGENT, discoveryBin);
  try {
    for (const [label, bin] of [...(WITH_GO ? [['go', goBin]] : []), ...TS_AGENTS.map((b, i) => [`ts${i}`, b])] as [string, string][]) {
      const ns = netns(`pa-vsgo-${label}-${process.pid}`);
      const dir = path.join(tmp.path, label);
      fs.mkdirSync(path.join(dir, 'config'), { recursive: true });
      fs.writeFileSync(path.join(dir, 'config', 'web.yaml'), CONFIG);
      if (WITH_CA) {
        fs.mkdirSync(path.join(dir, 'config', 'ca', 'identities', 'bench'), { recursive: true, mode: 0o700 });
        fs.chmodSync(path.join(dir, 'config', 'ca'), 0o700);
        fs.chmodSync(path.join(dir, 'config', 'ca', 'identities'), 0o700);
        fs.writeFileSync(path.join(dir, 'config', 'ca', 'identities', 'bench', 'default'), `${TOKEN}\n`, { mode: 0o600 });
      }
      // The same control plane for all: this project's discovery server (a copy of the first TS build).
      const discovery = ns.spawn(discoveryBin, ['discovery', '--config-dir', path.join(dir, 'config'), '--grpc-addr', '127.0.0.1:15010'], { stdio: 'ignore', env: baseEnv() });
      sides.push({ label, bin, ns, dir, discovery, keep: new Set(), figures: { spawned: [], ready: [], cpu: [], rss: [], anon: [], pss: [], version: [] } });
    }
    await sleep(1500);
    for (const s of sides) s.keep = new Set(s.ns.pids());
    for (let i = 0; i < 10; i++) for (const s of sides) versionWall(s.bin); // warm the page cache
    for (let i = 0; i < 21; i++) for (const s of sides) s.figures.version.push(versionWall(s.bin));
    for (let round = 0; round <= ROUNDS; round++) {
      for (const s of round % 2 ? [...sides].reverse() : sides) {
        const before = { ...s.figures };
        await oneRun(s, template, round);
        // Round 0 warms caches (Envoy's binary, the agent's pages) and is not counted.
        if (round === 0) for (const k of Object.keys(before) as (keyof Side['figures'])[]) if (k !== 'version') s.figures[k].pop();
      }
      process.stderr.write(`round ${round}/${ROUNDS}\n`);
    }
    const [g, ...ts] = sides as [Side, ...Side[]];
    const size = (b: string) => fs.statSync(b).size / 1e6;
    const row = (name: string, unit: string, pick: (s: Side) => number, digits = 1) =>
      `| ${name} | ${pick(g).toFixed(digits)} ${unit} | ${ts.map((t) => `${pick(t).toFixed(digits)} ${unit} | ${(pick(t) / pick(g)).toFixed(2)}x`).join(' | ')} |`;
    const lines = [
      `${WITH_CA ? 'with the embedded CA (VS_GO_CA=1); ' : ''}${WITH_GO ? `Go agent: ${goBin}` : `base: ${g.bin}`}; ${ts.map((t) => `${t.label}: ${t.bin}`).join('; ')}; ${ROUNDS} alternating rounds (+1 warm-up), ${g.figures.version.length} version runs each`,
      '',
      `| figure | ${WITH_GO ? 'Go agent' : g.label} | ${ts.map((t) => `${t.label} | ratio`).join(' | ')} |`,
      `|---|---|${ts.map(() => '---|---|').join('')}`,
      row('`version` wall', 'ms', (s) => median(s.figures.version)),
      row('start -> Envoy spawned', 'ms', (s) => median(s.figures.spawned)),
      row('start -> 15021 ready', 'ms', (s) => median(s.figures.ready)),
      row('agent CPU until ready', 'ms', (s) => median(s.figures.cpu), 0),
      row('idle VmRSS', 'MiB', (s) => median(s.figures.rss)),
      row('idle RssAnon', 'MiB', (s) => median(s.figures.anon)),
      row('idle PSS', 'MiB', (s) => median(s.figures.pss)),
      row('binary size', 'MB', (s) => size(s.bin)),
    ];
    process.stdout.write(lines.join('\n') + '\n');
    if (process.env.VS_GO_RAW) process.stdout.write(JSON.stringify(Object.fromEntries(sides.map((s) => [s.label, s.figures]))) + '\n');
  } finally {
    for (const s of sides) {
      s.discovery.kill('SIGKILL');
      await exited(s.discovery);
      s.ns.remove();
    }
    tmp.cleanup();
  }
}

main().catch((e: Error) => {
  process.stderr.write(`${e.stack ?? e.message}\n`);
  process.exit(1);
});
