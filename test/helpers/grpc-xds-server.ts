// Real proxyless gRPC servers (grpc-js-xds XdsServer), run as their own process with GRPC_XDS_BOOTSTRAP set:
// `node --import tsx test/helpers/grpc-xds-server.ts '<json>'`. Each entry of `servers` listens on 127.0.0.1:<port>
// with XdsServerCredentials (the transport, plaintext or mTLS, is what the control plane's inbound listener says)
// and answers /test.Echo/Who with `<name> <transport> <peer certificate URI SAN or ->`. Prints `bound` once every
// port is bound; ends on SIGTERM.

import * as grpc from '@grpc/grpc-js';
import * as xds from '@grpc/grpc-js-xds';

interface Args {
  servers: { port: number; name: string }[];
}

const args = JSON.parse(process.argv[2] ?? '{}') as Args;
// The xDS HTTP filters (router, fault) are registered here; without them every listener is NACKed.
xds.register();
const id = (b: Buffer) => b;
const ECHO = { Who: { path: '/test.Echo/Who', requestStream: false, responseStream: false, requestSerialize: id, requestDeserialize: id, responseSerialize: id, responseDeserialize: id } };
const servers: xds.XdsServer[] = [];

async function main(): Promise<void> {
  for (const s of args.servers) {
    const server = new xds.XdsServer();
    server.addService(ECHO, {
      Who: (call: grpc.ServerUnaryCall<Buffer, Buffer>, cb: grpc.sendUnaryData<Buffer>) => {
        const auth = call.getAuthContext();
        const san = auth.sslPeerCertificate?.subjectaltname ?? '-';
        cb(null, Buffer.from(`${s.name} ${auth.transportSecurityType ?? 'insecure'} ${san}`));
      },
    });
    await new Promise<void>((resolve, reject) => server.bindAsync(`127.0.0.1:${s.port}`, new xds.XdsServerCredentials(grpc.ServerCredentials.createInsecure()), (e) => (e ? reject(e) : resolve())));
    servers.push(server);
  }
  process.stdout.write('bound\n');
}

process.on('SIGTERM', () => {
  for (const s of servers) s.forceShutdown();
  process.exit(0);
});
main().catch((e: Error) => {
  process.stderr.write(`${e.stack}\n`);
  process.exit(1);
});
