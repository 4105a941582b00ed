// The xDS proxy's side towards the control plane: how to reach it (decided from the config as Istio decides),
// and one raw ADS call on a fresh channel. Credentials (root CA, client cert, token) are read from their files at
// every connect, so rotated files take effect on the next reconnect without a restart. The token authenticates the
// stream (Istio's XDS_AUTH; the discovery server's gateway keys and health reports need it): sent over TLS, and in
// plaintext only to a Unix socket or loopback address, as the CA client sends it, never across a network.

import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import type * as grpc from '@grpc/grpc-js';
import { type ClientCertFiles, loadClientCert, provCertFiles } from './client-cert';
import { ISTIOD_ROOT_CA, MOUNTED_ROOT_CA as DEFAULT_ROOT_CA } from './cert-provider';
import type { AgentConfig } from './config';
import * as envs from './env';
import type { Env } from './env';
import { AgentError, errorMessage } from './errors';
import type { XdsKind } from './xds-state';
import { tlsCredentials } from './tls-policy';

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

/** A Unix socket or a loopback address: a plaintext token sent there crosses no network. */
export function isLocalAddress(address: string): boolean {
  if (address.startsWith('unix:') || address.startsWith('/')) return true;
  const { host } = splitHostPort(address);
  return host === 'localhost' || host === '::1' || (net.isIPv4(host) && host.startsWith('127.'));
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
 * One ADS call at the level of grpc-js's channel call, below its Node streams: one message is read per
 * `startRead()` and one written at a time, so the proxy decides exactly how much it buffers each way.
 */
export interface UpstreamCall {
  /** Writes one message; `done` runs once gRPC has taken it. Write the next only after that. */
  write(message: Buffer, done: () => void): void;
  /** Asks for the next message. */
  startRead(): void;
  cancel(details: string): void;
  /** Calls back once the channel is connected, or with an error after timeoutMs; never after close(). */
  whenReady(timeoutMs: number, cb: (err?: Error) => void): void;
  /** Closes the channel. */
  close(): void;
}

const FLOW_CONTROL_WINDOW = 16 * 1024 * 1024;

// grpc-js loads with the first call, not with this module: the CA client takes its options from here, and the agent
// asks the CA before grpc-js has loaded (see agent.ts).
// eslint-disable-next-line @typescript-eslint/no-require-imports
const grpcJs = () => require('@grpc/grpc-js') as typeof grpc;

/** The stream's metadata: the headers, and the token where it may go (TLS, or a Unix socket or loopback address). */
export function upstreamMetadata(o: UpstreamOptions): grpc.Metadata {
  const md = new (grpcJs().Metadata)();
  for (const [k, v] of Object.entries(o.headers ?? {})) md.set(k, v);
  if (o.tls || isLocalAddress(o.address)) {
    const token = o.token ?? (o.tokenFile ? readIfExists(o.tokenFile)?.toString('utf8').trim() : undefined);
    if (token) md.set('authorization', `Bearer ${token}`);
  }
  return md;
}

/** A channel (one connection) to the control plane. Throws AgentError if credentials cannot be loaded. */
function newChannel(o: UpstreamOptions, maxMessageBytes: number): grpc.Client {
  const grpc = grpcJs();
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const { connectOnceOptions } = require('./grpc-connect-once') as typeof import('./grpc-connect-once');
  const options: grpc.ChannelOptions = {
    'grpc.max_receive_message_length': maxMessageBytes,
    'grpc.max_send_message_length': maxMessageBytes,
    'grpc.keepalive_time_ms': o.keepaliveTimeMs ?? 30_000,
    'grpc.keepalive_timeout_ms': o.keepaliveTimeoutMs ?? 10_000,
    // The proxy owns retries: it re-sends subscriptions itself, so gRPC must not replay messages.
    'grpc.enable_retries': 0,
    // The proxy also owns the reconnect backoff: each channel is one connection attempt (see grpc-connect-once.ts).
    // A channel that shares a subchannel still in another's backoff fails at once without connecting ("No
    // connection established. Last error: null"), and the two backoffs multiply into a 30 s stall after a 3 s outage.
    ...connectOnceOptions(),
    // HTTP/2's default 64 KB window makes a 10 MB push wait on hundreds of WINDOW_UPDATEs (Envoy advertises
    // 256 MB). This is also the most the proxy holds unread when it stops reading because Envoy is behind.
    'grpc-node.flow_control_window': FLOW_CONTROL_WINDOW,
  };
  let creds: grpc.ChannelCredentials;
  if (o.tls) {
    const cc = loadClientCert(clientCertFiles(o));
    creds = tlsCredentials(o.compliancePolicy, rootCa(o), cc?.key ?? null, cc?.cert ?? null);
    const { host } = splitHostPort(o.address);
    if (o.serverName && o.serverName !== host && !net.isIP(o.serverName))
      options['grpc.ssl_target_name_override'] = o.serverName;
  } else {
    creds = grpc.credentials.createInsecure();
  }
  return new grpc.Client(o.address, creds, options);
}

/** How long a spare channel waits for Envoy's first stream before it is closed (Envoy connects within ~0.3 s). */
const SPARE_MAX_AGE_MS = 10_000;

/**
 * A channel opened and connecting before Envoy's first stream, so that the stream's upstream connection (TCP, TLS)
 * is made while Envoy starts rather than after it asks (the Go agent dials only then). `take()` hands it over once,
 * while it is connecting or connected and young; otherwise it is closed and the caller opens a channel as usual.
 */
export interface SpareChannel {
  take(): grpc.Client | undefined;
  close(): void;
}

/** Starts connecting a spare channel; undefined when its credentials cannot be loaded now (the caller's own try says why). */
export function spareChannel(o: UpstreamOptions, maxMessageBytes: number): SpareChannel | undefined {
  let client: grpc.Client | undefined;
  try {
    client = newChannel(o, maxMessageBytes);
  } catch {
    return undefined;
  }
  const { connectivityState } = grpcJs();
  client.getChannel().getConnectivityState(true);
  const close = () => {
    clearTimeout(timer);
    client?.close();
    client = undefined;
  };
  const timer = setTimeout(close, SPARE_MAX_AGE_MS);
  timer.unref();
  return {
    take: () => {
      const c = client;
      if (!c) return undefined;
      client = undefined;
      clearTimeout(timer);
      const state = c.getChannel().getConnectivityState(false);
      if (state === connectivityState.READY || state === connectivityState.CONNECTING) return c;
      c.close();
      return undefined;
    },
    close,
  };
}

/**
 * Opens one ADS call on a channel with a connection of its own (a new one, or `channel`, which it then owns).
 * Throws AgentError if credentials cannot be loaded.
 */
export function openUpstream(
  o: UpstreamOptions,
  kind: XdsKind,
  maxMessageBytes: number,
  listener: UpstreamListener,
  channel?: grpc.Client,
): UpstreamCall {
  const grpc = grpcJs();
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const { whenChannelReady } = require('./grpc-connect-once') as typeof import('./grpc-connect-once');
  const client = channel ?? newChannel(o, maxMessageBytes);
  const md = upstreamMetadata(o);
  let closed = false;
  // Messages are Buffers at this level: serialization is the client stub's job, and there is none.
  const call = client.getChannel().createCall(ADS_PATHS[kind], Infinity, null, null, null);
  call.start(md, {
    onReceiveMetadata: () => undefined,
    onReceiveMessage: (m: Buffer) => listener.onMessage(m),
    onReceiveStatus: (st) => listener.onStatus({ code: st.code, details: st.details }),
  });
  return {
    write: (m, done) => call.sendMessageWithContext({ callback: () => done() }, m),
    startRead: () => call.startRead(),
    cancel: (details) => call.cancelWithStatus(grpc.status.CANCELLED, details),
    whenReady: (timeoutMs, cb) => whenChannelReady(client.getChannel(), Date.now() + timeoutMs, () => closed, cb),
    close: () => {
      closed = true;
      client.close();
    },
  };
}
