// A gRPC server on a Unix socket of the agent's: a stale socket file is replaced (never anything else, nor a socket
// another process serves), the socket is bound, and the file gets the narrowest mode that works; or the server takes
// over a socket bound earlier in start-up (lib/prebind.ts prebindUnixSocket). Stopping it ends the server, the
// listener, and removes the socket file.

import * as fs from 'node:fs';
import * as net from 'node:net';
import type { GrpcServer } from './grpc-server';
import { errorMessage } from './errors';
import { scope } from './log';
import { takePrebound } from './prebind';
import { AGENT_SOCKET_MODE, prepareSocket } from './unix-socket';

const log = scope('socket');

export interface BoundUnixServer {
  /** Stops the server at once (open streams end) and removes its socket file. Safe to call twice. */
  stop(): void;
}

/**
 * Serves the socket with the server, or the one prebindUnixSocket() already bound there (connections that arrived
 * before are served first). If it throws, nothing was bound and no file is touched.
 */
export async function bindUnixSocket(
  server: GrpcServer,
  socketPath: string,
  mode = AGENT_SOCKET_MODE,
): Promise<BoundUnixServer> {
  let listener: { close(): void } | undefined = takePrebound(socketPath, (s) => server.handleConnection(s));
  if (!listener) {
    await prepareSocket(socketPath);
    const l = net.createServer((s) => server.handleConnection(s));
    await new Promise<void>((resolve, reject) => {
      l.once('error', reject);
      l.listen(socketPath, () => {
        l.off('error', reject);
        // A failed accept (EMFILE: a peer holding every descriptor) is an 'error' event: logged, never a crash.
        l.on('error', (err) => log.warn(`listener ${socketPath}: ${errorMessage(err)}`));
        resolve();
      });
    });
    fs.chmodSync(socketPath, mode);
    listener = l;
  }
  let stopped = false;
  return {
    stop() {
      if (stopped) return;
      stopped = true;
      listener.close();
      server.close();
      try {
        if (fs.lstatSync(socketPath).isSocket()) fs.unlinkSync(socketPath);
      } catch {
        // already gone
      }
    },
  };
}
