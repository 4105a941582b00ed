// The agent's DNS proxy (Istio's pkg/dns/client), on DNS_PROXY_ADDR over UDP and TCP. A and AAAA questions for
// names in the NDS name table are answered here (authoritative, TTL 30, addresses shuffled); everything else is
// forwarded as is to the resolv.conf servers (./dns-upstream.ts), over the protocol the client used. Before the first name table
// every question gets SERVFAIL, unless the proxy serves port 53 (then it forwards), as Istio does.
//
// Wire format: `dns-packet`; the header checks before it are Istio's (miekg/dns's accept rules): responses are
// dropped, opcodes other than QUERY and NOTIFY get NOTIMP, anything but one question (or undecodable) gets FORMERR, and a
// packet shorter than a header is dropped, so no input can crash the proxy or make it send more than it got.

import * as dgram from 'node:dgram';
import * as net from 'node:net';
import * as dnsPacket from 'dns-packet';
import { Counter, Histogram, type Registry } from './prom';
import { type Component, type Condition, closedSignal, type StatusRoute } from './component';
import { buildDnsTable, type DnsTable, lookup } from './dns-table';
import { joinHostPort, splitHostPort, Upstreams } from './dns-upstream';
import {
  addressRdata,
  clientLimit,
  encodeLocalAnswer,
  encodeWithin,
  errorReply,
  F,
  frame,
  HEADER,
  type Proto,
  type Question,
  questionEnd,
  RCODE,
  shuffle,
  wellFormed,
} from './dns-wire';
import type { AgentConfig } from './config';
import { parseResolvConf } from './dns-upstream';
import { DNS_FORWARD_PARALLEL, DNS_FORWARD_TIMEOUT, type Env } from './env';
import { AgentError, errorMessage } from './errors';
import { scope } from './log';
import { json } from './status-server';
import type { NameTable } from './xds-istio';

const log = scope('dns');

const TTL = 30;
const TCP_IDLE_MS = 10_000;
const TCP_MAX_INFLIGHT = 32;
const TCP_MAX_CONNECTIONS = 1024;
const TCP_MAX_UNREAD = 256 * 1024;

export interface DnsServerOptions {
  /** `host:port`; `localhost` listens on 127.0.0.1 and/or ::1 after the upstreams' families, as Istio does. */
  address: string;
  /** `host:port` of each upstream resolver, in order. */
  upstreams: readonly string[];
  searchDomains: readonly string[];
  proxyNamespace: string;
  proxyDomain: string;
  /** Ask every upstream at once and take the first answer (DNS_FORWARD_PARALLEL). */
  forwardParallel?: boolean;
  /** How long one upstream gets to answer (default 5 s). */
  timeoutMs?: number;
  /** Forward instead of SERVFAIL before the first name table (Istio: when serving port 53 as root). */
  forwardBeforeTable?: boolean;
}

/**
 * Istio's rules for the listen address and the resolv.conf to read: port 53 needs the right to bind it (Istio
 * asks for uid 0; here CAP_NET_BIND_SERVICE, which a systemd unit can give a non-root user and root may lack;
 * otherwise the default address is used, with an error log); on 53, /var/lib/istio/resolv.conf is preferred when
 * it exists (the host's own resolv.conf then points at the proxy) and questions are forwarded before the first table.
 */
export function dnsListenPlan(
  address: string,
  canBind53: boolean,
  altResolvConfExists: boolean,
): { address: string; resolvConf: string; forwardBeforeTable: boolean } {
  const plan = { address: address || 'localhost:15053', resolvConf: '/etc/resolv.conf', forwardBeforeTable: false };
  if (plan.address.endsWith(':53')) {
    if (canBind53) {
      plan.forwardBeforeTable = true;
      if (altResolvConfExists) plan.resolvConf = '/var/lib/istio/resolv.conf';
    } else {
      log.error(
        `DNS address ${plan.address} needs CAP_NET_BIND_SERVICE (or root); listening on localhost:15053 instead`,
      );
      plan.address = 'localhost:15053';
    }
  }
  return plan;
}

/**
 * The DNS proxy's options from the agent's config: the listen plan (port 53 rules), upstreams and search domains
 * from resolv.conf, and DNS_FORWARD_PARALLEL / DNS_FORWARD_TIMEOUT from `env` (proxyMetadata over the environment).
 */
export function dnsOptionsFor(
  cfg: Pick<AgentConfig, 'dnsProxyAddr' | 'podNamespace' | 'domain'>,
  env: Env,
  io: { readFile(path: string): string | undefined; canBind53: boolean },
): DnsServerOptions {
  const plan = dnsListenPlan(
    cfg.dnsProxyAddr,
    io.canBind53,
    io.canBind53 && io.readFile('/var/lib/istio/resolv.conf') !== undefined,
  );
  const text = io.readFile(plan.resolvConf);
  if (text === undefined)
    log.warn(`${plan.resolvConf} does not exist: DNS questions not in the name table get SERVFAIL`);
  const rc = parseResolvConf(text ?? '');
  return {
    address: plan.address,
    upstreams: rc.servers,
    searchDomains: rc.search,
    proxyNamespace: cfg.podNamespace,
    proxyDomain: cfg.domain,
    forwardParallel: DNS_FORWARD_PARALLEL.get(env),
    timeoutMs: DNS_FORWARD_TIMEOUT.get(env),
    forwardBeforeTable: plan.forwardBeforeTable,
  };
}

export class DnsServer implements Component {
  readonly name = 'DNS proxy';
  private readonly signal = closedSignal();
  readonly closed = this.signal.closed;
  private readonly udp: dgram.Socket[] = [];
  private readonly tcp: net.Server[] = [];
  private readonly conns = new Set<net.Socket>();
  private table: DnsTable | undefined;
  private nameTable: NameTable | undefined;
  private closing = false;
  private failure: Error | undefined;
  private readonly upstream: Upstreams;
  private boundPort = 0;
  private lastAcceptError = 0;
  private readonly rdataCache = new Map<string, Buffer>();
  private readonly m = {
    requests: new Counter({
      name: 'istio_agent_dns_requests_total',
      help: 'Total number of DNS requests.',
      registers: [],
    }),
    upstream: new Counter({
      name: 'istio_agent_dns_upstream_requests_total',
      help: 'Total number of DNS requests forwarded to upstream.',
      registers: [],
    }),
    failures: new Counter({
      name: 'istio_agent_dns_upstream_failures_total',
      help: 'Total number of DNS requests that no upstream answered.',
      registers: [],
    }),
    malformed: new Counter({
      name: 'istio_agent_dns_malformed_requests_total',
      help: 'DNS requests dropped or answered FORMERR/NOTIMP.',
      registers: [],
    }),
    duration: new Histogram({
      name: 'istio_agent_dns_upstream_request_duration_seconds',
      help: 'Total time in seconds Istio takes to get DNS response from upstream.',
      buckets: [0.001, 0.005, 0.01, 0.1, 1, 5],
      registers: [],
    }),
  };

  constructor(private readonly o: DnsServerOptions) {
    splitHostPort(o.address, 'DNS_PROXY_ADDR');
    this.upstream = new Upstreams({
      servers: o.upstreams,
      parallel: o.forwardParallel ?? false,
      timeoutMs: o.timeoutMs ?? 5000,
    });
  }

  /** The port it listens on (the real one when 0 was asked). */
  get port(): number {
    return this.boundPort;
  }

  async start(): Promise<void> {
    const { host, port } = splitHostPort(this.o.address);
    let hosts = [host || '0.0.0.0'];
    if (host === 'localhost') {
      const fams = new Set(this.o.upstreams.map((u) => net.isIP(splitHostPort(u).host)));
      hosts = [...(fams.has(4) || !fams.has(6) ? ['127.0.0.1'] : []), ...(fams.has(6) ? ['::1'] : [])];
    }
    try {
      for (let attempt = 0; ; attempt++) {
        try {
          this.boundPort = port;
          for (const h of hosts) await this.listen(h);
          break;
        } catch (err) {
          // Port 0: UDP picked a port that TCP cannot have; try another.
          if (port !== 0 || attempt >= 5 || (err as NodeJS.ErrnoException).code !== 'EADDRINUSE') throw err;
          this.closeSockets();
        }
      }
    } catch (err) {
      this.closeSockets();
      throw new AgentError('IO', `failed to start the DNS proxy on ${this.o.address}: ${errorMessage(err)}`, err);
    }
    log.info(
      `DNS proxy listening on ${hosts.map((h) => joinHostPort(h, this.boundPort)).join(', ')} (udp, tcp); upstream ${this.o.upstreams.join(', ') || 'none'}`,
    );
  }

  private async listen(host: string): Promise<void> {
    const sock = dgram.createSocket({ type: net.isIPv6(host) ? 'udp6' : 'udp4', ipv6Only: net.isIPv6(host) });
    this.udp.push(sock);
    await new Promise<void>((resolve, reject) => {
      sock.once('error', reject);
      sock.bind(this.boundPort, host, () => {
        sock.off('error', reject);
        resolve();
      });
    });
    this.boundPort = sock.address().port;
    sock.on('error', (err) => this.fail(`UDP socket on ${host}`, err));
    sock.on('message', (msg, rinfo) => {
      // Source port 0 cannot be answered (send() would throw); a spoofed or raw packet can carry it.
      if (rinfo.port === 0) return void this.m.malformed.inc();
      void this.handle(msg, 'udp').then((reply) => {
        if (!reply || this.closing) return;
        try {
          sock.send(reply, rinfo.port, rinfo.address, (e) => e && log.debug(`cannot send a DNS reply: ${e.message}`));
        } catch (err) {
          log.debug(`cannot send a DNS reply: ${errorMessage(err)}`);
        }
      });
    });
    const srv = net.createServer((c) => this.serveTcp(c));
    // Each connection is a descriptor until its idle timeout: a flood must not use up the agent's.
    srv.maxConnections = TCP_MAX_CONNECTIONS;
    this.tcp.push(srv);
    await new Promise<void>((resolve, reject) => {
      srv.once('error', reject);
      srv.listen({ port: this.boundPort, host, ipv6Only: net.isIPv6(host) }, () => {
        srv.off('error', reject);
        resolve();
      });
    });
    // A failed accept (EMFILE under a connection flood, ECONNABORTED) is one client's loss, not the listener's.
    srv.on('error', (err: NodeJS.ErrnoException) => {
      if (err.syscall !== 'accept') return this.fail(`TCP listener on ${host}`, err);
      if (Date.now() - this.lastAcceptError > 1000) log.warn(`DNS proxy: accept on ${host} failed: ${err.message}`);
      this.lastAcceptError = Date.now();
    });
  }

  private fail(what: string, err: Error): void {
    if (this.closing) return;
    log.error(`DNS proxy ${what} failed: ${err.message}`);
    this.failure = new AgentError('IO', `DNS proxy ${what} failed: ${err.message}`, err);
    void this.close();
  }

  private serveTcp(c: net.Socket): void {
    this.conns.add(c);
    c.setTimeout(TCP_IDLE_MS, () => c.destroy());
    c.on('close', () => this.conns.delete(c));
    c.on('error', () => c.destroy());
    let buf = Buffer.alloc(0);
    // A client that pipelines questions without reading the answers is paused: its questions in flight, its
    // buffered bytes and its unread answers stay bounded (miekg/dns, Istio's server, serves one at a time).
    let inflight = 0;
    const pump = () => {
      while (!c.destroyed && inflight < TCP_MAX_INFLIGHT && c.writableLength <= TCP_MAX_UNREAD && buf.length >= 2) {
        const len = buf.readUInt16BE(0);
        if (buf.length < 2 + len) break;
        const msg = Buffer.from(buf.subarray(2, 2 + len));
        buf = buf.subarray(2 + len);
        inflight++;
        void this.handle(msg, 'tcp').then((reply) => {
          inflight--;
          if (reply && c.writable) c.write(frame(reply));
          pump();
        });
      }
      if (c.destroyed) return;
      if (inflight >= TCP_MAX_INFLIGHT || c.writableLength > TCP_MAX_UNREAD) c.pause();
      else c.resume();
    };
    c.on('drain', pump);
    c.on('data', (chunk) => {
      buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
      pump();
    });
  }

  /** One query in, one reply out (or undefined: dropped). Never throws. */
  async handle(query: Buffer, proto: Proto): Promise<Buffer | undefined> {
    this.m.requests.inc();
    try {
      return await this.answer(query, proto);
    } catch (err) {
      log.debug(`DNS query failed: ${errorMessage(err)}`);
      this.m.malformed.inc();
      return query.length >= HEADER && !(query[2]! & 0x80) ? errorReply(query, RCODE.SERVFAIL) : undefined;
    }
  }

  private async answer(query: Buffer, proto: Proto): Promise<Buffer | undefined> {
    if (query.length < HEADER || query[2]! & 0x80) {
      this.m.malformed.inc();
      return undefined;
    }
    // QUERY, and NOTIFY, which Istio's server (miekg/dns) lets through and answers like a query.
    const opcode = (query.readUInt16BE(2) >> 11) & 0xf;
    if (opcode !== 0 && opcode !== 4) {
      this.m.malformed.inc();
      return errorReply(query, RCODE.NOTIMP);
    }
    const [qd, an, ns, ar] = [4, 6, 8, 10].map((o) => query.readUInt16BE(o)) as [number, number, number, number];
    if (qd !== 1 || an > 1 || ns > 1 || ar > 2) {
      this.m.malformed.inc();
      return errorReply(query, RCODE.FORMERR);
    }
    let req: dnsPacket.DecodedPacket;
    try {
      if (!wellFormed(query)) throw new Error('bad framing');
      req = dnsPacket.decode(query);
    } catch {
      this.m.malformed.inc();
      return errorReply(query, RCODE.FORMERR);
    }
    const q = req.questions![0] as Question;
    const additionals = (req.additionals ?? []) as dnsPacket.Answer[];
    const limit = clientLimit(proto, additionals);
    if (!this.table) {
      if (this.o.forwardBeforeTable) return this.forward(query, proto, limit, q);
      log.debug(`DNS question for ${q.name} before the first name table`);
      return errorReply(query, RCODE.SERVFAIL, q);
    }
    const found = lookup(this.table, q.type, q.name);
    if (!found) return this.forward(query, proto, limit, q);
    const qEnd = questionEnd(query);
    if (qEnd < 0) return errorReply(query, RCODE.FORMERR);
    const cname = found.answers[0]?.type === 'CNAME' ? found.answers[0].data : undefined;
    const addrs = found.answers
      .filter((a) => a.type !== 'CNAME')
      .map((a) => this.rdata(q.type as 'A' | 'AAAA', a.data));
    return encodeLocalAnswer({
      query,
      qEnd,
      ttl: TTL,
      cname,
      type: q.type as 'A' | 'AAAA',
      rdata: shuffle(addrs),
      limit,
      // As Istio's: RD and CD copied, no RA, and no OPT record even to an EDNS query.
      flags: F.AA | (query.readUInt16BE(2) & (F.RD | F.CD)),
    });
  }

  /** Wire form of an address record's data, kept per address (a table has a bounded set of them). */
  private rdata(type: 'A' | 'AAAA', ip: string): Buffer {
    let b = this.rdataCache.get(ip);
    if (!b) {
      if (this.rdataCache.size > 100_000) this.rdataCache.clear();
      this.rdataCache.set(ip, (b = addressRdata(type, ip)));
    }
    return b;
  }

  private async forward(query: Buffer, proto: Proto, limit: number, q: Question): Promise<Buffer> {
    this.m.upstream.inc();
    const end = this.m.duration.startTimer();
    const reply = await this.upstream.forward(query, proto);
    end();
    if (!reply) {
      this.m.failures.inc();
      log.debug(`no upstream answered ${q.name} ${q.type}`);
      return errorReply(query, RCODE.SERVFAIL, q);
    }
    if (reply.length <= limit) return reply;
    // The upstream answered more than the client takes (it ignored the client's EDNS size).
    try {
      return encodeWithin(dnsPacket.decode(reply), limit);
    } catch (err) {
      log.info(`upstream answer for ${q.name} cannot be decoded to truncate it: ${errorMessage(err)}`);
      this.m.failures.inc();
      return errorReply(query, RCODE.SERVFAIL, q);
    }
  }

  /**
   * Takes a new name table. A table with bad entries is rejected (logged, the last good one stays); returns whether
   * it was taken.
   */
  updateTable(nt: NameTable): boolean {
    try {
      this.table = buildDnsTable(nt, this.o);
      this.nameTable = nt;
      log.debug(`name table with ${this.table.hosts} hosts, ${this.table.names.size} names`);
      return true;
    } catch (err) {
      log.error(
        `${errorMessage(err)}; keeping the ${this.table ? 'last good table' : 'SERVFAIL answers until a good table comes'}`,
      );
      return false;
    }
  }

  readiness(): Condition {
    return this.table
      ? { ready: true, reason: '' }
      : { ready: false, reason: 'DNS proxy: no name table from the control plane yet (NDS)' };
  }

  routes(): StatusRoute[] {
    return [{ method: 'GET', path: '/debug/ndsz', handler: () => json(this.nameTable ?? {}) }];
  }

  registerMetrics(registry: Registry): void {
    for (const c of Object.values(this.m)) registry.registerMetric(c);
  }

  /** Counter values, for tests and benchmarks. */
  async stats(): Promise<{ requests: number; upstream: number; failures: number; malformed: number }> {
    const v = async (c: Counter) => (await c.get()).values[0]?.value ?? 0;
    return {
      requests: await v(this.m.requests),
      upstream: await v(this.m.upstream),
      failures: await v(this.m.failures),
      malformed: await v(this.m.malformed),
    };
  }

  private closeSockets(): void {
    for (const s of this.udp.splice(0)) {
      try {
        s.close();
      } catch {
        // already closed
      }
    }
    for (const s of this.tcp.splice(0)) s.close();
  }

  async close(): Promise<void> {
    if (this.closing) return;
    this.closing = true;
    const tcpClosed = this.tcp.map((s) => new Promise<void>((r) => s.close(() => r())));
    for (const s of this.udp.splice(0)) s.close();
    this.tcp.length = 0;
    for (const c of this.conns) c.destroy();
    this.upstream.close();
    await Promise.all(tcpClosed);
    this.signal.resolve(this.failure);
  }
}
