// A gRPC server on a Unix socket of the agent's: a stale socket file is replaced (never anything else, nor a socket
// another process serves), the server is bound, and the file gets the narrowest mode that works.

import * as fs from 'node:fs';
import * as grpc from '@grpc/grpc-js';
import { prepareSocket } from './unix-socket';

export async function bindUnixSocket(server: grpc.Server, socketPath: string, mode: number): Promise<void> {
  await prepareSocket(socketPath);
  await new Promise<void>((resolve, reject) =>
    server.bindAsync(`unix://${socketPath}`, grpc.ServerCredentials.createInsecure(), (e) => (e ? reject(e) : resolve())));
  fs.chmodSync(socketPath, mode);
}
