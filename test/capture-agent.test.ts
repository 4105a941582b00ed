// The whole agent (dist/pilot-agent) as a standalone sidecar in capture mode on a "VM" (a network namespace made by
// the test, joined to a "remote host" namespace by a veth pair), set up as README's "VM with capture": the
// injector's istio-iptables rules plus --redirect-dns, the agent with group 1337, Envoy as 1337, the example config
// (examples/standalone/config) and its two backends on the VM's loopback, and an app running as nobody.

import { type ChildProcess, execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { agentBin } from './helpers/agent';
import { agentFixture, type AgentFixture } from './helpers/agent-fixture';
import { tempDir, waitFor } from './helpers/harness';
import { createNetns, type Netns } from './helpers/netns';

const REPO = path.resolve(__dirname, '..');
const VM_IP = '10.99.0.2';
const REMOTE_IP = '10.99.0.3';
const APP_PORT = 7070;

// A server that says which port it is and how many requests it has had, and who called it.
const SERVER = (host: string, ports: number[], label: string) => `
const http = require('http'); let n = 0;
for (const p of ${JSON.stringify(ports)}) http.createServer((q, s) => {
  n++; s.end('${label} ' + p + ' ' + n + ' from ' + q.socket.remoteAddress + (q.headers['x-forwarded-client-cert'] ? ' xfcc ' + q.headers['x-forwarded-client-cert'] : ''));
}).listen(p, '${host}');`;

interface Setup {
  vm: Netns;
  remote: Netns;
  config: string;
  agentLog(): string;
  /** curl as the app (uid nobody) in the VM: [exit code, body]. */
  app(...args: string[]): Promise<[number, string]>;
  /** A counter from Envoy's admin /stats. */
  stat(name: string): Promise<number>;
  stop(): Promise<void>;
}

/** `configs`: more files for the config directory; `env`: more agent variables; `prepare(dir)`: before the agent starts. */
async function start(opts: { configs?: Record<string, string>; env?: Record<string, string>; prepare?: (dir: string) => void } = {}): Promise<Setup> {
  const bin = agentBin();
  const tmp = tempDir('pa-capture-');
  const children: ChildProcess[] = [];
  let vm: Netns | undefined;
  let remote: Netns | undefined;
  let fixture: AgentFixture | undefined;
  let out = '';
  const stop = async () => {
    await fixture?.close(15_000);
    for (const c of children.reverse()) {
      if (c.exitCode !== null || c.signalCode !== null) continue;
      const exited = new Promise((r) => c.once('exit', r));
      c.kill('SIGTERM');
      const t = setTimeout(() => c.kill('SIGKILL'), 15_000);
      await exited;
      clearTimeout(t);
    }
    vm?.remove();
    remote?.remove();
    tmp.cleanup();
  };
  try {
    // The VM's resolver is never reached: mesh names are answered by the agent through the DNS capture rule.
    vm = createNetns('pacapvm', { 'resolv.conf': `nameserver ${REMOTE_IP}\noptions timeout:2 attempts:1\n` });
    remote = createNetns('pacaprm');
    execFileSync('ip', ['-n', vm.name, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', remote.name]);
    for (const [ns, addr] of [[vm, VM_IP], [remote, REMOTE_IP]] as const) {
      execFileSync('ip', ['-n', ns.name, 'addr', 'add', `${addr}/24`, 'dev', 'eth0']);
      execFileSync('ip', ['-n', ns.name, 'link', 'set', 'eth0', 'up']);
    }
    // As on any VM, a default route: the kernel needs a route to a VIP (240.240/16) before the capture rule runs.
    execFileSync('ip', ['-n', vm.name, 'route', 'add', 'default', 'via', REMOTE_IP]);
    const config = path.join(tmp.path, 'config');
    fs.cpSync(path.join(REPO, 'examples/standalone/config'), config, { recursive: true });
    // A TCP service on the remote host (no address: the DNS proxy answers an auto-allocated VIP).
    fs.writeFileSync(path.join(config, 'remote-tcp.yaml'), `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: remote-tcp, namespace: demo}
spec:
  hosts: [remote-tcp.example.local]
  ports: [{number: 9100, name: tcp, protocol: TCP}]
  location: MESH_EXTERNAL
  resolution: STATIC
  endpoints: [{address: ${REMOTE_IP}, ports: {tcp: 9000}}]
`);
    for (const [f, text] of Object.entries(opts.configs ?? {})) fs.writeFileSync(path.join(config, f), text);
    opts.prepare?.(tmp.path);
    fs.chmodSync(tmp.path, 0o755);
    fs.mkdirSync(path.join(tmp.path, 'proxy'));
    fs.chownSync(path.join(tmp.path, 'proxy'), 1337, 1337);

    // The injector's flags (istio/istio's sidecar template) plus --redirect-dns.
    const ipt = await vm.run(bin, ['istio-iptables', '-p', '15001', '-z', '15006', '-u', '1337', '-m', 'REDIRECT', '-i', '*', '-x', '', '-b', '*', '-d', '15090,15021,15020', '--redirect-dns']);
    assert.is(ipt.code, 0, `istio-iptables: ${ipt.stdout}${ipt.stderr}`);

    const spawnIn = (ns: Netns, cmd: string, args: string[], env: Record<string, string> = {}) => {
      const c = ns.spawn(cmd, args, { cwd: tmp.path, stdio: ['ignore', 'pipe', 'pipe'], env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...env } });
      c.stdout!.on('data', (d) => (out += d));
      c.stderr!.on('data', (d) => (out += d));
      children.push(c);
      return c;
    };
    spawnIn(vm, process.execPath, [path.join(REPO, 'examples/standalone/backends.js')]);
    spawnIn(vm, 'setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', process.execPath, '-e', SERVER('0.0.0.0', [APP_PORT], 'app')]);
    spawnIn(remote, process.execPath, ['-e', SERVER(REMOTE_IP, [8080, 9000], 'remote')]);
    fixture = await agentFixture({ dir: tmp, netns: vm });
    const agent = (await fixture.start({
      args: ['proxy', 'sidecar', '--standalone', config],
      proxyConfig: {
        // Istio's bootstrap keeps no per-cluster stats unless asked; the test counts upstream connections.
        proxyStatsMatcher: { inclusionPrefixes: ['cluster.', 'listener.'] },
      },
      env: {
        POD_NAME: 'vm-1', POD_NAMESPACE: 'demo', INSTANCE_IP: VM_IP,
        ENVOY_UID: '1337', ENVOY_GID: '1337', ISTIO_META_DNS_CAPTURE: 'true', ISTIO_META_STANDALONE_CAPTURE: 'true',
        ...opts.env,
      },
      wrap: ['setpriv', '--regid=1337', '--clear-groups'],
      ready: 'none',
    })).proc;
    const f = fixture;
    const logs = () => out + f.log();
    const curlIn = async (ns: Netns, asApp: boolean, args: string[]): Promise<[number, string]> => {
      const cmd = ['curl', '-sS', '-m', '10', ...args];
      const r = asApp ? await ns.run('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', ...cmd]) : await ns.run(cmd[0]!, cmd.slice(1));
      return [r.code, r.stdout + (r.code ? r.stderr : '')];
    };
    await waitFor('the agent ready in the VM', async () => {
      if (agent.exitCode !== null) throw new Error(`the agent exited with ${agent.exitCode}`);
      return (await curlIn(vm!, false, ['-o', '/dev/null', '-w', '%{http_code}', 'http://127.0.0.1:15020/healthz/ready']))[1] === '200';
    }, 60_000, 250).catch((e: Error) => { throw new Error(`${e.message}\n${logs()}`); });
    const v = vm;
    return {
      vm: v,
      remote,
      config,
      agentLog: logs,
      app: (...args) => curlIn(v, true, args),
      stat: async (name) => {
        const body = (await curlIn(v, false, ['http://127.0.0.1:15000/stats']))[1];
        const line = body.split('\n').find((l) => l.startsWith(`${name}: `));
        return line ? Number(line.slice(name.length + 2)) : 0;
      },
      stop,
    };
  } catch (e) {
    await stop();
    throw e;
  }
}

test('capture mode on a VM: the app calls a mesh name through DNS and 15001, unknown destinations follow outboundTrafficPolicy, inbound reaches the app through 15006, Envoy\'s own connections are not looped', async () => {
  const s = await start();
  try {
    const ndsz = JSON.parse((await s.vm.run('curl', ['-sS', 'http://127.0.0.1:15020/debug/ndsz'])).stdout) as { table: Record<string, { ips: string[] }> };
    const vip = ndsz.table['backend.example.local']!.ips[0]!;
    assert.match(vip, /^240\.240\.\d+\.\d+$/);

    // By name: the DNS proxy answers the VIP, the connection to it is captured to 15001 and routed by the VirtualService.
    const [code, body] = await s.app('-w', '\n%{remote_ip}', 'http://backend.example.local:8080/');
    if (code !== 0) {
      const dbg = (await s.vm.run('curl', ['-sS', 'http://127.0.0.1:15000/listeners'])).stdout + (await s.vm.run('iptables-save', [])).stdout + (await s.vm.run('ss', ['-ltnp'])).stdout;
      assert.is(code, 0, `${body}\n${dbg}\n${s.agentLog()}`);
    }
    const lines = body.split('\n');
    const [text, remoteIp] = [lines[0], lines[lines.length - 1]];
    assert.match(text!, /^v[12] \/$/);
    assert.is(remoteIp, vip, 'the app connected to the VIP the DNS proxy answered');
    assert.equal(await s.app('-H', 'x-version: v2', 'http://backend.example.local:8080/'), [0, 'v2 /\n']);
    assert.equal(await s.app('http://backend.example.local:8080/v1/hello'), [0, 'v1 /hello\n'], 'prefix route with rewrite');
    const backendCx = (await s.stat('cluster.outbound|8080|v1|backend.example.local.upstream_rq_total')) + (await s.stat('cluster.outbound|8080|v2|backend.example.local.upstream_rq_total'));
    assert.is(backendCx, 3, 'three requests through Envoy\'s routes');

    // A TCP service: its VIP picks the tcp_proxy of 0.0.0.0_9100, to the endpoint's port.
    assert.match((await s.app('http://remote-tcp.example.local:9100/'))[1], new RegExp(`^remote 9000 \\d+ from ${VM_IP}$`));
    assert.is(await s.stat('cluster.outbound|9100||remote-tcp.example.local.upstream_cx_total'), 1);

    // ALLOW_ANY (the default): an unknown address passes through to where it was going, on any port.
    assert.match((await s.app(`http://${REMOTE_IP}:9000/`))[1], new RegExp(`^remote 9000 \\d+ from ${VM_IP}$`));
    assert.match((await s.app(`http://${REMOTE_IP}:8080/`))[1], /^remote 8080 /, 'an unknown Host on a mesh HTTP port goes through the allow_any route');
    // Each passthrough is exactly one upstream connection: a looped one would come back through 15001 again.
    assert.is(await s.stat('cluster.PassthroughCluster.upstream_cx_total'), 2);

    // Inbound: from the remote host to the app's port, captured to 15006 and passed on from 127.0.0.6.
    const [ic, inbound] = await curlIn(s.remote, `http://${VM_IP}:${APP_PORT}/`);
    assert.is(ic, 0, inbound);
    assert.match(inbound, new RegExp(`^app ${APP_PORT} 1 from 127\\.0\\.0\\.6$`), 'the app sees Envoy\'s inbound passthrough address');
    assert.is(await s.stat('cluster.InboundPassthroughCluster.upstream_cx_total'), 1, 'one inbound connection, not looped');

    // REGISTRY_ONLY (a Sidecar in the config directory): unknown addresses are closed, mesh names still work.
    fs.writeFileSync(path.join(s.config, 'sidecar.yaml'), `apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: demo}
spec:
  egress: [{hosts: ["*/*"]}]
  outboundTrafficPolicy: {mode: REGISTRY_ONLY}
`);
    await waitFor('REGISTRY_ONLY in force', async () => (await s.app(`http://${REMOTE_IP}:9000/`))[0] !== 0, 20_000, 300);
    const before = (await curlIn(s.remote, `http://${REMOTE_IP}:9000/`))[1];
    const [blockedCode, blocked] = await s.app(`http://${REMOTE_IP}:9000/`);
    assert.ok(blockedCode === 52 || blockedCode === 56, `refused, not timed out (curl ${blockedCode}: ${blocked})`);
    assert.equal(await s.app('-o', '/dev/null', '-w', '%{http_code}', `http://${REMOTE_IP}:8080/`), [0, '502']);
    const after = (await curlIn(s.remote, `http://${REMOTE_IP}:9000/`))[1];
    assert.is(Number(after.split(' ')[2]), Number(before.split(' ')[2]) + 1, 'no blocked request reached the remote host');
    assert.equal(await s.app('-H', 'x-version: v2', 'http://backend.example.local:8080/'), [0, 'v2 /\n']);
    assert.match((await s.app('http://remote-tcp.example.local:9100/'))[1], /^remote 9000 /, 'a TCP mesh service too');
  } finally {
    await s.stop();
  }
});

test('capture mode with Istio mTLS: the VM calls its own mesh service by name, out through 15001 and back in through 15006 over mTLS (the app sees the SPIFFE id); PeerAuthentication STRICT then refuses plaintext from another host', async () => {
  const s = await start({
    configs: {
      'app.yaml': `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: app, namespace: demo}
spec:
  hosts: [app.example.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: ${APP_PORT}, name: http, protocol: HTTP}]
  endpoints: [{address: ${VM_IP}, ports: {http: ${APP_PORT}}, labels: {security.istio.io/tlsMode: istio}, serviceAccount: vm}]
`,
    },
    env: { SERVICE_ACCOUNT: 'vm' },
    // The embedded CA's identity for demo/vm, proven by the agent's token.
    prepare: (dir) => {
      fs.mkdirSync(path.join(dir, 'config/ca/identities/demo'), { recursive: true });
      fs.writeFileSync(path.join(dir, 'config/ca/identities/demo/vm'), 'vm-token\n', { mode: 0o600 });
      fs.mkdirSync(path.join(dir, 'var/run/secrets/tokens'), { recursive: true });
      fs.writeFileSync(path.join(dir, 'var/run/secrets/tokens/istio-token'), 'vm-token');
    },
  });
  try {
    const mesh = `http://app.example.local:${APP_PORT}/`;
    const [code, body] = await waitFor('a request over mTLS', async () => {
      const r = await s.app(mesh);
      return r[0] === 0 && r[1].includes('xfcc') ? r : undefined;
    }, 30_000, 300).catch((e: Error) => { throw new Error(`${e.message}\n${s.agentLog().slice(-4000)}`); });
    assert.is(code, 0);
    assert.match(body, new RegExp(`^app ${APP_PORT} \\d+ from 127\\.0\\.0\\.1 xfcc .*URI=spiffe://cluster\\.local/ns/demo/sa/vm`), 'terminated by virtualInbound\'s chain for the port');
    assert.ok((await s.stat('listener.0.0.0.0_15006.ssl.handshake')) >= 1);
    // PERMISSIVE (the default): plaintext from another host still reaches the app, through the same port's chain.
    assert.match((await curlIn(s.remote, `http://${VM_IP}:${APP_PORT}/`))[1], new RegExp(`^app ${APP_PORT} \\d+ from 127\\.0\\.0\\.1$`));
    fs.writeFileSync(path.join(s.config, 'peer.yaml'), `apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: demo}
spec: {mtls: {mode: STRICT}}
`);
    await waitFor('STRICT in force', async () => (await curlIn(s.remote, `http://${VM_IP}:${APP_PORT}/`))[0] !== 0, 20_000, 300);
    assert.match((await s.app(mesh))[1], /xfcc .*URI=spiffe:\/\/cluster\.local\/ns\/demo\/sa\/vm/, 'mTLS from the mesh still accepted');
  } finally {
    await s.stop();
  }
});

async function curlIn(ns: Netns, url: string): Promise<[number, string]> {
  const r = await ns.run('curl', ['-sS', '-m', '10', url]);
  return [r.code, r.stdout + (r.code ? r.stderr : '')];
}

test.run();
