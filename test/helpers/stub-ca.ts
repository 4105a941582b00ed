// A CA for agent-level tests: Istio's IstioCertificateService as a TLS HTTP/2 server (node:http2, decoded with
// protobufjs from proto/istio/ca.proto, independently of lib/ca-protos.ts) that signs every CSR with a test mesh root,
// asks for a client certificate without requiring one, and records per call which one it got, the token and when.

import * as http2 from 'node:http2';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';
import type * as tls from 'node:tls';
import { X509Certificate } from 'node:crypto';
import * as protobuf from 'protobufjs';
import { REPO } from './harness';
import { makeLeaf, makeRoot, signCsr, type Issuer } from './test-ca';

export interface Call {
  /** SHA-256 fingerprint of the client certificate presented, or 'none'. */
  client: string;
  token?: string;
  /** performance.now() in the test's process when the request arrived. */
  at: number;
}

export interface StubCa {
  address: string;
  calls: Call[];
  /** Fingerprints of the leaves signed, in order. */
  issued: string[];
  serverRoot: Issuer;
  close(): Promise<void>;
}

export async function startStubCa(): Promise<StubCa> {
  const pb = new protobuf.Root();
  pb.loadSync(path.join(REPO, 'proto/istio/ca.proto'), { keepCase: true });
  const Req = pb.lookupType('istio.v1.auth.IstioCertificateRequest');
  const Resp = pb.lookupType('istio.v1.auth.IstioCertificateResponse');
  const serverRoot = await makeRoot('istiod serving root');
  const meshRoot = await makeRoot('mesh root');
  const serving = await makeLeaf(serverRoot, { dns: ['istiod.istio-system.svc'], ip: ['127.0.0.1'] });
  const calls: Call[] = [];
  const issued: string[] = [];
  // Asks for a client certificate, accepts any or none: what was presented is what the test asserts.
  const srv = http2.createSecureServer({ key: serving.keyPem, cert: serving.certPem, requestCert: true, rejectUnauthorized: false });
  srv.on('stream', (stream, headers) => {
    const peer = (stream.session!.socket as tls.TLSSocket).getPeerCertificate();
    calls.push({ client: peer?.fingerprint256 ?? 'none', token: headers.authorization as string | undefined, at: performance.now() });
    const chunks: Buffer[] = [];
    stream.on('data', (c: Buffer) => chunks.push(c));
    stream.on('end', async () => {
      const body = Buffer.concat(chunks);
      const req = Req.toObject(Req.decode(body.subarray(5, 5 + body.readUInt32BE(1))), { longs: Number }) as { csr: string; validity_duration: number };
      const chain = [await signCsr(meshRoot, req.csr, { ttlMs: req.validity_duration * 1000 }), meshRoot.pem];
      issued.push(fingerprint(chain[0]!));
      const msg = Buffer.from(Resp.encode(Resp.fromObject({ cert_chain: chain })).finish());
      const head = Buffer.alloc(5);
      head.writeUInt32BE(msg.length, 1);
      stream.respond({ ':status': 200, 'content-type': 'application/grpc' }, { waitForTrailers: true });
      stream.on('wantTrailers', () => stream.sendTrailers({ 'grpc-status': '0' }));
      stream.end(Buffer.concat([head, msg]));
    });
  });
  const sessions = new Set<http2.ServerHttp2Session>();
  srv.on('session', (s) => (sessions.add(s), s.on('close', () => sessions.delete(s))));
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  return {
    address: `127.0.0.1:${(srv.address() as AddressInfo).port}`,
    calls,
    issued,
    serverRoot,
    close: async () => {
      for (const s of sessions) s.destroy();
      await new Promise<void>((r) => srv.close(() => r()));
    },
  };
}


const fingerprint = (pem: string) => new X509Certificate(pem).fingerprint256;
