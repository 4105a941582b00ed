// A peer of the discovery server, run as its own process so security tests can run it as another uid
// (`setpriv --reuid 65534 ... node --import tsx test/helpers/discovery-attacker.ts '<json>'`). It plays an ADS
// client (any node id, metadata and token it is told) or a CA client, and prints one JSON line of what it got.

import * as grpc from '@grpc/grpc-js';
import { CaClient } from '../../lib/ca-client';
import { generateKeyAndCsr } from '../../lib/csr';
import { messageType } from '../../lib/envoy-protos';

export interface AdsAttack {
  mode: 'ads';
  address: string;
  nodeId: string;
  metadata?: Record<string, string>;
  token?: string;
  /** Sent in order; the node goes on the first. */
  requests: { type_url: string; resource_names?: string[]; error_detail?: { code: number; message: string } }[];
  /** How long to collect responses after the last request. */
  waitMs: number;
}

export interface CaAttack {
  mode: 'ca';
  address: string;
  tokenFile: string;
  identity: string;
}

export interface AttackResult {
  /** The stream's or call's gRPC status when it ended early (refused), else undefined. */
  code?: number;
  details?: string;
  /** Resource names received, per type. */
  resources: Record<string, string[]>;
  /** Did any response carry PEM private key material? */
  privateKey: boolean;
  /** CA mode: the chain length signed. */
  signed?: number;
}

const SERVICE = '/envoy.service.discovery.v3.AggregatedDiscoveryService';

async function ads(a: AdsAttack): Promise<AttackResult> {
  const req = messageType('envoy.service.discovery.v3.DiscoveryRequest');
  const res = messageType('envoy.service.discovery.v3.DiscoveryResponse');
  const client = new grpc.Client(a.address, grpc.credentials.createInsecure());
  const md = new grpc.Metadata();
  if (a.token) md.set('authorization', `Bearer ${a.token}`);
  const out: AttackResult = { resources: {}, privateKey: false };
  const call = client.makeBidiStreamRequest(
    `${SERVICE}/StreamAggregatedResources`,
    (o: Record<string, unknown>) => Buffer.from(req.encode(req.fromObject(o)).finish()),
    (b: Buffer) => ({ raw: b, msg: res.toObject(res.decode(b), { arrays: true }) as { type_url: string; resources: { value: Uint8Array }[] } }),
    md,
  );
  const ended = new Promise<void>((resolve) => {
    call.on('data', ({ raw, msg }: { raw: Buffer; msg: { type_url: string; resources: { value: Uint8Array }[] } }) => {
      if (raw.includes('PRIVATE KEY')) out.privateKey = true;
      const names = (out.resources[msg.type_url] ??= []);
      const secret = messageType('envoy.extensions.transport_sockets.tls.v3.Secret');
      for (const r of msg.resources) {
        try {
          names.push(String((secret.decode(r.value) as unknown as { name: string }).name));
        } catch {
          names.push('?');
        }
      }
    });
    call.on('error', (e: grpc.ServiceError) => {
      out.code = e.code;
      out.details = e.details;
      resolve();
    });
    call.on('end', () => resolve());
  });
  const metadata = { fields: Object.fromEntries(Object.entries(a.metadata ?? {}).map(([k, v]) => [k, { stringValue: v }])) };
  // Each request handed to the transport before the next, and the wait counted from the last: under load the
  // connection can take longer than waitMs, and a cancel before the writes would send nothing.
  for (const [i, r] of a.requests.entries()) {
    const sent = new Promise<void>((resolve) => call.write(i === 0 ? { ...r, node: { id: a.nodeId, metadata } } : r, () => resolve()));
    await Promise.race([sent, ended]);
  }
  await Promise.race([ended, new Promise((r) => setTimeout(r, a.waitMs))]);
  call.cancel();
  client.close();
  // A refusal arriving with the cancel is still a refusal.
  if (out.code === grpc.status.CANCELLED) delete out.code;
  return out;
}

async function ca(a: CaAttack): Promise<AttackResult> {
  const signer = new CaClient({ address: a.address, tls: false, rootCaFile: '', serverName: '', tokenFile: a.tokenFile, headers: {} });
  const { csrPem } = await generateKeyAndCsr({ identity: a.identity, algorithm: { kind: 'ECDSA' } });
  try {
    return { resources: {}, privateKey: false, signed: (await signer.sign(csrPem, 600)).length };
  } catch (e) {
    return { resources: {}, privateKey: false, code: -1, details: (e as Error).message };
  }
}

const input = JSON.parse(process.argv[2] ?? '{}') as AdsAttack | CaAttack;
(input.mode === 'ca' ? ca(input) : ads(input)).then(
  (r) => {
    process.stdout.write(`${JSON.stringify(r)}\n`);
    process.exit(0);
  },
  (e: Error) => {
    process.stdout.write(`${JSON.stringify({ error: e.message })}\n`);
    process.exit(2);
  },
);
