// Start-up with a CA: one standalone sidecar with the embedded CA (no istiod needed), from the agent's start to
// (1) 15021 /healthz/ready answering 200 and (2) the first request that crosses mTLS (the app's call to a service
// whose endpoint is this sidecar's own inbound listener: outbound cluster with ISTIO_MUTUAL, inbound mTLS, the app).
// Two executables side by side, alternating, in a network namespace of their own per run (fixed ports inside):
//   npx tsx bench/ca-startup.bench.ts [runs] [baseline-binary]
// The baseline defaults to $BASELINE_AGENT; without one, only dist/pilot-agent is measured.

import { execFile, execFileSync, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { promisify } from 'node:util';
import { REPO, envoyBin, tempDir } from '../test/helpers/harness';

const run = promisify(execFile);
const RUNS = Number(process.argv[2] ?? 7);
const BASELINE = process.argv[3] ?? process.env.BASELINE_AGENT;
const IP = '10.77.0.1';

const CONFIG = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: app, namespace: shop }
spec:
  hosts: [app.shop.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{ number: 8080, name: http, protocol: HTTP }]
  endpoints:
  - { address: ${IP}, ports: { http: 9080 }, labels: { security.istio.io/tlsMode: istio }, serviceAccount: app }
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: { name: default, namespace: shop }
spec: { mtls: { mode: STRICT } }
`;

const APP = `require('http').createServer((q, s) => { q.resume(); s.end(String(q.headers['x-forwarded-client-cert'] ? 'mtls' : 'plain')); }).listen(9080, '127.0.0.1');`;

async function curl(ns: string, url: string, host?: string): Promise<string> {
  try {
    const { stdout } = await run('ip', ['netns', 'exec', ns, 'curl', '-s', '-m', '1', ...(host ? ['-H', `host: ${host}`] : []), '-w', ' %{http_code}', url]);
    return stdout;
  } catch {
    return 'ERR';
  }
}

async function once(binary: string, n: number): Promise<{ ready: number; mtls: number }> {
  const ns = `pa-cab-${process.pid % 10000}-${n}`;
  const dir = tempDir('pa-ca-bench-');
  const cfgDir = path.join(dir.path, 'config');
  fs.mkdirSync(path.join(cfgDir, 'ca', 'identities', 'shop'), { recursive: true, mode: 0o700 });
  fs.writeFileSync(path.join(cfgDir, 'ca', 'identities', 'shop', 'app'), 'app-token\n', { mode: 0o600 });
  fs.writeFileSync(path.join(cfgDir, 'mesh.yaml'), CONFIG);
  fs.mkdirSync(path.join(dir.path, 'var/run/secrets/tokens'), { recursive: true });
  fs.writeFileSync(path.join(dir.path, 'var/run/secrets/tokens/istio-token'), 'app-token', { mode: 0o600 });
  execFileSync('ip', ['netns', 'add', ns]);
  execFileSync('ip', ['-n', ns, 'link', 'set', 'lo', 'up']);
  execFileSync('ip', ['-n', ns, 'addr', 'add', `${IP}/32`, 'dev', 'lo']);
  const app = spawn('ip', ['netns', 'exec', ns, process.execPath, '-e', APP], { stdio: 'ignore' });
  // The root key is made once per config dir: a warm-up start creates it, so every measured start reuses it.
  const start = () => spawn('ip', ['netns', 'exec', ns, binary, 'proxy', 'sidecar', '--standalone', cfgDir], {
    cwd: dir.path, stdio: 'ignore',
    env: {
      PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: '/',
      PROXY_CONFIG: JSON.stringify({ configPath: path.join(dir.path, 'proxy'), binaryPath: envoyBin(), drainDuration: '1s', parentShutdownDuration: '2s', terminationDrainDuration: '0s' }),
      POD_NAME: 'app-1', POD_NAMESPACE: 'shop', SERVICE_ACCOUNT: 'app', INSTANCE_IP: IP,
    },
  });
  try {
    const stop = async (p: ReturnType<typeof spawn>) => {
      const gone = new Promise((r) => p.once('exit', r));
      p.kill('SIGTERM');
      await Promise.race([gone, new Promise((r) => setTimeout(r, 10_000))]);
      p.kill('SIGKILL');
    };
    const warm = start();
    for (let i = 0; i < 300 && !fs.existsSync(path.join(cfgDir, 'ca', 'root-key.pem')); i++) await new Promise((r) => setTimeout(r, 50));
    await stop(warm);
    const t0 = performance.now();
    const agent = start();
    let ready = 0;
    let mtls = 0;
    const deadline = t0 + 30_000;
    while (performance.now() < deadline && (!ready || !mtls)) {
      if (!ready && (await curl(ns, 'http://127.0.0.1:15021/healthz/ready')).endsWith(' 200')) ready = performance.now() - t0;
      if (!mtls && (await curl(ns, 'http://127.0.0.1:8080/', 'app.shop.local')) === 'mtls 200') mtls = performance.now() - t0;
    }
    await stop(agent);
    if (!ready || !mtls) throw new Error(`${binary}: not ready or no mTLS request within 30 s`);
    return { ready, mtls };
  } finally {
    app.kill('SIGKILL');
    try {
      for (const pid of execFileSync('ip', ['netns', 'pids', ns]).toString().split('\n').filter(Boolean)) process.kill(Number(pid), 'SIGKILL');
    } catch {
      // gone
    }
    execFileSync('ip', ['netns', 'del', ns]);
    dir.cleanup();
  }
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

async function main(): Promise<void> {
  const binaries: Array<[string, string]> = [['this build', path.join(REPO, 'dist', 'pilot-agent')]];
  if (BASELINE) binaries.push(['baseline', BASELINE]);
  const got = new Map(binaries.map(([name]) => [name, { ready: [] as number[], mtls: [] as number[] }]));
  for (let i = 0; i < RUNS; i++) {
    for (const [name, bin] of i % 2 ? [...binaries].reverse() : binaries) {
      const r = await once(bin, i);
      got.get(name)!.ready.push(r.ready);
      got.get(name)!.mtls.push(r.mtls);
    }
  }
  for (const [name, bin] of binaries) {
    const g = got.get(name)!;
    console.log(`${name} (${bin}): start -> 15021 ready median ${median(g.ready).toFixed(0)} ms, start -> first mTLS request median ${median(g.mtls).toFixed(0)} ms (n=${RUNS})`);
  }
  if (BASELINE) {
    const a = got.get('this build')!;
    const b = got.get('baseline')!;
    console.log(`ratio this/baseline: ready ${(median(a.ready) / median(b.ready)).toFixed(2)}x, first mTLS ${(median(a.mtls) / median(b.mtls)).toFixed(2)}x`);
  }
}

void main();
