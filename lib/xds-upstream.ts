// The xDS proxy's side towards the control plane: how to reach it (decided from the config as Istio decides),
// and one raw ADS call on a fresh channel. Credentials (root CA, client cert, token) are read from their files at
// every connect, so rotated files take effect on the next reconnect without a restart. The token authenticates the
// stream (Istio's XDS_AUTH; the discovery server's gateway keys and health reports need it): sent over TLS, and in
// plaintext only to a Unix socket or loopback address, as the CA client sends it, never across a network.

import * as fs from 'node:fs';
import * as path from 'node:path';
import type * as http2 from 'node:http2';
import { type ClientCertFiles, loadClientCert, provCertFiles } from './client-cert';
import { ISTIOD_ROOT_CA, MOUNTED_ROOT_CA as DEFAULT_ROOT_CA } from './cert-provider';
import type { AgentConfig } from './config';
import * as envs from './env';
import type { Env } from './env';
import { AgentError, errorMessage } from './errors';
import type { XdsKind } from './xds-state';
import { GrpcStatus } from './grpc-status';
import {
  type ClientTls,
  connectionFailure,
  connectSession,
  describeTarget,
  isLocalTarget,
  type GrpcError,
  header,
  httpStatusCode,
  MessageReader,
  messagePrefix,
  requestHeaders,
  rstStatusCode,
  statusFromHeaders,
} from './grpc-wire';
import { clientTlsOptions } from './tls-policy';

export interface UpstreamOptions {
  /** host:port of the discovery server. */
  address: string;
  tls: boolean;
  /** PEM file of the roots to trust, or SYSTEM; unset: Istio's default locations, looked up at each connect. */
  rootCaFile?: string;
  /** Name the server certificate must carry (also the TLS SNI). Default: the address's host. */
  serverName?: string;
  /** Directory with cert-chain.pem and key.pem for a client certificate (PROV_CERT). */
  clientCertDir?: string;
  /**
   * Client certificate files when the certificates are mounted (ISTIO_META_TLS_CLIENT_KEY and _CERT_CHAIN, as Go's
   * GetKeyCertsForXDS), and the root to verify the server with (ISTIO_META_TLS_CLIENT_ROOT_CERT, FindRootCAForXDS).
   */
  clientKeyFile?: string;
  clientCertFile?: string;
  clientRootFile?: string;
  /** COMPLIANCE_POLICY: restricts this connection's TLS as Go's EnforceGoCompliance does. */
  compliancePolicy?: string;
  /** JWT sent as `authorization: Bearer`, read at each connect; over TLS or to a local address only. */
  tokenFile?: string;
  /** A token held in memory instead (the in-process discovery server of `proxy --standalone`); wins over tokenFile. */
  token?: string;
  /** Extra gRPC metadata (ClusterID, XDS_HEADER_*). */
  headers?: Record<string, string>;
  keepaliveTimeMs?: number;
  keepaliveTimeoutMs?: number;
}

export const ADS_SERVICE = 'envoy.service.discovery.v3.AggregatedDiscoveryService';
export const ADS_PATHS: Record<XdsKind, string> = {
  sotw: `/${ADS_SERVICE}/StreamAggregatedResources`,
  delta: `/${ADS_SERVICE}/DeltaAggregatedResources`,
};

/** Istio's default root locations when XDS_ROOT_CA is unset (pkg/istio-agent FindRootCAForXDS order). */
export { DEFAULT_ROOT_CA, ISTIOD_ROOT_CA };
const THIRD_PARTY_TOKEN = './var/run/secrets/tokens/istio-token';
const FIRST_PARTY_TOKEN = '/var/run/secrets/kubernetes.io/serviceaccount/token';
const XDS_HEADER_PREFIX = 'XDS_HEADER_';

export function splitHostPort(address: string): { host: string; port: string } {
  const m = /^\[([^\]]+)\]:(\d+)$/.exec(address) ?? /^([^:]*):(\d+)$/.exec(address);
  if (m) return { host: m[1]!, port: m[2]! };
  return { host: address, port: '' };
}

/** Plaintext when controlPlaneAuthPolicy is NONE or the port is 15010 (istiod's plaintext port), TLS otherwise. */
export function upstreamFromConfig(cfg: AgentConfig, env: Env): UpstreamOptions {
  const address = cfg.proxy.discoveryAddress;
  const { host, port } = splitHostPort(address);
  const tls = !(cfg.proxy.controlPlaneAuthPolicy === 'NONE' || port === '15010');
  const headers: Record<string, string> = { ClusterID: cfg.clusterId };
  for (const [k, v] of Object.entries(env)) {
    // As Istio does: the rest of the variable's name is the header name (gRPC lowercases it).
    if (k.startsWith(XDS_HEADER_PREFIX) && k.length > XDS_HEADER_PREFIX.length && v !== undefined)
      headers[k.slice(XDS_HEADER_PREFIX.length)] = v;
  }
  const san = envs.ISTIOD_SAN.get(env);
  const o: UpstreamOptions = {
    address,
    tls,
    serverName: san || (host.includes('localhost') ? 'istiod.istio-system.svc' : host),
    tokenFile: envs.JWT_POLICY.get(env) === 'first-party-jwt' ? FIRST_PARTY_TOKEN : THIRD_PARTY_TOKEN,
    headers,
    keepaliveTimeMs: envs.GRPC_KEEPALIVE_INTERVAL.get(env),
    keepaliveTimeoutMs: envs.GRPC_KEEPALIVE_TIMEOUT.get(env),
  };
  const root = envs.XDS_ROOT_CA.get(env);
  if (root) o.rootCaFile = root;
  const prov = envs.PROV_CERT.get(env);
  if (prov) o.clientCertDir = prov;
  else if (envs.FILE_MOUNTED_CERTS.get(env) || workloadCredentialsMounted()) {
    // Go reads these from proxyConfig.proxyMetadata; here also from the environment (proxyMetadata acts as env).
    const key = envs.ISTIO_META_TLS_CLIENT_KEY.get(env);
    const cert = envs.ISTIO_META_TLS_CLIENT_CERT_CHAIN.get(env);
    if (key && cert) Object.assign(o, { clientKeyFile: key, clientCertFile: cert });
    const root = envs.ISTIO_META_TLS_CLIENT_ROOT_CERT.get(env);
    if (root) o.clientRootFile = root;
  }
  const policy = envs.COMPLIANCE_POLICY.get(env);
  if (policy) o.compliancePolicy = policy;
  return o;
}

/** Go's FileMountedCerts also holds when the workload-spiffe-credentials directory has all three files. */
function workloadCredentialsMounted(): boolean {
  const dir = './var/run/secrets/workload-spiffe-credentials';
  return ['cert-chain.pem', 'key.pem', 'root-cert.pem'].every((f) => fs.existsSync(path.join(dir, f)));
}

export interface Backoff {
  /** The shortest delay, and the first after a working stream is lost. */
  initialMs: number;
  /** The longest delay. */
  maxMs: number;
}

/** Each delay is at most this share of the time the upstream has been lost. */
const BACKOFF_SHARE = 0.15;
/** Each delay is spread down to this much less, at random. */
const BACKOFF_JITTER = 0.2;

/**
 * The delay before the next connect attempt, from how long the upstream has been lost: 15 % of that time, at least
 * initialMs and at most maxMs, spread over 80-100 % so that a fleet of agents that lost the same control plane does
 * not come back in one wave. Growing with the time lost rather than doubling at each attempt bounds how late the
 * proxy is when the control plane returns to 15 % of the outage (doubling can leave it waiting almost as long again
 * as the outage lasted), at the price of more attempts, each a single connect.
 */
export function backoffDelay(lostForMs: number, b: Backoff, rand: () => number = Math.random): number {
  const base = Math.min(b.maxMs, Math.max(b.initialMs, lostForMs * BACKOFF_SHARE));
  return Math.round(base * (1 - BACKOFF_JITTER * rand()));
}

function readIfExists(file: string): Buffer | undefined {
  try {
    return fs.readFileSync(file);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new AgentError('IO', `cannot read ${file}: ${errorMessage(e)}`, e);
  }
}

function rootCa(o: UpstreamOptions): Buffer | null {
  if (o.rootCaFile === 'SYSTEM') return null;
  let file = o.rootCaFile;
  if (!file) {
    if (fs.existsSync(DEFAULT_ROOT_CA)) file = DEFAULT_ROOT_CA;
    else if (o.clientCertDir) file = path.join(o.clientCertDir, 'root-cert.pem');
    else file = o.clientRootFile || ISTIOD_ROOT_CA;
  }
  const pem = readIfExists(file);
  if (!pem) throw new AgentError('IO', `root CA file for XDS does not exist: ${file}`);
  return pem;
}

function clientCertFiles(o: UpstreamOptions): ClientCertFiles | undefined {
  if (o.clientCertDir) return provCertFiles(o.clientCertDir);
  return o.clientCertFile && o.clientKeyFile ? { cert: o.clientCertFile, key: o.clientKeyFile } : undefined;
}

export interface UpstreamListener {
  onMessage(message: Buffer): void;
  /** The call ended (always last; once). */
  onStatus(status: { code: number; details: string }): void;
}

/**
 * One ADS call: one message is read per `startRead()` (HTTP/2 flow control holds the rest at the server) and one
 * written at a time, so the proxy decides exactly how much it buffers each way.
 */
export interface UpstreamCall {
  /** Writes one message; `done` runs once HTTP/2 has taken it. Write the next only after that. */
  write(message: Buffer, done: () => void): void;
  /** Asks for the next message. */
  startRead(): void;
  cancel(details: string): void;
  /** Calls back once the connection is up, or with an error after timeoutMs; never after close(). */
  whenReady(timeoutMs: number, cb: (err?: Error) => void): void;
  /** Closes the connection. */
  close(): void;
}

const FLOW_CONTROL_WINDOW = 16 * 1024 * 1024;

/** The stream's metadata: the headers, and the token where it may go (TLS, or a Unix socket or loopback address). */
export function upstreamMetadata(o: UpstreamOptions): Record<string, string> {
  const md: Record<string, string> = {};
  for (const [k, v] of Object.entries(o.headers ?? {})) md[k.toLowerCase()] = v;
  if (o.tls || isLocalTarget(o.address)) {
    const token = o.token ?? (o.tokenFile ? readIfExists(o.tokenFile)?.toString('utf8').trim() : undefined);
    if (token) md.authorization = `Bearer ${token}`;
  }
  return md;
}

function upstreamTls(o: UpstreamOptions): ClientTls {
  const cc = loadClientCert(clientCertFiles(o));
  const root = rootCa(o);
  const pem = { ...(root && { ca: root }), ...(cc && { key: cc.key, cert: cc.cert }) };
  return {
    serverName: o.serverName || splitHostPort(o.address).host,
    options: clientTlsOptions(o.compliancePolicy, pem),
  };
}

/**
 * One HTTP/2 connection to the control plane, made once: the proxy owns reconnecting (a fresh channel per attempt,
 * so rotated roots, certificates and tokens are read again and a failed attempt leaves nothing behind). Keepalive
 * PINGs every keepaliveTimeMs; no ACK within keepaliveTimeoutMs ends the connection, as gRPC's keepalive does.
 */
export class UpstreamChannel {
  readonly session: http2.ClientHttp2Session;
  private up = false;
  private down = false;
  private failure: string | undefined;
  private readonly waiters = new Set<(err?: Error) => void>();
  private keepalive: NodeJS.Timeout | undefined;

  /** Throws AgentError if credentials cannot be loaded, GrpcError for an address that is no target. */
  constructor(private readonly o: UpstreamOptions) {
    this.session = connectSession(o.address, o.tls ? upstreamTls(o) : undefined, {
      h2: {
        settings: { initialWindowSize: FLOW_CONTROL_WINDOW, enablePush: false },
        // A large push in flight is held here until the proxy reads it.
        maxSessionMemory: Math.ceil((4 * FLOW_CONTROL_WINDOW) / (1024 * 1024)),
      },
    });
    const s = this.session;
    s.on('connect', () => {
      this.up = true;
      // HTTP/2's default 64 KB window makes a 10 MB push wait on hundreds of WINDOW_UPDATEs (Envoy advertises
      // 256 MB). This is also the most the proxy holds unread when it stops reading because Envoy is behind.
      try {
        s.setLocalWindowSize(FLOW_CONTROL_WINDOW);
      } catch {
        // the session went meanwhile
      }
      this.startKeepalive();
      for (const w of [...this.waiters]) w();
    });
    s.on('error', (e: Error) => {
      this.failure ??= connectionFailure(o.address, s, e.message);
    });
    s.on('goaway', (code: number) => {
      this.failure ??= `${o.address} closed the connection (GOAWAY, code ${code})`;
    });
    s.on('close', () => {
      this.down = true;
      this.stopKeepalive();
    });
  }

  /** Connecting or connected, and usable for a call. */
  get usable(): boolean {
    return !this.down && !this.session.closed && !this.session.destroyed && this.failure === undefined;
  }

  get connected(): boolean {
    return this.up && this.usable;
  }

  /** Why the connection failed, if it did. */
  get error(): string | undefined {
    return this.failure ?? connectionFailure(this.o.address, this.session);
  }

  whenReady(timeoutMs: number, cb: (err?: Error) => void): () => void {
    if (this.connected) {
      cb();
      return () => undefined;
    }
    // A connection that failed calls back at the deadline only: the call's status says how it failed.
    const timer = setTimeout(
      () =>
        waiter(new Error(`not connected to ${describeTarget(this.o.address, this.session)} within ${timeoutMs} ms`)),
      timeoutMs,
    );
    timer.unref();
    const waiter = (err?: Error) => {
      clearTimeout(timer);
      this.waiters.delete(waiter);
      cb(err);
    };
    this.waiters.add(waiter);
    return () => {
      clearTimeout(timer);
      this.waiters.delete(waiter);
    };
  }

  close(): void {
    this.down = true;
    this.stopKeepalive();
    this.waiters.clear();
    this.session.destroy();
  }

  private startKeepalive(): void {
    const every = this.o.keepaliveTimeMs ?? 30_000;
    const timeout = this.o.keepaliveTimeoutMs ?? 10_000;
    if (!(every > 0) || !Number.isFinite(every)) return;
    this.keepalive = setInterval(() => {
      if (this.down) return;
      const t = setTimeout(() => {
        this.failure ??= `${this.o.address} did not answer a keepalive ping within ${timeout} ms`;
        this.session.destroy();
      }, timeout);
      t.unref();
      try {
        if (!this.session.ping(() => clearTimeout(t))) clearTimeout(t);
      } catch {
        clearTimeout(t);
      }
    }, every);
    this.keepalive.unref();
  }

  private stopKeepalive(): void {
    if (this.keepalive) clearInterval(this.keepalive);
    this.keepalive = undefined;
  }
}

/** How long a spare channel waits for Envoy's first stream before it is closed (Envoy connects within ~0.3 s). */
const SPARE_MAX_AGE_MS = 10_000;

/**
 * A channel opened and connecting before Envoy's first stream, so that the stream's upstream connection (TCP, TLS)
 * is made while Envoy starts rather than after it asks (the Go agent dials only then). `take()` hands it over once,
 * while it is connecting or connected and young; otherwise it is closed and the caller opens a channel as usual.
 */
export interface SpareChannel {
  take(): UpstreamChannel | undefined;
  close(): void;
}

/** Starts connecting a spare channel; undefined when its credentials cannot be loaded now (the caller's own try says why). */
export function spareChannel(o: UpstreamOptions): SpareChannel | undefined {
  let channel: UpstreamChannel | undefined;
  try {
    channel = new UpstreamChannel(o);
  } catch {
    return undefined;
  }
  const close = () => {
    clearTimeout(timer);
    channel?.close();
    channel = undefined;
  };
  const timer = setTimeout(close, SPARE_MAX_AGE_MS);
  timer.unref();
  return {
    take: () => {
      const c = channel;
      if (!c) return undefined;
      channel = undefined;
      clearTimeout(timer);
      if (c.usable) return c;
      c.close();
      return undefined;
    },
    close,
  };
}

/**
 * Opens one ADS call on a connection of its own (a new one, or `channel`, which it then owns). Throws AgentError if
 * credentials cannot be loaded, GrpcError for an unusable address or metadata.
 */
export function openUpstream(
  o: UpstreamOptions,
  kind: XdsKind,
  maxMessageBytes: number,
  listener: UpstreamListener,
  channel?: UpstreamChannel,
): UpstreamCall {
  const headers = requestHeaders(ADS_PATHS[kind], upstreamMetadata(o));
  const ch = channel ?? new UpstreamChannel(o);
  const who = o.address;
  const reader = new MessageReader(maxMessageBytes);
  const queue: Buffer[] = [];
  let wanted = 0;
  let delivering = false;
  let closed = false;
  let ended = false;
  let finalStatus: { code: number; details: string } | undefined;
  let httpStatus = 0;
  let trailerStatus: { code: number; details: string } | undefined;
  let stopWaiting: (() => void) | undefined;

  const report = (st: { code: number; details: string }) => {
    if (ended) return;
    ended = true;
    queue.length = 0;
    listener.onStatus(st);
  };
  /** The stream is over: its status goes after the messages already read (at once if it failed). */
  const finish = (st: { code: number; details: string }, now = false) => {
    if (ended || finalStatus) return;
    finalStatus = st;
    if (now || queue.length === 0) report(st);
  };
  const deliver = () => {
    if (delivering) return;
    delivering = true;
    try {
      while (wanted > 0 && queue.length > 0 && !ended) {
        wanted--;
        listener.onMessage(queue.shift()!);
      }
    } finally {
      delivering = false;
    }
    if (finalStatus && queue.length === 0) report(finalStatus);
    else if (wanted > 0 && !ended && stream?.isPaused()) stream.resume();
  };
  const abort = (code: number, details: string) => {
    try {
      stream?.close(8 /* CANCEL */);
    } catch {
      // already gone
    }
    finish({ code, details }, true);
  };

  let stream: http2.ClientHttp2Stream | undefined;
  try {
    stream = ch.session.request(headers, { endStream: false });
  } catch (e) {
    const details = ch.error ?? `cannot start a call to ${who}: ${errorMessage(e)}`;
    setImmediate(() => finish({ code: GrpcStatus.UNAVAILABLE, details }, true));
  }
  if (stream) {
    const st = stream;
    st.on('response', (h) => {
      httpStatus = Number(h[':status']);
      if (httpStatus !== 200) return abort(httpStatusCode(httpStatus), `${who} answered HTTP ${httpStatus}`);
      const raw = header(h, 'grpc-status');
      // A trailers-only answer has its status here.
      if (raw !== undefined) trailerStatus = statusFromHeaders(raw, header(h, 'grpc-message'), who);
      else if (!/^application\/grpc/.test(header(h, 'content-type') ?? ''))
        abort(GrpcStatus.UNKNOWN, `${who} answered content-type ${header(h, 'content-type') ?? 'none'}`);
    });
    st.on('trailers', (h) => {
      trailerStatus = statusFromHeaders(header(h, 'grpc-status'), header(h, 'grpc-message'), who);
    });
    st.on('data', (chunk: Buffer) => {
      if (ended || finalStatus) return;
      let messages: Buffer[];
      try {
        messages = reader.push(chunk);
      } catch (e) {
        const g = e as GrpcError;
        return abort(g.code, g.details);
      }
      queue.push(...messages);
      deliver();
      if (queue.length > 0 && wanted === 0) st.pause();
    });
    // A reset stream also emits 'error'; what it means is decided on 'close'.
    st.on('error', () => undefined);
    st.on('close', () => {
      if (trailerStatus) {
        if (trailerStatus.code === GrpcStatus.OK && reader.pending)
          return finish({ code: GrpcStatus.INTERNAL, details: `${who} ended the call inside a message` });
        return finish(trailerStatus);
      }
      const rst = st.rstCode;
      const what = `${who} ended the call without a status (stream reset code ${rst})`;
      // Nothing answered: the connection failed (its own error, when there is one, says how; it may come later).
      if (!httpStatus)
        return setImmediate(() => finish({ code: GrpcStatus.UNAVAILABLE, details: ch.error ?? what }, true));
      finish({ code: rstStatusCode(rst), details: what }, true);
    });
    st.pause();
  }

  return {
    write: (m, done) => {
      if (ended || finalStatus || !stream) return;
      if (m.length > maxMessageBytes)
        return abort(GrpcStatus.RESOURCE_EXHAUSTED, `Sent message larger than max (${m.length} vs ${maxMessageBytes})`);
      stream.write(messagePrefix(m.length));
      stream.write(m, (err) => {
        if (!err) done();
      });
    },
    startRead: () => {
      if (ended) return;
      wanted++;
      deliver();
    },
    cancel: (details) => abort(GrpcStatus.CANCELLED, details),
    whenReady: (timeoutMs, cb) => {
      stopWaiting = ch.whenReady(timeoutMs, (err) => {
        if (!closed) cb(err);
      });
    },
    close: () => {
      closed = true;
      stopWaiting?.();
      ch.close();
    },
  };
}
