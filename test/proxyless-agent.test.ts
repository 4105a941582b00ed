// DISABLE_ENVOY=true (Istio's grpc-agent template): the agent runs with no Envoy at all (its binaryPath does not
// even exist), writes the gRPC xDS bootstrap at GRPC_XDS_BOOTSTRAP and the workload certificate files at
// OUTPUT_CERTS for gRPC's file_watcher provider, is ready once those files exist (Istio's grpcready), and ends on
// SIGTERM with exit 0.

import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { agentFixture, type StartOptions } from './helpers/agent-fixture';
import { httpRequest, waitFor } from './helpers/harness';

/** start() options for DISABLE_ENVOY: no Envoy to run, so none of its ports or drain settings. */
function proxyless(dir: string, extra: Record<string, string>, proxyConfig: Record<string, unknown> = {}): StartOptions {
  const none = { proxyAdminPort: undefined, drainDuration: undefined, parentShutdownDuration: undefined, terminationDrainDuration: undefined };
  return {
    proxyConfig: { binaryPath: path.join(dir, 'no-such-envoy'), ...none, ...proxyConfig },
    env: { DISABLE_ENVOY: 'true', POD_NAME: 'echo-1', SERVICE_ACCOUNT: 'echo', ENVOY_STATUS_PORT: undefined, ENVOY_PROMETHEUS_PORT: undefined, ...extra },
  };
}

test('DISABLE_ENVOY: no Envoy, the gRPC bootstrap and certificate files written (and rotated), ready, SIGTERM exits 0', async () => {
  const agent = await agentFixture({ prefix: 'pa-proxyless-' });
  const { dir } = agent;
  const cfgDir = path.join(dir.path, 'mesh');
  agent.writeTokens(cfgDir, { echo: 'echo-token' }, 'echo');
  const certs = path.join(dir.path, 'var/lib/istio/data');
  try {
    await agent.start({ args: ['proxy', 'sidecar', '--standalone', cfgDir], ...proxyless(dir.path, { OUTPUT_CERTS: certs, ISTIO_META_CLUSTER_ID: 'Kubernetes', SECRET_TTL: '6s' }) });
    // Istio's default location, relative to the working directory.
    const file = path.join(dir.path, 'etc/istio/proxy/grpc-bootstrap.json');
    assert.is(fs.statSync(file).mode & 0o777, 0o644);
    assert.is(fs.statSync(path.dirname(file)).mode & 0o777, 0o700);
    const b = JSON.parse(fs.readFileSync(file, 'utf8'));
    assert.is(b.xds_servers[0].server_uri, `unix://${path.join(dir.path, 'proxy', 'XDS')}`);
    assert.is(b.node.id, 'sidecar~127.0.0.1~echo-1.test~test.svc.cluster.local');
    assert.is(b.node.metadata.GENERATOR, 'grpc');
    assert.is(b.node.metadata.CLUSTER_ID, 'Kubernetes');
    assert.equal(b.node.locality, {});
    assert.equal(b.certificate_providers.default.config.certificate_file, path.join(certs, 'cert-chain.pem'));
    for (const f of ['cert-chain.pem', 'key.pem', 'root-cert.pem']) assert.is(fs.statSync(path.join(certs, f)).mode & 0o777, 0o600, f);
    assert.match(fs.readFileSync(path.join(certs, 'cert-chain.pem'), 'utf8'), /BEGIN CERTIFICATE/);
    // The xDS proxy serves the XDS socket; nothing for Envoy was written or bound.
    assert.ok(fs.statSync(path.join(dir.path, 'proxy', 'XDS')).isSocket());
    assert.not.ok(fs.existsSync(path.join(dir.path, 'proxy', 'envoy-rev0.json')), 'no Envoy bootstrap');
    assert.not.ok(fs.existsSync(path.join(dir.path, 'var/run/secrets/workload-spiffe-uds/socket')), 'no SDS socket');
    assert.match(agent.log(), /starting proxyless \(DISABLE_ENVOY\)/);
    // Rotation (SECRET_TTL 6 s) rewrites the files gRPC's file_watcher re-reads.
    const first = fs.readFileSync(path.join(certs, 'cert-chain.pem'), 'utf8');
    await waitFor('a rotated certificate file', () => fs.readFileSync(path.join(certs, 'cert-chain.pem'), 'utf8') !== first, 20_000, 200);
  } finally {
    try {
      agent.proc.kill('SIGTERM');
      const exit = await waitFor('agent exit', () => agent.exited, 15_000);
      await agent.stop();
      const log = agent.log();
      assert.is(exit.code, 0, log.slice(-2000));
      assert.match(log, /agent exiting with code 0: SIGTERM/);
    } finally {
      await agent.close();
    }
  }
});

test('DISABLE_ENVOY: not ready while the file_watcher certificate files do not exist (CA unreachable); app probes answered', async () => {
  const agent = await agentFixture({ prefix: 'pa-proxyless-' });
  const { dir, ports: { status } } = agent;
  const certs = path.join(dir.path, 'certs');
  const boot = path.join(dir.path, 'boot', 'grpc.json');
  const app = net.createServer((c) => c.destroy());
  await new Promise<void>((r) => app.listen(0, '127.0.0.1', r));
  const probers = JSON.stringify({ '/app-health/app/livez': { tcpSocket: { port: (app.address() as net.AddressInfo).port } } });
  try {
    await agent.start({ args: ['proxy', 'sidecar'], ...proxyless(dir.path, { OUTPUT_CERTS: certs, GRPC_XDS_BOOTSTRAP: boot, CA_ADDR: '127.0.0.1:1', ISTIO_KUBE_APP_PROBERS: probers }, { discoveryAddress: '127.0.0.1:1' }), ready: 'none' });
    const r = await waitFor('a readiness answer', async () => {
      const x = await httpRequest(`http://127.0.0.1:${status}/healthz/ready`).catch(() => undefined);
      return x && x.status !== 0 ? x : undefined;
    }, 20_000).catch((e: Error) => { throw new Error(`${e.message}\n${agent.log()}`); });
    assert.is(r.status, 503);
    assert.match(r.body, new RegExp(`${path.join(certs, 'cert-chain.pem')} does not exist`));
    assert.ok(fs.existsSync(boot), 'bootstrap at GRPC_XDS_BOOTSTRAP');
    assert.not.ok(fs.existsSync(path.join(dir.path, 'etc/istio/proxy/grpc-bootstrap.json')));
    // The app's rewritten probes are answered with no Envoy too.
    assert.is((await httpRequest(`http://127.0.0.1:${status}/app-health/app/livez`)).status, 200);
  } finally {
    try {
      app.close();
      agent.proc.kill('SIGTERM');
      const exit = await waitFor('agent exit', () => agent.exited, 15_000);
      await agent.stop();
      const log = agent.log();
      assert.is(exit.code, 0, log.slice(-2000));
    } finally {
      await agent.close();
    }
  }
});

test('beside Envoy the gRPC bootstrap is written too (an app may use proxyless gRPC next to the sidecar), and removed at exit', async () => {
  const agent = await agentFixture({ prefix: 'pa-proxyless-' });
  const { dir } = agent;
  const file = path.join(dir.path, 'etc/istio/proxy/grpc-bootstrap.json');
  try {
    await agent.start({
      proxyConfig: { discoveryAddress: '127.0.0.1:1' },
      env: { POD_NAME: 'web-1' },
      ready: () => fs.existsSync(file),
      readyTimeoutMs: 20_000,
    });
    const b = JSON.parse(fs.readFileSync(file, 'utf8'));
    assert.is(b.node.id, 'sidecar~127.0.0.1~web-1.test~test.svc.cluster.local');
    assert.is(b.xds_servers[0].server_uri, `unix://${path.join(dir.path, 'proxy', 'XDS')}`);
  } finally {
    try {
      agent.proc.kill('SIGTERM');
      const exit = await waitFor('agent exit', () => agent.exited, 20_000);
      await agent.stop();
      const left = fs.existsSync(file);
      assert.is(exit.code, 0, agent.log().slice(-2000));
      assert.not.ok(left, 'removed at exit');
    } finally {
      await agent.close();
    }
  }
});

/** Runs a command as uid/gid 65534 (another local user than the agent's); its stdout, or the error's stderr. */
function asNobody(cmd: string[]): { ok: boolean; out: string } {
  try {
    return { ok: true, out: execFileSync('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', ...cmd], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }) };
  } catch (e) {
    return { ok: false, out: String((e as { stderr?: string }).stderr ?? e) };
  }
}

test('security: another local uid reads the gRPC bootstrap (no secret in it) but neither the key files nor the XDS socket', async () => {
  const agent = await agentFixture({ prefix: 'pa-proxyless-' });
  const { dir } = agent;
  fs.chmodSync(dir.path, 0o755);
  const cfgDir = path.join(dir.path, 'mesh');
  agent.writeTokens(cfgDir, { echo: 'echo-token' }, 'echo');
  // The directories as a pod's shared volumes have them (traversable): the files' own modes are what is tested.
  const certs = path.join(dir.path, 'certs');
  for (const d of [certs, path.join(dir.path, 'etc/istio/proxy'), path.join(dir.path, 'proxy')]) fs.mkdirSync(d, { recursive: true, mode: 0o755 });
  for (const d of [path.join(dir.path, 'etc'), path.join(dir.path, 'etc/istio'), path.join(dir.path, 'etc/istio/proxy'), certs, path.join(dir.path, 'proxy')]) fs.chmodSync(d, 0o755);
  try {
    await agent.start({ args: ['proxy', 'sidecar', '--standalone', cfgDir], ...proxyless(dir.path, { OUTPUT_CERTS: certs }) });
    const boot = asNobody(['cat', path.join(dir.path, 'etc/istio/proxy/grpc-bootstrap.json')]);
    assert.ok(boot.ok, boot.out);
    assert.not.match(boot.out, /PRIVATE KEY|echo-token/);
    for (const f of ['key.pem', 'cert-chain.pem', 'root-cert.pem']) {
      const r = asNobody(['cat', path.join(certs, f)]);
      assert.not.ok(r.ok, `${f} readable by another uid`);
      assert.match(r.out, /Permission denied/);
    }
    const connect = `require('net').connect(${JSON.stringify(path.join(dir.path, 'proxy', 'XDS'))}).on('connect', () => process.exit(0)).on('error', (e) => { console.error(e.code); process.exit(1); })`;
    const sock = asNobody([process.execPath, '-e', connect]);
    assert.not.ok(sock.ok, 'XDS socket reachable by another uid');
    assert.match(sock.out, /EACCES/, sock.out);
  } finally {
    try {
      agent.proc.kill('SIGTERM');
      await waitFor('agent exit', () => agent.exited, 15_000);
      await agent.stop();
    } finally {
      await agent.close();
    }
  }
});

test.run();
