// Two standalone sidecars on two "hosts" (two network namespaces made here, joined by a veth pair), sharing one
// config directory and nothing else: each `pilot-agent proxy --standalone DIR` runs its own discovery server and
// embedded CA from the shared root in DIR/ca. The client app's request to the server's service goes over mTLS
// (the server app sees the client's SPIFFE id in XFCC); under PeerAuthentication STRICT a plaintext client is
// refused; PERMISSIVE lets it in again.

import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { promisify } from 'node:util';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { agentFixture, type AgentFixture } from './helpers/agent-fixture';
import { tempDir, waitFor } from './helpers/harness';
import { createNetns, type Netns } from './helpers/netns';

const run = promisify(execFile);
const CLIENT = 'spiffe://cluster.local/ns/shop/sa/client';

async function sh(...args: string[]): Promise<void> {
  await run(args[0]!, args.slice(1));
}

/** curl inside a namespace: `<http code> <body>`, or `ERR <curl exit code>` when no HTTP answer came. */
async function curlIn(ns: string, url: string, headers: Record<string, string> = {}): Promise<string> {
  const h = Object.entries(headers).flatMap(([k, v]) => ['-H', `${k}: ${v}`]);
  try {
    const { stdout } = await run('ip', ['netns', 'exec', ns, 'curl', '-s', '-m', '3', ...h, '-w', '\n%{http_code}', url]);
    const i = stdout.lastIndexOf('\n');
    return `${stdout.slice(i + 1)} ${stdout.slice(0, i)}`;
  } catch (e) {
    return `ERR ${(e as { code?: number }).code}`;
  }
}

function spawnIn(ns: string, cmd: string, args: string[], opts: { cwd: string; env: Record<string, string> }): { proc: ChildProcess; log: () => string; exited: Promise<number | null> } {
  const proc = spawn('ip', ['netns', 'exec', ns, cmd, ...args], { cwd: opts.cwd, env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: '/', ...opts.env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  proc.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  proc.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((r) => proc.once('exit', (c) => r(c)));
  return { proc, log: () => out, exited };
}

const yaml = (serverIp: string, mode: string) => `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: server, namespace: shop }
spec:
  hosts: [server.shop.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{ number: 8080, name: http, protocol: HTTP }]
  endpoints:
  - { address: ${serverIp}, ports: { http: 9080 }, labels: { security.istio.io/tlsMode: istio }, serviceAccount: server }
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: { name: default, namespace: shop }
spec: { mtls: { mode: ${mode} } }
`;

const APP = `require('http').createServer((q, s) => { q.resume(); s.end(String(q.headers['x-forwarded-client-cert'] || 'no xfcc')); }).listen(9080, '127.0.0.1');`;

test('two standalone sidecars in two network namespaces: mTLS between the apps with identities from the embedded CA; plaintext refused under STRICT', async () => {
  const id = randomBytes(3).toString('hex');
  const subnet = `10.${200 + (parseInt(id.slice(0, 2), 16) % 50)}.${parseInt(id.slice(2, 4), 16)}`;
  const [ipA, ipB] = [`${subnet}.1`, `${subnet}.2`];
  const dir = tempDir('pa-sidecars-');
  const cfgDir = path.join(dir.path, 'shared-config');
  fs.mkdirSync(path.join(cfgDir, 'ca', 'identities', 'shop'), { recursive: true });
  fs.writeFileSync(path.join(cfgDir, 'ca', 'identities', 'shop', 'client'), 'client-token\n', { mode: 0o600 });
  fs.writeFileSync(path.join(cfgDir, 'ca', 'identities', 'shop', 'server'), 'server-token\n', { mode: 0o600 });
  fs.writeFileSync(path.join(cfgDir, 'mesh.yaml'), yaml(ipB, 'STRICT'));
  const procs: { proc: ChildProcess; log: () => string; exited: Promise<number | null> }[] = [];
  const agents: AgentFixture[] = [];
  const agentLogs = () => [...agents.map((a) => a.log()), ...procs.map((p) => p.log())]
    .map((l, i) => `--- process ${i}\n${l.slice(-2500)}`).join('\n');
  const spaces: Netns[] = [];
  try {
    const [a, b] = [createNetns('pa-a-'), createNetns('pa-b-')];
    spaces.push(a, b);
    const [nsA, nsB] = [a.name, b.name];
    await sh('ip', 'link', 'add', `va${id}`, 'type', 'veth', 'peer', 'name', `vb${id}`);
    await sh('ip', 'link', 'set', `va${id}`, 'netns', nsA);
    await sh('ip', 'link', 'set', `vb${id}`, 'netns', nsB);
    for (const [ns, dev, ip] of [[nsA, `va${id}`, ipA], [nsB, `vb${id}`, ipB]] as const) {
      await sh('ip', '-n', ns, 'addr', 'add', `${ip}/24`, 'dev', dev);
      await sh('ip', '-n', ns, 'link', 'set', dev, 'up');
    }
    const agent = async (ns: Netns, host: string, sa: string, ip: string) => {
      const fixture = await agentFixture({ prefix: `pa-${host}-`, netns: ns });
      agents.push(fixture);
      const cwd = fixture.dir.path;
      fs.mkdirSync(path.join(cwd, 'var/run/secrets/tokens'), { recursive: true });
      fs.writeFileSync(path.join(cwd, 'var/run/secrets/tokens/istio-token'), `${sa}-token`);
      await fixture.start({
        args: ['proxy', 'sidecar', '--standalone', cfgDir],
        env: { POD_NAME: `${sa}-1`, POD_NAMESPACE: 'shop', SERVICE_ACCOUNT: sa, INSTANCE_IP: ip },
        ready: 'none',
      });
    };
    await agent(a, 'host-a', 'client', ipA);
    await agent(b, 'host-b', 'server', ipB);
    procs.push(spawnIn(nsB, process.execPath, ['-e', APP], { cwd: dir.path, env: {} }));
    for (const ns of [nsA, nsB]) {
      await waitFor(`the agent in ${ns} ready`, async () => (await curlIn(ns, 'http://127.0.0.1:15020/healthz/ready')).startsWith('200'), 30_000, 300)
        .catch((e: Error) => { throw new Error(`${e.message}\n${agentLogs()}`); });
    }
    const viaSidecars = () => curlIn(nsA, 'http://127.0.0.1:8080/', { host: 'server.shop.local' });
    const first = await waitFor('the client app reaching the server app through both sidecars', async () => {
      const r = await viaSidecars();
      return r.startsWith('200') ? r : undefined;
    }, 30_000, 300).catch((e: Error) => { throw new Error(`${e.message}\n${agentLogs()}`); });
    assert.match(first, `URI=${CLIENT}`, 'the server app sees the client sidecar\'s SPIFFE id');
    assert.match(first, 'By=spiffe://cluster.local/ns/shop/sa/server');
    // istiod's inbound XFCC: APPEND_FORWARD with the client certificate's subject, URI and DNS SANs.
    assert.match(first, /^200 By=spiffe:\/\/cluster\.local\/ns\/shop\/sa\/server;Hash=[0-9a-f]+;Subject="[^"]*";URI=spiffe:\/\/cluster\.local\/ns\/shop\/sa\/client$/);
    for (let i = 0; i < 10; i++) assert.match(await viaSidecars(), `URI=${CLIENT}`);
    // (Istio's stats inclusion list in the agent's bootstrap keeps no ssl.* stats; XFCC is only set from a
    // verified client certificate, so it is the proof, with the server's id in By=.)

    // STRICT: a plaintext client on host A, straight to the server sidecar, gets no HTTP answer.
    const plain = await curlIn(nsA, `http://${ipB}:9080/`);
    assert.ok(plain.startsWith('ERR') || plain.startsWith('000'), `plaintext refused under STRICT, got ${plain}`);
    // PERMISSIVE: the same plaintext request is let through (and carries no identity).
    fs.writeFileSync(path.join(cfgDir, 'mesh.yaml'), yaml(ipB, 'PERMISSIVE'));
    const permitted = await waitFor('plaintext accepted under PERMISSIVE', async () => {
      const r = await curlIn(nsA, `http://${ipB}:9080/`);
      return r.startsWith('200') ? r : undefined;
    }, 15_000, 300);
    assert.match(permitted, 'no xfcc');
    assert.match(await viaSidecars(), `URI=${CLIENT}`, 'mTLS still used by the sidecars under PERMISSIVE');
  } finally {
    for (const p of procs) p.proc.kill('SIGTERM');
    await Promise.all(agents.map((a) => a.close()));
    await Promise.race([Promise.all(procs.map((p) => p.exited)), new Promise((r) => setTimeout(r, 15_000))]);
    for (const p of procs) if (p.proc.exitCode === null && p.proc.signalCode === null) p.proc.kill('SIGKILL');
    await Promise.all(procs.map((p) => p.exited));
    for (const ns of spaces) ns.remove();
    dir.cleanup();
  }
});

test.run();
