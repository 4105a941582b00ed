// Forwarding for the DNS proxy: a question the name table does not answer goes, as is, to the resolv.conf servers
// over the protocol the client used: one after the other in a random order, or all at once (first answer wins,
// the others are cancelled) with DNS_FORWARD_PARALLEL. Each server gets `timeoutMs`; an answer whose framing does not
// hold is a failure of that server; undefined when none answers (the proxy then says SERVFAIL).
//
// Each UDP question gets its own connected socket: a fresh random source port (the id alone is 16 bits to guess),
// only the server's packets reach it, and a refused port fails at once instead of at the timeout.

import * as dgram from 'node:dgram';
import * as net from 'node:net';
import { AgentError, errorMessage } from './errors';
import { scope } from './log';
import { frame, isAnswerTo, type Proto, questionEnd, shuffle, wellFormed } from './dns-wire';

const log = scope('dns');

/** resolv.conf -> upstream `host:port` list and search domains (the last `search` or `domain` line wins). */
export function parseResolvConf(text: string): { servers: string[]; search: string[] } {
  const servers: string[] = [];
  let search: string[] = [];
  for (const raw of text.split('\n')) {
    const line = raw.replace(/[#;].*$/, '').trim();
    const [key, ...rest] = line.split(/\s+/);
    if (key === 'nameserver' && rest[0]) {
      const ip = rest[0].replace(/%.*$/, '');
      if (net.isIP(ip)) servers.push(joinHostPort(ip, 53));
    } else if ((key === 'search' || key === 'domain') && rest.length) search = rest;
  }
  return { servers, search };
}

export function joinHostPort(host: string, port: number): string {
  return host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
}

export function splitHostPort(addr: string, what = 'DNS address'): { host: string; port: number } {
  const m = /^(?:\[([^\]]+)\]|([^:\s]*)):(\d{1,5})$/.exec(addr);
  const port = m ? Number(m[3]) : NaN;
  if (!m || port > 65535) throw new AgentError('CONFIG_INVALID', `invalid ${what} "${addr}": want host:port`);
  return { host: m[1] ?? m[2] ?? '', port };
}

export interface UpstreamOptions {
  /** `host:port` of each server, in order. */
  servers: readonly string[];
  parallel: boolean;
  timeoutMs: number;
}

/** Questions waiting for an upstream at once, at most. */
const MAX_PENDING = 1024;

interface Exchange {
  reply: Promise<Buffer | undefined>;
  cancel(): void;
}

export class Upstreams {
  private readonly servers: { addr: string; host: string; port: number }[];
  private readonly inflight = new Set<Exchange>();
  private closed = false;
  private pending = 0;
  private saturated = false;

  constructor(private readonly o: UpstreamOptions) {
    this.servers = o.servers.map((addr) => ({ addr, ...splitHostPort(addr, 'upstream DNS server') }));
  }

  /** The first answer to `query` from a server, or undefined when none answers in time. */
  async forward(query: Buffer, proto: Proto): Promise<Buffer | undefined> {
    const qEnd = questionEnd(query);
    if (qEnd < 0 || this.closed) return undefined;
    // Each question in flight holds a socket: a flood against a silent upstream must not use up the descriptors
    // the rest of the agent needs. Beyond the cap, questions fail at once (SERVFAIL) until some are answered.
    if (this.pending >= MAX_PENDING) {
      if (!this.saturated) log.warn(`${MAX_PENDING} DNS questions wait for an upstream; failing new ones for now`);
      this.saturated = true;
      return undefined;
    }
    this.saturated = false;
    this.pending++;
    try {
      return await this.forwardNow(query, qEnd, proto);
    } finally {
      this.pending--;
    }
  }

  private async forwardNow(query: Buffer, qEnd: number, proto: Proto): Promise<Buffer | undefined> {
    if (!this.o.parallel) {
      // In a random order each time, as Istio's agent does: the load spreads over the servers.
      for (const s of shuffle([...this.servers])) {
        const reply = await this.exchange(s, query, qEnd, proto).reply;
        if (reply || this.closed) return reply;
      }
      return undefined;
    }
    const all = this.servers.map((s) => this.exchange(s, query, qEnd, proto));
    const reply = await firstSuccess(all.map((e) => e.reply));
    for (const e of all) e.cancel();
    return reply;
  }

  /** Ends every exchange in flight (their questions get undefined). */
  close(): void {
    this.closed = true;
    for (const e of [...this.inflight]) e.cancel();
  }

  /** One server, one try: the reply, or undefined on timeout, error, or an answer whose framing does not hold. */
  private exchange(
    server: { addr: string; host: string; port: number },
    query: Buffer,
    qEnd: number,
    proto: Proto,
  ): Exchange {
    const { addr: upstream, host, port } = server;
    let cancel = () => {};
    const reply = new Promise<Buffer | undefined>((resolve) => {
      let done = false;
      let cleanup = () => {};
      const finish = (reply: Buffer | undefined, why?: string) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        cleanup();
        if (why) log.info(`upstream failure: ${upstream}: ${why}`);
        resolve(reply);
      };
      cancel = () => finish(undefined);
      const timer = setTimeout(() => finish(undefined, `no answer within ${this.o.timeoutMs} ms`), this.o.timeoutMs);
      timer.unref();
      const accept = (reply: Buffer): boolean => {
        if (!isAnswerTo(query, qEnd, reply)) return false;
        // The framing check is enough to pass it on; it is decoded only if it must be cut down.
        if (!wellFormed(reply)) finish(undefined, 'undecodable answer');
        else finish(reply);
        return true;
      };
      if (proto === 'udp') {
        const s = dgram.createSocket(net.isIPv6(host) ? 'udp6' : 'udp4');
        cleanup = () => {
          try {
            s.close();
          } catch {
            // never bound: nothing to close
          }
        };
        s.on('error', (err) => finish(undefined, err.message));
        s.on('message', (msg) => void accept(msg));
        // A connect that fails (no route: a network blip, an IPv6 server on a v4-only host) comes back here with
        // the error; sending on the unconnected socket then would throw. finish() may also have closed it already.
        s.connect(port, host, (err?: Error) => {
          if (done) return;
          if (err) return finish(undefined, err.message);
          try {
            s.send(query, (e) => e && finish(undefined, e.message));
          } catch (e) {
            finish(undefined, errorMessage(e));
          }
        });
      } else {
        const s = net.connect({ host, port });
        cleanup = () => s.destroy();
        s.on('error', (err) => finish(undefined, err.message));
        s.on('close', () => finish(undefined, 'connection closed before an answer'));
        s.on('connect', () => s.write(frame(query)));
        let buf = Buffer.alloc(0);
        s.on('data', (chunk) => {
          buf = Buffer.concat([buf, chunk]);
          while (buf.length >= 2 && buf.length >= 2 + buf.readUInt16BE(0)) {
            const msg = buf.subarray(2, 2 + buf.readUInt16BE(0));
            buf = buf.subarray(2 + msg.length);
            if (accept(Buffer.from(msg))) return;
          }
        });
      }
    });
    const ex: Exchange = { reply, cancel: () => cancel() };
    this.inflight.add(ex);
    void reply.then(() => this.inflight.delete(ex));
    return ex;
  }
}

/** The first promise that resolves to a value; undefined when all resolve to undefined. */
function firstSuccess<T>(ps: Promise<T | undefined>[]): Promise<T | undefined> {
  return new Promise((resolve) => {
    let left = ps.length;
    if (!left) resolve(undefined);
    for (const p of ps) {
      void p.then((v) => {
        if (v !== undefined) resolve(v);
        else if (--left === 0) resolve(undefined);
      });
    }
  });
}
