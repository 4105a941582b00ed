// The Go agent's SDS socket knobs (issue 23, identity part), from pkg/istio-agent/agent.go Run and
// generateNodeMetadata, and pkg/bootstrap:
// - WORKLOAD_IDENTITY_SOCKET_FILE names the socket in ./var/run/secrets/workload-spiffe-uds that Envoy's sds-grpc
//   cluster uses; a path is refused, and a non-default name that nothing serves fails the start.
// - Another server on the workload socket (SPIRE's agent): Envoy's identity comes from it; the agent serves only file
//   certificates, on ./var/run/secrets/credential-uds/files-socket (sds-files-grpc, metadata `file-credential`).
// - A server on ./var/run/secrets/credential-uds/socket: metadata `credential` (istiod then adds `sds-external`); a
//   socket file nobody answers on is removed, as Go's checkSocket does.
// The real Envoy of the agent serves a listener's certificate from each socket.

import 'reflect-metadata';
import { execFileSync } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import * as tls from 'node:tls';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { buildConfig } from '../lib/config';
import { packAny } from '../lib/envoy-protos';
import { SdsServer } from '../lib/sds-server';
import { SecretCache } from '../lib/secret-cache';
import { agentFixture, type AgentFixture } from './helpers/agent-fixture';
import { CLUSTER, ControlPlane, LISTENER, type Resource } from './helpers/control-plane';
import { freePort, tempDir, waitFor } from './helpers/harness';
import { makeLeaf, makeRoot } from './helpers/test-ca';

test('WORKLOAD_IDENTITY_SOCKET_FILE: the sds-grpc pipe follows it; a path is refused by name', () => {
  const cfg = (env: Record<string, string>) => buildConfig({ flags: {}, env, readFile: () => undefined });
  assert.is(cfg({}).sdsSocket, './var/run/secrets/workload-spiffe-uds/socket');
  assert.is(cfg({ WORKLOAD_IDENTITY_SOCKET_FILE: 'spire.sock' }).sdsSocket, './var/run/secrets/workload-spiffe-uds/spire.sock');
  for (const bad of ['../socket', 'a/b', '/tmp/x']) {
    assert.throws(() => cfg({ WORKLOAD_IDENTITY_SOCKET_FILE: bad }), (e: Error) =>
      /WORKLOAD_IDENTITY_SOCKET_FILE/.test(e.message) && e.message.includes(`must be a filename, not a path: ${bad}`));
  }
  const facts = buildConfig({ flags: {}, env: {}, readFile: () => undefined, sockets: { externalSds: true, credentialSocket: false } });
  assert.is(facts.sdsServeSocket, './var/run/secrets/credential-uds/files-socket');
});

/** Starts the agent and waits for it to exit. */
async function run(agent: AgentFixture, env: Record<string, string>): Promise<{ code: number | null; out: string }> {
  await agent.start({ env, ready: 'none' });
  const r = await agent.exited;
  return { code: r.code, out: agent.log() };
}

test('a non-default WORKLOAD_IDENTITY_SOCKET_FILE that nothing serves: start-up fails, naming the socket', async () => {
  const agent = await agentFixture({ prefix: 'pa-knobs-wisf-' });
  try {
    const r = await run(agent, { WORKLOAD_IDENTITY_SOCKET_FILE: 'spire.sock' });
    assert.is(r.code, 1, r.out);
    // The Go agent's line, checked against /root/go/bin/pilot-agent: "agent configured for non-default SDS socket path:
    // var/run/secrets/workload-spiffe-uds/spire.sock but no socket found".
    assert.match(r.out, /^error: agent configured for non-default SDS socket path: var\/run\/secrets\/workload-spiffe-uds\/spire\.sock but no socket found/m);
  } finally {
    await agent.close();
  }
});

const SDS = (cluster: string) => ({
  api_config_source: { api_type: 'GRPC', transport_api_version: 'V3', set_node_on_first_message_only: true, grpc_services: [{ envoy_grpc: { cluster_name: cluster } }] },
  resource_api_version: 'V3',
});

function tlsListener(name: string, port: number, secret: string, cluster: string): Resource {
  const hcm = packAny('envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager', {
    stat_prefix: name,
    route_config: { virtual_hosts: [{ name: 'all', domains: ['*'], routes: [{ match: { prefix: '/' }, direct_response: { status: 200, body: { inline_string: 'ok' } } }] }] },
    http_filters: [{ name: 'envoy.filters.http.router', typed_config: packAny('envoy.extensions.filters.http.router.v3.Router', {}) }],
  });
  const ctx = packAny('envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext', {
    common_tls_context: { tls_certificate_sds_secret_configs: [{ name: secret, sds_config: SDS(cluster) }] },
  });
  return {
    name,
    any: packAny('envoy.config.listener.v3.Listener', {
      name,
      address: { socket_address: { address: '127.0.0.1', port_value: port } },
      filter_chains: [{ filters: [{ name: 'envoy.filters.network.http_connection_manager', typed_config: hcm }], transport_socket: { name: 'envoy.transport_sockets.tls', typed_config: ctx } }],
    }),
  };
}

function servedSerial(port: number): Promise<string> {
  return new Promise((resolve) => {
    const s = tls.connect({ host: '127.0.0.1', port, rejectUnauthorized: false }, () => {
      resolve(s.getPeerX509Certificate()?.serialNumber ?? '');
      s.destroy();
    });
    s.on('error', () => resolve(''));
  });
}

test('SPIRE-style workload socket and a credential socket: Envoy gets its identity from the other server, file certificates from the agent', async () => {
  const dir = tempDir('pa-knobs-extsds-');
  const root = await makeRoot('spire root');
  const external = await makeLeaf(root, { uri: 'spiffe://example.org/ns/ns/sa/web' });
  const fileCert = await makeLeaf(root, { dns: ['gateway.example'] });
  const ext = path.join(dir.path, 'external');
  fs.mkdirSync(ext);
  fs.writeFileSync(path.join(ext, 'cert-chain.pem'), external.certPem);
  fs.writeFileSync(path.join(ext, 'key.pem'), external.keyPem, { mode: 0o600 });
  fs.writeFileSync(path.join(ext, 'root-cert.pem'), root.pem);
  fs.writeFileSync(path.join(dir.path, 'gw.pem'), fileCert.certPem);
  fs.writeFileSync(path.join(dir.path, 'gw.key'), fileCert.keyPem, { mode: 0o600 });
  const spireSock = path.join(dir.path, 'var/run/secrets/workload-spiffe-uds/spire.sock');
  const credSock = path.join(dir.path, 'var/run/secrets/credential-uds/socket');
  fs.mkdirSync(path.dirname(spireSock), { recursive: true });
  fs.mkdirSync(path.dirname(credSock), { recursive: true });
  const cache = new SecretCache({ identity: 'spiffe://example.org/ns/ns/sa/web', algorithm: { kind: 'ECDSA' }, ttlMs: 3600_000, graceRatio: 0.5, graceJitter: 0, mountedDir: ext });
  const spire = new SdsServer({ socketPath: spireSock, provider: cache });
  cache.onUpdate((n) => spire.push(n));
  const cred = net.createServer((c) => c.destroy());
  const cp = new ControlPlane();
  const agent = await agentFixture({ dir });
  try {
    await spire.start();
    await cache.start();
    await new Promise<void>((r) => cred.listen(credSock, r));
    await cp.start();
    // Answered at once (an empty delta set is sent only to a new subscription), so Envoy goes on to ask for listeners.
    cp.set(CLUSTER, 'c1', []);
    const configPath = path.join(dir.path, 'proxy');
    await agent.start({
      proxyConfig: { discoveryAddress: cp.address, controlPlaneAuthPolicy: 'NONE' },
      env: { WORKLOAD_IDENTITY_SOCKET_FILE: 'spire.sock', POD_NAME: 'web-1', POD_NAMESPACE: 'ns' },
      ready: 'none',
    });
    await waitFor('Envoy subscribes', () => cp.requests.some((r) => r.typeUrl === CLUSTER), 20_000)
      .catch((e: Error) => { throw new Error(`${e.message}\n${agent.log()}`); });
    const boot = JSON.parse(fs.readFileSync(path.join(configPath, 'envoy-rev0.json'), 'utf8'));
    const pipe = (name: string) => boot.static_resources.clusters.find((c: { name: string }) => c.name === name)?.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.pipe.path;
    assert.is(pipe('sds-grpc'), './var/run/secrets/workload-spiffe-uds/spire.sock');
    assert.is(pipe('sds-files-grpc'), './var/run/secrets/credential-uds/files-socket');
    assert.is(boot.node.metadata.credential, 'true');
    assert.is(boot.node.metadata['file-credential'], 'true');
    assert.is(boot.node.metadata.WORKLOAD_IDENTITY_SOCKET_FILE, 'spire.sock');

    const [p1, p2] = [await freePort(), await freePort()];
    cp.set(LISTENER, 'l1', [
      tlsListener('workload', p1, 'default', 'sds-grpc'),
      tlsListener('gateway', p2, `file-cert:${path.join(dir.path, 'gw.pem')}~${path.join(dir.path, 'gw.key')}`, 'sds-files-grpc'),
    ]);
    const serial = (pem: string) => new X509Certificate(pem).serialNumber;
    await waitFor('Envoy serves the external server\'s certificate', async () => (await servedSerial(p1)) === serial(external.certPem), 20_000, 200)
      .catch((e: Error) => { throw new Error(`${e.message}\n${agent.log()}`); });
    await waitFor('Envoy serves the file certificate from the agent\'s files socket', async () => (await servedSerial(p2)) === serial(fileCert.certPem), 20_000, 200)
      .catch((e: Error) => { throw new Error(`${e.message}\n${agent.log()}`); });
    assert.ok(fs.existsSync(path.join(dir.path, 'var/run/secrets/credential-uds/files-socket')));
    assert.not.ok(fs.existsSync(path.join(dir.path, 'var/run/secrets/workload-spiffe-uds/socket')), 'the agent does not listen on the default socket');
  } finally {
    await agent.close();
    await cp.stop();
    await spire.close();
    await cache.close();
    cred.close();
  }
});

test('a credential socket nobody answers on is removed, and the metadata says nothing of it', async () => {
  const dir = tempDir('pa-knobs-credstale-');
  const credSock = path.join(dir.path, 'var/run/secrets/credential-uds/socket');
  fs.mkdirSync(path.dirname(credSock), { recursive: true });
  // A socket file left by a process that is gone.
  execFileSync('python3', ['-c', 'import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])', credSock]);
  const cp = new ControlPlane();
  const agent = await agentFixture({ dir });
  try {
    await cp.start();
    const configPath = path.join(dir.path, 'proxy');
    await agent.start({
      proxyConfig: { discoveryAddress: cp.address, controlPlaneAuthPolicy: 'NONE' },
      env: { POD_NAME: 'web-1', POD_NAMESPACE: 'ns', FILE_MOUNTED_CERTS: 'true' },
      ready: 'none',
    });
    await waitFor('Envoy subscribes', () => cp.requests.some((r) => r.typeUrl === CLUSTER), 20_000)
      .catch((e: Error) => { throw new Error(`${e.message}\n${agent.log()}`); });
    assert.not.ok(fs.existsSync(credSock), 'the stale socket is gone');
    const boot = JSON.parse(fs.readFileSync(path.join(configPath, 'envoy-rev0.json'), 'utf8'));
    assert.is(boot.node.metadata.credential, undefined);
    assert.is(boot.node.metadata['file-credential'], undefined);
    assert.not.ok(boot.static_resources.clusters.some((c: { name: string }) => c.name === 'sds-files-grpc'));
  } finally {
    await agent.close();
    await cp.stop();
  }
});

test.run();
