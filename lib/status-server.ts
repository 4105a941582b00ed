// The agent's status server (statusPort, 15020): readiness, merged metrics, and the routes components bring.
// It knows nothing about the components behind them: readiness is a function (the composition of every
// component's condition), metrics are the agent's registry plus other sources (Envoy's text), and routes come
// from each component. Endpoints that change the agent's lifecycle (/quitquitquit, /drain) and every /debug/
// page answer only loopback peers (debug pages can be opened with STATUS_SERVER_REMOTE_DEBUG), and 127.0.0.6,
// where probes and Envoy's inbound passthrough come from, is not one.

import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Registry } from './prom';
import type { Component, Condition, Handler, Reply, StatusRoute } from './component';

export type { Handler, Reply };
import { closedSignal } from './component';
import { takePreboundPort } from './prebind';
import { scope } from './log';
import type { MergedScrape, MetricsSource } from './metrics';

/** gzip for the scrape (node:zlib loads with the first compressed one, not with the status server). */
function gzipAsync(body: string): Promise<Buffer> {
  return new Promise((resolve, reject) =>
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    (require('node:zlib') as typeof import('node:zlib')).gzip(body, (err, out) => (err ? reject(err) : resolve(out))),
  );
}

const log = scope('status');

interface Route {
  method: string;
  handler: Handler;
  localOnly: boolean;
}

/**
 * A loopback peer, not counting 127.0.0.6 and ::6: the agent's app probes and Envoy's inbound passthrough connect
 * from there on behalf of other callers (kubelet, a remote client), so it never counts as a local admin.
 */
export function isLoopback(addr: string | undefined): boolean {
  if (!addr) return false;
  const a = addr.startsWith('::ffff:') ? addr.slice(7) : addr;
  if (a === '127.0.0.6' || a === '::6') return false;
  return a === '::1' || a.startsWith('127.');
}

export { json } from './component';

export interface StatusServerOptions {
  port: number;
  host?: string;
  /** Readiness of the whole agent; /healthz/ready answers 503 with the reasons while it is unmet. */
  readiness?: () => Promise<Condition>;
  /**
   * The agent's metrics and what is appended to them on /stats/prometheus and /metrics; `localOnly`
   * (METRICS_LOCALHOST_ACCESS_ONLY): those two paths answer only loopback peers, as Istio's handleStats.
   */
  metrics?: { registry: Registry | (() => Registry); sources: readonly MetricsSource[]; localOnly?: boolean };
  /** Serve /debug/ pages to any address, not only loopback. */
  remoteDebug?: boolean;
  /** When the agent started, for istio_agent_startup_duration_seconds (agent start to first readiness). */
  startedAt?: number;
}

export class StatusServer implements Component {
  readonly name = 'status server';
  private readonly table = new Map<string, Route>();
  private server: http.Server | undefined;
  private readonly signal = closedSignal();
  readonly closed = this.signal.closed;
  private startupSeconds: number | undefined;

  constructor(private readonly opts: StatusServerOptions) {
    const { readiness, metrics } = opts;
    if (readiness) {
      this.route('GET', '/healthz/ready', async () => {
        const r = await readiness();
        if (r.ready && opts.startedAt !== undefined) this.startupSeconds ??= (Date.now() - opts.startedAt) / 1000;
        return r.ready ? { status: 200, body: '' } : { status: 503, body: r.reason + '\n' };
      });
    }
    if (metrics) {
      // The registry (a function: made on the first scrape, with prom-client and every component's metrics, none of
      // which is read before: not while Envoy starts).
      let merged: MergedScrape | undefined;
      const firstScrape = (): MergedScrape => {
        // eslint-disable-next-line @typescript-eslint/no-require-imports
        const { gaugeFrom, mergedScrape } = require('./metrics') as typeof import('./metrics');
        const registry = typeof metrics.registry === 'function' ? metrics.registry() : metrics.registry;
        gaugeFrom(
          registry,
          'istio_agent_startup_duration_seconds',
          "Seconds from the agent's start to its first readiness",
          () => this.startupSeconds,
        );
        return mergedScrape(registry, metrics.sources);
      };
      if (typeof metrics.registry !== 'function') merged = firstScrape();
      // Scrapes that share one merge (lib/metrics.ts) share its compression too.
      const zipped = new WeakMap<object, Promise<Buffer>>();
      const scrape = async (req: http.IncomingMessage): Promise<Reply> => {
        const m = await (merged ??= firstScrape())(req.headers.accept);
        // Envoy's stats compress about tenfold; Prometheus asks for gzip.
        if (/\bgzip\b/.test(String(req.headers['accept-encoding'] ?? ''))) {
          let z = zipped.get(m);
          if (!z) zipped.set(m, (z = gzipAsync(m.body)));
          return {
            status: 200,
            body: await z,
            contentType: m.contentType,
            headers: { 'content-encoding': 'gzip', vary: 'accept-encoding' },
          };
        }
        return { status: 200, body: m.body, contentType: m.contentType };
      };
      const localOnly = metrics.localOnly ?? false;
      this.route('GET', '/stats/prometheus', scrape, { localOnly }).route('GET', '/metrics', scrape, { localOnly });
    }
  }

  route(method: string, path: string, handler: Handler, opts: { localOnly?: boolean } = {}): this {
    const debug = path.startsWith('/debug/') && !this.opts.remoteDebug;
    this.table.set(path, { method, handler, localOnly: (opts.localOnly ?? false) || debug });
    return this;
  }

  addRoutes(routes: readonly StatusRoute[]): this {
    for (const r of routes) this.route(r.method, r.path, r.handler, { localOnly: r.localOnly });
    return this;
  }

  get port(): number {
    return (this.server?.address() as AddressInfo | null)?.port ?? this.opts.port;
  }

  start(): Promise<void> {
    const server = http.createServer((req, res) => void this.handle(req, res));
    server.keepAliveTimeout = 5000;
    this.server = server;
    // The port bound before Envoy's spawn (agent.ts, lib/prebind.ts), if any: this server listens on its socket
    // (so its own request timeouts and connection tracking cover every connection), then takes the ones that waited.
    const early = takePreboundPort(this.opts.port, this.opts.host);
    return new Promise((resolve, reject) => {
      server.once('error', (err) =>
        reject(new Error(`cannot listen on status port ${this.opts.port}: ${err.message}`)),
      );
      // No host: Node listens on :: dual-stack where IPv6 exists (an IPv6-only pod's Envoy calls ::1),
      // else on 0.0.0.0. Kubelet probes reach the pod IP either way.
      const onListening = () => {
        server.removeAllListeners('error');
        server.on('error', (err) => log.error(`status server: ${err.message}`));
        log.info(`status server listening on port ${this.port}`);
        for (const s of early?.queued ?? []) {
          server.emit('connection', s);
          s.resume();
        }
        resolve();
      };
      if (early) server.listen(early.listener, onListening);
      else if (this.opts.host) server.listen(this.opts.port, this.opts.host, onListening);
      else server.listen(this.opts.port, onListening);
    });
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const path = (req.url ?? '/').split('?')[0]!;
    const route = this.table.get(path) ?? this.prefixRoute(path);
    let reply: Reply;
    if (!route) reply = { status: 404, body: `no such endpoint ${path}\n` };
    else if (route.method !== req.method && !(route.method === 'GET' && req.method === 'HEAD'))
      reply = { status: 405, body: `${path} wants ${route.method}\n` };
    else if (route.localOnly && !isLoopback(req.socket.remoteAddress)) {
      log.warn(`refused ${req.method} ${path} from ${req.socket.remoteAddress}: allowed from localhost only`);
      reply = { status: 403, body: 'allowed from localhost only\n' };
    } else {
      try {
        reply = await route.handler(req);
      } catch (err) {
        reply = { status: 500, body: `${(err as Error).message}\n` };
      }
    }
    req.resume();
    res.writeHead(reply.status, { ...reply.headers, 'content-type': reply.contentType ?? 'text/plain; charset=utf-8' });
    res.end(req.method === 'HEAD' ? undefined : reply.body);
  }

  /** Routes registered with a trailing slash match every path below them (e.g. /app-health/). */
  private prefixRoute(path: string): Route | undefined {
    for (const [p, r] of this.table) if (p.endsWith('/') && path.startsWith(p)) return r;
    return undefined;
  }

  async close(): Promise<void> {
    const s = this.server;
    if (!s) return this.signal.resolve();
    this.server = undefined;
    await new Promise<void>((r) => {
      s.close(() => r());
      s.closeAllConnections();
    });
    this.signal.resolve();
  }
}
