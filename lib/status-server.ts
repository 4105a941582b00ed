// The agent's status server (statusPort, 15020): readiness, lifecycle endpoints and debug pages.
// Routes are registered by agent.ts; the server knows nothing about the components behind them.
// Endpoints that change the agent's lifecycle (/quitquitquit, /drain) answer only to loopback peers.

import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import { scope } from './log';

const log = scope('status');

export interface Reply {
  status: number;
  body: string | Buffer;
  contentType?: string;
}

export type Handler = (req: http.IncomingMessage) => Promise<Reply> | Reply;

interface Route {
  method: string;
  handler: Handler;
  localOnly: boolean;
}

export function isLoopback(addr: string | undefined): boolean {
  if (!addr) return false;
  const a = addr.startsWith('::ffff:') ? addr.slice(7) : addr;
  return a === '::1' || a.startsWith('127.');
}

export const json = (value: unknown, status = 200): Reply => ({ status, body: JSON.stringify(value, null, 2) + '\n', contentType: 'application/json' });

export class StatusServer {
  private readonly routes = new Map<string, Route>();
  private server: http.Server | undefined;
  private closedResolve!: (e: Error | undefined) => void;
  readonly closed: Promise<Error | undefined> = new Promise((r) => (this.closedResolve = r));

  constructor(private readonly opts: { port: number; host?: string }) {}

  route(method: string, path: string, handler: Handler, opts: { localOnly?: boolean } = {}): this {
    this.routes.set(path, { method, handler, localOnly: opts.localOnly ?? false });
    return this;
  }

  get port(): number {
    return (this.server?.address() as AddressInfo | null)?.port ?? this.opts.port;
  }

  start(): Promise<void> {
    const server = http.createServer((req, res) => void this.handle(req, res));
    server.keepAliveTimeout = 5000;
    this.server = server;
    return new Promise((resolve, reject) => {
      server.once('error', (err) => reject(new Error(`cannot listen on status port ${this.opts.port}: ${err.message}`)));
      // No host: Node listens on :: dual-stack where IPv6 exists (an IPv6-only pod's Envoy calls ::1),
      // else on 0.0.0.0. Kubelet probes reach the pod IP either way.
      const onListening = () => {
        server.removeAllListeners('error');
        server.on('error', (err) => log.error(`status server: ${err.message}`));
        log.info(`status server listening on port ${this.port}`);
        resolve();
      };
      if (this.opts.host) server.listen(this.opts.port, this.opts.host, onListening);
      else server.listen(this.opts.port, onListening);
    });
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const path = (req.url ?? '/').split('?')[0]!;
    const route = this.routes.get(path) ?? this.prefixRoute(path);
    let reply: Reply;
    if (!route) reply = { status: 404, body: `no such endpoint ${path}\n` };
    else if (route.method !== req.method && !(route.method === 'GET' && req.method === 'HEAD')) reply = { status: 405, body: `${path} wants ${route.method}\n` };
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
    res.writeHead(reply.status, { 'content-type': reply.contentType ?? 'text/plain; charset=utf-8' });
    res.end(req.method === 'HEAD' ? undefined : reply.body);
  }

  /** Routes registered with a trailing slash match every path below them (e.g. /app-health/). */
  private prefixRoute(path: string): Route | undefined {
    for (const [p, r] of this.routes) if (p.endsWith('/') && path.startsWith(p)) return r;
    return undefined;
  }

  async close(): Promise<void> {
    const s = this.server;
    if (!s) return this.closedResolve(undefined);
    this.server = undefined;
    await new Promise<void>((r) => {
      s.close(() => r());
      s.closeAllConnections();
    });
    this.closedResolve(undefined);
  }
}
