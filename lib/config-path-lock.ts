// One agent per configPath. A second agent on the same directory would delete the first one's base id file and
// bootstrap and unlink its Envoy's shared memory, after which every hot restart of the first one fails. So the
// agent claims configPath before it touches anything in it, with a Unix socket bound at
// <configPath>/agent.lock.sock: bind() is atomic, a live holder makes it fail with EADDRINUSE, and the kernel
// closes the socket when its process dies however it dies. A file left by a dead holder refuses connections
// (ECONNREFUSED) and is replaced; that replacement is serialised by an abstract-namespace socket named after the
// directory (also released by the kernel), so two agents starting at once never both remove it and both bind.
// The holder's pid is kept next to the socket, for the error message of the agent that loses.

import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { AgentError, errorMessage } from './errors';
import { scope } from './log';

const log = scope('lock');

export const LOCK_SOCKET = 'agent.lock.sock';
export const LOCK_PID = 'agent.lock.pid';
const PROBES_AT_ONCE = 16;
const PROBE_MS = 1000;

export interface ConfigPathLock {
  /** Removes the socket and pid files (synchronous, so it can run in process.on('exit')); safe to call twice. */
  release(): void;
}

/** Claims `dir` for this process; rejects with an AgentError naming the other agent's pid when one holds it. */
export async function claimConfigPath(dir: string): Promise<ConfigPathLock> {
  fs.mkdirSync(dir, { recursive: true });
  const sock = path.join(dir, LOCK_SOCKET);
  if (Buffer.byteLength(sock) > 107)
    throw new AgentError(
      'CONFIG_INVALID',
      `configPath ${dir} is too long for its lock socket ${sock} (a Unix socket path has at most 107 bytes)`,
    );
  const pidFile = path.join(dir, LOCK_PID);
  for (let attempt = 0; attempt < 100; attempt++) {
    const server = await listen(sock);
    if (!(server instanceof Error)) return holding(server, pidFile);
    if ((server as NodeJS.ErrnoException).code !== 'EADDRINUSE')
      throw new AgentError('IO', `cannot claim configPath ${dir} (lock socket ${sock}): ${server.message}`, server);
    const probe = await connectResult(sock);
    if (probe.state === 'live' || probe.state === 'unknown') throw inUse(dir, pidFile, probe);
    // Refused, or gone since: a holder that died. Replace it under the directory's mutex, checking again there.
    const mutex = await listen(mutexName(dir));
    if (mutex instanceof Error) {
      await sleep(20); // another agent is replacing it right now; whoever binds first wins, the other sees it live
      continue;
    }
    try {
      const again = await connectResult(sock);
      if (again.state === 'live' || again.state === 'unknown') throw inUse(dir, pidFile, again);
      if (again.state === 'refused') {
        if (!fs.lstatSync(sock).isSocket())
          throw new AgentError(
            'IO',
            `cannot claim configPath ${dir}: ${sock} exists and is not a socket; refusing to replace it`,
          );
        fs.rmSync(sock, { force: true });
        log.info(`removed the lock of an agent that is gone (${sock})`);
      }
    } finally {
      await close(mutex);
    }
  }
  throw new AgentError('IO', `cannot claim configPath ${dir}: the lock socket ${sock} kept changing hands`);
}

/** Does a live agent hold `dir`? (For judging what a gone agent left behind elsewhere on the host.) */
export async function configPathHeld(dir: string): Promise<boolean> {
  const probe = await connectResult(path.join(dir, LOCK_SOCKET));
  return probe.state === 'live' || probe.state === 'unknown';
}

function holding(server: net.Server, pidFile: string): ConfigPathLock {
  // Connections are only ever probes: answer with our pid and close. Never keeps the process alive. Anyone who may
  // connect can send anything, close first (the write then fails with EPIPE or ECONNRESET: without a listener that
  // error ended the agent) or never read: each connection lives at most a second, and only a few at once (beyond,
  // Node closes new ones at once, which a probing agent still takes as held).
  server.maxConnections = PROBES_AT_ONCE;
  server.on('connection', (c) => {
    c.on('error', () => c.destroy());
    c.setTimeout(PROBE_MS, () => c.destroy());
    c.end(`${process.pid}\n`);
  });
  server.unref();
  // For people (`cat agent.lock.pid`); the agent that loses asks the socket itself, which cannot be stale.
  fs.writeFileSync(pidFile + '.tmp', `${process.pid}\n`);
  fs.renameSync(pidFile + '.tmp', pidFile);
  let released = false;
  return {
    release() {
      if (released) return;
      released = true;
      if (readPid(pidFile) === process.pid) fs.rmSync(pidFile, { force: true });
      // Closing a Unix server unlinks its path (before the descriptor closes, so never a newer agent's socket).
      server.close();
    },
  };
}

function inUse(dir: string, pidFile: string, probe: Probe): AgentError {
  const pid = probe.pid ?? readPid(pidFile);
  const who = pid === undefined ? 'another pilot-agent (pid unknown)' : `another pilot-agent (pid ${pid})`;
  const why = probe.state === 'live' ? 'holds its lock' : 'holds its lock socket, which does not answer';
  return new AgentError(
    'CONFIG_INVALID',
    `configPath ${dir} is in use: ${who} ${why}; give each agent its own configPath, or stop the other one first`,
  );
}

function readPid(file: string): number | undefined {
  try {
    const text = fs.readFileSync(file, 'utf8').trim();
    return /^\d+$/.test(text) ? Number(text) : undefined;
  } catch {
    return undefined;
  }
}

/** Abstract-namespace name (no file, gone with the process) for the directory's identity, not its spelling. */
function mutexName(dir: string): string {
  const st = fs.statSync(dir);
  return `\0pilot-agent-config-path-lock/${st.dev}:${st.ino}`;
}

function listen(where: string): Promise<net.Server | Error> {
  return new Promise((resolve) => {
    const server = net.createServer();
    server.once('error', (err) => resolve(err));
    server.listen(where, () => {
      server.removeAllListeners('error');
      server.on('error', (err) => log.warn(`lock socket: ${errorMessage(err)}`));
      resolve(server);
    });
  });
}

function close(server: net.Server): Promise<void> {
  return new Promise((r) => server.close(() => r()));
}

interface Probe {
  /** live: an agent answers; refused: a file nobody listens on; gone: no file; unknown: anything else (kept, to be safe). */
  state: 'live' | 'refused' | 'gone' | 'unknown';
  pid?: number;
}

function connectResult(sock: string): Promise<Probe> {
  return new Promise((resolve) => {
    const c = net.connect({ path: sock });
    let text = '';
    let connected = false;
    const done = (p: Probe) => {
      c.destroy();
      resolve(p);
    };
    c.setEncoding('utf8');
    c.once('connect', () => (connected = true));
    c.on('data', (d: string) => (text += d));
    c.once('end', () => done({ state: 'live', pid: /^\d+$/.test(text.trim()) ? Number(text.trim()) : undefined }));
    c.once('error', (err: NodeJS.ErrnoException) =>
      done({
        state: connected
          ? 'live'
          : err.code === 'ECONNREFUSED'
            ? 'refused'
            : err.code === 'ENOENT'
              ? 'gone'
              : 'unknown',
      }),
    );
    c.setTimeout(2000, () => done({ state: connected ? 'live' : 'unknown' }));
  });
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
