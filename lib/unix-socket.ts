// Unix socket files for the agent's servers: a stale file left by a killed process is replaced, but nothing
// that is not a socket, or that another process still serves, is ever deleted.

import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { AgentError, errorMessage } from './errors';
import { mkdirs } from './fs-atomic';
import { scope } from './log';

const log = scope('socket');

/** Replaces a stale socket file; refuses to delete anything that is not a socket or that someone still serves. */
export async function prepareSocket(p: string): Promise<void> {
  if (Buffer.byteLength(p) > 107)
    throw new AgentError('CONFIG_INVALID', `socket path ${p} is longer than the 107 bytes a Unix socket allows`);
  mkdirs(path.dirname(p));
  let st: fs.Stats;
  try {
    st = fs.lstatSync(p);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw new AgentError('IO', `cannot inspect ${p}: ${errorMessage(e)}`, e);
  }
  if (!st.isSocket()) throw new AgentError('IO', `${p} exists and is not a socket; refusing to replace it`);
  if (await socketInUse(p)) throw new AgentError('IO', `${p} is in use by another process`);
  fs.unlinkSync(p);
  log.info(`removed stale socket ${p}`);
}

/** Does a live server accept connections on this socket? */
export function socketInUse(p: string): Promise<boolean> {
  return new Promise((resolve) => {
    const c = net.connect({ path: p });
    const done = (v: boolean) => {
      c.destroy();
      resolve(v);
    };
    c.once('connect', () => done(true));
    c.once('error', () => done(false));
    c.setTimeout(1000, () => done(false));
  });
}

// 0660 for the agent's own sockets (xDS, SDS): Envoy runs as the agent's user, or in its group when the agent starts
// it under another uid; nobody else on the host may read the mesh config, take its secrets, or push requests
// upstream with the agent's credentials.
export const AGENT_SOCKET_MODE = 0o660;

interface Prebound {
  server: net.Server;
  /** Connections accepted before a server adopted the socket, paused: their bytes wait in the kernel. */
  queue: net.Socket[];
  serve?: (s: net.Socket) => void;
}

const prebound = new Map<string, Prebound>();

/**
 * Binds a Unix socket now, for a server that loads later: connections are accepted paused and handed over when
 * the server adopts the socket (takePrebound). The agent spawns Envoy before gRPC and its servers load, and
 * Envoy's first connect to its xDS socket must not fail (Envoy would wait out a retry backoff).
 */
export async function prebindUnixSocket(p: string, mode = AGENT_SOCKET_MODE): Promise<void> {
  const key = path.resolve(p);
  if (prebound.has(key)) return;
  await prepareSocket(key);
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
    entry.server.listen(key, () => {
      entry.server.off('error', reject);
      resolve();
    });
  });
  fs.chmodSync(key, mode);
  prebound.set(key, entry);
  // Never adopted (start-up failed before its server loaded): no socket file is left behind.
  process.once('exit', () => {
    if (prebound.get(key) === entry) fs.rmSync(key, { force: true });
  });
}

/**
 * The socket prebindUnixSocket() bound at this path, if any, now served by `serve` (queued connections first,
 * each resumed after it is handed over). `close` stops accepting; the caller removes the file as usual.
 */
export function takePrebound(p: string, serve: (s: net.Socket) => void): { close(): void } | undefined {
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
