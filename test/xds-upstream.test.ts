// The upstream side of the xDS proxy: plaintext or TLS as Istio decides, credentials read at every connect
// (root CA, client certificate, token), ClusterID and XDS_HEADER_* metadata, and retrying while they are missing.

import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { buildConfig } from '../lib/config';
import { configureLogging, resetLogging } from '../lib/log';
import { upstreamFromConfig, XdsProxy, type UpstreamOptions } from '../lib/xds-proxy';
import { upstreamMetadata } from '../lib/xds-upstream';
import { CLUSTER, ControlPlane, edsCluster, FakeEnvoy } from './helpers/control-plane';
import { tempDir, waitFor } from './helpers/harness';

// Test-only PKI, generated once with openssl (EC P-256, valid 100 years): a root, a server certificate for
// istiod.istio-system.svc, and a client (workload) certificate. Never used outside tests.
const CA = `-----BEGIN CERTIFICATE-----
MIIBuzCCAWGgAwIBAgIUA7q8Wm1WzIZpN7k6/4Mq1UTB6M0wCgYIKoZIzj0EAwIw
MjEcMBoGA1UECgwTcGlsb3QtYWdlbnQtdHMgdGVzdDESMBAGA1UEAwwJdGVzdCBy
b290MCAXDTI2MTEzMDA0MzU0OFoYDzIxMjYxMTA2MDQzNTQ4WjAyMRwwGgYDVQQK
DBNwaWxvdC1hZ2VudC10cyB0ZXN0MRIwEAYDVQQDDAl0ZXN0IHJvb3QwWTATBgcq
hkjOPQIBBggqhkjOPQMBBwNCAAS3OcP5nT74uiEZtCnL+GSMRYBRmqgoicFiO792
pIfRut/FONTQsFcYl6jxDokKMN3X7LVUDWy+uWNnq2v20qJNo1MwUTAdBgNVHQ4E
FgQUzKHhPOs2L8FtE/6xWdN7odLUVwAwHwYDVR0jBBgwFoAUzKHhPOs2L8FtE/6x
WdN7odLUVwAwDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNIADBFAiEAnost
l7AHIjD4YBhVtCVUB+8T/FlErfFdMYemfIEzCxQCIGqoxhg5xUL+ixXzJ+SToBN8
F1n8s4jgs7X/et9XQD2K
-----END CERTIFICATE-----
`;
const SERVER_CERT = `-----BEGIN CERTIFICATE-----
MIIBwjCCAWigAwIBAgIUF2ESFtjhYrU0gVaNr/5lNVrJG90wCgYIKoZIzj0EAwIw
MjEcMBoGA1UECgwTcGlsb3QtYWdlbnQtdHMgdGVzdDESMBAGA1UEAwwJdGVzdCBy
b290MCAXDTI2MTEzMDA0MzU0OFoYDzIxMjYxMTA2MDQzNTQ4WjARMQ8wDQYDVQQD
DAZpc3Rpb2QwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAATZY8HGZQyev/WKtp44
hl00PSkY+up9jQrONzhOvHPDbN7gNSyfEQUzs2aTgv01Y7jRSXZ+MIh60ZNO3TAl
Cf0uo3sweTAiBgNVHREEGzAZghdpc3Rpb2QuaXN0aW8tc3lzdGVtLnN2YzATBgNV
HSUEDDAKBggrBgEFBQcDATAdBgNVHQ4EFgQU82eKFobIXPhCyJh6qIb93+vBkdsw
HwYDVR0jBBgwFoAUzKHhPOs2L8FtE/6xWdN7odLUVwAwCgYIKoZIzj0EAwIDSAAw
RQIgPohlo5CDYMagFizfoSi2wgF61837DmUcN1XSY+uZz9oCIQCTyL9FYzYGqNWB
wJS4Hm9yu/d0SwkpFhEWojFq2yvP4A==
-----END CERTIFICATE-----
`;
const SERVER_KEY = `-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgy58OMYSduUiM5lyp
D1qnbMWgxvzFFgIWhbh/v5XCQryhRANCAATZY8HGZQyev/WKtp44hl00PSkY+up9
jQrONzhOvHPDbN7gNSyfEQUzs2aTgv01Y7jRSXZ+MIh60ZNO3TAlCf0u
-----END PRIVATE KEY-----
`;
const CLIENT_CERT = `-----BEGIN CERTIFICATE-----
MIIB1zCCAXygAwIBAgIUF2ESFtjhYrU0gVaNr/5lNVrJG94wCgYIKoZIzj0EAwIw
MjEcMBoGA1UECgwTcGlsb3QtYWdlbnQtdHMgdGVzdDESMBAGA1UEAwwJdGVzdCBy
b290MCAXDTI2MTEzMDA0MzU0OFoYDzIxMjYxMTA2MDQzNTQ4WjATMREwDwYDVQQD
DAh3b3JrbG9hZDBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABHeQ4ZeMc0UhsHIc
nW5hL5zoyCqOy2P2l8PX1mpKZQyGXuxQPxXXQLZpZoXI2zsCU+VoAMKhx+aY99q2
/PFFxTWjgYwwgYkwMgYDVR0RBCswKYYnc3BpZmZlOi8vY2x1c3Rlci5sb2NhbC9u
cy9ucy9zYS9kZWZhdWx0MBMGA1UdJQQMMAoGCCsGAQUFBwMCMB0GA1UdDgQWBBTe
HIvYlwgfMOzkvjMpDaMCtiaMCDAfBgNVHSMEGDAWgBTMoeE86zYvwW0T/rFZ03uh
0tRXADAKBggqhkjOPQQDAgNJADBGAiEA8qj3CNiKOT3ic9+SEtAJXRy/6neSJbm1
g+rvz1N09H8CIQCQp2eHMfpsDII7tQgiXNH9cUDWlrOha8vu93d5aii6fw==
-----END CERTIFICATE-----
`;
const CLIENT_KEY = `-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgTyNMcNsoSCqW1Bk2
OXKiuxQvGv0EOpIh+KokbZy7JzKhRANCAAR3kOGXjHNFIbByHJ1uYS+c6Mgqjstj
9pfD19ZqSmUMhl7sUD8V10C2aWaFyNs7AlPlaADCocfmmPfatvzxRcU1
-----END PRIVATE KEY-----
`;

function cfg(env: Record<string, string> = {}, proxyConfig?: string) {
  return buildConfig({ flags: {}, env: { ...env, ...(proxyConfig ? { PROXY_CONFIG: proxyConfig } : {}) }, readFile: () => undefined });
}

test('upstreamFromConfig decides plaintext or TLS as Istio does, with its default names and paths', () => {
  const env = { ISTIO_META_CLUSTER_ID: 'east' };
  const d = upstreamFromConfig(cfg(env), env);
  assert.equal(d, {
    address: 'istiod.istio-system.svc:15012', tls: true, serverName: 'istiod.istio-system.svc',
    tokenFile: './var/run/secrets/tokens/istio-token', headers: { ClusterID: 'east' }, keepaliveTimeMs: 30_000, keepaliveTimeoutMs: 10_000,
  });
  assert.is(upstreamFromConfig(cfg({}, '{"controlPlaneAuthPolicy": "NONE"}'), {}).tls, false);
  assert.is(upstreamFromConfig(cfg({}, '{"discoveryAddress": "istiod.istio-system.svc:15010"}'), {}).tls, false);
  assert.is(upstreamFromConfig(cfg({}, '{"discoveryAddress": "localhost:15012"}'), {}).serverName, 'istiod.istio-system.svc');
  const env2 = {
    ISTIOD_SAN: 'istiod.example', XDS_HEADER_X_ISTIO_REVISION: 'canary', XDS_ROOT_CA: '/roots.pem', PROV_CERT: '/prov',
    JWT_POLICY: 'first-party-jwt', GRPC_KEEPALIVE_INTERVAL: '15s',
  };
  const o = upstreamFromConfig(cfg(env2, '{"discoveryAddress": "10.0.0.9:15012"}'), env2);
  assert.equal([o.serverName, o.rootCaFile, o.clientCertDir, o.tokenFile, o.keepaliveTimeMs], ['istiod.example', '/roots.pem', '/prov', '/var/run/secrets/kubernetes.io/serviceaccount/token', 15_000]);
  assert.equal(o.headers, { ClusterID: 'Kubernetes', X_ISTIO_REVISION: 'canary' });
});

async function withProxy(upstream: UpstreamOptions, fn: (p: XdsProxy, env: FakeEnvoy, logs: string[]) => Promise<void>, dialTimeoutMs?: number): Promise<void> {
  const dir = tempDir('pa-xds-up-');
  const logs: string[] = [];
  configureLogging({ write: (l) => logs.push(l) });
  const proxy = new XdsProxy({ socketPath: path.join(dir.path, 'XDS'), upstream, backoff: { initialMs: 50, maxMs: 200 }, dialTimeoutMs });
  let env: FakeEnvoy | undefined;
  try {
    await proxy.start();
    env = new FakeEnvoy(`unix://${path.join(dir.path, 'XDS')}`, 'sotw');
    env.request({ typeUrl: CLUSTER });
    await fn(proxy, env, logs);
  } finally {
    env?.close();
    await proxy.close();
    resetLogging();
    dir.cleanup();
  }
}

test('TLS upstream: verifies the server name against the root, sends ClusterID, extra headers and the token, re-read at each connect', async () => {
  const dir = tempDir('pa-xds-tls-');
  const cp = new ControlPlane({ tls: { key: Buffer.from(SERVER_KEY), cert: Buffer.from(SERVER_CERT) } });
  let cp2: ControlPlane | undefined;
  try {
    fs.writeFileSync(path.join(dir.path, 'root.pem'), CA);
    fs.writeFileSync(path.join(dir.path, 'token'), 'token-1\n');
    cp.set(CLUSTER, 'c1', [edsCluster('a')]);
    await cp.start(0);
    const upstream: UpstreamOptions = {
      address: cp.address, tls: true, serverName: 'istiod.istio-system.svc', rootCaFile: path.join(dir.path, 'root.pem'),
      tokenFile: path.join(dir.path, 'token'), headers: { ClusterID: 'east', X_ISTIO_REVISION: 'canary' },
    };
    await withProxy(upstream, async (proxy, env) => {
      await env.waitForResponse('CDS over TLS', (x) => x.typeUrl === CLUSTER);
      assert.is(cp.metadata[0]!.authorization, 'Bearer token-1');
      assert.is(cp.metadata[0]!.clusterid, 'east');
      assert.is(cp.metadata[0]!.x_istio_revision, 'canary');
      fs.writeFileSync(path.join(dir.path, 'token'), 'token-2\n');
      await cp.stop();
      cp2 = new ControlPlane({ tls: { key: Buffer.from(SERVER_KEY), cert: Buffer.from(SERVER_CERT) } });
      cp2.set(CLUSTER, 'c2', [edsCluster('a')]);
      await cp2.start(cp.port);
      await env.waitForResponse('CDS from the restarted server', (x) => x.version === 'c2');
      assert.is(cp2.metadata[0]!.authorization, 'Bearer token-2', 'the token is read at each connect');
      assert.is(proxy.metrics().xds_proxy_downstream_streams_total, 1);
    });
  } finally {
    await cp.stop();
    await cp2?.stop();
    dir.cleanup();
  }
});

test('TLS upstream with a client certificate from PROV_CERT; in plaintext the token goes to a local address only', async () => {
  const dir = tempDir('pa-xds-mtls-');
  const cp = new ControlPlane({ tls: { key: Buffer.from(SERVER_KEY), cert: Buffer.from(SERVER_CERT), clientCa: Buffer.from(CA) } });
  const plain = new ControlPlane();
  try {
    fs.writeFileSync(path.join(dir.path, 'root-cert.pem'), CA);
    fs.writeFileSync(path.join(dir.path, 'cert-chain.pem'), CLIENT_CERT);
    fs.writeFileSync(path.join(dir.path, 'key.pem'), CLIENT_KEY);
    fs.writeFileSync(path.join(dir.path, 'token'), 'secret');
    cp.set(CLUSTER, 'c1', [edsCluster('a')]);
    await cp.start(0);
    // No rootCaFile: with PROV_CERT set and no ./etc/certs/root-cert.pem, Istio takes PROV_CERT/root-cert.pem.
    await withProxy({ address: cp.address, tls: true, serverName: 'istiod.istio-system.svc', clientCertDir: dir.path }, async (_p, env) => {
      await env.waitForResponse('CDS over mutual TLS', (x) => x.typeUrl === CLUSTER);
    });
    plain.set(CLUSTER, 'p1', [edsCluster('a')]);
    await plain.start(0);
    await withProxy({ address: plain.address, tls: false, tokenFile: path.join(dir.path, 'token') }, async (_p, env) => {
      await env.waitForResponse('CDS in plaintext', (x) => x.typeUrl === CLUSTER);
      assert.is(plain.metadata[0]!.authorization, 'Bearer secret', 'loopback: the stream is authenticated, as the CA call is');
    });
    // Across a network in plaintext, never (the address is not dialled: only the metadata is built).
    for (const address of ['10.0.0.1:15010', 'istiod.istio-system.svc:15010', '[fd00::1]:15010']) {
      assert.is(upstreamMetadata({ address, tls: false, tokenFile: path.join(dir.path, 'token') }).authorization, undefined, address);
    }
    assert.equal(upstreamMetadata({ address: 'unix:///x.sock', tls: false, token: 'mem', tokenFile: path.join(dir.path, 'token') }).authorization, 'Bearer mem');
  } finally {
    await cp.stop();
    await plain.stop();
    dir.cleanup();
  }
});

test('a wrong server name or a missing root CA is logged and retried, with Envoy\'s stream kept open, until it is fixed', async () => {
  const dir = tempDir('pa-xds-badtls-');
  const cp = new ControlPlane({ tls: { key: Buffer.from(SERVER_KEY), cert: Buffer.from(SERVER_CERT) } });
  try {
    cp.set(CLUSTER, 'c1', [edsCluster('a')]);
    await cp.start(0);
    const root = path.join(dir.path, 'root.pem');
    await withProxy({ address: cp.address, tls: true, serverName: 'istiod.other-namespace.svc', rootCaFile: root }, async (_p, env, logs) => {
      fs.writeFileSync(root, CA);
      await waitFor('a log line naming the certificate problem', () => logs.some((l) => /\twarn\txdsproxy\tupstream xDS stream ended \(UNAVAILABLE: .*\); Envoy's stream 1 stays open/.test(l)));
      assert.is(env.status, undefined);
      assert.is(cp.streamsOpened, 0);
    });
    fs.rmSync(root);
    await withProxy({ address: cp.address, tls: true, serverName: 'istiod.istio-system.svc', rootCaFile: root }, async (proxy, env, logs) => {
      await waitFor('the missing root CA to be logged', () => logs.some((l) => /cannot connect to 127\.0\.0\.1:\d+: root CA file for XDS does not exist: .*root\.pem; Envoy's stream 1 stays open, reconnecting in \d+ ms/.test(l)));
      fs.writeFileSync(root, CA);
      await env.waitForResponse('CDS once the root CA exists', (x) => x.typeUrl === CLUSTER);
      assert.ok(proxy.metrics().xds_proxy_upstream_failures_total >= 1);
    });
  } finally {
    await cp.stop();
    dir.cleanup();
  }
});

test('an upstream name that resolves to an address nothing serves: the log names that address and the refusal', async () => {
  const free = await new Promise<number>((r) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const p = (s.address() as net.AddressInfo).port;
      s.close(() => r(p));
    });
  });
  for (const tls of [false, true]) {
    await withProxy({ address: `localhost:${free}`, tls, serverName: 'istiod.istio-system.svc', rootCaFile: 'SYSTEM' }, async (_p, _env, logs) => {
      const want = new RegExp(`upstream xDS stream ended \\(UNAVAILABLE: connection to localhost:${free} \\((127\\.0\\.0\\.1|::1)\\): connect ECONNREFUSED`);
      await waitFor(`a log line naming the resolved address (tls ${tls})`, () => logs.some((l) => want.test(l)));
    });
  }
  // A server that takes the connection and never answers the TLS handshake: the dial deadline names the address.
  const silent = net.createServer(() => undefined);
  await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
  const port = (silent.address() as net.AddressInfo).port;
  try {
    await withProxy({ address: `localhost:${port}`, tls: true, serverName: 'istiod.istio-system.svc', rootCaFile: 'SYSTEM' }, async (_p, _env, logs) => {
      const want = new RegExp(`upstream xDS stream ended \\(not connected to localhost:${port} \\((127\\.0\\.0\\.1|::1)\\) within 300 ms\\)`);
      await waitFor('the dial deadline naming the resolved address', () => logs.some((l) => want.test(l)));
    }, 300);
  } finally {
    silent.close();
  }
});

test.run();
