// Shared test harness: the real Envoy, temp dirs, free ports, polling, and plain HTTP on loopback.
// Nothing here mocks Envoy; a test that needs Envoy fails (never skips) when it cannot be had.

import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';

export const REPO = path.resolve(__dirname, '..', '..');

let cachedEnvoy: string | undefined;
/** Path of the real Envoy binary (installs it with the project's script if needed); throws if none can be had. */
export function envoyBin(): string {
  if (cachedEnvoy) return cachedEnvoy;
  try {
    cachedEnvoy = execFileSync('bash', [path.join(REPO, 'scripts/install-envoy.sh')], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] }).trim();
  } catch (e) {
    throw new Error(`this test needs the real Envoy and none could be found or installed: ${(e as Error).message}`);
  }
  return cachedEnvoy;
}

export interface TempDir {
  path: string;
  cleanup(): void;
}

export function tempDir(prefix = 'pa-test-'): TempDir {
  const p = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  return { path: p, cleanup: () => fs.rmSync(p, { recursive: true, force: true }) };
}

const handedOut = new Set<number>();
// Below Linux's ephemeral range (32768-60999): the kernel never picks these for listen(0) or for the source port
// of an outgoing connection, so a port handed out here cannot be taken by accident before the test binds it.
const RANGE = { from: 20_000, to: 32_000 };

function canBind(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.unref();
    s.once('error', () => resolve(false));
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
  });
}

/** A free port on 127.0.0.1 that this process has not handed out before. */
export async function freePort(): Promise<number> {
  for (let tries = 0; tries < 1000; tries++) {
    const port = RANGE.from + Math.floor(Math.random() * (RANGE.to - RANGE.from));
    if (handedOut.has(port)) continue;
    handedOut.add(port);
    if (await canBind(port)) return port;
  }
  throw new Error(`no free port found in ${RANGE.from}-${RANGE.to}`);
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Polls fn until it returns a truthy value or throws after timeoutMs, naming what it waited for. */
export async function waitFor<T>(what: string, fn: () => Promise<T | undefined | false> | T | undefined | false, timeoutMs = 15_000, everyMs = 50): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v as T;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${(last as Error).message}` : ''}`);
    await sleep(everyMs);
  }
}

export interface HttpResult {
  status: number;
  body: string;
  headers: http.IncomingHttpHeaders;
}

export function httpRequest(url: string, opts: { method?: string; body?: string; timeoutMs?: number; headers?: Record<string, string>; agent?: http.Agent } = {}): Promise<HttpResult> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: opts.method ?? 'GET', headers: opts.headers, agent: opts.agent ?? false, timeout: opts.timeoutMs ?? 5000 }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8'), headers: res.headers }));
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error(`request to ${url} timed out`)));
    req.on('error', reject);
    req.end(opts.body);
  });
}

/** Is a process with this pid still alive (and not a zombie)? */
export function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.split(') ')[1]?.[0] !== 'Z';
  } catch {
    return false;
  }
}

/** Names of Envoy shared-memory segments present now. */
export function envoyShm(): string[] {
  try {
    return fs.readdirSync('/dev/shm').filter((f) => f.startsWith('envoy_shared_memory_'));
  } catch {
    return [];
  }
}
