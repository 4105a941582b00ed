// The README's "Security model" table, row by row: one standalone sidecar with the embedded CA and the DNS proxy
// runs in network namespace A (a "VM", or a pod), and each socket and port is tried by the wrong caller: another
// uid on the same host (uid 65534 inside A, the way the app of a pod or another user of a VM would) and another
// host (namespace B, joined to A by a veth pair). What must be public stays reachable; nothing else is.

import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { promisify } from 'node:util';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { agentFixture, type AgentFixture } from './helpers/agent-fixture';
import { waitFor } from './helpers/harness';
import { createNetns, type Netns } from './helpers/netns';

const run = promisify(execFile);
const NOBODY = ['setpriv', '--reuid', '65534', '--regid', '65534', '--clear-groups'];

async function sh(...args: string[]): Promise<void> {
  await run(args[0]!, args.slice(1));
}

/** curl in a namespace, optionally as uid 65534: `<code> <body>`, or `ERR <curl exit code>` without an answer. */
async function curl(ns: string, url: string, opts: { nobody?: boolean; method?: string } = {}): Promise<string> {
  const argv = [...(opts.nobody ? NOBODY : []), 'curl', '-s', '-m', '3', '-X', opts.method ?? 'GET', '-w', '\n%{http_code}', url];
  try {
    const { stdout } = await run('ip', ['netns', 'exec', ns, ...argv], { maxBuffer: 64 << 20 });
    const i = stdout.lastIndexOf('\n');
    return `${stdout.slice(i + 1)} ${stdout.slice(0, i)}`;
  } catch (e) {
    return `ERR ${(e as { code?: number }).code}`;
  }
}

// Connects to a Unix stream socket (or sends to a datagram one) as uid 65534 and prints what happened.
const UNIX_PROBE = `
import socket, sys
for p in sys.argv[1:]:
    kind = socket.SOCK_DGRAM if p.endswith("#dgram") else socket.SOCK_STREAM
    p = p.split("#")[0]
    s = socket.socket(socket.AF_UNIX, kind)
    try:
        if kind == socket.SOCK_DGRAM: s.sendto(b"x", p)
        else: s.connect(p)
        print(p, "OPEN")
    except OSError as e:
        print(p, type(e).__name__)
`;

async function unixAsNobody(ns: string, paths: string[]): Promise<Map<string, string>> {
  const { stdout } = await run('ip', ['netns', 'exec', ns, ...NOBODY, '/usr/bin/python3', '-c', UNIX_PROBE, ...paths]);
  return new Map(stdout.trim().split('\n').map((l) => {
    const i = l.lastIndexOf(' ');
    return [l.slice(0, i), l.slice(i + 1)] as [string, string];
  }));
}

async function dig(ns: string, server: string, name: string, nobody = false): Promise<string> {
  const argv = [...(nobody ? NOBODY : []), 'dig', `@${server}`, '-p', '15053', '+tries=1', '+time=2', name, 'A'];
  try {
    return (await run('ip', ['netns', 'exec', ns, ...argv])).stdout;
  } catch (e) {
    return `ERR ${String((e as { stdout?: string }).stdout ?? '')}`;
  }
}

const CONFIG = (ip: string) => `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: app, namespace: shop }
spec:
  hosts: [app.shop.local]
  addresses: [240.240.9.9]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{ number: 8080, name: http, protocol: HTTP }]
  endpoints:
  - { address: ${ip}, ports: { http: 9080 }, labels: { security.istio.io/tlsMode: istio }, serviceAccount: app }
`;

test('every socket and port of the agent, tried by another uid and from another host', async () => {
  const id = randomBytes(3).toString('hex');
  const subnet = `10.${200 + (parseInt(id.slice(0, 2), 16) % 50)}.${parseInt(id.slice(2, 4), 16)}`;
  const [ipA, ipB] = [`${subnet}.1`, `${subnet}.2`];
  const made: Netns[] = [];
  let agent: AgentFixture | undefined;
  try {
    const hostA = createNetns('pa-sa-');
    made.push(hostA);
    const hostB = createNetns('pa-sb-');
    made.push(hostB);
    const [nsA, nsB] = [hostA.name, hostB.name];
    await sh('ip', 'link', 'add', `sa${id}`, 'type', 'veth', 'peer', 'name', `sb${id}`);
    await sh('ip', 'link', 'set', `sa${id}`, 'netns', nsA);
    await sh('ip', 'link', 'set', `sb${id}`, 'netns', nsB);
    for (const [ns, dev, ip] of [[nsA, `sa${id}`, ipA], [nsB, `sb${id}`, ipB]] as const) {
      await sh('ip', '-n', ns, 'addr', 'add', `${ip}/24`, 'dev', dev);
      await sh('ip', '-n', ns, 'link', 'set', dev, 'up');
    }
    // 0o755: another uid may walk the tree, so the sockets' own modes must hold.
    agent = await agentFixture({ prefix: 'pa-secmodel-', mode: 0o755, netns: hostA });
    const cfgDir = path.join(agent.dir.path, 'config');
    fs.mkdirSync(path.join(cfgDir, 'ca', 'identities', 'shop'), { recursive: true, mode: 0o700 });
    fs.writeFileSync(path.join(cfgDir, 'ca', 'identities', 'shop', 'app'), 'app-token\n', { mode: 0o600 });
    fs.writeFileSync(path.join(cfgDir, 'mesh.yaml'), CONFIG(ipA));
    const cwd = path.join(agent.dir.path, 'host-a');
    fs.mkdirSync(path.join(cwd, 'var/run/secrets/tokens'), { recursive: true });
    fs.writeFileSync(path.join(cwd, 'var/run/secrets/tokens/istio-token'), 'app-token', { mode: 0o600 });
    const configPath = path.join(cwd, 'proxy');
    await agent.start({
      args: ['proxy', 'sidecar', '--standalone', cfgDir],
      cwd,
      proxyConfig: { configPath },
      env: {
        HOME: '/', POD_NAME: 'app-1', POD_NAMESPACE: 'shop', SERVICE_ACCOUNT: 'app', INSTANCE_IP: ipA, ISTIO_META_DNS_CAPTURE: 'true',
        OUTPUT_CERTS: path.join(cwd, 'certs'),
      },
      readyTimeoutMs: 40_000,
    });
    // The workload certificate exists once Envoy asked for it (the inbound listener's mTLS).
    await waitFor('the workload certificate written', () => fs.existsSync(path.join(cwd, 'certs', 'key.pem')), 20_000);

    // Status port 15020: readiness, metrics and app probes are public (kubelet, Prometheus)...
    assert.match(await curl(nsB, `http://${ipA}:15020/healthz/ready`), /^200/, 'readiness from another host');
    assert.match(await curl(nsB, `http://${ipA}:15020/stats/prometheus`), /^200 [\s\S]*istio_agent_/, 'metrics from another host');
    // ...the agent's lifecycle and its debug pages are not, from another host.
    for (const [method, p] of [['POST', '/quitquitquit'], ['POST', '/drain'], ['GET', '/debug/epochs'], ['GET', '/debug/certs'],
      ['GET', '/debug/pprof/heap'], ['GET', '/debug/pprof/profile?seconds=1'], ['GET', '/debug/xds'], ['GET', '/debug/ndsz']] as const) {
      assert.match(await curl(nsB, `http://${ipA}:15020${p}`, { method }), /^403/, `${method} ${p} from another host`);
    }
    // Local uids reach the debug pages (as in Istio), but no page holds a key: the heap profile is a sampling
    // profile (stacks and sizes), full heap snapshots are off unless the operator turns them on.
    const heap = await curl(nsA, 'http://127.0.0.1:15020/debug/pprof/heap?seconds=1', { nobody: true });
    assert.match(heap, /^200 /, 'the heap profile for a local uid');
    assert.not.match(heap, /PRIVATE KEY|app-token/, 'no key and no token in the heap profile');
    assert.match(await curl(nsA, 'http://127.0.0.1:15020/debug/pprof/heapsnapshot', { nobody: true }), /^403/, 'no heap snapshot');
    assert.not.match(await curl(nsA, 'http://127.0.0.1:15020/debug/certs', { nobody: true }), /PRIVATE KEY/, '/debug/certs shows no key');
    // Envoy's readiness (15021) and Prometheus (15090) listeners are public; its admin (15000) is loopback only.
    assert.match(await curl(nsB, `http://${ipA}:15021/healthz/ready`), /^200/, '15021 from another host');
    assert.match(await curl(nsB, `http://${ipA}:15090/stats/prometheus`), /^200 [\s\S]*envoy_/, '15090 from another host');
    assert.match(await curl(nsB, `http://${ipA}:15000/server_info`), /^ERR/, 'Envoy admin is not reachable from another host');
    // DNS proxy: on localhost only; any local uid may resolve (it is the host's resolver).
    assert.match(await dig(nsB, ipA, 'app.shop.local'), /^ERR|connection timed out|no servers could be reached/, 'DNS from another host');
    assert.match(await dig(nsA, '127.0.0.1', 'app.shop.local', true), /app\.shop\.local\.\s+30\s+IN\s+A\s+240\.240\.9\.9/, 'DNS for a local uid');

    // Unix sockets: Envoy's xDS and SDS, the embedded discovery server, the lock, Envoy's hot restart: not another uid's.
    const sockets = [
      path.join(configPath, 'XDS'),
      path.join(cwd, 'var/run/secrets/workload-spiffe-uds/socket'),
      path.join(configPath, 'discovery.sock'),
      path.join(configPath, 'agent.lock.sock'),
      ...fs.readdirSync(path.join(configPath, 'envoy-hot-restart')).map((f) => `${path.join(configPath, 'envoy-hot-restart', f)}#dgram`),
    ];
    for (const s of sockets) assert.ok(fs.lstatSync(s.split('#')[0]!).isSocket(), `${s} exists`);
    const probed = await unixAsNobody(nsA, sockets);
    for (const s of sockets) assert.is(probed.get(s.split('#')[0]!), 'PermissionError', `${s} as uid 65534`);

    // Files with secrets or control: the bootstrap, the written certificates, the CA's root key.
    for (const f of [path.join(configPath, 'envoy-rev0.json'), path.join(cwd, 'certs', 'key.pem'), path.join(cfgDir, 'ca', 'root-key.pem')]) {
      assert.is(fs.statSync(f).mode & 0o077, 0, `${f} is its owner's only`);
    }
    for (const f of fs.readdirSync('/dev/shm').filter((n) => n.startsWith('envoy_shared_memory_'))) {
      assert.is(fs.statSync(path.join('/dev/shm', f)).mode & 0o077, 0, `/dev/shm/${f} is its owner's only`);
    }

    agent.proc.kill('SIGTERM');
    const late = new Promise<string>((r) => setTimeout(() => r('no exit within 30 s'), 30_000).unref());
    const code = await Promise.race([agent.exited.then((e) => e.code), late]);
    assert.is(code, 0, 'the agent drains and exits 0');
  } finally {
    await agent?.close();
    for (const ns of made) ns.remove();
  }
});

test.run();
