// Where the agent's workload identity comes from: mounted files, the CA (istiod or, standalone, the embedded
// CA when identities are declared), or only the certificate files the config names (standalone without a CA); and
// no SDS server of its own when
// another one (e.g. SPIRE's agent) already serves the socket, as in Istio.

import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { buildConfig } from '../lib/config';
import { workloadIdentity } from '../lib/workload-identity';
import { tempDir } from './helpers/harness';

async function inDir<T>(fn: (dir: string) => Promise<T>): Promise<T> {
  const dir = tempDir();
  const cwd = process.cwd();
  process.chdir(dir.path);
  try {
    return await fn(dir.path);
  } finally {
    process.chdir(cwd);
    dir.cleanup();
  }
}

async function rejects(fn: () => Promise<unknown>, re: RegExp): Promise<void> {
  const err = await fn().then(() => undefined, (e: Error) => e);
  assert.ok(err, `expected a rejection matching ${re}`);
  assert.match(err.message, re);
}

const cfg = (env: Record<string, string>, standalone?: string) => buildConfig({ flags: standalone ? { standalone } : {}, env, readFile: () => undefined });

test('the CA by default (the discovery address), mounted files when present, the embedded CA only when declared', () => inDir(async (dir) => {
  const env = { POD_NAMESPACE: 'ns1', SERVICE_ACCOUNT: 'sa1' };
  const ca = await workloadIdentity(cfg(env), env);
  assert.is(ca!.source, 'CA istiod.istio-system.svc:15012');
  assert.is((ca!.cache.debug() as { identity: string }).identity, 'spiffe://cluster.local/ns/ns1/sa/sa1');
  fs.mkdirSync(path.join(dir, 'mesh'));
  assert.is((await workloadIdentity(cfg(env, path.join(dir, 'mesh')), env, path.join(dir, 'discovery.sock')))!.source, 'file certificates only (no CA)');
  fs.mkdirSync(path.join(dir, 'mesh', 'ca', 'identities'), { recursive: true });
  const embedded = await workloadIdentity(cfg(env, path.join(dir, 'mesh')), env, path.join(dir, 'discovery.sock'));
  assert.is(embedded!.source, `CA unix:${path.join(dir, 'discovery.sock')}`);
  fs.mkdirSync('etc/certs', { recursive: true });
  fs.writeFileSync('etc/certs/cert-chain.pem', '');
  fs.writeFileSync('etc/certs/key.pem', '');
  assert.is((await workloadIdentity(cfg(env), env))!.source, 'files in ./etc/certs');
}));

test('another SDS server on the socket: the agent serves none', () => inDir(async () => {
  const sock = './var/run/secrets/workload-spiffe-uds/socket';
  fs.mkdirSync(path.dirname(sock), { recursive: true });
  const server = net.createServer((c) => c.destroy());
  await new Promise<void>((r) => server.listen(sock, () => r()));
  try {
    assert.is(await workloadIdentity(cfg({}), {}), undefined);
  } finally {
    await new Promise<void>((r) => server.close(() => r()));
  }
}));

test('an SDS socket that cannot be bound: fatal with a CA or mounted certificates, no SDS server otherwise', () => inDir(async (dir) => {
  const env = { POD_NAMESPACE: 'ns1', SERVICE_ACCOUNT: 'sa1' };
  const sdsUnavailable = new Error('cannot create directory /var/run/secrets/workload-spiffe-uds: EACCES');
  await rejects(() => workloadIdentity(cfg(env), env, undefined, { sdsServedElsewhere: false, sdsUnavailable }), /EACCES/);
  fs.mkdirSync(path.join(dir, 'mesh'));
  // Standalone without a CA (e.g. the router image as uid 1337 with / read-only): runs without SDS.
  assert.is(await workloadIdentity(cfg(env, path.join(dir, 'mesh')), env, path.join(dir, 'discovery.sock'), { sdsServedElsewhere: false, sdsUnavailable }), undefined);
  fs.mkdirSync(path.join(dir, 'mesh', 'ca', 'identities'), { recursive: true });
  await rejects(() => workloadIdentity(cfg(env, path.join(dir, 'mesh')), env, path.join(dir, 'discovery.sock'), { sdsServedElsewhere: false, sdsUnavailable }), /EACCES/);
}));

test.run();
