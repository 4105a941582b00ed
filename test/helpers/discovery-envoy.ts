// A real Envoy pointed at a discovery server over ADS (SotW or Delta), with a minimal bootstrap written to a temp
// dir, and loopback HTTP backends that answer with their own name. Everything started here is stopped by stop().

import { type ChildProcess, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as net from 'node:net';
import * as path from 'node:path';
import { adsBootstrap } from './ads-bootstrap';
import { envoyBin, freePort, httpRequest, tempDir, waitFor } from './harness';

export interface TestEnvoy {
  adminPort: number;
  proc: ChildProcess;
  logs(): string;
  /** Envoy's config dump, parsed. */
  configDump(): Promise<Record<string, unknown>>;
  stop(): Promise<void>;
}

/**
 * Runs the real Envoy (no hot restart) on a bootstrap written to a temp dir, and waits until its admin answers.
 * stop() sends SIGTERM (SIGKILL after 3 s) and removes the dir; a start that fails stops it and throws with Envoy's
 * output.
 */
export async function spawnTestEnvoy(bootstrap: Record<string, unknown>, adminPort: number, dirPrefix: string): Promise<{ proc: ChildProcess; logs(): string; stop(): Promise<void> }> {
  const dir = tempDir(dirPrefix);
  const cfg = path.join(dir.path, 'envoy.json');
  fs.writeFileSync(cfg, JSON.stringify(bootstrap));
  const proc = spawn(envoyBin(), ['-c', cfg, '--disable-hot-restart', '--use-dynamic-base-id', '-l', 'warning', '--log-format', '%L %n: %v'], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  proc.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  proc.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<void>((r) => proc.once('exit', () => r()));
  const stop = async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGTERM');
      const t = setTimeout(() => proc.kill('SIGKILL'), 3000);
      await exited;
      clearTimeout(t);
    }
    dir.cleanup();
  };
  try {
    await waitFor('Envoy admin to answer', async () => (await httpRequest(`http://127.0.0.1:${adminPort}/ready`, { timeoutMs: 500 })).status > 0, 15_000, 100);
  } catch (e) {
    await stop();
    throw new Error(`${(e as Error).message}\nEnvoy output:\n${out}`);
  }
  return { proc, logs: () => out, stop };
}

export async function startEnvoy(opts: { xdsAddress: string; nodeId: string; delta?: boolean; labels?: Record<string, string>; metadata?: Record<string, unknown>; xdsToken?: string }): Promise<TestEnvoy> {
  const adminPort = await freePort();
  const bootstrap = adsBootstrap({
    nodeId: opts.nodeId, adminPort, delta: !!opts.delta, xdsAddress: opts.xdsAddress, metadata: { ...(opts.labels ? { LABELS: opts.labels } : {}), ...opts.metadata },
    ...(opts.xdsToken && { xdsToken: opts.xdsToken }),
  });
  const envoy = await spawnTestEnvoy(bootstrap, adminPort, 'pa-disc-envoy-');
  return {
    adminPort,
    ...envoy,
    configDump: async () => JSON.parse((await httpRequest(`http://127.0.0.1:${adminPort}/config_dump?include_eds`)).body) as Record<string, unknown>,
  };
}

export interface Backend {
  name: string;
  port: number;
  requests: number;
  close(): Promise<void>;
}

/** An HTTP server on 127.0.0.1 answering every request with its name (and counting them). */
export async function startBackend(name: string, port?: number): Promise<Backend> {
  const server = http.createServer((req, res) => {
    b.requests++;
    req.resume();
    res.setHeader('content-type', 'text/plain');
    res.end(name);
  });
  server.keepAliveTimeout = 60_000;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port ?? 0, '127.0.0.1', () => resolve());
  });
  const b: Backend = {
    name,
    port: (server.address() as net.AddressInfo).port,
    requests: 0,
    close: () => new Promise<void>((r) => {
      server.closeAllConnections();
      server.close(() => r());
    }),
  };
  return b;
}

/** Envoy's answer body for a GET through a listener, or `HTTP <status>` when it is not 200. */
export async function fetchText(url: string, headers?: Record<string, string>): Promise<string> {
  const r = await httpRequest(url, { headers, timeoutMs: 3000 });
  return r.status === 200 ? r.body : `HTTP ${r.status}`;
}
