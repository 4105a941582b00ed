// A gRPC server on a Unix socket of the agent's: a stale socket file is replaced (never anything else, nor a socket
// another process serves), the server is bound, and the file gets the narrowest mode that works; or the server takes
// over a socket bound earlier in start-up (lib/prebind.ts prebindUnixSocket). Stopping it ends the server, the
// pre-bound listener if there was one, and removes the socket file.

import * as fs from 'node:fs';
import type * as grpc from '@grpc/grpc-js';
import { takePrebound } from './prebind';
import { AGENT_SOCKET_MODE, prepareSocket } from './unix-socket';

export interface BoundUnixServer {
  /** Stops the server at once (open streams end) and removes its socket file. Safe to call twice. */
  stop(): void;
}

/**
 * Binds the server on the socket, or serves the one prebindUnixSocket() already bound there (connections that
 * arrived before are served first). If it throws, nothing was bound and no file is touched; the caller may still
 * shut the server down.
 */
export async function bindUnixSocket(
  server: grpc.Server,
  socketPath: string,
  mode = AGENT_SOCKET_MODE,
): Promise<BoundUnixServer> {
  let injector: grpc.ConnectionInjector | undefined;
  const early = takePrebound(socketPath, (s) =>
    (injector ??= server.createConnectionInjector(insecure())).injectConnection(s),
  );
  if (!early) {
    await prepareSocket(socketPath);
    await new Promise<void>((resolve, reject) =>
      server.bindAsync(`unix://${socketPath}`, insecure(), (e) => (e ? reject(e) : resolve())),
    );
    fs.chmodSync(socketPath, mode);
  }
  return {
    stop() {
      server.forceShutdown();
      early?.close();
      try {
        if (fs.lstatSync(socketPath).isSocket()) fs.unlinkSync(socketPath);
      } catch {
        // already gone
      }
    },
  };
}

// Required when a server is bound: importers (the SDS server) load before grpc-js is needed.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const insecure = () => (require('@grpc/grpc-js') as typeof grpc).ServerCredentials.createInsecure();
