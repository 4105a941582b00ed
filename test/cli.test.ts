// The agent executable's command line: version, bootstrap, proxy with the generated bootstrap and the real
// Envoy, wait, request, and every startup error (one line naming the field, non-zero exit, nothing started).

import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { execFile } from 'node:child_process';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as path from 'node:path';
import { agentBin } from './helpers/agent';
import { agentFixture } from './helpers/agent-fixture';
import { envoyBin, freePort, httpRequest, pidAlive, tempDir, waitFor } from './helpers/harness';

function run(args: string[], env: Record<string, string>, cwd: string): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(agentBin(), args, { cwd, env, timeout: 30_000 }, (err, stdout, stderr) => {
      const code = err ? ((err as unknown as { code: number }).code ?? 1) : 0;
      resolve({ code: typeof code === 'number' ? code : 1, stdout, stderr });
    });
  });
}

const cli = suite('cli');

cli('version works from any directory with an empty environment', async () => {
  const r = await run(['version'], {}, '/');
  assert.is(r.code, 0);
  assert.match(r.stdout, /^pilot-agent version \d+\.\d+\.\d+/);
  const v = await run(['--version'], {}, '/');
  assert.is(v.code, 0);
  assert.match(v.stdout, /^\d+\.\d+\.\d+/);
});

cli('bootstrap prints the bootstrap proxy would write', async () => {
  const dir = tempDir();
  try {
    const r = await run(['bootstrap', 'router', '--unknownFlag=1'], { POD_NAME: 'gw-1', POD_NAMESPACE: 'edge', INSTANCE_IP: '10.0.0.7' }, dir.path);
    assert.is(r.code, 0, r.stderr);
    const b = JSON.parse(r.stdout);
    assert.is(b.node.id, 'router~10.0.0.7~gw-1.edge~edge.svc.cluster.local');
    assert.is(b.admin.address.socket_address.address, '127.0.0.1');
  } finally {
    dir.cleanup();
  }
});

cli('typos and missing values are usage errors: one line, exit 2; unknown flags stay accepted', async () => {
  for (const args of [['frobnicate'], ['proxyy'], ['proxy', '--standalone'], ['proxy', '--concurrency'], ['completion']]) {
    const r = await run(args, {}, '/');
    assert.is(r.code, 2, `${args.join(' ')}: ${r.stderr}`);
    assert.is(r.stderr.trim().split('\n').length, 1, r.stderr);
    assert.match(r.stderr, /^error: .*\(see pilot-agent --help\)$/m);
    assert.is(r.stdout, '');
  }
  assert.is((await run(['version', '--someUnknownFlag'], {}, '/')).code, 0);
});

cli('version -s and -o json|yaml, as the Go agent offers them', async () => {
  assert.match((await run(['version', '-s'], {}, '/')).stdout, /^\d+\.\d+\.\d+\n$/);
  const j = JSON.parse((await run(['version', '-o', 'json'], {}, '/')).stdout);
  assert.match(j.clientVersion.version, /^\d+\.\d+\.\d+/);
  assert.match((await run(['version', '-o', 'yaml'], {}, '/')).stdout, /^clientVersion:\n {2}version: \d/);
});

cli('waypoint is a proxy type (node id waypoint~...), and a flag given twice takes the last value', async () => {
  const r = await run(['bootstrap', 'waypoint', '--concurrency', '2', '--concurrency', '3'], { POD_NAME: 'wp', POD_NAMESPACE: 'ns', INSTANCE_IP: '10.1.2.3' }, '/');
  assert.is(r.code, 0, r.stderr);
  const b = JSON.parse(r.stdout);
  assert.match(b.node.id, /^waypoint~10\.1\.2\.3~wp\.ns~/);
});

cli('a large output through a pipe is complete, and a reader that goes away ends the agent quietly', async () => {
  const dir = tempDir();
  try {
    // 400 KB of node metadata (ISTIO_META_*) lands in the bootstrap: far past a pipe's 64 KiB buffer.
    const env: Record<string, string> = { POD_NAME: 'p', POD_NAMESPACE: 'ns', INSTANCE_IP: '10.0.0.1' };
    for (let i = 0; i < 4; i++) env[`ISTIO_META_BIG${i}`] = 'x'.repeat(100_000);
    const whole = await new Promise<{ code: number; out: string; err: string }>((resolve) => {
      execFile('bash', ['--norc', '--noprofile', '-c', `"${agentBin()}" bootstrap | cat`], { cwd: dir.path, env, maxBuffer: 64 * 1024 * 1024 }, (e, out, err) => resolve({ code: e ? 1 : 0, out, err }));
    });
    assert.is(whole.code, 0, whole.err);
    assert.ok(whole.out.length > 400_000, `got ${whole.out.length} bytes`);
    assert.ok(JSON.parse(whole.out).node, 'the whole JSON arrived');
    const head = await new Promise<{ out: string; err: string; rc: string }>((resolve) => {
      execFile('bash', ['--norc', '--noprofile', '-c', `set -o pipefail; "${agentBin()}" bootstrap | head -c 10; echo " rc=\${PIPESTATUS[0]}"`], { cwd: dir.path, env }, (_e, out, err) => resolve({ out, err, rc: out }));
    });
    assert.is(head.err, '', 'no EPIPE stack trace');
    assert.match(head.out, / rc=0$/m);
  } finally {
    dir.cleanup();
  }
});

const bad = suite('bad input');

interface BadCase {
  name: string;
  args?: string[];
  env?: Record<string, string>;
  files?: Record<string, string | { mode: number; text: string }>;
  want: RegExp;
  /** Found by the first Envoy's failed start (the first bootstrap is not validated before the spawn): logged, then exit 1. */
  afterSpawn?: true;
}

const REJECTED_BOOTSTRAP = '{"static_resources": {"listeners": [{"name": "x", "address": {"socket_address": {"port_value": "nope"}}}]}}';

const CASES: BadCase[] = [
  { name: 'malformed PROXY_CONFIG', env: { PROXY_CONFIG: '{"drainDuration": ' }, want: /PROXY_CONFIG/ },
  { name: 'malformed mesh file', args: ['--meshConfig', 'mesh.yaml'], files: { 'mesh.yaml': 'defaultConfig: {drainDuration: [' }, want: /mesh config mesh\.yaml/ },
  { name: 'unknown proxy type', args: ['gateway'], want: /unknown proxy type "gateway"/ },
  { name: 'bad duration', env: { PROXY_CONFIG: '{"terminationDrainDuration": "soon"}' }, want: /terminationDrainDuration \(from environment variable PROXY_CONFIG\)/ },
  { name: 'port out of range', env: { PROXY_CONFIG: '{"proxyAdminPort": 70000}' }, want: /proxyAdminPort .*out of range/ },
  { name: 'missing Envoy binary', env: { PROXY_CONFIG: '{"binaryPath": "/nonexistent/envoy"}' }, want: /binaryPath .*\/nonexistent\/envoy does not exist/ },
  { name: 'non-executable Envoy binary', env: { PROXY_CONFIG: '{"binaryPath": "ENVOY_NOEXEC"}' }, files: { envoy: { mode: 0o644, text: 'not a program' } }, want: /binaryPath .*is not executable/ },
  { name: 'a bootstrap Envoy rejects', env: { PROXY_CONFIG: '{"customConfigFile": "CUSTOM"}' }, files: { 'custom.json': REJECTED_BOOTSTRAP }, want: /Envoy rejects the bootstrap/, afterSpawn: true },
  { name: 'an Envoy binary that is not a program', env: { PROXY_CONFIG: '{"binaryPath": "ENVOY_NOEXEC"}' }, files: { envoy: { mode: 0o755, text: 'not a program' } }, want: /binaryPath .*cannot run/, afterSpawn: true },
  { name: 'a bootstrap Envoy rejects, validated before the spawn', env: { PROXY_CONFIG: '{"customConfigFile": "CUSTOM"}', ENVOY_VALIDATE_FIRST_BOOTSTRAP: 'true' }, files: { 'custom.json': REJECTED_BOOTSTRAP }, want: /Envoy rejects the bootstrap/ },
  { name: 'an Envoy binary that is not a program, validated before the spawn', env: { PROXY_CONFIG: '{"binaryPath": "ENVOY_NOEXEC"}', ENVOY_VALIDATE_FIRST_BOOTSTRAP: 'true' }, files: { envoy: { mode: 0o755, text: 'not a program' } }, want: /binaryPath .*cannot run/ },
  { name: 'unwritable configPath', env: { PROXY_CONFIG: '{"configPath": "/dev/null/proxy"}' }, want: /configPath .*\/dev\/null\/proxy is not a writable directory/ },
];

for (const c of CASES) {
  const title = c.afterSpawn ? `${c.name}: the first Envoy's failure ends the agent (exit 1) naming the reason, no retries` : `${c.name}: one clear error line, non-zero exit, nothing started`;
  bad(title, async () => {
    const dir = tempDir();
    try {
      for (const [name, content] of Object.entries(c.files ?? {})) {
        const f = path.join(dir.path, name);
        if (typeof content === 'string') fs.writeFileSync(f, content);
        else fs.writeFileSync(f, content.text, { mode: content.mode });
      }
      const configPath = path.join(dir.path, 'proxy');
      const base = { configPath, binaryPath: envoyBin(), statusPort: await freePort(), proxyAdminPort: await freePort() };
      const overrides = c.env?.PROXY_CONFIG;
      let proxyConfig = JSON.stringify(base);
      if (overrides) {
        try {
          proxyConfig = JSON.stringify({ ...base, ...JSON.parse(overrides.replace('ENVOY_NOEXEC', path.join(dir.path, 'envoy')).replace('CUSTOM', path.join(dir.path, 'custom.json'))) });
        } catch {
          proxyConfig = overrides; // deliberately malformed
        }
      }
      const r = await run(['proxy', ...(c.args ?? [])], { ...c.env, PROXY_CONFIG: proxyConfig, POD_NAME: 'p', POD_NAMESPACE: 'ns' }, dir.path);
      assert.is.not(r.code, 0);
      const lines = r.stderr.trim().split('\n');
      if (c.afterSpawn) {
        assert.is(r.code, 1);
        assert.match(lines[lines.length - 1]!, /agent exiting with code 1: /);
        assert.match(lines[lines.length - 1]!, c.want);
        assert.not.match(r.stderr, /restart budget left 8/, 'ended at the first failure, not after the retries');
        const rest = fs.existsSync(configPath) ? fs.readdirSync(configPath).filter((f) => f.endsWith('.json')) : [];
        assert.equal(rest, [], 'no bootstrap file left');
        return;
      }
      assert.is(lines.length, 1, `one error line, got:\n${r.stderr}`);
      assert.match(lines[0]!, /^error: /);
      assert.match(lines[0]!, c.want);
      const left = fs.existsSync(configPath) ? fs.readdirSync(configPath) : [];
      assert.equal(left, [], 'no bootstrap file, partial or whole');
    } finally {
      dir.cleanup();
    }
  });
}

const proxy = suite('proxy with the generated bootstrap');

proxy('proxy writes envoy-rev0.json and starts the real Envoy, whose admin answers', async () => {
  const agent = await agentFixture();
  const { dir, ports: { admin, status } } = agent;
  try {
    await agent.start({
      args: ['proxy', '--concurrency', '1', '--proxyLogLevel', 'info,misc:error', '--someIstioFlagWeDoNotKnow', 'x'],
      proxyConfig: {
        discoveryAddress: '127.0.0.1:1',
        drainDuration: undefined, parentShutdownDuration: undefined, terminationDrainDuration: undefined,
      },
      env: { POD_NAME: 'web-1', POD_NAMESPACE: 'shop', INSTANCE_IP: '10.20.30.40', ISTIO_META_APP: 'web' },
      ready: 'none',
    });
    const info = await waitFor('Envoy /server_info', async () => {
      const r = await httpRequest(`http://127.0.0.1:${admin}/server_info`);
      return r.status === 200 ? JSON.parse(r.body) : undefined;
    }, 20_000);
    assert.is(info.node.id, 'sidecar~10.20.30.40~web-1.shop~shop.svc.cluster.local');
    assert.is(info.node.metadata.APP, 'web');
    assert.is(info.command_line_options.restart_epoch, 0);
    assert.is(info.command_line_options.concurrency, 1);
    assert.not.ok(info.command_line_options.disable_hot_restart, 'hot restart enabled');
    const rev0 = path.join(dir.path, 'proxy', 'envoy-rev0.json');
    assert.ok(fs.existsSync(rev0));
    assert.is(JSON.parse(fs.readFileSync(rev0, 'utf8')).node.id, info.node.id);
    // No xDS server answers: Envoy is up but not ready, and the agent says so (once its status server listens: it
    // starts after the CA request and the xDS proxy's loading, which can be after Envoy's admin is up).
    const ready = await waitFor('the status server', () => httpRequest(`http://127.0.0.1:${status}/healthz/ready`), 10_000);
    assert.is(ready.status, 503);
  } finally {
    try {
      const pids = await httpRequest(`http://127.0.0.1:${status}/debug/epochs`).then((r) => JSON.parse(r.body).epochs.map((e: { pid: number }) => e.pid), () => []);
      agent.proc.kill('SIGTERM');
      await waitFor('agent exit', () => agent.exited, 15_000);
      for (const pid of pids) assert.not.ok(pidAlive(pid), 'Envoy gone after the agent');
      assert.equal(fs.readdirSync(path.join(dir.path, 'proxy')), [], 'bootstrap removed at exit');
      await agent.stop();
    } finally {
      await agent.close();
    }
  }
});

const clients = suite('wait and request');

function server(handler: http.RequestListener, port = 0): Promise<{ s: http.Server; port: number }> {
  const s = http.createServer(handler);
  return new Promise((resolve, reject) => {
    s.once('error', reject);
    s.listen(port, '127.0.0.1', () => resolve({ s, port: (s.address() as { port: number }).port }));
  });
}

clients('wait returns 0 once ready, 1 on timeout', async () => {
  let n = 0;
  const { s, port } = await server((_q, r) => {
    r.statusCode = ++n >= 3 ? 200 : 503;
    r.end();
  });
  try {
    const ok = await run(['wait', `--url=http://127.0.0.1:${port}/healthz/ready`, '--periodMillis=50'], {}, '/');
    assert.is(ok.code, 0, ok.stderr);
    assert.match(ok.stderr, /Envoy is ready/);
    n = -1000;
    const late = await run(['wait', `--url=http://127.0.0.1:${port}/healthz/ready`, '--periodMillis=50', '--timeoutSeconds=1'], {}, '/');
    assert.is(late.code, 1);
    assert.match(late.stderr, /timeout waiting for Envoy proxy to become ready.*503/);
  } finally {
    s.close();
  }
});

clients('request prints the raw body from an allowed local port and refuses others', async () => {
  let seen = '';
  const { s } = await server((q, r) => {
    let body = '';
    q.on('data', (c) => (body += c));
    q.on('end', () => {
      seen = `${q.method} ${q.url} ${body}`;
      r.end('raw-body\n');
    });
  }, 15004);
  try {
    const r = await run(['request', 'POST', 'drain_listeners?graceful', 'payload', '--debug-port', '15004'], {}, '/');
    assert.is(r.code, 0, r.stderr);
    assert.is(r.stdout, 'raw-body\n');
    assert.is(seen, 'POST /drain_listeners?graceful payload');
    const refused = await run(['request', 'GET', '/stats', '--debug-port', '8080'], {}, '/');
    assert.is(refused.code, 1);
    assert.match(refused.stderr, /not allowed/);
  } finally {
    s.close();
  }
});

cli.run();
bad.run();
proxy.run();
clients.run();
