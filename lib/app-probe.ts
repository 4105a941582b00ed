// App probes: kubelet's liveness/readiness/startup probes (and lifecycle hooks), which Istio's injector rewrites
// to `:15020/app-health/<container>/<kind>` and describes in ISTIO_KUBE_APP_PROBERS. The agent runs the real
// probe against the app, so that mTLS and traffic capture never break it:
// - targets the pod IP (INSTANCE_IP), or the probe's `host`, from 127.0.0.6 when the target is on this host (traffic
//   from that address is not captured);
// - HTTP: the incoming request's headers are passed on (with the probe's httpHeaders), its Host keeps its name with
//   the app's port, HTTPS is not verified, kubelet's redirect rules apply, at most 10 KB of the body is read;
//   a 3xx answers 200, anything else the app's own code; failures answer 500; a redirect to a port of the agent or
//   Envoy is never followed (the answer goes to the status port's caller, who may be remote);
// - TCP: a connect; gRPC: grpc.health.v1.Health/Check, SERVING -> 200, else 500.
// Each probe gets its timeoutSeconds (1 s when unset, kubelet's default). Each HTTP probe path has its own client
// (lib/probe-client.ts): HTTP/2 by ALPN for HTTPS (ISTIO_ENABLE_HTTP2_PROBING), connections kept or not
// (ENABLE_PROBE_KEEPALIVE_CONNECTIONS), as the Go agent's per-path http.Client.

import type * as http from 'node:http';
import * as net from 'node:net';
import { closedSignal, type Component, type StatusRoute } from './component';
import { AgentError, configError } from './errors';
import type { Env } from './env';
import * as envs from './env';
import { scope } from './log';
import { grpcProbe, httpProbe, probeTarget, tcpProbe, type ProbeResult } from './probe';
import { ProbeClient, type ProbeClientOptions } from './probe-client';
import type { Reply } from './component';

const log = scope('probes');

export interface AppProber {
  httpGet?: {
    path: string;
    port: number;
    scheme: 'http' | 'https';
    host?: string;
    httpHeaders: Array<{ name: string; value: string }>;
  };
  tcpSocket?: { port: number; host?: string };
  grpc?: { port: number; service: string };
  timeoutSeconds: number;
}

const PATH_PATTERN = /^\/(app-health|app-lifecycle)\/[^/]+\/(livez|readyz|startupz|prestopz|poststartz)$/;
const VAR = 'ISTIO_KUBE_APP_PROBERS';

function isObj(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function port(v: unknown, where: string): number {
  // As Istio: a named port ("http") cannot be resolved by the agent; the injector writes numbers.
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 1 || v > 65535)
    throw new Error(`${where}.port must be a port number, got ${JSON.stringify(v)}`);
  return v;
}

function optString(v: unknown, where: string): string | undefined {
  if (v === undefined || v === null || v === '') return undefined;
  if (typeof v !== 'string') throw new Error(`${where} must be a string`);
  return v;
}

function parseOne(path: string, raw: unknown): AppProber {
  if (!PATH_PATTERN.test(path))
    throw new Error(
      `key ${JSON.stringify(path)} is not /app-health/<container>/(livez|readyz|startupz) or /app-lifecycle/<container>/(prestopz|poststartz)`,
    );
  if (!isObj(raw)) throw new Error(`${path}: want an object`);
  const kinds = ['httpGet', 'tcpSocket', 'grpc'].filter((k) => raw[k] !== undefined && raw[k] !== null);
  if (kinds.length !== 1)
    throw new Error(
      `${path}: want exactly one of httpGet, tcpSocket or grpc, got ${kinds.length ? kinds.join(', ') : 'none'}`,
    );
  const t = raw.timeoutSeconds;
  if (t !== undefined && (typeof t !== 'number' || !(t >= 0)))
    throw new Error(`${path}.timeoutSeconds must be a number of seconds`);
  const p: AppProber = { timeoutSeconds: (t as number | undefined) || 1 };
  const k = kinds[0]!;
  const v = raw[k];
  if (!isObj(v)) throw new Error(`${path}.${k}: want an object`);
  const where = `${path}.${k}`;
  if (k === 'httpGet') {
    const scheme = (optString(v.scheme, `${where}.scheme`) ?? 'HTTP').toLowerCase();
    if (scheme !== 'http' && scheme !== 'https') throw new Error(`${where}.scheme must be HTTP or HTTPS`);
    const hh = v.httpHeaders ?? [];
    if (
      !Array.isArray(hh) ||
      !hh.every((h) => isObj(h) && typeof h.name === 'string' && typeof (h.value ?? '') === 'string')
    )
      throw new Error(`${where}.httpHeaders must be a list of {name, value}`);
    p.httpGet = {
      path: optString(v.path, `${where}.path`) ?? '/',
      port: port(v.port, where),
      scheme,
      host: optString(v.host, `${where}.host`),
      httpHeaders: hh.map((h) => ({ name: h.name as string, value: (h.value as string | undefined) ?? '' })),
    };
  } else if (k === 'tcpSocket') {
    p.tcpSocket = { port: port(v.port, where), host: optString(v.host, `${where}.host`) };
  } else {
    p.grpc = { port: port(v.port, where), service: optString(v.service, `${where}.service`) ?? '' };
  }
  return p;
}

/** The probes from ISTIO_KUBE_APP_PROBERS; throws a CONFIG_INVALID AgentError naming the variable on bad input. */
export function parseAppProbers(env: Env): Map<string, AppProber> {
  const text = envs.ISTIO_KUBE_APP_PROBERS.get(env);
  const out = new Map<string, AppProber>();
  if (!text.trim()) return out;
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    throw configError(VAR, `environment variable ${VAR}`, `not JSON: ${(e as Error).message}`);
  }
  if (!isObj(doc)) throw configError(VAR, `environment variable ${VAR}`, 'want a JSON object keyed by probe path');
  for (const [path, raw] of Object.entries(doc)) {
    try {
      out.set(path, parseOne(path, raw));
    } catch (e) {
      throw configError(VAR, `environment variable ${VAR}`, (e as Error).message);
    }
  }
  return out;
}

/** Where probes go: INSTANCE_IP (first), else POD_IP, else 127.0.0.1; `localhost` with Istio's legacy switch. */
export function appProbeDestination(env: Env): string {
  if (envs.REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION.get(env)) return 'localhost';
  const ip =
    envs.INSTANCE_IP.get(env)
      .split(',')
      .map((s) => s.trim())
      .find((s) => net.isIP(s)) ?? envs.POD_IP.get(env).trim();
  return ip || '127.0.0.1';
}

// Hop-by-hop and framing headers belong to the kubelet connection, not to the probe sent on.
const NOT_FORWARDED = new Set([
  'host',
  'connection',
  'keep-alive',
  'transfer-encoding',
  'content-length',
  'upgrade',
  'te',
  'trailer',
  'proxy-connection',
]);

export interface AppProbesOptions {
  probers: Map<string, AppProber>;
  /** Pod IP (see appProbeDestination). */
  destination: string;
  /** The status port, replaced by the app's port in a forwarded Host header. */
  statusPort: number;
  /** The agent's and Envoy's other ports (admin, readiness, Prometheus): app redirects to them are not followed. */
  ownPorts?: readonly number[];
  /** Connection policy of HTTP probes (see appProbeConnections); Go's defaults when absent. */
  connections?: ProbeClientOptions;
}

/** ISTIO_ENABLE_HTTP2_PROBING and ENABLE_PROBE_KEEPALIVE_CONNECTIONS. */
export function appProbeConnections(env: Env): ProbeClientOptions {
  return {
    http2: envs.ISTIO_ENABLE_HTTP2_PROBING.get(env),
    keepAlive: envs.ENABLE_PROBE_KEEPALIVE_CONNECTIONS.get(env),
  };
}

// Istio's fixed sidecar ports (admin, capture, tunnel, status, readiness, DNS, Prometheus...), refused as redirect
// targets beside the configured ones: a redirect answered by the agent or Envoy would reach a remote caller.
const ISTIO_PORTS = [15000, 15001, 15004, 15006, 15008, 15009, 15010, 15012, 15014, 15017, 15020, 15021, 15053, 15090];

export class AppProbes implements Component {
  readonly name = 'app probes';
  private readonly sig = closedSignal();
  readonly closed = this.sig.closed;
  private readonly stop = new AbortController();
  private readonly refusedPorts: ReadonlySet<number>;
  private readonly warned = new Set<string>();
  private readonly clients = new Map<string, ProbeClient>();

  constructor(private readonly o: AppProbesOptions) {
    this.refusedPorts = new Set([...ISTIO_PORTS, o.statusPort, ...(o.ownPorts ?? [])]);
    const c = o.connections ?? { http2: true, keepAlive: false };
    for (const [path, p] of o.probers) if (p.httpGet) this.clients.set(path, new ProbeClient(c));
  }

  async start(): Promise<void> {
    if (this.o.probers.size) log.info(`app probes: ${[...this.o.probers.keys()].join(', ')} -> ${this.o.destination}`);
  }

  async close(): Promise<void> {
    this.stop.abort();
    for (const c of this.clients.values()) c.close();
    this.sig.resolve();
  }

  routes(): StatusRoute[] {
    const handler = (req: http.IncomingMessage) => this.handle(req);
    return [
      { method: 'GET', path: '/app-health/', handler },
      { method: 'GET', path: '/app-lifecycle/', handler },
    ];
  }

  async handle(req: http.IncomingMessage): Promise<Reply> {
    const path = (req.url ?? '/').split('?')[0]!;
    const p = this.o.probers.get(path);
    // Go's words, for tooling that matches them.
    if (!p) return { status: 400, body: `app prober config does not exists for ${path}` };
    const r = await this.run(path, p, req);
    if (r.reason) log.warn(`app probe ${path} failed: ${r.reason}`);
    else if (r.warning && !this.warned.has(path)) {
      this.warned.add(path);
      log.warn(`app probe ${path}: ${r.warning}`);
    }
    return { status: r.status, body: r.body };
  }

  private run(path: string, p: AppProber, req: http.IncomingMessage): Promise<ProbeResult> {
    const timeoutMs = p.timeoutSeconds * 1000;
    const signal = this.stop.signal;
    if (p.httpGet) {
      const g = p.httpGet;
      const t = probeTarget(g.host ?? this.o.destination);
      const headers = this.headers(req, g.port, g.httpHeaders);
      const client = this.clients.get(path);
      return httpProbe({
        scheme: g.scheme,
        ...t,
        port: g.port,
        path: g.path,
        headers,
        refusedPorts: this.refusedPorts,
        client,
        timeoutMs,
        signal,
      });
    }
    if (p.tcpSocket) {
      return tcpProbe({
        ...probeTarget(p.tcpSocket.host ?? this.o.destination),
        port: p.tcpSocket.port,
        timeoutMs,
        signal,
      });
    }
    if (p.grpc) {
      const ua = req.headers['user-agent'];
      return grpcProbe({
        ...probeTarget(this.o.destination),
        port: p.grpc.port,
        service: p.grpc.service,
        timeoutMs,
        userAgent: ua,
        signal,
      });
    }
    throw new AgentError('INTERNAL', 'app prober without a probe');
  }

  private headers(
    req: http.IncomingMessage,
    appPort: number,
    extra: Array<{ name: string; value: string }>,
  ): Array<[string, string]> {
    const out: Array<[string, string]> = [];
    const incomingHost = req.headers.host;
    if (incomingHost) {
      // As Istio: the Host kubelet used keeps its name; the status port in it becomes the app's port.
      const m = /^(.*):(\d+)$/.exec(incomingHost);
      out.push(['host', m && Number(m[2]) === this.o.statusPort ? `${m[1]}:${appPort}` : incomingHost]);
    }
    const raw = req.rawHeaders;
    for (let i = 0; i + 1 < raw.length; i += 2) {
      if (!NOT_FORWARDED.has(raw[i]!.toLowerCase())) out.push([raw[i]!, raw[i + 1]!]);
    }
    for (const h of extra) {
      const idx = out.findIndex(([k]) => k.toLowerCase() === h.name.toLowerCase());
      if (idx >= 0) out.splice(idx, 1);
      out.push([h.name, h.value]);
    }
    return out;
  }
}
