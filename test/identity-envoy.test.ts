// Workload identity end to end with real Envoys: two secret caches (each its own SPIFFE id, signed by one CA),
// two SDS servers on Unix sockets, two Envoys that take `default` and `ROOTCA` from them. Requests from one app
// reach the other over mTLS (handshake stats, the caller's SPIFFE id in XFCC), a plaintext client is refused,
// and with a short certificate lifetime several rotations happen under load with zero failed requests and no
// Envoy restart, while the served serial changes.

import * as http from 'node:http';
import * as net from 'node:net';
import * as path from 'node:path';
import type { CertificateSigner } from '../lib/ca-client';
import { spiffeId } from '../lib/csr';
import { SdsServer } from '../lib/sds-server';
import { SecretCache } from '../lib/secret-cache';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { freePort, httpRequest, sleep, tempDir, waitFor } from './helpers/harness';
import { envoyCertSerials, startSdsEnvoy, type SdsEnvoy } from './helpers/sds-envoy';
import { makeIntermediate, makeRoot, signCsr, type Issuer } from './helpers/test-ca';

const CLIENT_ID = spiffeId('cluster.local', 'a', 'client');
const SERVER_ID = spiffeId('cluster.local', 'b', 'server');

/** An in-process signer (the CA client itself is tested against a real gRPC CA elsewhere). */
function signer(inter: Issuer, root: Issuer): CertificateSigner & { signed: number } {
  const s = {
    address: 'in-process test CA',
    signed: 0,
    async sign(csr: string, validitySeconds: number) {
      s.signed++;
      const leaf = await signCsr(inter, csr, { notBefore: new Date(Date.now() - 1000), ttlMs: validitySeconds * 1000 });
      return [leaf, inter.pem, root.pem];
    },
  };
  return s;
}

/** Answers with the XFCC header Envoy set from the caller's certificate. */
async function xfccBackend(): Promise<{ port: number; close(): Promise<void> }> {
  const server = http.createServer((req, res) => {
    req.resume();
    res.end(String(req.headers['x-forwarded-client-cert'] ?? 'no xfcc'));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return {
    port: (server.address() as net.AddressInfo).port,
    close: () => new Promise<void>((r) => {
      server.closeAllConnections();
      server.close(() => r());
    }),
  };
}

interface Side {
  cache: SecretCache;
  sds: SdsServer;
  envoy?: SdsEnvoy;
}

async function side(dir: string, name: string, identity: string, sign: CertificateSigner, ttlMs: number): Promise<Side> {
  const cache = new SecretCache({ identity, algorithm: { kind: 'ECDSA' }, ttlMs, graceRatio: 0.5, graceJitter: 0.01, signer: sign, backoff: { initialMs: 100, maxMs: 1000 } });
  const sds = new SdsServer({ socketPath: path.join(dir, name, 'var/run/secrets/workload-spiffe-uds/socket'), provider: cache });
  cache.onUpdate((n) => sds.push(n));
  await sds.start();
  await cache.start();
  return { cache, sds };
}

function plaintextRefused(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1', () => s.write('GET / HTTP/1.1\r\nhost: x\r\n\r\n'));
    let data = '';
    s.on('data', (d) => (data += d.toString()));
    s.on('error', () => resolve(true));
    s.on('close', () => resolve(!data.startsWith('HTTP/1.1 200')));
    s.setTimeout(5000, () => s.destroy());
  });
}

test('mTLS between two Envoys with SDS secrets; rotations under load fail no request and restart no Envoy', async () => {
  const dir = tempDir();
  const root = await makeRoot('mesh root');
  const inter = await makeIntermediate(root);
  const sign = signer(inter, root);
  const backend = await xfccBackend();
  const [inPort, outPort] = [await freePort(), await freePort()];
  const sides: Side[] = [];
  try {
    // 6 s certificates are renewed about every 3 s.
    const server = await side(dir.path, 'server', SERVER_ID, sign, 6000);
    const client = await side(dir.path, 'client', CLIENT_ID, sign, 6000);
    sides.push(server, client);
    server.envoy = await startSdsEnvoy({ sdsSocket: path.join(dir.path, 'server/var/run/secrets/workload-spiffe-uds/socket'), inbound: { port: inPort, backendPort: backend.port, peerSanPrefix: 'spiffe://cluster.local/' } });
    client.envoy = await startSdsEnvoy({ sdsSocket: path.join(dir.path, 'client/var/run/secrets/workload-spiffe-uds/socket'), outbound: { port: outPort, peerPort: inPort, peerSan: SERVER_ID } });

    const url = `http://127.0.0.1:${outPort}/`;
    const xfcc = await waitFor('a request through both Envoys', async () => {
      const r = await httpRequest(url, { timeoutMs: 2000 });
      return r.status === 200 ? r.body : undefined;
    }, 20_000, 200);
    assert.match(xfcc, `URI=${CLIENT_ID}`);
    assert.ok((await server.envoy.stat(`listener.127.0.0.1_${inPort}.ssl.handshake`)) > 0, 'server-side handshakes');
    assert.ok((await client.envoy.stat('cluster.peer.ssl.handshake')) > 0, 'client-side handshakes');
    assert.ok(await plaintextRefused(inPort), 'a plaintext client is refused');

    const pids = [server.envoy.proc.pid, client.envoy.proc.pid];
    const firstSerial = server.cache.current()!.serial;
    const rotated0 = [server.cache, client.cache].map((c) => (c.debug() as { certificate: { serial: string } }).certificate.serial);
    const serials = new Set<string>([firstSerial]);
    const results = { ok: 0, failed: [] as string[] };
    const keepAlive = new http.Agent({ keepAlive: true, maxSockets: 4 });
    let running = true;
    const worker = async (agent?: http.Agent) => {
      while (running) {
        try {
          const r = await httpRequest(url, { timeoutMs: 5000, agent });
          if (r.status === 200 && r.body.includes(CLIENT_ID)) results.ok++;
          else results.failed.push(`HTTP ${r.status} ${r.body.slice(0, 100)}`);
        } catch (e) {
          results.failed.push((e as Error).message);
        }
      }
    };
    const workers = [worker(keepAlive), worker(keepAlive), worker(), worker()];
    const deadline = Date.now() + 30_000;
    let rotations = 0;
    while (Date.now() < deadline) {
      await sleep(250);
      serials.add(server.cache.current()!.serial);
      rotations = Math.min(...[server.cache, client.cache].map((c) => countRotations(c)));
      if (rotations >= 3 && serials.size >= 4) break;
    }
    running = false;
    await Promise.all(workers);
    keepAlive.destroy();
    assert.ok(rotations >= 3, `at least 3 rotations on each side (got ${rotations})`);
    assert.ok(serials.size >= 4, `the serial changed (${[...serials].join(', ')})`);
    assert.equal(results.failed, [], `failed requests: ${results.failed.length}`);
    assert.ok(results.ok > 50, `requests ran (${results.ok})`);
    assert.equal([server.envoy.proc.pid, client.envoy.proc.pid], pids, 'no Envoy restarted');
    assert.is(server.envoy.proc.exitCode, null);
    const now = server.cache.current()!.serial;
    await waitFor('Envoy to hold the current certificate', async () => (await envoyCertSerials(server.envoy!.adminPort)).includes(now), 10_000, 200);
    assert.not.equal(now, rotated0[0]);
  } finally {
    for (const s of sides.reverse()) {
      await s.envoy?.stop();
      await s.cache.close();
      await s.sds.close();
    }
    await backend.close();
    dir.cleanup();
  }
});

const rotatedCounts = new WeakMap<SecretCache, { last: string; n: number }>();
function countRotations(c: SecretCache): number {
  const serial = c.current()!.serial;
  const r = rotatedCounts.get(c);
  if (!r) {
    rotatedCounts.set(c, { last: serial, n: 0 });
    return 0;
  }
  if (r.last !== serial) {
    r.last = serial;
    r.n++;
  }
  return r.n;
}

test.run();
