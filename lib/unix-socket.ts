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
