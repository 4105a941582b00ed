// The xDS proxy: Envoy's ADS (state of the world and Delta) on a Unix socket, forwarded to the control plane.
//
// Messages pass through as bytes. The proxy reads only the top-level fields it acts on (type URL, version, nonce,
// resource names; for Delta also each Resource's name and version) and never unpacks a resource's Any, so a 10 MB
// push costs a scan of its field headers, not a decode and re-encode. Requests from Envoy go upstream through an
// unbounded queue, so a slow control plane never blocks Envoy's stream; responses are read from upstream one at
// a time and reading stops while more than 16 MB wait for Envoy, so a slow Envoy bounds the proxy's memory.
//
// How this proxy does better than Istio's when the control plane goes away:
// Istio's pilot-agent ties each Envoy stream to one upstream stream; when istiod restarts or the connection
// breaks, the agent closes Envoy's stream and waits for Envoy to reconnect and subscribe again. Envoy keeps its
// config, but its ADS stream is reset (control_plane.connected_state drops to 0), every subscription starts over,
// and the agent has no retry of its own: how soon Envoy is current again depends on Envoy's reconnect backoff.
// Here Envoy's stream stays open while the upstream is down. The proxy reconnects by itself with a backoff that
// grows with the outage, capped and jittered (each attempt one real connect on a fresh channel, so the proxy is
// back soon after the server, and rotated certificates and tokens are picked up), and re-sends
// what Envoy is subscribed to: for state of the world, Envoy's latest request of each type with the version it
// last accepted; for Delta, its current subscriptions with the versions of the resources it has ACKed, so the
// server sends only what changed while it was away. ACKs that Envoy sends for responses of the old stream are
// dropped or stripped of their stale nonce, so the new server is not confused by them. Envoy sees no disconnect,
// keeps serving its last config throughout, and is brought up to date as soon as the server is back.
//
// A peer on the socket pays for what it opens. A stream costs only its bookkeeping until Envoy's first request
// on it, when its upstream call (a channel and connection of its own) is opened, so streams opened and cancelled
// at once (CVE-2023-44487's rapid reset) never reach the control plane. At most `maxStreams` streams are served at
// once (Envoy holds one, two during a hot restart); more are refused with RESOURCE_EXHAUSTED, logged once per
// burst (at most once per 10 s) and counted. The stream that feeds the agent's own types is the newest that has
// sent a request, so an idle stream cannot take them from Envoy's. Per-stream log lines are capped per window.
//
// Types for the agent (NDS name table, proxy config) are subscribed by the proxy after Envoy's first LDS request,
// answered by handlers registered from agent.ts (which ACK or NACK), and never reach Envoy.
//
// The one look inside resources: a listener or cluster response that contains `file-cert:`/`file-root:` at all is
// walked for its SDS names (lib/xds-secret-names.ts) before Envoy gets it, and the names go to `secretReferences`:
// the SDS server serves a file name only while the config that reaches Envoy references it. And one type may be
// rewritten on its way (registerRewriter; agent.ts: ECDS through lib/wasm-ecds.ts, which fetches Wasm modules).

import * as path from 'node:path';
import { Counter, type Registry } from './prom';
import type { Component, StatusRoute } from './component';
import { AgentError, wrap } from './errors';
import { counterFrom, registerCounters } from './metrics';
import { json } from './status-server';
import { scope } from './log';
import { GrpcServer, type ServerCall } from './grpc-server';
import { GrpcStatus } from './grpc-status';
import { bindUnixSocket, type BoundUnixServer } from './grpc-unix';
import {
  newCounters,
  Session,
  type AgentHandler,
  type AgentRequest,
  type Counters,
  type ResourceRewriter,
  type SessionContext,
} from './xds-session';
import type { XdsKind } from './xds-state';
import type { SecretReferenceSink } from './secret-names';
import { ADS_PATHS, spareChannel, type Backoff, type SpareChannel, type UpstreamOptions } from './xds-upstream';

export { upstreamFromConfig, type UpstreamOptions } from './xds-upstream';
export type { AgentHandler, AgentRequest, AgentResponseMeta, ResourceRewriter } from './xds-session';

const log = scope('xdsproxy');

export interface XdsProxyOptions {
  /** Unix socket Envoy's bootstrap points ADS at (`<configPath>/XDS`). */
  socketPath: string;
  upstream: UpstreamOptions;
  /** Largest message accepted or sent either way (default 256 MiB, env XDS_MAX_MESSAGE_BYTES). */
  maxMessageBytes?: number;
  /** Reconnect backoff (default 200 ms to 30 s, growing with the time the upstream has been lost; see backoffDelay). */
  backoff?: Backoff;
  /** How long one connect attempt may take before it is abandoned (default 5 s, as Istio dials). */
  dialTimeoutMs?: number;
  /** Told the `file-cert:`/`file-root:` SDS names the listeners and clusters reference (the SDS server's references). */
  secretReferences?: SecretReferenceSink;
  /** Envoy streams served at once; more are refused with RESOURCE_EXHAUSTED (default 16). */
  maxStreams?: number;
  /** Connect the first stream's upstream channel as soon as the proxy listens (default true). */
  preconnect?: boolean;
}

const DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024;
/** Envoy opens one ADS stream, two while a hot restart overlaps the epochs; the rest is headroom for reconnects. */
const DEFAULT_MAX_STREAMS = 16;
/** Per-stream lines (connected, closed, reconnecting) at their level per window, enough for a full cap of streams;
 * the rest at debug, counted. */
const STREAM_LOG_BURST = 40;
const STREAM_LOG_WINDOW_MS = 10_000;

export class XdsProxy implements Component {
  readonly name = 'xDS proxy';
  readonly closed: Promise<Error | undefined>;
  private resolveClosed!: (e: Error | undefined) => void;
  private server: GrpcServer | undefined;
  private bound: BoundUnixServer | undefined;
  private readonly sessions = new Map<number, Session>();
  private readonly handlers = new Map<string, AgentHandler>();
  private readonly rewriters = new Map<string, ResourceRewriter>();
  private readonly agentRequests = new Map<string, AgentRequest>();
  private readonly counters: Counters = newCounters();
  private readonly ctx: SessionContext;
  private readonly socketPath: string;
  private nextId = 1;
  private primary: Session | undefined;
  private readonly maxStreams: number;
  /** Streams refused since the proxy last had room: warned once per such burst, at most once a window. */
  private refusedInBurst = 0;
  private burstWarned = false;
  private lastRefusalWarn = -Infinity;
  private readonly lineBudget = new LineBudget(STREAM_LOG_BURST, STREAM_LOG_WINDOW_MS, (n) =>
    log.info(`${n} more xDS stream lines in the last ${STREAM_LOG_WINDOW_MS / 1000} s were logged at debug level`),
  );
  private state: 'new' | 'starting' | 'listening' | 'closed' = 'new';
  /** The first Envoy stream's upstream channel, connecting since the proxy started listening. */
  private spare: SpareChannel | undefined;

  constructor(private readonly o: XdsProxyOptions) {
    this.closed = new Promise((r) => (this.resolveClosed = r));
    this.socketPath = path.resolve(o.socketPath);
    this.maxStreams = o.maxStreams ?? DEFAULT_MAX_STREAMS;
    if (!Number.isInteger(this.maxStreams) || this.maxStreams < 1) {
      throw new AgentError('BAD_INPUT', `xDS proxy maxStreams must be a positive integer, got ${this.maxStreams}`);
    }
    const proxy = this;
    this.ctx = {
      upstream: o.upstream,
      maxMessageBytes: o.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES,
      backoff: o.backoff ?? { initialMs: 200, maxMs: 30_000 },
      dialTimeoutMs: o.dialTimeoutMs ?? 5_000,
      counters: this.counters,
      handler: (t) => proxy.handlers.get(t),
      rewriter: (t) => proxy.rewriters.get(t),
      handlerTypes: () => [...proxy.handlers.keys()],
      isPrimary: (s) => proxy.primary === s,
      started: (s) => {
        // The newest Envoy stream that has asked for something feeds the agent's handlers (after a hot restart,
        // the new Envoy's); a stream that never sends a request never takes that over.
        proxy.primary = s;
      },
      streamLog: (level, line, fields) => (proxy.lineBudget.take() ? log[level] : log.debug)(line, fields),
      agentRequests: () => [...proxy.agentRequests.values()],
      closed: (s) => proxy.sessionClosed(s),
      secretReferences: o.secretReferences,
      spareChannel: () => {
        const c = proxy.spare?.take();
        proxy.spare = undefined;
        return c;
      },
    };
  }

  /** Resolves once the socket accepts connections. */
  async start(): Promise<void> {
    if (this.state !== 'new') throw new AgentError('INTERNAL', 'xDS proxy already started');
    this.state = 'starting';
    try {
      const server = new GrpcServer({
        methods: {
          [ADS_PATHS.sotw]: (call) => this.accept(call, 'sotw'),
          [ADS_PATHS.delta]: (call) => this.accept(call, 'delta'),
        },
        maxMessageBytes: this.ctx.maxMessageBytes,
        // Per connection, as HTTP/2 SETTINGS: nghttp2 refuses streams beyond it before they reach the proxy.
        maxConcurrentStreams: this.maxStreams,
        peerName: `unix:${this.socketPath}`,
      });
      this.server = server;
      this.bound = await bindUnixSocket(server, this.socketPath);
    } catch (e) {
      this.server?.close();
      this.state = 'closed';
      const err = wrap(
        `failed to start xDS proxy on ${this.socketPath}`,
        e,
        e instanceof AgentError ? undefined : 'IO',
      );
      this.resolveClosed(err);
      throw err;
    }
    if ((this.state as string) === 'closed') {
      // close() ran while the socket was being bound.
      this.bound.stop();
      return;
    }
    this.state = 'listening';
    // Envoy's first stream comes ~0.1 s after its spawn; its upstream connection is made meanwhile.
    if (this.o.preconnect !== false) this.spare = spareChannel(this.o.upstream);
    log.info(
      `xDS proxy listening on ${this.socketPath}, upstream ${this.o.upstream.address} (${this.o.upstream.tls ? 'TLS' : 'plaintext'})`,
    );
  }

  /** Ends every stream and removes the socket. Safe to call twice. */
  async close(): Promise<void> {
    if (this.state === 'closed') return;
    this.state = 'closed';
    this.lineBudget.stop();
    this.spare?.close();
    this.spare = undefined;
    for (const s of [...this.sessions.values()]) s.close('xDS proxy shutting down', true);
    // While the socket is still being bound, start() stops the server once it is.
    if (this.bound) this.bound.stop();
    else this.server?.close();
    this.resolveClosed(undefined);
  }

  /** Takes responses of typeUrl away from Envoy: the proxy subscribes to it, the handler ACKs (returns) or NACKs (throws). */
  registerHandler(typeUrl: string, h: AgentHandler): void {
    const isNew = !this.handlers.has(typeUrl);
    this.handlers.set(typeUrl, h);
    if (isNew) for (const s of this.sessions.values()) s.addAgentType(typeUrl);
  }

  /**
   * Responses of typeUrl pass through `rewrite` on their way to Envoy (ECDS: the Wasm module fetch); each is held
   * while it runs, other responses flow. Register before Envoy connects.
   */
  registerRewriter(typeUrl: string, rewrite: ResourceRewriter): void {
    this.rewriters.set(typeUrl, rewrite);
  }

  /** Sends an agent request upstream (e.g. HealthInformation); the last one of each type is re-sent after a reconnect. */
  send(request: AgentRequest): void {
    this.agentRequests.set(request.typeUrl, request);
    this.primary?.sendAgentRequest(request);
  }

  /** Counters for the status server to merge (prefix `xds_proxy_`). */
  metrics(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const [k, v] of Object.entries(this.counters)) out[`xds_proxy_${k}`] = v;
    out.xds_proxy_downstream_streams = this.sessions.size;
    out.xds_proxy_upstream_connected = [...this.sessions.values()].some((s) => s.upstreamConnected) ? 1 : 0;
    return out;
  }

  registerMetrics(registry: Registry): void {
    registerCounters(registry, 'istio_agent_', 'xDS proxy', () => this.metrics());
    // The Go agent's names for what it measures the same way (dashboards and alerts use them).
    const c = this.counters;
    counterFrom(
      registry,
      'istio_agent_xds_proxy_requests',
      'The total number of Xds Proxy Requests',
      () => c.requests_to_upstream,
    );
    counterFrom(
      registry,
      'istio_agent_xds_proxy_responses',
      'The total number of Xds Proxy Responses',
      () => c.responses_to_envoy,
    );
    counterFrom(
      registry,
      'istio_agent_istiod_connection_failures',
      'The total number of connection failures to Istiod',
      () => c.upstream_dial_failures_total,
    );
    // Go: istiodDisconnections and envoyDisconnections, type="cancelled" | "error" (pkg/istio-agent/metrics).
    const byType = (name: string, help: string, read: () => [number, number]) =>
      registry.registerMetric(
        new Counter({
          name,
          help,
          labelNames: ['type'],
          registers: [],
          collect() {
            this.reset();
            const [cancelled, error] = read();
            if (cancelled) this.inc({ type: 'cancelled' }, cancelled);
            if (error) this.inc({ type: 'error' }, error);
          },
        }),
      );
    byType('istio_agent_istiod_connection_terminations', 'The total number of connection errors to Istiod', () => [
      c.istiod_stream_cancellations_total,
      c.istiod_stream_errors_total,
    ]);
    byType('istio_agent_envoy_connection_terminations', 'The total number of connection errors from envoy', () => [
      c.envoy_stream_cancellations_total,
      c.envoy_stream_errors_total,
    ]);
  }

  routes(): StatusRoute[] {
    return [{ method: 'GET', path: '/debug/xds', handler: () => json(this.debugState()) }];
  }

  /** For /debug/xds: per Envoy stream, the last versions and nonces each way per type. */
  debugState(): Record<string, unknown> {
    return {
      socket: this.socketPath,
      upstream: {
        address: this.o.upstream.address,
        tls: this.o.upstream.tls,
        serverName: this.o.upstream.tls ? this.o.upstream.serverName : undefined,
      },
      agentTypes: [...this.handlers.keys()],
      agentRequests: [...this.agentRequests.values()].map((r) => ({
        typeUrl: r.typeUrl,
        error: r.errorDetail?.message,
      })),
      streams: [...this.sessions.values()].map((s) => s.debugState()),
    };
  }

  private accept(call: ServerCall, kind: XdsKind): void {
    if (this.state === 'closed') {
      call.fail(GrpcStatus.UNAVAILABLE, 'xDS proxy shutting down');
      return;
    }
    if (this.sessions.size >= this.maxStreams) {
      this.counters.downstream_streams_refused_total++;
      if (this.refusedInBurst++ === 0) {
        const now = performance.now();
        this.burstWarned = now - this.lastRefusalWarn >= STREAM_LOG_WINDOW_MS;
        if (this.burstWarned) this.lastRefusalWarn = now;
        (this.burstWarned ? log.warn : log.debug)(
          `refusing new xDS streams with RESOURCE_EXHAUSTED: ${this.sessions.size} ` +
            `are open, the most this proxy serves (Envoy holds one, two during a hot restart)`,
          { peer: call.peer },
        );
      }
      const details = `the xDS proxy serves at most ${this.maxStreams} streams at once`;
      call.fail(GrpcStatus.RESOURCE_EXHAUSTED, details);
      return;
    }
    this.counters.downstream_streams_total++;
    const s = new Session(this.nextId++, kind, call, this.ctx);
    this.sessions.set(s.id, s);
  }

  private sessionClosed(s: Session): void {
    this.sessions.delete(s.id);
    if (this.refusedInBurst && this.sessions.size < this.maxStreams && this.state !== 'closed') {
      const line = `accepting xDS streams again (refused ${this.refusedInBurst} while ${this.maxStreams} were open)`;
      (this.burstWarned ? log.info : log.debug)(line);
      this.refusedInBurst = 0;
    }
    if (this.primary !== s) return;
    this.primary = [...this.sessions.values()].filter((x) => x.started).pop();
    if (this.primary && this.state !== 'closed') this.primary.becamePrimary();
  }
}

/**
 * At most `burst` lines per window at their own level; the rest go to debug and their number is logged once the
 * window ends, so a peer that churns streams cannot make the agent write without bound (or block on stderr).
 */
class LineBudget {
  private windowStart = -Infinity;
  private used = 0;
  private demoted = 0;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly burst: number,
    private readonly windowMs: number,
    private readonly summary: (n: number) => void,
  ) {}

  /** True: log the line at its level; false: at debug. */
  take(): boolean {
    const now = performance.now();
    if (now - this.windowStart >= this.windowMs) {
      this.windowStart = now;
      this.used = 0;
    }
    if (this.used < this.burst) {
      this.used++;
      return true;
    }
    this.demoted++;
    if (!this.timer) {
      this.timer = setTimeout(() => this.flush(), this.windowStart + this.windowMs - now);
      this.timer.unref();
    }
    return false;
  }

  stop(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
  }

  private flush(): void {
    this.timer = undefined;
    const n = this.demoted;
    this.demoted = 0;
    if (n) this.summary(n);
  }
}
