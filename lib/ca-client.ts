// The client of Istio's certificate service: one CreateCertificate call per CSR, on a fresh connection each time, so
// a rotated root, token or CA address takes effect on the next call. Over TLS the CA must present a certificate
// that verifies with the configured root and carries the expected name (ISTIOD_SAN, else the address's host);
// the bearer token is read from its file at every call, and so is PROV_CERT's client certificate. Plaintext only
// where Istio allows it (port 15010 or controlPlaneAuthPolicy NONE), and the token then goes only to a loopback or
// Unix socket address. The call itself is lib/grpc-unary.ts (no grpc-js: the agent asks before grpc-js loads).
//
// This file checks the answer's shape (a chain of at least two PEM certificates); the secret cache checks it
// against our key, identity, validity and root before it is used.

import * as fs from 'node:fs';
import type * as http2 from 'node:http2';
import { Counter, type Registry } from './prom';
import {
  CREATE_CERTIFICATE_PATH,
  decodeCertificateResponse,
  encodeCertificateRequest,
  type CertificateResponse,
} from './ca-protos';
import { loadClientCert, provCertFiles } from './client-cert';
import { checkCaProvider, defaultRoot, pilotCertProvider } from './cert-provider';
import type { AgentConfig } from './config';
import * as envs from './env';
import type { Env } from './env';
import { readNamedFileSync } from './named-file';
import { AgentError, errorMessage } from './errors';
import { GrpcStatus } from './grpc-status';
import { type GrpcError, unaryCall } from './grpc-unary';
import { connectSession, isLocalTarget, type ClientTls } from './grpc-wire';
import { clientTlsOptions } from './tls-policy';
import { DEFAULT_ROOT_CA, ISTIOD_ROOT_CA, splitHostPort, upstreamFromConfig } from './xds-upstream';

export interface CaClientOptions {
  /** host:port, or unix:/path. */
  address: string;
  tls: boolean;
  /** PEM file of roots to trust, or SYSTEM. */
  rootCaFile: string;
  /** Name the CA's certificate must carry (also the TLS SNI). */
  serverName: string;
  /** JWT sent as `authorization: Bearer`, read at each call; unset: none is sent. */
  tokenFile?: string;
  /** ClusterID and CA_HEADER_* values. */
  headers: Record<string, string>;
  /** Per call (default 10 s). */
  timeoutMs?: number;
  /** ISTIO_META_CERT_SIGNER: sent as the request's metadata CertSigner, as the Go agent does. */
  certSigner?: string;
  /** COMPLIANCE_POLICY: the CA connection's TLS restricted as Go's EnforceGoCompliance does. */
  compliancePolicy?: string;
  /**
   * PROV_CERT: a directory whose cert-chain.pem and key.pem are presented as the TLS client certificate, read at
   * each call (./client-cert.ts). While one is presented a missing token is no error: the certificate authenticates.
   */
  clientCertDir?: string;
}

/** What the secret cache needs from a CA. */
export interface CertificateSigner {
  readonly address: string;
  /** The chain for the CSR, leaf first; rejects with an AgentError naming what went wrong. */
  sign(csrPem: string, validitySeconds: number): Promise<string[]>;
  /**
   * Starts the next sign()'s connection now (its TCP and TLS, and loading node:http2 the first time), while the
   * caller still makes the key and the CSR; sign() connects as usual when none is ready. Never throws.
   */
  connectAhead?(): void;
}

/** How long a connection opened ahead waits for its call before it is closed (the first key takes 30-250 ms). */
const AHEAD_MS = 10_000;

const CA_HEADER_PREFIX = 'CA_HEADER_';

/** CA retries: the first after initialMs, doubling up to maxMs (Istio's 1 s to 60 s by default). */
export const CA_RETRY = { initialMs: 1000, maxMs: 60_000 };
/** Each delay is spread down to this much less, at random, so that agents that lost one CA do not return at once. */
const CA_RETRY_JITTER = 0.2;

/**
 * The delay before retry number `attempt` (1 for the first) of a CA that failed: initialMs x 2^(attempt-1), at most
 * maxMs, spread over 80-100 %. A down or refusing CA is asked about once a minute after seven tries, not every second.
 */
export function caRetryDelay(
  attempt: number,
  b: { initialMs: number; maxMs: number } = CA_RETRY,
  rand: () => number = Math.random,
): number {
  const base = Math.min(b.maxMs, b.initialMs * 2 ** Math.min(Math.max(0, attempt - 1), 30));
  return Math.round(base * (1 - CA_RETRY_JITTER * rand()));
}

/** Did the CA answer at all (a refusal or garbage), as opposed to being unreachable? From sign()'s error. */
export function caAnswered(err: unknown): boolean {
  if (!(err instanceof AgentError)) return false;
  if (err.code === 'BAD_INPUT') return true;
  const code = (err.cause as { code?: number } | undefined)?.code;
  return (
    err.code === 'UPSTREAM' &&
    code !== undefined &&
    ![GrpcStatus.UNAVAILABLE, GrpcStatus.DEADLINE_EXCEEDED, GrpcStatus.CANCELLED].includes(code)
  );
}

/** Istio's choices: CA_ADDR or the discovery address; plaintext on :15010 or with auth policy NONE. */
export function caClientOptions(cfg: AgentConfig, env: Env): CaClientOptions {
  const xds = upstreamFromConfig(cfg, env);
  const address = envs.CA_ADDR.get(env) || cfg.proxy.discoveryAddress;
  const { host, port } = splitHostPort(address);
  const tls = !(
    port === '15010' ||
    address.startsWith('unix:') ||
    (cfg.proxy.controlPlaneAuthPolicy === 'NONE' && !envs.CA_ADDR.isSet(env))
  );
  const headers: Record<string, string> = { ClusterID: cfg.clusterId };
  for (const [k, v] of Object.entries(env)) {
    if (k.startsWith(CA_HEADER_PREFIX) && k.length > CA_HEADER_PREFIX.length && v !== undefined)
      headers[k.slice(CA_HEADER_PREFIX.length)] = v;
  }
  checkCaProvider(envs.CA_PROVIDER.get(env), address);
  const provider = pilotCertProvider(envs.PILOT_CERT_PROVIDER.get(env));
  const provCert = envs.PROV_CERT.get(env);
  const rootDefaults = {
    provCert,
    mounted: DEFAULT_ROOT_CA,
    mountedExists: fs.existsSync(DEFAULT_ROOT_CA),
    istiod: ISTIOD_ROOT_CA,
  };
  const explicitRoot = envs.CA_ROOT_CA.get(env) || envs.XDS_ROOT_CA.get(env);
  const root = explicitRoot || (tls ? defaultRoot(provider, rootDefaults, 'CA') : ISTIOD_ROOT_CA);
  return {
    address,
    tls,
    rootCaFile: root,
    serverName: caServerName(
      envs.CA_ADDR.get(env) ? address : undefined,
      host,
      envs.ISTIOD_SAN.get(env),
      xds.serverName,
    ),
    tokenFile: xds.tokenFile,
    headers,
    certSigner: envs.ISTIO_META_CERT_SIGNER.get(env) || undefined,
    compliancePolicy: envs.COMPLIANCE_POLICY.get(env) || undefined,
    // As Go's GetKeyCertsForCA: PROV_CERT only (mounted ISTIO_META_TLS_CLIENT_* files are for xDS), over TLS only.
    ...(tls && provCert ? { clientCertDir: provCert } : {}),
  };
}

/**
 * The name the CA's certificate must carry, as Istio's agent picks it: ISTIOD_SAN applies only to the CA it
 * defaults to (the discovery address); an explicit CA_ADDR is checked against its own host, except that an address
 * naming localhost (a port-forward to istiod) expects istiod's name.
 */
function caServerName(explicit: string | undefined, host: string, istiodSan: string, xdsServerName?: string): string {
  if (explicit === undefined) return istiodSan || (xdsServerName ?? host);
  return explicit.includes('localhost') ? 'istiod.istio-system.svc' : host;
}

/**
 * The Go agent's names for CA calls (security/pkg/nodeagent/cache/monitoring.go, security/pkg/monitoring), all
 * with request_type="csr": one request a sign() call, failed ones, their latency summed in milliseconds, and a
 * retry for a call made after the previous one failed (Go counts the retries its gRPC interceptor makes inside one
 * call; here the secret cache makes them as new calls, so a retry is also a request).
 */
const TO = '(e.g. to a token exchange server, CA, etc.)';
const CA_METRICS = {
  requests: ['istio_agent_num_outgoing_requests', `Number of total outgoing requests ${TO}`],
  failures: ['istio_agent_num_failed_outgoing_requests', `Number of failed outgoing requests ${TO}`],
  latencyMs: ['istio_agent_outgoing_latency', `The latency of outgoing requests ${TO} in milliseconds.`],
  retries: ['istio_agent_num_outgoing_retries', `Number of outgoing retry requests ${TO}`],
} as const;

/**
 * The JWT from its file. Without a client certificate an unreadable or empty file fails the call before the CA is
 * asked; with one the call goes without a token, as Go's token provider sends none when the file is missing (a VM
 * whose token is gone after a reboot renews with its certificate alone).
 */
function readToken(file: string, haveClientCert: boolean): string | undefined {
  let token: string;
  try {
    // A regular file (checked before and after it is opened O_NONBLOCK) and capped: a FIFO or device named here must
    // not wedge the agent. Read at once, as the root is: no turn of the event loop stands between the CSR and the call.
    token = readNamedFileSync(file).toString('utf8').trim();
  } catch (e) {
    if (haveClientCert) return undefined;
    throw new AgentError('IO', `cannot read the CA token file ${file}: ${errorMessage(e)}`, e);
  }
  if (!token && !haveClientCert) throw new AgentError('BAD_INPUT', `the CA token file ${file} is empty`);
  return token || undefined;
}

export class CaClient implements CertificateSigner {
  readonly calls = { requests: 0, failures: 0, latencyMs: 0, retries: 0 };
  private lastFailed = false;
  private ahead: http2.ClientHttp2Session | undefined;

  constructor(private readonly o: CaClientOptions) {}

  registerMetrics(registry: Registry): void {
    const calls = this.calls;
    for (const key of Object.keys(CA_METRICS) as (keyof typeof CA_METRICS)[]) {
      const [name, help] = CA_METRICS[key];
      registry.registerMetric(
        new Counter({
          name,
          help,
          labelNames: ['request_type'],
          registers: [],
          collect() {
            this.reset();
            this.inc({ request_type: 'csr' }, calls[key]);
          },
        }),
      );
    }
  }

  async sign(csrPem: string, validitySeconds: number): Promise<string[]> {
    const c = this.calls;
    c.requests++;
    if (this.lastFailed) c.retries++;
    const t0 = performance.now();
    try {
      const chain = await this.call(csrPem, validitySeconds);
      this.lastFailed = false;
      return chain;
    } catch (e) {
      c.failures++;
      this.lastFailed = true;
      throw e;
    } finally {
      c.latencyMs += performance.now() - t0;
    }
  }

  get address(): string {
    return this.o.address;
  }

  connectAhead(): void {
    if (this.ahead && !this.ahead.closed && !this.ahead.destroyed) return;
    try {
      const o = this.o;
      const tlsOpts = o.tls ? this.connectionTls(this.clientCert()) : undefined;
      const session = connectSession(o.address, tlsOpts);
      // A failure before the call is the call's to meet again, on a connection of its own, and to report.
      session.on('error', () => undefined);
      // Unused, it holds neither the process (an agent that stops meanwhile exits) nor the CA for long.
      session.unref();
      const t = setTimeout(() => session.destroy(), AHEAD_MS);
      t.unref();
      session.once('close', () => clearTimeout(t));
      this.ahead = session;
    } catch {
      // unreadable roots or client certificate: sign() reports them
    }
  }

  private clientCert(): ReturnType<typeof loadClientCert> {
    const o = this.o;
    return o.tls ? loadClientCert(o.clientCertDir ? provCertFiles(o.clientCertDir) : undefined) : undefined;
  }

  /** The connection's TLS as the files say now: the root to trust and the client certificate, if any. */
  private connectionTls(clientCert: ReturnType<typeof loadClientCert>): ClientTls {
    const o = this.o;
    let root: Buffer | undefined;
    if (o.rootCaFile !== 'SYSTEM') {
      try {
        root = readNamedFileSync(o.rootCaFile);
      } catch (e) {
        throw new AgentError('IO', `cannot read the CA root certificate ${o.rootCaFile}: ${errorMessage(e)}`, e);
      }
    }
    const { host } = splitHostPort(o.address);
    return {
      serverName: o.serverName || host,
      options: clientTlsOptions(o.compliancePolicy, { ...(root && { ca: root }), ...clientCert }),
    };
  }

  private async call(csrPem: string, validitySeconds: number): Promise<string[]> {
    const o = this.o;
    const request = {
      csr: csrPem,
      validityDuration: validitySeconds,
      ...(o.certSigner ? { metadata: { CertSigner: o.certSigner } } : {}),
    };
    const metadata: Record<string, string> = { ...o.headers };
    const clientCert = this.clientCert();
    if (o.tokenFile && (o.tls || isLocalTarget(o.address))) {
      const token = readToken(o.tokenFile, clientCert !== undefined);
      if (token) metadata.authorization = `Bearer ${token}`;
    }
    // Its own connection, closed with the call: a pooled one could outlive a rotated root or a CA restart. One
    // opened ahead for this call (connectAhead, moments before, from the same files) is that connection.
    const tlsOpts = o.tls ? this.connectionTls(clientCert) : undefined;
    const session = this.ahead;
    this.ahead = undefined;
    const where = `CA ${o.address}${o.tls ? ` (TLS, name ${o.serverName})` : ' (plaintext)'}`;
    let resp: CertificateResponse;
    try {
      const answer = await unaryCall({
        address: o.address,
        path: CREATE_CERTIFICATE_PATH,
        message: encodeCertificateRequest(request),
        metadata,
        tls: tlsOpts,
        session,
        timeoutMs: o.timeoutMs ?? 10_000,
      });
      try {
        resp = decodeCertificateResponse(answer);
      } catch (e) {
        throw new AgentError('BAD_INPUT', `${where}: answer not parsable: ${errorMessage(e)}`, e);
      }
    } catch (e) {
      if (e instanceof AgentError) throw e;
      const ge = e as GrpcError;
      throw new AgentError('UPSTREAM', `${where}: ${ge.details || ge.message}`, e);
    }
    const chain = resp.certChain ?? [];
    if (chain.length < 2)
      throw new AgentError(
        'BAD_INPUT',
        `CA ${o.address} answered a chain of ${chain.length} certificate(s); want the leaf and at least the root`,
      );
    for (const [i, pem] of chain.entries()) {
      if (!/-----BEGIN CERTIFICATE-----/.test(pem))
        throw new AgentError('BAD_INPUT', `CA ${o.address}: element ${i + 1} of the chain is not a PEM certificate`);
    }
    return chain;
  }
}
