// Listeners bound before their servers load. The agent spawns Envoy before gRPC, the xDS proxy, the SDS server and
// the status server have loaded; Envoy's first connect to its xDS and SDS sockets must not fail (it would wait out
// a retry backoff), and a status port (15020) that something else holds must stop the start before Envoy is
// spawned, not after. Connections accepted meanwhile are paused (their bytes wait in the kernel) and handed over,
// in order, when the server adopts the listener: a Unix socket's to a gRPC server's connection injector
// (takePrebound); the port's listening socket itself to the HTTP server, which then accepts on it with its own
// timeouts and connection tracking (takePreboundPort).

import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { errorMessage } from './errors';
import { scope } from './log';
import { AGENT_SOCKET_MODE, prepareSocket } from './unix-socket';

const log = scope('socket');

interface Prebound {
  server: net.Server;
  /** Connections accepted before a server adopted the listener, paused. */
  queue: net.Socket[];
  serve?: (s: net.Socket) => void;
}

export interface Adopted {
  /** Stops accepting; connections already handed over are the adopting server's. */
  close(): void;
}

const prebound = new Map<string, Prebound>();
const portKey = (port: number, host?: string) => `tcp:${host ?? ''}:${port}`;

/** Listens at `where` (a socket path, or a port and host) with paused connections queued until adopted. */
async function listenPaused(key: string, where: net.ListenOptions): Promise<Prebound> {
  const entry: Prebound = { queue: [], server: net.createServer({ pauseOnConnect: true }) };
  entry.server.on('connection', (s) => {
    if (entry.serve) return entry.serve(s);
    entry.queue.push(s);
    s.on('error', () => undefined).once('close', () => {
      const i = entry.queue.indexOf(s);
      if (i >= 0) entry.queue.splice(i, 1);
    });
  });
  await new Promise<void>((resolve, reject) => {
    entry.server.once('error', reject);
    entry.server.listen(where, () => {
      entry.server.off('error', reject);
      // A failed accept (EMFILE: a peer holding every descriptor) is an 'error' event: logged, never a crash.
      entry.server.on('error', (err) => log.warn(`pre-bound listener ${key}: ${errorMessage(err)}`));
      resolve();
    });
  });
  prebound.set(key, entry);
  return entry;
}

/**
 * Binds a Unix socket now (a stale file is replaced as lib/unix-socket.ts prepareSocket does), with the agent's
 * mode; a socket no server adopted (start-up failed before its server loaded) is removed when the process exits.
 */
export async function prebindUnixSocket(p: string, mode = AGENT_SOCKET_MODE): Promise<void> {
  const key = path.resolve(p);
  if (prebound.has(key)) return;
  await prepareSocket(key);
  const entry = await listenPaused(key, { path: key });
  fs.chmodSync(key, mode);
  process.once('exit', () => {
    if (prebound.get(key) === entry) fs.rmSync(key, { force: true });
  });
}

/**
 * Binds a TCP port now. No host: `::` dual-stack where IPv6 exists, else 0.0.0.0, as an HTTP server's listen(port)
 * does. Rejects with the listen error (EADDRINUSE, EACCES) for the caller to name the port.
 */
export async function prebindPort(port: number, host?: string): Promise<void> {
  const key = portKey(port, host);
  if (prebound.has(key)) return;
  await listenPaused(key, host ? { port, host } : { port });
}

/** The socket prebindUnixSocket() bound at this path, if any, now served by `serve` (queued connections first). */
export function takePrebound(p: string, serve: (s: net.Socket) => void): Adopted | undefined {
  const key = path.resolve(p);
  const entry = prebound.get(key);
  if (!entry) return undefined;
  prebound.delete(key);
  entry.serve = (s) => {
    serve(s);
    s.resume();
  };
  for (const s of entry.queue.splice(0)) if (!s.destroyed) entry.serve(s);
  return { close: () => entry.server.close() };
}

/**
 * The port prebindPort() bound (same port and host), if any: `listener` for the adopting server to listen on
 * (`server.listen(listener)` takes over its socket, so that server accepts from then on and closing it closes the
 * port), and the connections that waited, paused, to hand to it once it listens.
 */
export function takePreboundPort(
  port: number,
  host: string | undefined,
): { listener: net.Server; queued: net.Socket[] } | undefined {
  const key = portKey(port, host);
  const entry = prebound.get(key);
  if (!entry) return undefined;
  prebound.delete(key);
  return { listener: entry.server, queued: entry.queue.splice(0).filter((s) => !s.destroyed) };
}
