// A real proxyless gRPC client, run as its own process (grpc-js-xds reads GRPC_XDS_BOOTSTRAP once per process and
// keeps its xDS stream open): `node --import tsx test/helpers/grpc-xds-client.ts '<json>'` with GRPC_XDS_BOOTSTRAP
// set. It calls /test.Echo/Who on `xds:///<target>` once per entry of `calls` (each entry: request metadata) and
// prints one JSON line: the answers (the backend's name, or `error: ...`).

import * as grpc from '@grpc/grpc-js';
import * as xds from '@grpc/grpc-js-xds';

interface Args {
  target: string;
  calls: Record<string, string>[];
  /** mTLS from the bootstrap's certificate provider (XdsChannelCredentials), plaintext otherwise. */
  xdsCreds?: boolean;
  deadlineMs?: number;
}

const args = JSON.parse(process.argv[2] ?? '{}') as Args;
xds.register();
const id = (b: Buffer) => b;
const Echo = grpc.makeGenericClientConstructor({
  Who: { path: '/test.Echo/Who', requestStream: false, responseStream: false, requestSerialize: id, requestDeserialize: id, responseSerialize: id, responseDeserialize: id },
}, 'Echo');
const creds = args.xdsCreds ? new xds.XdsChannelCredentials(grpc.credentials.createInsecure()) : grpc.credentials.createInsecure();
const client = new Echo(`xds:///${args.target}`, creds) as unknown as {
  Who(req: Buffer, md: grpc.Metadata, opts: grpc.CallOptions, cb: (err: grpc.ServiceError | null, res?: Buffer) => void): void;
  close(): void;
};

async function main(): Promise<void> {
  const answers: string[] = [];
  for (const headers of args.calls) {
    const md = new grpc.Metadata();
    for (const [k, v] of Object.entries(headers)) md.set(k, v);
    answers.push(await new Promise<string>((resolve) => {
      client.Who(Buffer.alloc(0), md, { deadline: Date.now() + (args.deadlineMs ?? 10_000) }, (err, res) => resolve(err ? `error: ${err.code} ${err.details}` : res!.toString()));
    }));
  }
  process.stdout.write(JSON.stringify({ answers }) + '\n');
  client.close();
  // The xDS client is a process-wide singleton with an open stream: end the process, not wait for it.
  process.exit(0);
}

void main();
