// The SDS server: Envoy's SecretDiscoveryService on a Unix socket. Protocol details with a grpc-js client (a
// stream waits for a secret that does not exist yet, ACK/NACK, Delta), then a real Envoy that serves TLS with
// the secrets it gets and takes a new certificate without a restart.

import * as fs from 'node:fs';
import * as path from 'node:path';
import * as tls from 'node:tls';
import { X509Certificate } from 'node:crypto';
import * as grpc from '@grpc/grpc-js';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { messageType } from '../lib/envoy-protos';
import { SdsServer, SECRET_TYPE, type SecretValue } from '../lib/sds-server';
import { freePort, sleep, tempDir, waitFor } from './helpers/harness';
import { envoyCertSerials, startSdsEnvoy } from './helpers/sds-envoy';
import { makeLeaf, makeRoot } from './helpers/test-ca';

const REQ = 'envoy.service.discovery.v3.DiscoveryRequest';
const RESP = 'envoy.service.discovery.v3.DiscoveryResponse';
const DREQ = 'envoy.service.discovery.v3.DeltaDiscoveryRequest';
const DRESP = 'envoy.service.discovery.v3.DeltaDiscoveryResponse';
const SECRET = 'envoy.extensions.transport_sockets.tls.v3.Secret';
const enc = (n: string) => (v: object) => Buffer.from(messageType(n).encode(messageType(n).fromObject(v as Record<string, unknown>)).finish());
const dec = (n: string) => (b: Buffer) => messageType(n).toObject(messageType(n).decode(b), { arrays: true, defaults: true }) as Record<string, any>;

function sdsClient(socket: string, kind: 'Stream' | 'Delta') {
  const [req, resp] = kind === 'Stream' ? [REQ, RESP] : [DREQ, DRESP];
  const client = new grpc.Client(`unix://${socket}`, grpc.credentials.createInsecure());
  const call = client.makeBidiStreamRequest(`/envoy.service.secret.v3.SecretDiscoveryService/${kind}Secrets`, enc(req), dec(resp));
  const got: Record<string, any>[] = [];
  call.on('data', (m: Record<string, any>) => got.push(m));
  call.on('error', () => undefined);
  return { call, got, close: () => { call.cancel(); client.close(); } };
}

const secretOf = (any: { value: Uint8Array }) => dec(SECRET)(Buffer.from(any.value));

class Provider {
  values = new Map<string, SecretValue>();
  requested: string[] = [];
  secret = (n: string) => this.values.get(n);
  requestedFn = (n: string) => void this.requested.push(n);
}

test('a stream waits for a secret that does not exist yet, gets it on push, and ACKs; a NACK keeps the last one', async () => {
  const dir = tempDir();
  const p = new Provider();
  const sds = new SdsServer({ socketPath: path.join(dir.path, 'sds', 'socket'), provider: { secret: p.secret, requested: p.requestedFn } });
  await sds.start();
  const c = sdsClient(path.join(dir.path, 'sds', 'socket'), 'Stream');
  try {
    assert.is(fs.statSync(path.join(dir.path, 'sds', 'socket')).mode & 0o777, 0o660);
    c.call.write({ node: { id: 'n1' }, type_url: SECRET_TYPE, resource_names: ['default'] });
    await waitFor('the request to reach the provider', () => p.requested.includes('default'));
    await sleep(200);
    assert.is(c.got.length, 0, 'nothing is sent before the secret exists');
    p.values.set('default', { kind: 'tls', certChainPem: 'CHAIN', keyPem: 'KEY' });
    sds.push('default');
    await waitFor('the first response', () => c.got.length === 1);
    const r = c.got[0]!;
    assert.is(r.type_url, SECRET_TYPE);
    const s = secretOf(r.resources[0]);
    assert.is(s.name, 'default');
    assert.is(Buffer.from(s.tls_certificate.certificate_chain.inline_bytes).toString(), 'CHAIN');
    assert.is(Buffer.from(s.tls_certificate.private_key.inline_bytes).toString(), 'KEY');
    c.call.write({ type_url: SECRET_TYPE, resource_names: ['default'], version_info: r.version_info, response_nonce: r.nonce });
    sds.push('default'); // unchanged: nothing to send
    await sleep(200);
    assert.is(c.got.length, 1);
    assert.equal(sds.streamStatus()[0]!.acked, { default: r.version_info });
    p.values.set('default', { kind: 'tls', certChainPem: 'CHAIN2', keyPem: 'KEY2' });
    sds.push('default');
    await waitFor('the changed secret', () => c.got.length === 2);
    const r2 = c.got[1]!;
    c.call.write({ type_url: SECRET_TYPE, resource_names: ['default'], version_info: r.version_info, response_nonce: r2.nonce, error_detail: { code: 3, message: 'bad cert' } });
    await sleep(200);
    assert.is(c.got.length, 2, 'a NACK is not answered with the same secret again');
    assert.equal(sds.streamStatus()[0]!.acked, { default: r.version_info });
  } finally {
    c.close();
    await sds.close();
    await sds.close();
    assert.not.ok(fs.existsSync(path.join(dir.path, 'sds', 'socket')));
    dir.cleanup();
  }
});

test('DeltaSecrets: subscribe, get the secret with its version, unsubscribe', async () => {
  const dir = tempDir();
  const p = new Provider();
  p.values.set('ROOTCA', { kind: 'root', rootPem: 'ROOT' });
  const sock = path.join(dir.path, 'socket');
  const sds = new SdsServer({ socketPath: sock, provider: { secret: p.secret } });
  await sds.start();
  const c = sdsClient(sock, 'Delta');
  try {
    c.call.write({ node: { id: 'n1' }, type_url: SECRET_TYPE, resource_names_subscribe: ['ROOTCA', 'file-root:/nope'] });
    await waitFor('the delta response', () => c.got.length === 1);
    const r = c.got[0]!;
    assert.is(r.resources.length, 1);
    assert.is(r.resources[0].name, 'ROOTCA');
    assert.is(Buffer.from(secretOf(r.resources[0].resource).validation_context.trusted_ca.inline_bytes).toString(), 'ROOT');
    c.call.write({ type_url: SECRET_TYPE, response_nonce: r.nonce, resource_names_unsubscribe: ['ROOTCA'] });
    await waitFor('the unsubscribe', () => sds.streamStatus()[0]?.names.length === 1);
    p.values.set('ROOTCA', { kind: 'root', rootPem: 'ROOT2' });
    sds.push('ROOTCA');
    await sleep(200);
    assert.is(c.got.length, 1);
  } finally {
    c.close();
    await sds.close();
    dir.cleanup();
  }
});

async function tlsPeerSerial(port: number, ca: string): Promise<string> {
  return new Promise((resolve, reject) => {
    // Envoy asks for a client certificate; the handshake completes from our side before it checks one.
    const s = tls.connect({ host: '127.0.0.1', port, ca, checkServerIdentity: () => undefined }, () => {
      const cert = s.getPeerX509Certificate();
      s.destroy();
      cert ? resolve(cert.serialNumber) : reject(new Error('no peer certificate'));
    });
    s.on('error', reject);
  });
}

test('a real Envoy serves TLS with the SDS secrets and takes a new certificate without a restart', async () => {
  const dir = tempDir();
  const root = await makeRoot();
  const leaf1 = await makeLeaf(root, { uri: 'spiffe://cluster.local/ns/a/sa/one' });
  const leaf2 = await makeLeaf(root, { uri: 'spiffe://cluster.local/ns/a/sa/one' });
  const p = new Provider();
  const sock = path.join(dir.path, 'socket');
  const sds = new SdsServer({ socketPath: sock, provider: { secret: p.secret } });
  await sds.start();
  const port = await freePort();
  const envoy = await startSdsEnvoy({ sdsSocket: sock, inbound: { port, backendPort: await freePort() } });
  try {
    await waitFor('Envoy to ask for its secrets', () => sds.streamStatus().length >= 2);
    p.values.set('ROOTCA', { kind: 'root', rootPem: root.pem });
    p.values.set('default', { kind: 'tls', certChainPem: leaf1.certPem, keyPem: leaf1.keyPem });
    sds.push('ROOTCA');
    sds.push('default');
    const serial1 = new X509Certificate(leaf1.certPem).serialNumber;
    assert.is(await waitFor('Envoy to serve the first certificate', () => tlsPeerSerial(port, root.pem).catch(() => undefined), 15_000, 200), serial1);
    assert.ok((await envoyCertSerials(envoy.adminPort)).includes(serial1));
    const pid = envoy.proc.pid;
    p.values.set('default', { kind: 'tls', certChainPem: leaf2.certPem, keyPem: leaf2.keyPem });
    sds.push('default');
    const serial2 = new X509Certificate(leaf2.certPem).serialNumber;
    await waitFor('Envoy to serve the new certificate', async () => (await tlsPeerSerial(port, root.pem)) === serial2, 15_000, 200);
    assert.is(envoy.proc.pid, pid);
    assert.is(envoy.proc.exitCode, null);
    await waitFor('Envoy to ACK', () => sds.streamStatus().every((s) => Object.keys(s.acked).length > 0));
  } finally {
    await envoy.stop();
    await sds.close();
    dir.cleanup();
  }
});

test.run();
