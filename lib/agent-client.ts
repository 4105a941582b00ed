// `pilot-agent wait` and `pilot-agent request`: small HTTP clients for scripts and Kubernetes hooks.

import * as http from 'node:http';

export interface WaitOptions {
  url: string;
  periodMs: number;
  requestTimeoutMs: number;
  timeoutMs: number;
  write?: (line: string) => void;
}

function get(url: string, timeoutMs: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = http.get(url, { timeout: timeoutMs, agent: false }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('timeout', () => req.destroy(new Error(`timed out after ${timeoutMs} ms`)));
    req.on('error', reject);
  });
}

/** Polls the readiness URL until it answers 200; 0 when ready, 1 when the overall timeout passes. */
export async function waitReady(o: WaitOptions): Promise<number> {
  const write = o.write ?? ((l: string) => process.stderr.write(l + '\n'));
  const deadline = Date.now() + o.timeoutMs;
  write(`Waiting for Envoy proxy to be ready (timeout: ${Math.round(o.timeoutMs / 1000)} seconds)...`);
  let last = '';
  for (;;) {
    try {
      const code = await get(o.url, o.requestTimeoutMs);
      if (code === 200) {
        write('Envoy is ready!');
        return 0;
      }
      last = `HTTP status code ${code}`;
    } catch (err) {
      last = (err as Error).message;
    }
    if (Date.now() + o.periodMs > deadline) {
      write(`timeout waiting for Envoy proxy to become ready. Last error: ${last}`);
      return 1;
    }
    await new Promise((r) => setTimeout(r, o.periodMs));
  }
}

export const REQUEST_ALLOWED_PORTS = [15000, 15020, 15021, 15004];

/** Envoy's admin port as `pilot-agent request` knows it: with ENVOY_ADMIN_MODE=uds it means the admin socket. */
export const REQUEST_ADMIN_PORT = 15000;

/**
 * Sends one request to a local agent/Envoy port and writes the raw body; 0 on 2xx. `adminSocket` (ENVOY_ADMIN_MODE=uds)
 * replaces the admin port: nothing listens there then.
 */
export async function localRequest(o: {
  method: string;
  path: string;
  body?: string;
  port: number;
  adminSocket?: string;
  out?: NodeJS.WritableStream;
}): Promise<number> {
  if (!REQUEST_ALLOWED_PORTS.includes(o.port)) {
    process.stderr.write(
      `error: --debug-port ${o.port} is not allowed (allowed: ${REQUEST_ALLOWED_PORTS.join(', ')})\n`,
    );
    return 1;
  }
  const path = o.path.startsWith('/') ? o.path : `/${o.path}`;
  const out = o.out ?? process.stdout;
  const method = o.method.toUpperCase();
  const socketPath = o.port === REQUEST_ADMIN_PORT ? o.adminSocket : undefined;
  const where = socketPath ? { socketPath } : { host: 'localhost', port: o.port };
  return new Promise((resolve) => {
    const req = http.request({ ...where, method, path, agent: false, timeout: 60_000 }, (res) => {
      res.pipe(out, { end: false });
      res.on('end', () => {
        const ok = (res.statusCode ?? 0) >= 200 && (res.statusCode ?? 0) < 300;
        if (!ok) process.stderr.write(`error: ${method} ${path} answered ${res.statusCode}\n`);
        resolve(ok ? 0 : 1);
      });
    });
    req.on('timeout', () => req.destroy(new Error('timed out')));
    req.on('error', (err) => {
      process.stderr.write(
        `error: ${method} ${socketPath ? `${socketPath} ` : `localhost:${o.port}`}${path}: ${err.message}\n`,
      );
      resolve(1);
    });
    req.end(o.body);
  });
}
