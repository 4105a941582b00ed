// The DNS proxy against a real resolver (dnsmasq) as upstream and the real client (dig): local answers, forwarding,
// NXDOMAIN passthrough, truncation and the TCP retry, EDNS sizes, bad upstreams, rejected tables, and a fuzz run.

import * as dgram from 'node:dgram';
import * as net from 'node:net';
import * as dnsPacket from 'dns-packet';
import { Registry } from 'prom-client';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { canBindPort, effectiveCapabilities } from '../lib/capabilities';
import { DnsServer, type DnsServerOptions, dnsListenPlan, dnsOptionsFor } from '../lib/dns-server';
import { parseResolvConf } from '../lib/dns-upstream';
import type { NameTable } from '../lib/xds-istio';
import { dig, type Dnsmasq, fakeUpstream, startDnsmasq } from './helpers/dns';

const TXT = (c: string) => `--txt-record=big.test,"${c.repeat(200)}"`;
let upstream: Dnsmasq;
const servers: DnsServer[] = [];

const many = Array.from({ length: 100 }, (_, i) => `10.1.${i >> 8}.${i & 255}`);
const table: NameTable = {
  table: {
    'reviews.ns1.svc.cluster.local': { ips: ['10.0.0.1', '10.0.0.2', '10.0.0.3', '10.0.0.4'], registry: 'Kubernetes', shortname: 'reviews', namespace: 'ns1' },
    'api.example.com': { ips: ['240.240.0.1'], registry: 'External', shortname: '', namespace: '' },
    'v6.example.com': { ips: ['fd00::1'], registry: 'External', shortname: '', namespace: '' },
    '*.wild.example.com': { ips: ['240.240.0.9'], registry: 'External', shortname: '', namespace: '' },
    'many.example.com': { ips: many, registry: 'External', shortname: '', namespace: '' },
    'a.test': { ips: ['10.7.7.7'], registry: 'External', shortname: '', namespace: '' },
  },
};

async function server(o: Partial<DnsServerOptions> = {}, withTable = true): Promise<DnsServer> {
  const s = new DnsServer({
    address: '127.0.0.1:0',
    upstreams: [upstream.address],
    searchDomains: ['ns1.svc.cluster.local', 'svc.cluster.local'],
    proxyNamespace: 'ns1',
    proxyDomain: 'ns1.svc.cluster.local',
    timeoutMs: 2000,
    ...o,
  });
  servers.push(s);
  await s.start();
  if (withTable) assert.ok(s.updateTable(table));
  return s;
}

test.before(async () => {
  upstream = await startDnsmasq(['--address=/up.test/10.9.9.9', '--address=/up.test/fd00::9', TXT('x'), TXT('y'), TXT('z')]);
});

test.after.each(async () => {
  for (const s of servers.splice(0)) await s.close();
});

test.after(async () => {
  await upstream?.stop();
});

test('before the first name table every question gets SERVFAIL and readiness names NDS', async () => {
  const s = await server({}, false);
  assert.is(s.readiness().ready, false);
  assert.match(s.readiness().reason, /name table/);
  assert.is((await dig(s.port, 'api.example.com')).status, 'SERVFAIL');
  assert.is((await dig(s.port, 'up.test')).status, 'SERVFAIL');
  assert.ok(s.updateTable(table));
  assert.is(s.readiness().ready, true);
  assert.is((await dig(s.port, 'up.test')).status, 'NOERROR');
});

test('before the first table, a proxy that may bind port 53 forwards (Istio), and port 53 without the right falls back to 15053', () => {
  assert.equal(dnsListenPlan('localhost:15053', true, true), { address: 'localhost:15053', resolvConf: '/etc/resolv.conf', forwardBeforeTable: false });
  assert.equal(dnsListenPlan('0.0.0.0:53', true, true), { address: '0.0.0.0:53', resolvConf: '/var/lib/istio/resolv.conf', forwardBeforeTable: true });
  assert.equal(dnsListenPlan('0.0.0.0:53', true, false).resolvConf, '/etc/resolv.conf');
  assert.equal(dnsListenPlan('0.0.0.0:53', false, true), { address: 'localhost:15053', resolvConf: '/etc/resolv.conf', forwardBeforeTable: false });
});

test('port 53 is allowed by CAP_NET_BIND_SERVICE in CapEff or a lowered ip_unprivileged_port_start, not by the uid', () => {
  const proc = (capEff: string, start = '1024') => (f: string) => (f.endsWith('ip_unprivileged_port_start') ? `${start}\n` : `Name:\tnode\nCapEff:\t${capEff}\n`);
  assert.is(canBindPort(53, proc('0000000000000400')), true, 'a user with the capability');
  assert.is(canBindPort(53, proc('0000000000000000')), false, 'root under CapabilityBoundingSet= has none');
  assert.is(canBindPort(53, proc('000001ffffffffff')), true, 'root with every capability');
  assert.is(canBindPort(53, proc('0000000000000000', '0')), true, 'ip_unprivileged_port_start=0');
  assert.is(canBindPort(15053, proc('0000000000000000')), true);
  assert.is(effectiveCapabilities('CapInh:\t0\n'), undefined);
});

test('forwards before the first table when told to', async () => {
  const s = await server({ forwardBeforeTable: true }, false);
  const r = await dig(s.port, 'up.test');
  assert.is(r.status, 'NOERROR');
  assert.equal(r.answers.map((a) => a.data), ['10.9.9.9']);
});

test('options from the agent config: resolv.conf upstreams and search list, env knobs, the port 53 rules', () => {
  const files: Record<string, string> = { '/etc/resolv.conf': 'nameserver 10.0.0.10\nsearch ns1.svc.cluster.local svc.cluster.local\n', '/var/lib/istio/resolv.conf': 'nameserver 10.0.0.99\n' };
  const io = (uid: number) => ({ readFile: (p: string) => files[p], canBind53: uid === 0 });
  const cfg = { dnsProxyAddr: 'localhost:15053', podNamespace: 'ns1', domain: 'ns1.svc.cluster.local' };
  assert.equal(dnsOptionsFor(cfg, {}, io(1000)), {
    address: 'localhost:15053', upstreams: ['10.0.0.10:53'], searchDomains: ['ns1.svc.cluster.local', 'svc.cluster.local'],
    proxyNamespace: 'ns1', proxyDomain: 'ns1.svc.cluster.local', forwardParallel: false, timeoutMs: 5000, forwardBeforeTable: false,
  });
  const o = dnsOptionsFor({ ...cfg, dnsProxyAddr: '0.0.0.0:53' }, { DNS_FORWARD_PARALLEL: 'true', DNS_FORWARD_TIMEOUT: '2s' }, io(0));
  assert.equal([o.address, o.upstreams, o.forwardParallel, o.timeoutMs, o.forwardBeforeTable], ['0.0.0.0:53', ['10.0.0.99:53'], true, 2000, true]);
  assert.is(dnsOptionsFor({ ...cfg, dnsProxyAddr: '0.0.0.0:53' }, {}, io(1000)).address, 'localhost:15053');
});

test('resolv.conf: nameservers in order with port 53, the last search line', () => {
  const r = parseResolvConf('# c\nnameserver 10.0.0.10\nnameserver fd00::10\nnameserver fe80::1%eth0\nnameserver bogus\nsearch a.b c.d\noptions ndots:5\nsearch ns1.svc.cluster.local svc.cluster.local\n');
  assert.equal(r.servers, ['10.0.0.10:53', '[fd00::10]:53', '[fe80::1]:53']);
  assert.equal(r.search, ['ns1.svc.cluster.local', 'svc.cluster.local']);
});

test('names in the table are answered locally over UDP and TCP: authoritative, TTL 30, every address', async () => {
  const s = await server();
  for (const opts of [[], ['+tcp'], ['+noedns']]) {
    for (const name of ['reviews.ns1.svc.cluster.local', 'reviews', 'reviews.ns1', 'reviews.ns1.svc']) {
      const r = await dig(s.port, name, 'A', opts);
      assert.is(r.status, 'NOERROR', `${name} ${opts}`);
      assert.ok(r.flags.includes('aa'), `${name} authoritative`);
      assert.equal(r.answers.map((a) => a.data).sort(), ['10.0.0.1', '10.0.0.2', '10.0.0.3', '10.0.0.4']);
      assert.ok(r.answers.every((a) => a.ttl === 30 && a.type === 'A'));
    }
  }
  const st = await s.stats();
  assert.is(st.upstream, 0, 'nothing was forwarded');
});

test('a local answer is a CNAME chain for name + first search domain, and wildcards answer the asked name', async () => {
  const s = await server();
  const r = await dig(s.port, 'api.example.com.ns1.svc.cluster.local');
  assert.equal(r.answers.map((a) => [a.type, a.data]), [['CNAME', 'api.example.com.'], ['A', '240.240.0.1']]);
  const w = await dig(s.port, 'x.wild.example.com');
  assert.equal(w.answers.map((a) => [a.name, a.data]), [['x.wild.example.com.', '240.240.0.9']]);
});

test('a known name without the asked family is NOERROR with no records; AAAA records are answered', async () => {
  const s = await server();
  const r = await dig(s.port, 'api.example.com', 'AAAA');
  assert.is(r.status, 'NOERROR');
  assert.ok(r.flags.includes('aa'));
  assert.is(r.answers.length, 0);
  assert.equal((await dig(s.port, 'v6.example.com', 'AAAA')).answers.map((a) => a.data), ['fd00::1']);
  assert.is((await dig(s.port, 'v6.example.com', 'A')).answers.length, 0);
  assert.is((await s.stats()).upstream, 0);
});

test('addresses come back shuffled', async () => {
  const s = await server();
  const orders = new Set<string>();
  for (let i = 0; i < 20; i++) orders.add((await dig(s.port, 'reviews.ns1.svc.cluster.local')).answers.map((a) => a.data).join(','));
  assert.ok(orders.size > 1, `always ${[...orders][0]}`);
});

test('other names and other types are forwarded to the upstream resolver; NXDOMAIN passes through', async () => {
  const s = await server();
  const r = await dig(s.port, 'up.test');
  assert.is(r.status, 'NOERROR');
  assert.not.ok(r.flags.includes('aa') && r.answers[0]?.ttl === 30);
  assert.equal(r.answers.map((a) => a.data), ['10.9.9.9']);
  assert.equal((await dig(s.port, 'up.test', 'AAAA', ['+tcp'])).answers.map((a) => a.data), ['fd00::9']);
  const nx = await dig(s.port, 'nothing-here.test');
  assert.is(nx.status, 'NXDOMAIN');
  assert.is((await dig(s.port, 'nothing-here.test', 'A', ['+tcp'])).status, 'NXDOMAIN');
  // A name in the table, but a type the table does not hold: the upstream's answer (dnsmasq has no a.test at all).
  assert.equal((await dig(s.port, 'a.test')).answers.map((a) => a.data), ['10.7.7.7']);
  const txt = await dig(s.port, 'a.test', 'TXT');
  assert.is(txt.status, 'NXDOMAIN');
  const st = await s.stats();
  assert.is(st.upstream, 5);
  assert.is(st.failures, 0);
});

test('a local answer larger than the client\'s UDP size sets TC, and dig retries over TCP to get every address', async () => {
  const s = await server();
  const cut = await dig(s.port, 'many.example.com', 'A', ['+bufsize=512', '+ignore']);
  assert.ok(cut.flags.includes('tc'), cut.raw);
  // Names are compressed (each owner a pointer to the question): 16 bytes an address, so 28 fit in 512 bytes.
  assert.ok(cut.answers.length >= 28 && cut.answers.length < 100, `${cut.answers.length} answers`);
  const noEdns = await dig(s.port, 'many.example.com', 'A', ['+noedns', '+ignore']);
  assert.ok(noEdns.flags.includes('tc'));
  const retried = await dig(s.port, 'many.example.com', 'A', ['+bufsize=512']);
  assert.ok(retried.retriedTcp, retried.raw);
  assert.is(retried.answers.length, 100);
  assert.not.ok(retried.flags.includes('tc'));
  const big = await dig(s.port, 'many.example.com', 'A', ['+bufsize=4096', '+notcp']);
  assert.not.ok(big.retriedTcp);
  assert.not.ok(big.flags.includes('tc'));
  assert.is(big.answers.length, 100);
  assert.is(big.ednsUdp, undefined, 'no OPT record in a local answer, as Istio\'s');
  const mid = await dig(s.port, 'many.example.com', 'A', ['+bufsize=1232', '+ignore']);
  assert.ok(mid.flags.includes('tc'));
  assert.ok(mid.answers.length > cut.answers.length && mid.answers.length < 100, `${mid.answers.length}`);
});

test('a forwarded answer truncated by the upstream keeps TC, and the TCP retry is forwarded over TCP', async () => {
  const s = await server();
  const r = await dig(s.port, 'big.test', 'TXT', ['+noedns']);
  assert.ok(r.retriedTcp, r.raw);
  assert.is(r.status, 'NOERROR');
  assert.is(r.answers.length, 3);
  const cut = await dig(s.port, 'big.test', 'TXT', ['+noedns', '+ignore']);
  assert.ok(cut.flags.includes('tc'));
  const edns = await dig(s.port, 'big.test', 'TXT', ['+bufsize=4096', '+notcp']);
  assert.not.ok(edns.retriedTcp);
  assert.is(edns.answers.length, 3);
});

test('an upstream that never answers gets SERVFAIL after the timeout; with two, the other one answers (sequential or parallel)', async () => {
  const dead = await fakeUpstream();
  try {
    const s = await server({ upstreams: [dead.address], timeoutMs: 300 });
    const t0 = Date.now();
    const r = await dig(s.port, 'up.test');
    assert.is(r.status, 'SERVFAIL');
    assert.ok(Date.now() - t0 >= 300, 'answered only after the timeout');
    assert.ok(dead.received() >= 1);
    assert.is((await s.stats()).failures, 1);
    const s2 = await server({ upstreams: [dead.address, upstream.address], timeoutMs: 300 });
    assert.equal((await dig(s2.port, 'up.test')).answers.map((a) => a.data), ['10.9.9.9']);
    const s3 = await server({ upstreams: [dead.address, upstream.address], timeoutMs: 5000, forwardParallel: true });
    const t1 = Date.now();
    assert.equal((await dig(s3.port, 'up.test')).answers.map((a) => a.data), ['10.9.9.9']);
    assert.ok(Date.now() - t1 < 4000, 'parallel: the live upstream answers without waiting for the dead one');
  } finally {
    await dead.close();
  }
});

test('an upstream that answers garbage gets SERVFAIL', async () => {
  const random = await fakeUpstream(() => Buffer.from(Array.from({ length: 40 }, () => Math.floor(Math.random() * 256))));
  // The right id and question, then a record that runs off the end of the packet.
  const broken = await fakeUpstream((q) => {
    const out = Buffer.concat([q, Buffer.from([0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 30, 0, 50, 1, 2])]);
    out[2] = out[2]! | 0x80;
    out.writeUInt16BE(1, 6);
    return out;
  });
  try {
    const s = await server({ upstreams: [random.address], timeoutMs: 300 });
    assert.is((await dig(s.port, 'up.test')).status, 'SERVFAIL');
    const s2 = await server({ upstreams: [broken.address], timeoutMs: 5000 });
    const t0 = Date.now();
    assert.is((await dig(s2.port, 'up.test')).status, 'SERVFAIL');
    assert.ok(Date.now() - t0 < 4000, 'an undecodable answer fails at once');
    const s3 = await server({ upstreams: [broken.address, upstream.address], timeoutMs: 5000 });
    assert.equal((await dig(s3.port, 'up.test')).answers.map((a) => a.data), ['10.9.9.9']);
  } finally {
    await random.close();
    await broken.close();
  }
});

test('a table with bad entries is rejected and the last good table keeps answering', async () => {
  const s = await server();
  const bad: NameTable = { table: { 'new.example.com': { ips: ['10.3.3.3'], registry: 'External', shortname: '', namespace: '' }, 'x..y': { ips: ['nope'], registry: '', shortname: '', namespace: '' } } };
  assert.is(s.updateTable(bad), false);
  assert.equal((await dig(s.port, 'api.example.com')).answers.map((a) => a.data), ['240.240.0.1']);
  assert.is((await dig(s.port, 'new.example.com.test')).status, 'NXDOMAIN', 'not from the rejected table');
  const ndsz = s.routes()[0]!;
  assert.is(ndsz.path, '/debug/ndsz');
  const body = JSON.parse(String((await ndsz.handler({} as never)).body));
  assert.ok(body.table['api.example.com'], 'ndsz shows the last good table');
  assert.not.ok(body.table['new.example.com']);
});

test('metrics are registered into the agent registry with Istio\'s names', async () => {
  const s = await server();
  const reg = new Registry();
  s.registerMetrics(reg);
  await dig(s.port, 'api.example.com');
  await dig(s.port, 'up.test');
  const text = await reg.metrics();
  assert.match(text, /istio_agent_dns_requests_total 2/);
  assert.match(text, /istio_agent_dns_upstream_requests_total 1/);
  assert.match(text, /istio_agent_dns_upstream_failures_total 0/);
  assert.match(text, /istio_agent_dns_upstream_request_duration_seconds_count 1/);
});

async function waitForCount(u: { received(): number }, n: number): Promise<void> {
  for (let i = 0; i < 100 && u.received() < n; i++) await new Promise((r) => setTimeout(r, 50));
}

// ---- fuzz ----

function rnd(n: number): Buffer {
  return Buffer.from(Array.from({ length: n }, () => Math.floor(Math.random() * 256)));
}

function validQuery(name: string, type: dnsPacket.RecordType = 'A'): Buffer {
  return dnsPacket.encode({ id: Math.floor(Math.random() * 65536), type: 'query', flags: dnsPacket.RECURSION_DESIRED, questions: [{ name, type }] });
}

/** Malformed packets of every kind the fuzz run sends. */
function badPacket(i: number): Buffer {
  const q = validQuery(`n${i}.example.com`);
  switch (i % 8) {
    case 0: return rnd(Math.floor(Math.random() * 600));
    case 1: return q.subarray(0, Math.floor(Math.random() * q.length)); // truncated anywhere, headers included
    case 2: { // a name that points at itself
      const b = Buffer.from(q);
      b.writeUInt16BE(0xc00c, 12);
      return b;
    }
    case 3: { // two names pointing at each other
      const b = Buffer.concat([q.subarray(0, 12), Buffer.from([0xc0, 0x0e, 0xc0, 0x0c, 0, 1, 0, 1])]);
      return b;
    }
    case 4: { // huge counts, short body
      const b = Buffer.from(q);
      for (const o of [4, 6, 8, 10]) b.writeUInt16BE(0xffff, o);
      return b;
    }
    case 5: { // a label longer than the packet, or a reserved label type
      const b = Buffer.from(q);
      b[12] = Math.random() < 0.5 ? 63 : 0x80 | (Math.random() * 63);
      return b;
    }
    case 6: { // random bytes after a valid header
      const b = Buffer.from(q);
      rnd(b.length - 12).copy(b, 12);
      return b;
    }
    default: { // random bit flips
      const b = Buffer.from(q);
      for (let k = 0; k < 3; k++) b[Math.floor(Math.random() * b.length)]! ^= 1 << Math.floor(Math.random() * 8);
      return b;
    }
  }
}

test('fuzz: thousands of random, truncated, looping and huge-count packets never crash it; valid queries still answer', async () => {
  // Packets that still decode are forwarded: to an upstream that echoes each question back as an empty answer, so
  // the fuzz load does not land on dnsmasq (whose TCP side takes 20 connections at a time).
  const echo = await fakeUpstream((q) => {
    const b = Buffer.from(q);
    b[2] = b[2]! | 0x80;
    return b;
  });
  const s = await server({ upstreams: [echo.address], timeoutMs: 2000 });
  // In-process: every packet's fate (dropped or a reply no larger than the limit) is checked.
  let replied = 0;
  for (let i = 0; i < 20_000; i++) {
    const p = badPacket(i);
    const reply = await s.handle(p, i % 2 ? 'udp' : 'tcp');
    if (!reply) continue;
    replied++;
    assert.ok(reply.length >= 12);
    assert.is(reply.readUInt16BE(0), p.readUInt16BE(0), 'a reply carries the query id');
    assert.ok(reply[2]! & 0x80, 'a reply is a response');
  }
  assert.ok(replied > 1000, `${replied} replies`);
  // A self-pointing name gets FORMERR.
  const loop = Buffer.from(validQuery('loop.example.com'));
  loop.writeUInt16BE(0xc00c, 12);
  const fe = await s.handle(loop, 'udp');
  assert.is(fe!.readUInt16BE(2) & 0xf, 1, 'FORMERR');
  assert.is(await s.handle(Buffer.from([1, 2, 3]), 'udp'), undefined, 'shorter than a header: dropped');
  const asResponse = Buffer.from(validQuery('x.example.com'));
  asResponse[2] = asResponse[2]! | 0x80;
  assert.is(await s.handle(asResponse, 'udp'), undefined, 'responses are dropped, never answered');
  const update = Buffer.from(validQuery('x.example.com'));
  update[2] = (update[2]! & 0x87) | (5 << 3);
  assert.is((await s.handle(update, 'udp'))!.readUInt16BE(2) & 0xf, 4, 'UPDATE and other opcodes: NOTIMP');

  // Over the sockets: a flood over UDP and TCP (garbage frames, a frame cut short, a connection closed early).
  const u = dgram.createSocket('udp4');
  for (let i = 0; i < 3000; i++) u.send(badPacket(i), s.port, '127.0.0.1');
  await new Promise((r) => setTimeout(r, 200));
  u.close();
  for (let c = 0; c < 20; c++) {
    await new Promise<void>((resolve) => {
      const sock = net.connect(s.port, '127.0.0.1', () => {
        const frames = Array.from({ length: 50 }, (_, i) => {
          const p = badPacket(i + c);
          const f = Buffer.alloc(2 + p.length);
          f.writeUInt16BE(p.length, 0);
          p.copy(f, 2);
          return f;
        });
        const cut = Buffer.from([0x10, 0x00, 1, 2, 3]); // announces 4096 bytes, sends 3
        sock.end(Buffer.concat([...frames, c % 2 ? cut : rnd(7)]));
      });
      sock.on('error', () => resolve());
      sock.on('close', () => resolve());
      sock.resume();
    });
  }
  assert.is((await dig(s.port, 'reviews.ns1.svc.cluster.local')).answers.length, 4);
  assert.is((await dig(s.port, 'reviews.ns1.svc.cluster.local', 'A', ['+tcp'])).answers.length, 4);
  const fwd = await dig(s.port, 'up.test');
  assert.is(fwd.status, 'NOERROR');
  assert.not.ok(fwd.flags.includes('aa'), 'forwarded to the echoing upstream');
  assert.ok((await s.stats()).malformed > 1000);
  await echo.close();
});

test('a TCP client pipelining 300 questions to a silent upstream has at most 32 in flight; then the proxy still answers', async () => {
  // The upstream accepts TCP and never answers: each forwarded question holds one connection to it.
  let conns = 0;
  const silent = net.createServer((c) => {
    conns++;
    c.on('error', () => {});
    c.resume(); // reads, so that it sees the proxy's close and silent.close() can finish
  });
  await new Promise<void>((r) => silent.listen(0, '127.0.0.1', () => r()));
  const addr = `127.0.0.1:${(silent.address() as net.AddressInfo).port}`;
  try {
    const s = await server({ upstreams: [addr], timeoutMs: 1500 });
    const c = net.connect(s.port, '127.0.0.1');
    c.on('error', () => {});
    await new Promise((r) => c.once('connect', r));
    c.write(Buffer.concat(Array.from({ length: 300 }, (_, i) => { const q = validQuery(`p${i}.example.org`); return Buffer.concat([Buffer.from([q.length >> 8, q.length & 255]), q]); })));
    await new Promise((r) => setTimeout(r, 700));
    assert.ok(conns > 0 && conns <= 32, `${conns} questions forwarded at once`);
    c.destroy();
    assert.equal((await dig(s.port, 'api.example.com', 'A', ['+tcp'])).answers.map((a) => a.data), ['240.240.0.1']);
  } finally {
    await new Promise((r) => silent.close(r));
  }
});

test('at most 1024 questions wait for a silent upstream; beyond, SERVFAIL at once (each would hold a socket)', async () => {
  const dead = await fakeUpstream();
  const client = dgram.createSocket('udp4');
  let servfail = 0;
  client.on('message', (m) => { if ((m.readUInt16BE(2) & 0xf) === 2) servfail++; });
  try {
    const s = await server({ upstreams: [dead.address], timeoutMs: 10_000 });
    // In batches: a burst of 1100 datagrams overflows a socket's receive buffer, and the test would count losses.
    for (let i = 0; i < 1100; i++) {
      client.send(validQuery(`q${i}.example.org`), s.port, '127.0.0.1');
      if (i % 50 === 49) await new Promise((r) => setTimeout(r, 30));
    }
    await waitForCount(dead, 1024);
    for (let i = 0; i < 40 && servfail < 76; i++) await new Promise((r) => setTimeout(r, 50));
    assert.is(dead.received(), 1024);
    assert.is(servfail, 76, 'the questions beyond the cap are answered SERVFAIL without waiting');
  } finally {
    client.close();
    await dead.close();
  }
});

test('a flood of 1100 idle TCP connections: at most 1024 are kept (each is a descriptor), and the proxy serves again once they go', async () => {
  const s = await server();
  const socks: net.Socket[] = [];
  try {
    let closedEarly = 0;
    for (let i = 0; i < 1100; i++) {
      const c = net.connect(s.port, '127.0.0.1');
      c.on('error', () => {});
      c.on('close', () => closedEarly++);
      socks.push(c);
      if (i % 100 === 99) await new Promise((r) => setTimeout(r, 20));
    }
    for (let i = 0; i < 60 && closedEarly < 76; i++) await new Promise((r) => setTimeout(r, 50));
    assert.is(closedEarly, 76, 'the connections beyond the cap are closed at once');
  } finally {
    for (const c of socks) c.destroy();
  }
  await new Promise((r) => setTimeout(r, 200));
  assert.equal((await dig(s.port, 'api.example.com', 'A', ['+tcp'])).answers.map((a) => a.data), ['240.240.0.1']);
});

test('close() with questions in flight to a silent upstream ends them at once; it releases both ports and is safe twice', async () => {
  const dead = await fakeUpstream();
  const busy = await server({ upstreams: [dead.address], timeoutMs: 60_000 });
  const pending = Array.from({ length: 20 }, (_, i) => busy.handle(validQuery(`x${i}.example.com`), i % 2 ? 'udp' : 'tcp'));
  await waitForCount(dead, 10);
  const t0 = Date.now();
  await busy.close();
  const replies = await Promise.all(pending);
  assert.ok(Date.now() - t0 < 5000);
  assert.ok(replies.every((r) => r && (r.readUInt16BE(2) & 0xf) === 2), 'SERVFAIL');
  await dead.close();
  const s = await server();
  const port = s.port;
  await s.close();
  await s.close();
  assert.is(await s.closed, undefined);
  const again = await server({ address: `127.0.0.1:${port}` });
  assert.is(again.port, port);
});

test.run();
