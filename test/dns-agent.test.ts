// The whole agent (dist/pilot-agent) as a standalone sidecar with DNS capture on, in a network namespace made by the
// test (a "VM": its own loopback, ports and /etc/resolv.conf), with dnsmasq as the VM's resolver: the embedded
// discovery server's NameTable reaches the agent's DNS proxy, which answers mesh names and forwards the rest.

import type { ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as dnsPacket from 'dns-packet';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { agentBin } from './helpers/agent';
import { agentFixture, type AgentFixture } from './helpers/agent-fixture';
import { dig, type Dnsmasq, ensureDnsTools, parseDig as parseDigOut, startDnsmasq } from './helpers/dns';
import { tempDir, waitFor } from './helpers/harness';
import {
  normalize, normalizeRaw, type Normal, PARITY_CONFIG, PARITY_DNSMASQ_ARGS, PARITY_RESOLV_CONF, RAW_SCRIPT, type RawNormal,
} from './helpers/dns-parity';
import { createNetns, type Netns } from './helpers/netns';

const SE = (name: string, host: string, extra = '') => `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ${name}, namespace: test}
spec:
  hosts: [${host}]
${extra}  ports: [{number: 8080, name: http, protocol: HTTP}]
  resolution: DNS
  endpoints: [{address: localhost}]
`;

interface Vm {
  ns: Netns;
  dir: string;
  config: string;
  agent: ChildProcess;
  log(): string;
  /** GET on the agent's status port inside the namespace. */
  status(p: string): Promise<{ code: number; body: string }>;
  stop(): Promise<void>;
}

/** A namespace with dnsmasq as its resolver at `resolverIp`:53 and the agent started by `wrap` (or directly). */
async function startVm(opts: {
  resolverIp: string;
  resolvConf: string;
  env?: Record<string, string>;
  /** A command that sets something up and execs the agent's command line appended to it (agentFixture's wrap). */
  wrap?: string[];
  configs?: Record<string, string>;
  /** Runs in the namespace before the agent starts (e.g. istio-iptables). */
  setup?: (ns: Netns, agentBin: string) => Promise<void>;
}): Promise<Vm> {
  ensureDnsTools();
  const bin = agentBin();
  const tmp = tempDir('pa-dns-agent-');
  let ns: Netns;
  try {
    ns = createNetns('padns', { 'resolv.conf': opts.resolvConf }, '10.99.0.2/24');
  } catch (e) {
    tmp.cleanup();
    throw e;
  }
  let dnsmasq: Dnsmasq | undefined;
  let fixture: AgentFixture | undefined;
  const stop = async () => {
    await fixture?.close(15_000);
    await dnsmasq?.stop();
    ns.remove();
    tmp.cleanup();
  };
  try {
    dnsmasq = await startDnsmasq(PARITY_DNSMASQ_ARGS, { netns: ns, port: 53, listen: opts.resolverIp });
    const config = path.join(tmp.path, 'config');
    fs.mkdirSync(config);
    const configs = opts.configs ?? {
      'backend.yaml': SE('backend', 'backend.example.local'),
      'reviews.yaml': SE('reviews', 'reviews.test.svc.cluster.local', '  addresses: [10.20.0.7]\n'),
    };
    for (const [f, text] of Object.entries(configs)) fs.writeFileSync(path.join(config, f), text);
    // As root with DNS on port 53, the agent runs Envoy as uid/gid 1337 (Istio's rule): like a VM install, the
    // proxy's directory belongs to that user.
    fs.mkdirSync(path.join(tmp.path, 'proxy'));
    fs.chownSync(path.join(tmp.path, 'proxy'), 1337, 1337);
    fixture = await agentFixture({ dir: tmp, mode: 0o755, netns: ns });
    await opts.setup?.(ns, bin);
    const agent = await fixture.start({
      args: ['proxy', 'sidecar', '--standalone', config],
      env: { POD_NAME: 'vm-1', INSTANCE_IP: '10.99.0.2', ISTIO_META_DNS_CAPTURE: 'true', ...opts.env },
      wrap: opts.wrap,
      ready: 'none',
    });
    const status = async (p: string) => {
      const r = await ns.run(process.execPath, ['-e', `require('http').get('http://127.0.0.1:15020${p}', (res) => { let b = ''; res.on('data', (d) => b += d); res.on('end', () => { process.stdout.write(res.statusCode + '\\n' + b); }); }).on('error', (e) => { process.stdout.write('0\\n' + e.message); })`]);
      const nl = r.stdout.indexOf('\n');
      return { code: Number(r.stdout.slice(0, nl)), body: r.stdout.slice(nl + 1) };
    };
    const out = () => fixture!.log();
    await waitFor('the agent ready in its namespace', async () => {
      if (agent.proc.exitCode !== null) throw new Error(`the agent exited with ${agent.proc.exitCode}`);
      return (await status('/healthz/ready')).code === 200;
    }, 60_000, 250)
      .catch((e: Error) => { throw new Error(`${e.message}\n${out()}`); });
    return { ns, dir: tmp.path, config, agent: agent.proc, log: out, status, stop };
  } catch (e) {
    await stop();
    throw e;
  }
}

test('standalone sidecar with DNS capture: mesh names from the embedded discovery server, the rest forwarded to the VM\'s resolver', async () => {
  const vm = await startVm({ resolverIp: '127.0.0.1', resolvConf: 'nameserver 127.0.0.1\nsearch test.svc.cluster.local\n' });
  try {
    const q = (name: string, type = 'A', opts: string[] = []) => dig(15053, name, type, opts, '127.0.0.1', vm.ns);
    const ndsz = JSON.parse((await vm.status('/debug/ndsz')).body) as { table: Record<string, { ips: string[] }> };
    const vip = ndsz.table['backend.example.local']!.ips[0]!;
    assert.match(vip, /^240\.240\.\d+\.\d+$/);
    const r = await q('backend.example.local');
    assert.is(r.status, 'NOERROR');
    assert.ok(r.flags.includes('aa'));
    assert.equal(r.answers.map((a) => [a.data, a.ttl]), [[vip, 30]]);
    assert.equal((await q('reviews', 'A', ['+tcp'])).answers.map((a) => a.data), ['10.20.0.7']);
    assert.equal((await q('reviews.test.svc')).answers.map((a) => a.data), ['10.20.0.7']);
    assert.equal((await q('backend.example.local.test.svc.cluster.local')).answers.map((a) => a.type), ['CNAME', 'A']);
    assert.is((await q('backend.example.local', 'AAAA')).status, 'NOERROR');
    assert.equal((await q('outside.test')).answers.map((a) => a.data), ['10.9.9.9']);
    assert.is((await q('nowhere.test')).status, 'NXDOMAIN');
    // A new ServiceEntry reaches DNS without a restart; an unrelated host keeps its VIP.
    fs.writeFileSync(path.join(vm.config, 'late.yaml'), SE('late', 'late.example.local', '  addresses: [10.30.0.3]\n'));
    await waitFor('the new host in DNS', async () => (await q('late.example.local')).answers[0]?.data === '10.30.0.3', 20_000, 200);
    assert.equal((await q('backend.example.local')).answers.map((a) => a.data), [vip]);
    const metrics = (await vm.status('/stats/prometheus')).body;
    assert.match(metrics, /^istio_agent_dns_requests_total \d+/m);
    assert.match(metrics, /^istio_agent_dns_upstream_requests_total [1-9]/m);
  } finally {
    await vm.stop();
  }
});

test('DNS on port 53 as root (no iptables): the VM\'s own resolver library goes through the agent; other names go to /var/lib/istio/resolv.conf', async () => {
  // The agent gets a private /var/lib holding istio/resolv.conf (pointing at dnsmasq on 127.0.0.53), while the
  // namespace's /etc/resolv.conf points every program at the agent on 127.0.0.1:53, as Istio's VM setup does.
  const vm = await startVm({
    resolverIp: '127.0.0.53',
    resolvConf: 'nameserver 127.0.0.1\n',
    env: { DNS_PROXY_ADDR: '127.0.0.1:53' },
    wrap: ['unshare', '--mount', '--propagation', 'private', 'sh', '-c',
      'mount -t tmpfs tmpfs /var/lib && mkdir /var/lib/istio && echo "nameserver 127.0.0.53" > /var/lib/istio/resolv.conf && exec "$0" "$@"'],
  });
  try {
    const getent = async (name: string) => (await vm.ns.run('getent', ['ahostsv4', name])).stdout.split('\n')[0]?.split(/\s+/)[0] ?? '';
    const vip = (JSON.parse((await vm.status('/debug/ndsz')).body) as { table: Record<string, { ips: string[] }> }).table['backend.example.local']!.ips[0]!;
    assert.is(await getent('backend.example.local'), vip);
    assert.is(await getent('reviews'), '10.20.0.7', 'short names resolve as in the cluster');
    assert.is(await getent('outside.test'), '10.9.9.9', 'forwarded to the resolver in /var/lib/istio/resolv.conf');
    assert.is(await getent('nowhere.test'), '');
  } finally {
    await vm.stop();
  }
});

test('DNS capture by istio-iptables: an app under another uid resolves mesh names with its own resolver library; the agent\'s forwarded questions are not captured again', async () => {
  // The VM's resolver is dnsmasq on 127.0.0.53; the capture rules send the app's questions to it to the agent on
  // 15053. README's VM setup: the injector's rules for 1337, the agent as root with group 1337 (so its forwarded
  // questions and its replies are the proxy's, excluded from capture), Envoy as 1337; the app runs as nobody.
  const vm = await startVm({
    resolverIp: '127.0.0.53',
    resolvConf: 'nameserver 127.0.0.53\nsearch test.svc.cluster.local\n',
    env: { ENVOY_UID: '1337', ENVOY_GID: '1337' },
    wrap: ['setpriv', '--regid=1337', '--clear-groups'],
    setup: async (ns, bin) => {
      const r = await ns.run(bin, ['istio-iptables', '-p', '15001', '-z', '15006', '-u', '1337', '-g', '1337', '-m', 'REDIRECT', '-i', '*', '-b', '*', '--redirect-dns']);
      assert.is(r.code, 0, `istio-iptables: ${r.stdout}${r.stderr}`);
    },
  });
  try {
    const asApp = async (...args: string[]) => (await vm.ns.run('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', ...args])).stdout;
    const vip = (JSON.parse((await vm.status('/debug/ndsz')).body) as { table: Record<string, { ips: string[] }> }).table['backend.example.local']!.ips[0]!;
    assert.is((await asApp('getent', 'ahostsv4', 'backend.example.local')).split(/\s+/)[0], vip, 'answered by the agent through the capture rule');
    assert.is((await asApp('getent', 'ahostsv4', 'reviews')).split(/\s+/)[0], '10.20.0.7');
    assert.is((await asApp('getent', 'ahostsv4', 'outside.test')).split(/\s+/)[0], '10.9.9.9', 'forwarded by the agent to dnsmasq, not looped');
    const direct = parseDigOut(await asApp('dig', '@127.0.0.53', 'backend.example.local', '+tries=1', '+time=5'));
    assert.ok(direct.flags.includes('aa') && direct.answers[0]?.ttl === 30, 'a question to 127.0.0.53:53 is answered by the agent, not dnsmasq');
    const tcp = parseDigOut(await asApp('dig', '@127.0.0.53', 'reviews.test.svc.cluster.local', '+tcp', '+tries=1', '+time=5'));
    assert.equal(tcp.answers.map((a) => a.data), ['10.20.0.7'], 'DNS over TCP is captured too');
    const metrics = (await vm.status('/stats/prometheus')).body;
    assert.match(metrics, /^istio_agent_dns_upstream_requests_total [1-9]/m);
  } finally {
    await vm.stop();
  }
});

test('an upstream resolver without a route (a network blip, an IPv6 resolver on a v4-only host) gets SERVFAIL over UDP and TCP; the agent keeps serving, and a packet from source port 0 is dropped', async () => {
  // The namespace has no route but loopback's: connect() to either resolver fails with ENETUNREACH at once.
  const vm = await startVm({ resolverIp: '127.0.0.1', resolvConf: 'nameserver 10.55.0.1\nnameserver 2001:db8::53\n' });
  try {
    const q = (name: string, type = 'A', opts: string[] = []) => dig(15053, name, type, opts, '127.0.0.1', vm.ns);
    for (let i = 0; i < 3; i++) {
      assert.is((await q(`unknown-${i}.example.org`)).status, 'SERVFAIL');
      assert.is((await q(`unknown-${i}.example.org`, 'AAAA', ['+tcp'])).status, 'SERVFAIL');
    }
    // A raw packet whose UDP source port is 0 (cannot be answered): on main the reply's send() threw.
    const query = dnsPacket.encode({ type: 'query', id: 7, flags: dnsPacket.RECURSION_DESIRED, questions: [{ type: 'A', name: 'backend.example.local' }] });
    const raw = await vm.ns.run('python3', ['-c', RAW_PORT0, query.toString('hex')]);
    assert.is(raw.code, 0, raw.stderr);
    assert.is((await q('unknown-late.example.org')).status, 'SERVFAIL');
    assert.is((await q('backend.example.local')).status, 'NOERROR', 'mesh names are still answered');
    assert.is(vm.agent.exitCode, null, `the agent is still running:\n${vm.log().slice(-3000)}`);
    assert.is(vm.agent.signalCode, null);
    assert.match(vm.log(), /upstream failure: 10\.55\.0\.1:53: .*ENETUNREACH/);
    const metrics = (await vm.status('/stats/prometheus')).body;
    assert.match(metrics, /^istio_agent_dns_upstream_failures_total [1-9]/m);
  } finally {
    await vm.stop();
  }
});

/** Sends argv[1] (hex) to 127.0.0.1:15053 over UDP from source port 0, through a raw socket (no UDP checksum). */
const RAW_PORT0 = `
import socket, struct, sys
q = bytes.fromhex(sys.argv[1])
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
s.sendto(struct.pack('!HHHH', 0, 15053, 8 + len(q), 0) + q, ('127.0.0.1', 0))
`;

test('every answer, and the reply to each malformed packet, matches the Go agent\'s for the same name table and resolver (test/golden/dns-go-agent.json)', async () => {
  const golden = JSON.parse(fs.readFileSync(path.join(__dirname, 'golden/dns-go-agent.json'), 'utf8')) as {
    queries: { name: string; type: string; opts: string[]; expect: Normal }[];
    packets: { label: string; hex: string; expect: RawNormal }[];
  };
  const vm = await startVm({ resolverIp: '127.0.0.1', resolvConf: PARITY_RESOLV_CONF, configs: PARITY_CONFIG });
  try {
    const diffs: string[] = [];
    for (const q of golden.queries) {
      const got = normalize(await dig(15053, q.name, q.type, q.opts, '127.0.0.1', vm.ns));
      if (JSON.stringify(got) !== JSON.stringify(q.expect)) diffs.push(`${q.name} ${q.type} ${q.opts.join(' ')}:\n  Go:   ${JSON.stringify(q.expect)}\n  ours: ${JSON.stringify(got)}`);
    }
    const raw = JSON.parse((await vm.ns.run(process.execPath, ['-e', RAW_SCRIPT, '15053', ...golden.packets.map((p) => p.hex)])).stdout) as string[];
    golden.packets.forEach((p, i) => {
      const got = normalizeRaw(p.hex, raw[i]!);
      if (JSON.stringify(got) !== JSON.stringify(p.expect)) diffs.push(`packet "${p.label}":\n  Go:   ${JSON.stringify(p.expect)}\n  ours: ${JSON.stringify(got)}`);
    });
    assert.is(diffs.join('\n'), '', 'answers that differ from the Go agent\'s');
    assert.ok(golden.queries.length >= 25 && golden.packets.length >= 10);
  } finally {
    await vm.stop();
  }
});

test.run();
