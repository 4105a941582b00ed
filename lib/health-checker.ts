// The workload health checker (VMs): runs ProxyConfig.readinessProbe every period and, on each change of state
// (after successThreshold successes or failureThreshold failures in a row), reports it to the control plane as
// Istio's health event: a DiscoveryRequest of type istio.v1.HealthInformation, with an error_detail (code 13,
// the probe's failure) when unhealthy and none when healthy. The control plane marks the proxy's WorkloadEntry
// unhealthy and takes its endpoints out of every other proxy's config. agent.ts hands the event to the xDS proxy,
// which keeps the latest one and sends it again on every new upstream stream, so a restarted control plane
// learns the current state without waiting for the next change.

import { spawn } from 'node:child_process';
import { closedSignal, type Component } from './component';
import { configError, errorMessage } from './errors';
import { scope } from './log';
import { grpcProbe, httpProbe, probeTarget, tcpProbe, type ProbeResult } from './probe';
import { HEALTH_INFO_TYPE } from './xds-istio';
import type { AgentRequest } from './xds-session';

const log = scope('healthcheck');

export interface ReadinessProbe {
  initialDelayMs: number;
  timeoutMs: number;
  periodMs: number;
  successThreshold: number;
  failureThreshold: number;
  httpGet?: { path: string; port: number; host?: string; scheme: 'http' | 'https'; headers: Array<[string, string]> };
  tcpSocket?: { port: number; host?: string };
  exec?: { command: string[] };
  grpc?: { port: number; service: string };
}

export interface HealthEvent {
  healthy: boolean;
  /** Why the probe failed; empty when healthy. */
  message: string;
}

// google.rpc.Code INTERNAL, as Istio's agent reports an unhealthy workload.
const UNHEALTHY_CODE = 13;

/** The xDS request carrying a health event (SotW or Delta encoding is the xDS proxy's choice). */
export function healthInformationRequest(e: HealthEvent): AgentRequest {
  return e.healthy
    ? { typeUrl: HEALTH_INFO_TYPE }
    : { typeUrl: HEALTH_INFO_TYPE, errorDetail: { code: UNHEALTHY_CODE, message: e.message } };
}

const pick = (o: Record<string, unknown>, camel: string, snake: string): unknown =>
  o[camel] !== undefined ? o[camel] : o[snake];

/** ProxyConfig.readinessProbe with Istio's defaults (period 10 s, timeout 1 s, thresholds 1); throws naming the field. */
export function parseReadinessProbe(raw: Record<string, unknown>, source: string): ReadinessProbe {
  const bad = (field: string, problem: string) => configError(`readinessProbe.${field}`, source, problem);
  const num = (camel: string, snake: string, def: number, min: number): number => {
    const v = pick(raw, camel, snake);
    if (v === undefined || v === null || v === 0) return def;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < min)
      throw bad(camel, `${JSON.stringify(v)} is not an integer >= ${min}`);
    return v;
  };
  const port = (o: Record<string, unknown>, where: string): number => {
    const v = typeof o.port === 'string' && /^\d+$/.test(o.port) ? Number(o.port) : o.port;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 1 || v > 65535)
      throw bad(`${where}.port`, `${JSON.stringify(o.port)} is not a port number`);
    return v;
  };
  const str = (v: unknown, where: string): string | undefined => {
    if (v === undefined || v === null || v === '') return undefined;
    if (typeof v !== 'string') throw bad(where, 'must be a string');
    return v;
  };
  const p: ReadinessProbe = {
    initialDelayMs: num('initialDelaySeconds', 'initial_delay_seconds', 0, 0) * 1000,
    timeoutMs: num('timeoutSeconds', 'timeout_seconds', 1, 1) * 1000,
    periodMs: num('periodSeconds', 'period_seconds', 10, 1) * 1000,
    successThreshold: num('successThreshold', 'success_threshold', 1, 1),
    failureThreshold: num('failureThreshold', 'failure_threshold', 1, 1),
  };
  const methods = [
    ['httpGet', 'http_get'],
    ['tcpSocket', 'tcp_socket'],
    ['exec', 'exec'],
    ['grpc', 'grpc'],
  ]
    .map(([c, s]) => [c!, pick(raw, c!, s!)] as const)
    .filter(([, v]) => v !== undefined && v !== null);
  if (methods.length !== 1)
    throw configError(
      'readinessProbe',
      source,
      `want exactly one of httpGet, tcpSocket, exec or grpc, got ${methods.map(([k]) => k).join(', ') || 'none'}`,
    );
  const [kind, v] = methods[0]!;
  if (typeof v !== 'object' || Array.isArray(v)) throw bad(kind, 'must be an object');
  const o = v as Record<string, unknown>;
  if (kind === 'httpGet') {
    const scheme = (str(o.scheme, 'httpGet.scheme') ?? 'http').toLowerCase();
    if (scheme !== 'http' && scheme !== 'https') throw bad('httpGet.scheme', `"${o.scheme}" is not HTTP or HTTPS`);
    const hh = pick(o, 'httpHeaders', 'http_headers') ?? [];
    if (!Array.isArray(hh)) throw bad('httpGet.httpHeaders', 'must be a list of {name, value}');
    p.httpGet = {
      path: str(o.path, 'httpGet.path') ?? '/',
      port: port(o, 'httpGet'),
      host: str(o.host, 'httpGet.host'),
      scheme,
      headers: hh.map(
        (h: { name?: unknown; value?: unknown }) => [String(h?.name ?? ''), String(h?.value ?? '')] as [string, string],
      ),
    };
    if (!p.httpGet.headers.some(([k]) => k.toLowerCase() === 'user-agent'))
      p.httpGet.headers.push(['User-Agent', 'istio-probe/1.0']);
  } else if (kind === 'tcpSocket') {
    p.tcpSocket = { port: port(o, 'tcpSocket'), host: str(o.host, 'tcpSocket.host') };
  } else if (kind === 'exec') {
    const cmd = o.command;
    if (!Array.isArray(cmd) || cmd.length === 0 || !cmd.every((c) => typeof c === 'string'))
      throw bad('exec.command', 'must be a non-empty list of strings');
    p.exec = { command: cmd as string[] };
  } else {
    p.grpc = { port: port(o, 'grpc'), service: str(o.service, 'grpc.service') ?? '' };
  }
  return p;
}

/** Runs a command; exit 0 is healthy. One that outlives the timeout (or the checker) is killed with its process group. */
export function execProbe(command: string[], timeoutMs: number, signal?: AbortSignal): Promise<ProbeResult> {
  return new Promise((resolve) => {
    const [file, ...args] = command as [string, ...string[]];
    const child = spawn(file, args, { stdio: ['ignore', 'ignore', 'pipe'], detached: true });
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => {
      if (stderr.length < 1024) stderr += d.toString();
    });
    let timedOut = false;
    const kill = () => {
      try {
        process.kill(-child.pid!, 'SIGKILL');
      } catch {
        child.kill('SIGKILL');
      }
    };
    const t = setTimeout(() => {
      timedOut = true;
      kill();
    }, timeoutMs);
    signal?.addEventListener('abort', kill, { once: true });
    const done = () => {
      clearTimeout(t);
      signal?.removeEventListener('abort', kill);
    };
    const fail = (reason: string) => resolve({ status: 500, body: reason, reason });
    child.once('error', (e) => {
      done();
      fail(`exec ${file} failed: ${e.message}`);
    });
    // 'exit', not 'close': a background process the probe left holding stderr does not make it hang.
    child.once('exit', (code, sig) => {
      done();
      child.stderr!.destroy();
      if (timedOut) return fail(`exec ${file} did not finish within ${timeoutMs} ms and was killed`);
      if (code === 0) return resolve({ status: 200, body: '' });
      const tail = stderr.trim() ? `: ${stderr.trim().split('\n').pop()}` : '';
      fail(`exec ${file} ${sig ? `was killed by ${sig}` : `exited with ${code}`}${tail}`);
    });
  });
}

export interface HealthCheckerOptions {
  probe: ReadinessProbe;
  /** Where probes without a host go: the first instance IP (Istio), or localhost. */
  defaultHost: string;
  /** Called on each change of state (the first result counts as one). */
  onChange: (e: HealthEvent) => void;
  /** Envoy's own readiness, checked first as Istio does: the workload is healthy only if its proxy is. */
  envoyReady?: () => Promise<boolean>;
}

export class HealthChecker implements Component {
  readonly name = 'health checker';
  private readonly sig = closedSignal();
  readonly closed = this.sig.closed;
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private readonly stop = new AbortController();
  private successes = 0;
  private failures = 0;
  private last: HealthEvent | undefined;

  constructor(private readonly o: HealthCheckerOptions) {}

  /** The state last reported, if any. */
  get state(): HealthEvent | undefined {
    return this.last;
  }

  async start(): Promise<void> {
    const p = this.o.probe;
    const what = p.httpGet
      ? `httpGet ${p.httpGet.scheme}://${p.httpGet.host ?? this.o.defaultHost}:${p.httpGet.port}${p.httpGet.path}`
      : p.tcpSocket
        ? `tcpSocket ${p.tcpSocket.host ?? this.o.defaultHost}:${p.tcpSocket.port}`
        : p.exec
          ? `exec ${p.exec.command.join(' ')}`
          : `grpc ${this.o.defaultHost}:${p.grpc!.port}`;
    log.info(
      `health checking ${what} every ${p.periodMs} ms (timeout ${p.timeoutMs} ms, thresholds ${p.successThreshold}/${p.failureThreshold}) after ${p.initialDelayMs} ms`,
    );
    this.schedule(p.initialDelayMs);
  }

  async close(): Promise<void> {
    this.stopped = true;
    this.stop.abort();
    if (this.timer) clearTimeout(this.timer);
    this.sig.resolve();
  }

  private schedule(ms: number): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => void this.check(), ms);
    this.timer.unref();
  }

  private async check(): Promise<void> {
    const started = Date.now();
    let r: ProbeResult;
    try {
      r = await this.probeOnce();
    } catch (e) {
      r = { status: 500, body: '', reason: errorMessage(e) };
    }
    if (this.stopped) return;
    this.record(r);
    this.schedule(Math.max(0, this.o.probe.periodMs - (Date.now() - started)));
  }

  private record(r: ProbeResult): void {
    const p = this.o.probe;
    const ok = r.status >= 200 && r.status < 400 && !r.reason;
    if (ok) {
      this.successes++;
      this.failures = 0;
      if (this.successes >= p.successThreshold && this.last?.healthy !== true)
        this.change({ healthy: true, message: '' });
    } else {
      this.failures++;
      this.successes = 0;
      log.debug(`probe failed: ${r.reason ?? `status ${r.status}`}`);
      if (this.failures >= p.failureThreshold && this.last?.healthy !== false)
        this.change({ healthy: false, message: r.reason ?? `status ${r.status}` });
    }
  }

  private change(e: HealthEvent): void {
    this.last = e;
    if (e.healthy) log.info('workload is healthy');
    else log.warn(`workload is unhealthy: ${e.message}`);
    this.o.onChange(e);
  }

  private async probeOnce(): Promise<ProbeResult> {
    if (this.o.envoyReady && !(await this.o.envoyReady().catch(() => false)))
      return { status: 503, body: '', reason: 'Envoy is not ready' };
    const p = this.o.probe;
    const timeoutMs = p.timeoutMs;
    const signal = this.stop.signal;
    if (p.httpGet) {
      const g = p.httpGet;
      const r = await httpProbe({
        scheme: g.scheme,
        ...probeTarget(g.host ?? this.o.defaultHost),
        port: g.port,
        path: g.path,
        headers: g.headers,
        timeoutMs,
        signal,
      });
      // Istio's health checker counts only 200-399 as healthy.
      return r.status >= 400 && !r.reason
        ? { ...r, reason: `status code was not from [200,400), bad code ${r.status}` }
        : r;
    }
    // As Istio, only the HTTP probe comes from 127.0.0.6.
    if (p.tcpSocket)
      return tcpProbe({
        host: probeTarget(p.tcpSocket.host ?? this.o.defaultHost).host,
        port: p.tcpSocket.port,
        timeoutMs,
        signal,
      });
    if (p.exec) return execProbe(p.exec.command, timeoutMs, signal);
    return grpcProbe({
      host: probeTarget(this.o.defaultHost).host,
      port: p.grpc!.port,
      service: p.grpc!.service,
      timeoutMs,
      signal,
    });
  }
}
