// The CA service schema in lib/ca-protos.ts is kept in step with proto/istio/ca.proto, and its messages use
// Istio's field numbers (so a real istiod reads what the agent sends).

import * as path from 'node:path';
import * as protobuf from 'protobufjs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import {
  CA_DESCRIPTOR, decodeCertificateRequest, decodeCertificateResponse, encodeCertificateRequest, encodeCertificateResponse,
} from '../lib/ca-protos';
import { REPO } from './helpers/harness';

test('the CA schema in lib/ca-protos.ts matches proto/istio/ca.proto', () => {
  const root = new protobuf.Root();
  root.loadSync(path.join(REPO, 'proto/istio/ca.proto'), { keepCase: true });
  assert.equal(JSON.parse(JSON.stringify(root.toJSON())), JSON.parse(JSON.stringify(CA_DESCRIPTOR)));
});

test('CreateCertificate messages use Istio field numbers: csr 1, validity_duration 3, cert_chain 1', () => {
  const req = encodeCertificateRequest({ csr: 'CSR', validityDuration: 86400 });
  // field 1 length-delimited "CSR", field 3 varint 86400
  assert.equal(req.toString('hex'), Buffer.concat([Buffer.from([0x0a, 3]), Buffer.from('CSR'), Buffer.from([0x18, 0x80, 0xa3, 0x05])]).toString('hex'));
  assert.equal(decodeCertificateRequest(req), { csr: 'CSR', validityDuration: 86400 });
  const resp = encodeCertificateResponse({ certChain: ['leaf', 'root'] });
  assert.equal(resp.toString('hex'), Buffer.from([0x0a, 4, ...Buffer.from('leaf'), 0x0a, 4, ...Buffer.from('root')]).toString('hex'));
  assert.equal(decodeCertificateResponse(resp).certChain, ['leaf', 'root']);
  assert.equal(decodeCertificateResponse(Buffer.alloc(0)).certChain, []);
});

test('garbage is not a certificate response', () => {
  assert.throws(() => decodeCertificateResponse(Buffer.from([0x0a, 0xff, 0xff, 0xff])));
});

test('the hand-written codec and protobufjs (from CA_DESCRIPTOR) read each other, metadata included', () => {
  const root = protobuf.Root.fromJSON(CA_DESCRIPTOR as unknown as protobuf.INamespace);
  const Req = root.lookupType('istio.v1.auth.IstioCertificateRequest');
  const Resp = root.lookupType('istio.v1.auth.IstioCertificateResponse');
  const metadata = { CertSigner: 'signer-a', 'é': '' };
  const ours = encodeCertificateRequest({ csr: 'PEM\n', validityDuration: 2 ** 40, metadata });
  assert.equal(Req.toObject(Req.decode(ours), { longs: Number }), {
    csr: 'PEM\n', validity_duration: 2 ** 40,
    metadata: { fields: { CertSigner: { stringValue: 'signer-a' }, 'é': { stringValue: '' } } },
  });
  const theirs = Buffer.from(Req.encode(Req.fromObject({
    csr: 'x', validity_duration: 7, metadata: { fields: { CertSigner: { stringValue: 's' }, n: { numberValue: 3 } } },
  })).finish());
  // Only string values count as metadata (Istio reads CertSigner as a string).
  assert.equal(decodeCertificateRequest(theirs), { csr: 'x', validityDuration: 7, metadata: { CertSigner: 's' } });
  const negative = Buffer.from(Req.encode(Req.fromObject({ csr: 'x', validity_duration: -5 })).finish());
  assert.ok(decodeCertificateRequest(negative).validityDuration < 0);
  const chain = ['leaf', '', 'root'];
  const ourChain = encodeCertificateResponse({ certChain: chain });
  assert.equal(Resp.toObject(Resp.decode(ourChain), { arrays: true }).cert_chain, chain);
  const theirChain = Buffer.from(Resp.encode(Resp.fromObject({ cert_chain: chain })).finish());
  assert.equal(decodeCertificateResponse(theirChain).certChain, chain);
});

test('a field of the wrong wire type is refused, an unknown field skipped', () => {
  assert.throws(() => decodeCertificateResponse(Buffer.from([0x08, 0x01])), /wire type/);
  assert.throws(() => decodeCertificateRequest(Buffer.from([0x0a, 0x01])), /claims|truncated/);
  assert.equal(decodeCertificateResponse(Buffer.from([0x10, 0x05, 0x0a, 0x01, 0x41])).certChain, ['A']);
});

test.run();
