// A small closed-loop HTTP load generator for tests: N workers on keep-alive connections, counting every
// response and every failure, bounded in time and stopped explicitly.

import * as http from 'node:http';

export interface LoadResult {
  ok: number;
  failed: number;
  /** status code -> count (non-2xx counted as failures). */
  statuses: Record<number, number>;
  /** first few failure descriptions. */
  errors: string[];
  /** response bodies -> count, when countBodies is set. */
  bodies: Record<string, number>;
}

export interface LoadOptions {
  url: string;
  concurrency?: number;
  /** Hard stop, even if stop() is never called. */
  maxDurationMs?: number;
  headers?: Record<string, string>;
  countBodies?: boolean;
  /** Delay between requests of one worker. */
  pauseMs?: number;
  /** false: a new connection for every request (exercises the listen socket, not just open connections). */
  keepAlive?: boolean;
}

export interface Load {
  /** Stops issuing requests, waits for in-flight ones, returns the tally. */
  stop(): Promise<LoadResult>;
  snapshot(): LoadResult;
}

export function startLoad(opts: LoadOptions): Load {
  const agent = new http.Agent({ keepAlive: opts.keepAlive ?? true, maxSockets: opts.concurrency ?? 4 });
  const res: LoadResult = { ok: 0, failed: 0, statuses: {}, errors: [], bodies: {} };
  let running = true;
  const hardStop = setTimeout(() => (running = false), opts.maxDurationMs ?? 120_000);
  hardStop.unref();
  const fail = (why: string) => {
    res.failed++;
    if (res.errors.length < 20) res.errors.push(why);
  };
  const one = () =>
    new Promise<void>((resolve) => {
      const req = http.request(opts.url, { agent, headers: opts.headers, timeout: 10_000 }, (r) => {
        const chunks: Buffer[] = [];
        r.on('data', (c: Buffer) => chunks.push(c));
        r.on('end', () => {
          const code = r.statusCode ?? 0;
          res.statuses[code] = (res.statuses[code] ?? 0) + 1;
          if (code >= 200 && code < 300) res.ok++;
          else fail(`HTTP ${code}: ${Buffer.concat(chunks).toString('utf8').slice(0, 200)}`);
          if (opts.countBodies) {
            const b = Buffer.concat(chunks).toString('utf8');
            res.bodies[b] = (res.bodies[b] ?? 0) + 1;
          }
          resolve();
        });
        r.on('error', (e) => {
          fail(`response error: ${e.message}`);
          resolve();
        });
      });
      req.on('timeout', () => req.destroy(new Error('timeout')));
      req.on('error', (e) => {
        fail(`request error: ${e.message}`);
        resolve();
      });
      req.end();
    });
  const worker = async () => {
    while (running) {
      await one();
      if (opts.pauseMs) await new Promise((r) => setTimeout(r, opts.pauseMs));
    }
  };
  const workers = Array.from({ length: opts.concurrency ?? 4 }, worker);
  return {
    snapshot: () => ({ ...res, statuses: { ...res.statuses }, errors: [...res.errors], bodies: { ...res.bodies } }),
    async stop() {
      running = false;
      await Promise.all(workers);
      clearTimeout(hardStop);
      agent.destroy();
      return res;
    },
  };
}
