// The HTTP client behind HTTP app probes, with the Go agent's connection policy (pilot/cmd/pilot-agent/status/
// server.go, setTransportDefaults and the per-path http.Client):
// - ISTIO_ENABLE_HTTP2_PROBING (default true): an HTTPS probe offers ALPN `h2, http/1.1` and speaks what the app
//   picks, as Go's http2.ConfigureTransports does; false: no ALPN at all, HTTP/1.1. Plain HTTP is always HTTP/1.1
//   (Go never tries h2c).
// - ENABLE_PROBE_KEEPALIVE_CONNECTIONS (default false, kubelet's behaviour): every probe its own connection,
//   `Connection: close` on HTTP/1.1 and an HTTP/2 connection used for one request; true: connections are kept per
//   probe path and reused, idle ones closed after 90 s (Go's IdleConnTimeout), at most 2 idle (MaxIdleConnsPerHost).
// A kept HTTP/2 connection from which nothing has been read for 30 s is sent a PING, and closed when the answer
// does not come within 15 s (Go's ReadIdleTimeout and PingTimeout), so a peer that went away without a FIN (a
// paused or partitioned app) costs one dropped connection, not probes that time out on it.
// TLS is not verified (kubelet does not either); SNI is the URL's host when it is a name, none for an IP (as Go).
// A request that fails on a reused connection before any answer is tried once more on a new one, as Go retries
// an idempotent request whose kept connection the app had closed.

import type * as http from 'node:http';
import type * as http2 from 'node:http2';
import * as net from 'node:net';
import type { Duplex } from 'node:stream';
import type * as tls from 'node:tls';

export interface ProbeClientOptions {
  keepAlive: boolean;
  /** Offer h2 by ALPN on HTTPS. */
  http2: boolean;
  /** Kept HTTP/2 connections' health check; Go's 30 s and 15 s when unset. For tests: no variable sets it. */
  h2Health?: { readIdleMs: number; pingTimeoutMs: number };
}

export interface ProbeRequest {
  url: URL;
  /** Request headers in order; a `host` header is the Host (`:authority` on HTTP/2). */
  headers: Array<[string, string]>;
  localAddress?: string;
  signal: AbortSignal;
  /** Bytes of body kept; the connection is dropped once they are read. */
  maxBody: number;
}

export interface ProbeResponse {
  status: number;
  location?: string;
  body: string;
  protocol: 'http/1.1' | 'h2';
}

const IDLE_MS = 90_000;
const H2_HEALTH = { readIdleMs: 30_000, pingTimeoutMs: 15_000 };

/** What a kept HTTP/2 session's timer looks at. */
interface SessionUse {
  /** Last frame read (an answer's headers or data, a PING's ACK). */
  lastRead: number;
  /** Last request started or finished: idle for IDLE_MS, the connection is closed. */
  lastUse: number;
}

/** The TLS handshake picked h2: the connection goes to an HTTP/2 session instead of the HTTP/1.1 agent. */
class H2Negotiated extends Error {
  constructor(readonly socket: tls.TLSSocket) {
    super('the app negotiated h2');
  }
}

interface DialOptions {
  host: string;
  port: number;
  localAddress?: string;
  probeTls?: { alpn?: string[] };
  probeSignal?: AbortSignal;
}

// node:http is loaded by the first client (the app probes start after Envoy's spawn), not with this module, which
// the probe settings' parser loads before it. require, not import(): a single executable has no dynamic import of
// built-ins.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const httpModule = () => require('node:http') as typeof http;

type ProbeAgent = http.Agent;
let probeAgent: (new (o: http.AgentOptions) => ProbeAgent) | undefined;

/** The one dialer for HTTP/1.1 connections, plain or TLS; for TLS it reports an h2 handshake instead of using it. */
const probeAgentClass = () =>
  (probeAgent ??= class ProbeAgent extends httpModule().Agent {
    override createConnection(
      args: http.ClientRequestArgs,
      cb?: (err: Error | null, s: Duplex) => void,
    ): Duplex | undefined {
      const o = args as DialOptions;
      const tcp = net.connect({ host: o.host, port: o.port, localAddress: o.localAddress });
      if (!o.probeTls) return tcp;
      // eslint-disable-next-line @typescript-eslint/no-require-imports
      const tlsMod = require('node:tls') as typeof tls;
      const sock = tlsMod.connect({
        socket: tcp,
        rejectUnauthorized: false,
        servername: net.isIP(o.host) ? undefined : o.host,
        ALPNProtocols: o.probeTls.alpn,
      });
      const abort = () => sock.destroy(new Error('probe cancelled'));
      const settle = (err: Error | null, s?: Duplex) => {
        sock.off('error', onError);
        o.probeSignal?.removeEventListener('abort', abort);
        cb?.(err, s as Duplex);
      };
      const onError = (e: Error) => settle(e);
      sock.once('error', onError);
      o.probeSignal?.addEventListener('abort', abort, { once: true });
      sock.once('secureConnect', () => {
        if (sock.alpnProtocol === 'h2') settle(new H2Negotiated(sock));
        else settle(null, sock);
      });
      return undefined;
    }
  });

export class ProbeClient {
  private readonly agent: ProbeAgent;
  private readonly sessions = new Map<string, http2.ClientHttp2Session>();
  private readonly use = new WeakMap<http2.ClientHttp2Session, SessionUse>();
  private closed = false;

  constructor(private readonly o: ProbeClientOptions) {
    const kept = { keepAlive: true, maxFreeSockets: 2, timeout: IDLE_MS };
    this.agent = new (probeAgentClass())(o.keepAlive ? kept : { keepAlive: false });
  }

  async get(r: ProbeRequest): Promise<ProbeResponse> {
    const key = `${r.url.host} ${r.localAddress ?? ''}`;
    const kept = r.url.protocol === 'https:' && this.o.http2 ? this.sessions.get(key) : undefined;
    if (kept && !kept.closed && !kept.destroyed) {
      try {
        return await this.h2Get(kept, r);
      } catch (e) {
        if (r.signal.aborted || (e as { answered?: boolean }).answered) throw e;
        kept.destroy();
      }
    }
    try {
      return await this.h1Get(r, true);
    } catch (e) {
      if (!(e instanceof H2Negotiated)) throw e;
      return this.h2Get(this.session(e.socket, r.url, key), r);
    }
  }

  close(): void {
    this.closed = true;
    this.agent.destroy();
    for (const s of this.sessions.values()) s.destroy();
    this.sessions.clear();
  }

  private h1Get(r: ProbeRequest, retry: boolean): Promise<ProbeResponse> {
    const headers: Record<string, string | string[]> = {};
    for (const [k, v] of r.headers) {
      const key = k.toLowerCase();
      const prev = headers[key];
      headers[key] = prev === undefined ? v : ([] as string[]).concat(prev, v);
    }
    const https = r.url.protocol === 'https:';
    const opts: http.RequestOptions & DialOptions = {
      method: 'GET',
      host: r.url.hostname.replace(/^\[(.*)\]$/, '$1'),
      port: Number(r.url.port || (https ? 443 : 80)),
      path: r.url.pathname + r.url.search,
      headers,
      agent: this.agent as http.Agent,
      localAddress: r.localAddress,
      signal: r.signal,
      probeTls: https ? { alpn: this.o.http2 ? ['h2', 'http/1.1'] : undefined } : undefined,
      probeSignal: r.signal,
    };
    return new Promise<ProbeResponse>((resolve, reject) => {
      const req = httpModule().request(opts, (res) => {
        const chunks: Buffer[] = [];
        let size = 0;
        let settled = false;
        const finish = (capped: boolean) => {
          if (settled) return;
          settled = true;
          res.removeAllListeners('data');
          // The rest of a large body is never read: that connection is dropped, not kept.
          if (capped) req.destroy();
          const body = Buffer.concat(chunks).subarray(0, r.maxBody).toString('utf8');
          resolve({ status: res.statusCode ?? 0, location: res.headers.location, body, protocol: 'http/1.1' });
        };
        res.on('data', (c: Buffer) => {
          chunks.push(c);
          size += c.length;
          if (size >= r.maxBody) finish(true);
        });
        res.on('end', () => finish(false));
        res.on('error', (e) => reject(Object.assign(e, { answered: true })));
      });
      req.on('error', (e) => {
        // A kept connection the app closed meanwhile: once more, on a new one.
        const again = retry && req.reusedSocket && !r.signal.aborted && !(e instanceof H2Negotiated);
        if (again) resolve(this.h1Get(r, false));
        else reject(e);
      });
      req.end();
    });
  }

  private session(sock: tls.TLSSocket, url: URL, key: string): http2.ClientHttp2Session {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const h2 = require('node:http2') as typeof http2;
    const s = h2.connect(`https://${url.host}`, { createConnection: () => sock });
    s.on('error', () => undefined);
    if (this.o.keepAlive && !this.closed) {
      this.sessions.get(key)?.destroy();
      this.sessions.set(key, s);
      s.once('close', () => {
        if (this.sessions.get(key) === s) this.sessions.delete(key);
      });
      s.once('goaway', () => {
        if (this.sessions.get(key) === s) this.sessions.delete(key);
      });
      s.unref();
      this.watch(s);
    }
    return s;
  }

  /**
   * One unref'd timer per kept session for both of its clocks: closed once unused for IDLE_MS (the session's own
   * setTimeout would not do: the PINGs count as activity there), and a PING after readIdleMs without a frame read,
   * the session destroyed when its ACK is not back within pingTimeoutMs.
   */
  private watch(s: http2.ClientHttp2Session): void {
    const { readIdleMs, pingTimeoutMs } = this.o.h2Health ?? H2_HEALTH;
    const u: SessionUse = { lastRead: Date.now(), lastUse: Date.now() };
    this.use.set(s, u);
    let timer: NodeJS.Timeout | undefined;
    const arm = (ms: number) => (timer = setTimeout(check, Math.max(0, ms)).unref());
    const check = () => {
      if (s.closed || s.destroyed) return;
      const now = Date.now();
      if (now - u.lastUse >= IDLE_MS) return void s.close();
      if (now - u.lastRead < readIdleMs)
        return arm(Math.min(readIdleMs - (now - u.lastRead), IDLE_MS - (now - u.lastUse)));
      timer = setTimeout(
        () => s.destroy(new Error(`no answer to an HTTP/2 PING within ${pingTimeoutMs} ms`)),
        pingTimeoutMs,
      ).unref();
      const sent = s.ping((err) => {
        clearTimeout(timer);
        if (err) return void s.destroy();
        u.lastRead = Date.now();
        arm(0);
      });
      if (!sent) s.destroy();
    };
    arm(readIdleMs);
    s.once('close', () => clearTimeout(timer));
  }

  private h2Get(s: http2.ClientHttp2Session, r: ProbeRequest): Promise<ProbeResponse> {
    const headers: http2.OutgoingHttpHeaders = {
      ':method': 'GET',
      ':scheme': 'https',
      ':path': r.url.pathname + r.url.search,
      ':authority': r.url.host,
    };
    for (const [k, v] of r.headers) {
      const key = k.toLowerCase();
      if (key === 'host') {
        headers[':authority'] = v;
        continue;
      }
      const prev = headers[key];
      headers[key] = prev === undefined ? v : ([] as string[]).concat(prev as string | string[], v);
    }
    const u = this.use.get(s);
    const read = () => {
      if (u) u.lastRead = u.lastUse = Date.now();
    };
    if (u) u.lastUse = Date.now();
    const done = () => {
      // Go's single-use connection: one request, then closed.
      if (!this.o.keepAlive) s.destroy();
    };
    return new Promise<ProbeResponse>((resolve, reject) => {
      let stream: http2.ClientHttp2Stream;
      try {
        stream = s.request(headers, { endStream: true, signal: r.signal });
      } catch (e) {
        done();
        return reject(e);
      }
      const chunks: Buffer[] = [];
      let size = 0;
      let status = 0;
      let location: string | undefined;
      let settled = false;
      const finish = (capped: boolean) => {
        if (settled) return;
        settled = true;
        stream.removeAllListeners('data');
        if (capped) stream.close(0x8 /* CANCEL */);
        done();
        const body = Buffer.concat(chunks).subarray(0, r.maxBody).toString('utf8');
        resolve({ status, location, body, protocol: 'h2' });
      };
      stream.on('response', (h) => {
        read();
        status = Number(h[':status'] ?? 0);
        const loc = h.location;
        location = Array.isArray(loc) ? loc[0] : loc;
      });
      stream.on('data', (c: Buffer) => {
        read();
        chunks.push(c);
        size += c.length;
        if (size >= r.maxBody) finish(true);
      });
      stream.on('end', () => finish(false));
      stream.on('error', (e) => {
        if (settled) return;
        settled = true;
        done();
        reject(Object.assign(e, { answered: status !== 0 }));
      });
      stream.on('close', () => {
        if (settled) return;
        settled = true;
        done();
        reject(Object.assign(new Error(`HTTP/2 stream closed (code ${stream.rstCode})`), { answered: status !== 0 }));
      });
    });
  }
}
