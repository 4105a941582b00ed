// HTTP app probes under each connection policy (lib/probe-client.ts), side by side in one run: N probes, one after
// the other, through AppProbes against local apps (HTTP/1.1 plain, HTTPS HTTP/1.1-only, HTTPS h2-only), with
// ENABLE_PROBE_KEEPALIVE_CONNECTIONS off (Go's default: a connection per probe) and on. Prints the median and p99
// per probe, and the connections each app accepted. Timings are noisy on a shared machine: compare the ratios.
//   npx tsx bench/app-probe-connections.bench.ts [probes]

import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as http2 from 'node:http2';
import * as https from 'node:https';
import type * as net from 'node:net';
import * as path from 'node:path';
import { AppProbes, appProbeConnections, parseAppProbers } from '../lib/app-probe';
import { configureLogging } from '../lib/log';
import { tempDir } from '../test/helpers/harness';

const N = Number(process.argv[2] ?? 300);
const listen = (s: net.Server): Promise<number> => new Promise((r) => s.listen(0, '127.0.0.1', () => r((s.address() as net.AddressInfo).port)));

async function main(): Promise<void> {
  configureLogging({ write: () => undefined });
  const dir = tempDir('pa-bench-probe-');
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-subj', '/CN=app', '-days', '1',
    '-keyout', path.join(dir.path, 'k.pem'), '-out', path.join(dir.path, 'c.pem')], { stdio: 'ignore' });
  const tls = { key: fs.readFileSync(path.join(dir.path, 'k.pem')), cert: fs.readFileSync(path.join(dir.path, 'c.pem')) };
  const conns = { plain: 0, h1: 0, h2: 0 };
  const ok = (_q: unknown, res: http.ServerResponse | http2.Http2ServerResponse) => res.end('ok');
  const plain = http.createServer(ok);
  plain.on('connection', () => conns.plain++);
  const h1 = https.createServer(tls, ok);
  h1.on('secureConnection', () => conns.h1++);
  const h2 = http2.createSecureServer({ ...tls, allowHTTP1: false }, ok);
  h2.on('secureConnection', () => conns.h2++);
  const ports = { plain: await listen(plain), h1: await listen(h1), h2: await listen(h2) };
  const probers = JSON.stringify({
    '/app-health/plain/readyz': { httpGet: { path: '/', port: ports.plain, scheme: 'HTTP' }, timeoutSeconds: 5 },
    '/app-health/h1/readyz': { httpGet: { path: '/', port: ports.h1, scheme: 'HTTPS' }, timeoutSeconds: 5 },
    '/app-health/h2/readyz': { httpGet: { path: '/', port: ports.h2, scheme: 'HTTPS' }, timeoutSeconds: 5 },
  });
  console.log(`${N} probes each, one at a time; median / p99 per probe (ms), connections the app accepted`);
  for (const keepalive of ['false', 'true']) {
    const env = { ISTIO_KUBE_APP_PROBERS: probers, ENABLE_PROBE_KEEPALIVE_CONNECTIONS: keepalive };
    const probes = new AppProbes({ probers: parseAppProbers(env), destination: '127.0.0.1', connections: appProbeConnections(env), statusPort: 15020 });
    for (const kind of ['plain', 'h1', 'h2'] as const) {
      const before = conns[kind];
      const times: number[] = [];
      for (let i = 0; i < N; i++) {
        const t0 = performance.now();
        const r = await probes.handle({ url: `/app-health/${kind}/readyz`, headers: {}, rawHeaders: [] } as unknown as http.IncomingMessage);
        times.push(performance.now() - t0);
        if (r.status !== 200) throw new Error(`${kind}: probe answered ${r.status}: ${String(r.body)}`);
      }
      times.sort((a, b) => a - b);
      const q = (p: number) => times[Math.min(times.length - 1, Math.floor(p * times.length))]!.toFixed(2);
      console.log(`keepalive=${keepalive.padEnd(5)} ${kind.padEnd(5)} median ${q(0.5)}  p99 ${q(0.99)}  connections ${conns[kind] - before}`);
    }
    await probes.close();
  }
  for (const s of [plain, h1, h2] as net.Server[]) {
    (s as http.Server).closeAllConnections?.();
    s.close();
  }
  dir.cleanup();
}

void main();
