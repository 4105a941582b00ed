// One Envoy ADS stream and the upstream stream that serves it. Messages pass as bytes; only top-level fields are
// read. The upstream is opened on Envoy's first request, not when the stream opens, so a stream cancelled before
// it sends anything (a rapid reset) costs its bookkeeping only. The Envoy stream outlives any number of upstream
// streams: when one ends, the session reconnects with backoff and re-sends what Envoy is subscribed to (see
// xds-state.ts).

import type { ServerCall } from './grpc-server';
import { errorMessage } from './errors';
import { grpcStatusName } from './grpc-status';
import { scope } from './log';
import {
  encodeDeltaRequest,
  encodeSotwRequest,
  LISTENER_TYPE,
  nodeField,
  TYPE_PREFIX,
  nodeId,
  parseDeltaRequest,
  parseDeltaResponse,
  parseSotwRequest,
  parseSotwResponse,
  sotwResources,
  withDeltaResources,
  withoutFields,
  withSotwResources,
  type DeltaResponse,
  type ErrorDetail,
} from './xds-codec';
import {
  DeltaSubscriptions,
  IssuedNonces,
  namesKey,
  SotwSubscriptions,
  STRIP_STALE,
  type Subscriptions,
  type XdsKind,
} from './xds-state';
import {
  backoffDelay,
  openUpstream,
  type Backoff,
  type UpstreamCall,
  type UpstreamChannel,
  type UpstreamOptions,
} from './xds-upstream';
import { mayNameFile, type SecretReferenceSink } from './secret-names';
import { fileSecretNames } from './xds-secret-names';

const log = scope('xdsproxy');

/**
 * Gets the raw google.protobuf.Any bytes of each resource (views into the message: copy what must outlive the
 * call); returns to ACK, throws or rejects to NACK.
 */
export type AgentHandler = (resources: Buffer[], meta: AgentResponseMeta) => void | Promise<void>;

export interface AgentResponseMeta {
  typeUrl: string;
  /** version_info (SotW) or system_version_info (Delta). */
  version: string;
  nonce: string;
  /** Delta only: resource names of `resources`, and names removed. */
  names?: string[];
  removed?: string[];
}

/**
 * Rewrites a type's resources before Envoy gets them, and may take its time (the ECDS Wasm fetch): the response
 * is held meanwhile while every other response flows. Gets each resource's Any (views into the message) and
 * returns, in order, a promise of each one's name and replacement; throws (or a promise rejects) to NACK the
 * response upstream (Envoy never sees it).
 */
export type ResourceRewriter = (resources: Buffer[]) => Array<Promise<{ name: string; any: Buffer }>>;

/** A request the agent itself sends upstream (e.g. HealthInformation); encoded for the stream's kind. */
export interface AgentRequest {
  typeUrl: string;
  resourceNames?: string[];
  nonce?: string;
  errorDetail?: ErrorDetail;
}

export interface Counters {
  downstream_streams_total: number;
  requests_from_envoy: number;
  request_bytes_from_envoy: number;
  requests_to_upstream: number;
  request_bytes_to_upstream: number;
  responses_from_upstream: number;
  response_bytes_from_upstream: number;
  responses_to_envoy: number;
  response_bytes_to_envoy: number;
  upstream_connects_total: number;
  upstream_reconnects_total: number;
  upstream_failures_total: number;
  envoy_nacks_total: number;
  agent_acks_total: number;
  agent_nacks_total: number;
  bad_messages_total: number;
  /** Envoy streams refused because the proxy already served its most (XdsProxyOptions.maxStreams). */
  downstream_streams_refused_total: number;
  /** Responses whose resources a rewriter replaced (ECDS Wasm), and those it rejected (NACKed upstream). */
  responses_rewritten_total: number;
  rewrite_nacks_total: number;
  /** Upstream attempts that never connected (Go: istio_agent_istiod_connection_failures). */
  upstream_dial_failures_total: number;
  /** Connected upstream streams that ended (Go: istio_agent_istiod_connection_terminations). */
  upstream_terminations_total: number;
  /**
   * Envoy's streams that ended, as Go's downstreamErr sorts them (istio_agent_envoy_connection_terminations):
   * closed by Envoy or cancelled (its connection gone) -> cancelled; a stream error, a status gRPC itself sent, or
   * a stream this proxy ended for a malformed message -> error. The proxy's own shutdown is neither.
   */
  envoy_stream_cancellations_total: number;
  envoy_stream_errors_total: number;
  /**
   * The connected upstream streams that ended, as Go's upstreamErr sorts them (the `type` of
   * istio_agent_istiod_connection_terminations): ended by the server (OK), cancelled, past a deadline, or its
   * connection dropped -> cancelled; anything else, and a stream this proxy reset for bad input -> error.
   */
  istiod_stream_cancellations_total: number;
  istiod_stream_errors_total: number;
}

export function newCounters(): Counters {
  return {
    downstream_streams_total: 0,
    requests_from_envoy: 0,
    request_bytes_from_envoy: 0,
    requests_to_upstream: 0,
    request_bytes_to_upstream: 0,
    responses_from_upstream: 0,
    response_bytes_from_upstream: 0,
    responses_to_envoy: 0,
    response_bytes_to_envoy: 0,
    upstream_connects_total: 0,
    upstream_reconnects_total: 0,
    upstream_failures_total: 0,
    envoy_nacks_total: 0,
    agent_acks_total: 0,
    agent_nacks_total: 0,
    bad_messages_total: 0,
    downstream_streams_refused_total: 0,
    responses_rewritten_total: 0,
    rewrite_nacks_total: 0,
    upstream_dial_failures_total: 0,
    upstream_terminations_total: 0,
    envoy_stream_cancellations_total: 0,
    envoy_stream_errors_total: 0,
    istiod_stream_cancellations_total: 0,
    istiod_stream_errors_total: 0,
  };
}

export interface SessionContext {
  readonly upstream: UpstreamOptions;
  readonly maxMessageBytes: number;
  readonly backoff: Backoff;
  readonly dialTimeoutMs: number;
  readonly counters: Counters;
  handler(typeUrl: string): AgentHandler | undefined;
  rewriter(typeUrl: string): ResourceRewriter | undefined;
  handlerTypes(): string[];
  isPrimary(s: Session): boolean;
  /** The stream sent its first request: it becomes the one that feeds the agent's handlers. */
  started(s: Session): void;
  /** A per-stream line (connected, closed, reconnecting): at its level while the proxy's line budget lasts, else debug. */
  streamLog(level: 'info' | 'warn', line: string, fields?: Record<string, unknown>): void;
  agentRequests(): AgentRequest[];
  closed(s: Session): void;
  /** Told the file SDS names each listener and cluster references (the SDS server serves only those). */
  readonly secretReferences?: SecretReferenceSink;
  /** A channel already connecting to the control plane, once, for the first stream's first upstream. */
  spareChannel?(): UpstreamChannel | undefined;
}

/** Types whose resources hold transport sockets, and so SDS names. */
const SECRET_REFERENCING_TYPES = new Set([LISTENER_TYPE, `${TYPE_PREFIX}envoy.config.cluster.v3.Cluster`]);

interface Upstream {
  gen: number;
  up: UpstreamCall;
  connected: boolean;
  ended: boolean;
  /** Why the proxy itself ended this stream, for the log line. */
  endReason?: string;
  /** Envoy -> upstream: unbounded, so Envoy's stream is never blocked by a slow control plane. */
  queue: Buffer[];
  /** A write is with gRPC; the next waits for it. */
  writing: boolean;
  /** A message has been asked for and not received yet. */
  reading: boolean;
  sentAny: boolean;
  issued: IssuedNonces;
  /** SotW: resource names last sent upstream per type, to drop a stale ACK that changes nothing. */
  sentNames: Map<string, string>;
  agentInjected: boolean;
  gotResponse: boolean;
  openedAt: number;
}

interface TypeDebug {
  agent?: boolean;
  envoy?: { version?: string; nonce: string; at: string; nack?: string; subscribed?: number };
  upstream?: { version: string; nonce: string; resources: number; removed?: number; at: string };
}

const ENVOY_REQUEST = { sotw: 'DiscoveryRequest', delta: 'DeltaDiscoveryRequest' } as const;
const METHOD = { sotw: 'StreamAggregatedResources', delta: 'DeltaAggregatedResources' } as const;
const UPSTREAM_RESPONSE = { sotw: 'DiscoveryResponse', delta: 'DeltaDiscoveryResponse' } as const;
const NACK_CODE = 13; // google.rpc.Code INTERNAL, as Envoy uses for its own NACKs
const DOWNSTREAM_HIGH_WATER = 16 * 1024 * 1024;
const DOWNSTREAM_LOW_WATER = 4 * 1024 * 1024;
const HEALTHY_STREAM_MS = 10_000;

export class Session {
  readonly openedAt = new Date();
  private readonly subs: Subscriptions;
  private upstream: Upstream | undefined;
  private gen = 0;
  /** When the upstream was lost (performance.now()): the end of the last stream that worked for a while, or the first failure. */
  private lostAt: number | undefined;
  private reconnectTimer: NodeJS.Timeout | undefined;
  private lastUpstreamError = '';
  /** The last reconnect's log line, to log a failure repeated all through an outage once at warn. */
  private lastReconnectWhy = '';
  private downstreamBlocked = false;
  /** Bytes written to Envoy's stream that gRPC has not handed to the connection yet. */
  private downstreamPending = 0;
  private done = false;
  /** Envoy has sent a request: the upstream has been opened (and is reopened after it ends). */
  private hasStarted = false;
  private readonly types = new Map<string, TypeDebug>();
  /** SotW: the last version the agent accepted per agent-handled type, re-sent on reconnect. */
  private readonly agentVersions = new Map<string, string>();
  private readonly agentChains = new Map<string, Promise<void>>();
  /** Rewritten types: per resource name, the sequence number of the last response that carried it to Envoy. */
  private readonly rewrittenSeq = new Map<string, number>();
  private rewriteSeq = 0;
  /** Keys under which this stream's resources reference SDS names (dropped when the stream closes). */
  private readonly secretSources = new Set<string>();

  constructor(
    readonly id: number,
    readonly kind: XdsKind,
    private readonly call: ServerCall,
    private readonly ctx: SessionContext,
  ) {
    this.subs = kind === 'sotw' ? new SotwSubscriptions() : new DeltaSubscriptions();
    call.on('message', (b: Buffer) => this.onEnvoyMessage(b));
    call.on('halfClose', () => this.envoyEnded('cancelled', 'Envoy closed its side of the stream', true));
    call.on('aborted', (st) => {
      if (!st) return this.envoyEnded('cancelled', 'cancelled by Envoy or the connection closed', false);
      // The transport ended the call itself, e.g. a message over the size limit.
      if (!this.done && st.code === 8 /* RESOURCE_EXHAUSTED */) ctx.counters.bad_messages_total++;
      this.envoyEnded('error', `gRPC ended it: ${st.details}`, false, true);
    });
    // Logged at info once it sends a request (start()): a stream cancelled before that is not worth a line.
    if (log.enabled('debug')) log.debug(`Envoy opened ${METHOD[kind]} stream ${id}`, { peer: call.peer });
  }

  get started(): boolean {
    return this.hasStarted;
  }

  get upstreamConnected(): boolean {
    return this.upstream?.connected ?? false;
  }

  // ---- Envoy -> upstream ----

  private onEnvoyMessage(buf: Buffer): void {
    if (this.done) return;
    const c = this.ctx.counters;
    c.requests_from_envoy++;
    c.request_bytes_from_envoy += buf.length;
    let typeUrl: string;
    let nonce: string;
    let changesNothing: boolean;
    let names: string | undefined;
    try {
      if (this.subs.kind === 'sotw') {
        const req = parseSotwRequest(buf);
        if (!req.typeUrl) throw new Error('no type_url');
        this.subs.record(buf, req);
        this.noteEnvoyRequest(
          req.typeUrl,
          req.responseNonce,
          req.errorDetail,
          req.versionInfo,
          req.resourceNames.length,
        );
        typeUrl = req.typeUrl;
        nonce = req.responseNonce;
        names = namesKey(req.resourceNames);
        changesNothing = this.upstream?.sentNames.get(typeUrl) === names;
      } else {
        const req = parseDeltaRequest(buf);
        if (!req.typeUrl) throw new Error('no type_url');
        this.subs.record(req);
        this.noteEnvoyRequest(
          req.typeUrl,
          req.responseNonce,
          req.errorDetail,
          undefined,
          this.subs.subscribed(req.typeUrl).length,
        );
        typeUrl = req.typeUrl;
        nonce = req.responseNonce;
        changesNothing = req.subscribe.length === 0 && req.unsubscribe.length === 0;
      }
    } catch (e) {
      c.bad_messages_total++;
      const why = `malformed ${ENVOY_REQUEST[this.kind]} from Envoy (${buf.length} bytes): ${errorMessage(e)}`;
      this.ctx.streamLog('warn', `closing Envoy's xDS stream ${this.id}: ${why}`);
      this.endDownstream(3 /* INVALID_ARGUMENT */, why);
      return;
    }
    if (log.enabled('debug'))
      log.debug(`stream ${this.id}: Envoy asks for ${shortType(typeUrl)}, nonce ${nonce.slice(0, 200) || '-'}`);
    if (!this.hasStarted) this.start();
    const up = this.upstream;
    // While the upstream is down, the request only updates the state that the reconnect re-sends.
    if (!up || up.ended) return;
    let out = buf;
    if (nonce && !up.issued.has(typeUrl, nonce)) {
      // An ACK/NACK of a response from an earlier upstream stream: the new server never issued that nonce.
      if (changesNothing) return;
      out = withoutFields(buf, STRIP_STALE[this.kind]);
    }
    this.sendUpstream(up, typeUrl, out, names);
  }

  private noteEnvoyRequest(
    typeUrl: string,
    nonce: string,
    err: ErrorDetail | undefined,
    version: string | undefined,
    subscribed: number,
  ): void {
    const t = this.typeDebug(typeUrl);
    t.envoy = { version, nonce, at: new Date().toISOString(), subscribed };
    if (err && nonce) {
      this.ctx.counters.envoy_nacks_total++;
      t.envoy.nack = err.message;
      log.warn(`Envoy rejected ${shortType(typeUrl)} (nonce ${nonce}) on stream ${this.id}: ${err.message}`);
    }
  }

  /** `names`: SotW requests from Envoy, the resource names they carry. */
  private sendUpstream(up: Upstream, typeUrl: string, bytes: Buffer, names?: string): void {
    if (!up.sentAny && this.subs.node && !hasNode(bytes, this.kind))
      bytes = Buffer.concat([nodeField(this.kind, this.subs.node), bytes]);
    up.sentAny = true;
    up.queue.push(bytes);
    if (names !== undefined) up.sentNames.set(typeUrl, names);
    this.pump(up);
    // As Istio does: the agent's own subscriptions follow Envoy's first LDS request, when the server knows the node.
    if (typeUrl === LISTENER_TYPE && !up.agentInjected) {
      up.agentInjected = true;
      this.injectAgentRequests(up, this.ctx.handlerTypes(), this.ctx.isPrimary(this));
    }
  }

  private pump(up: Upstream): void {
    if (up.writing || up.ended || up.queue.length === 0) return;
    const b = up.queue.shift()!;
    const c = this.ctx.counters;
    c.requests_to_upstream++;
    c.request_bytes_to_upstream += b.length;
    up.writing = true;
    up.up.write(b, () => {
      up.writing = false;
      this.pump(up);
    });
  }

  /** Reads the next upstream message unless Envoy is behind. */
  private readNext(up: Upstream): void {
    if (up.reading || up.ended || this.downstreamBlocked) return;
    up.reading = true;
    up.up.startRead();
  }

  // ---- the agent's own types ----

  private injectAgentRequests(up: Upstream, types: string[], withAgentRequests: boolean): void {
    for (const t of types) {
      this.typeDebug(t).agent = true;
      const bytes =
        this.kind === 'sotw'
          ? encodeSotwRequest({ typeUrl: t, versionInfo: this.agentVersions.get(t) })
          : encodeDeltaRequest({ typeUrl: t });
      this.sendUpstream(up, t, bytes);
    }
    if (withAgentRequests) for (const r of this.ctx.agentRequests()) this.sendAgentRequest(r);
  }

  /** A handler registered after this stream's first LDS request: subscribe now. */
  addAgentType(typeUrl: string): void {
    const up = this.upstream;
    if (up && !up.ended && up.agentInjected) this.injectAgentRequests(up, [typeUrl], false);
  }

  /** Sends the agent's request (e.g. HealthInformation) if the stream is far enough; otherwise the injection will. */
  sendAgentRequest(r: AgentRequest): void {
    const up = this.upstream;
    if (!up || up.ended || !up.agentInjected) return;
    const bytes =
      this.kind === 'sotw'
        ? encodeSotwRequest({
            typeUrl: r.typeUrl,
            resourceNames: r.resourceNames,
            responseNonce: r.nonce,
            errorDetail: r.errorDetail,
          })
        : encodeDeltaRequest({
            typeUrl: r.typeUrl,
            subscribe: r.resourceNames,
            responseNonce: r.nonce,
            errorDetail: r.errorDetail,
          });
    this.sendUpstream(up, r.typeUrl, bytes);
  }

  /** Called when this session becomes the one that feeds the agent's handlers. */
  becamePrimary(): void {
    for (const r of this.ctx.agentRequests()) this.sendAgentRequest(r);
  }

  private handleAgentResponse(
    up: Upstream,
    buf: Buffer,
    delta: DeltaResponse | undefined,
    typeUrl: string,
    version: string,
    nonce: string,
  ): void {
    const handler = this.ctx.handler(typeUrl)!;
    const prev = this.agentChains.get(typeUrl) ?? Promise.resolve();
    // One response at a time per type, in order; a slow handler never blocks Envoy's types.
    const next = prev
      .then(async () => {
        let resources: Buffer[];
        const meta: AgentResponseMeta = { typeUrl, version, nonce };
        if (!delta) {
          resources = sotwResources(buf);
        } else {
          const present = delta.resources.filter((r) => r.any);
          resources = present.map((r) => r.any!);
          meta.names = present.map((r) => r.name);
          meta.removed = delta.removed;
        }
        let err: unknown;
        if (this.ctx.isPrimary(this)) {
          try {
            await handler(resources, meta);
          } catch (e) {
            err = e ?? new Error('handler failed');
          }
        }
        if (up !== this.upstream || up.ended) return; // the reconnect re-subscribes
        const t = this.typeDebug(typeUrl);
        let bytes: Buffer;
        if (err !== undefined) {
          this.ctx.counters.agent_nacks_total++;
          const errorDetail = { code: NACK_CODE, message: errorMessage(err) };
          t.envoy = {
            version: this.agentVersions.get(typeUrl),
            nonce,
            at: new Date().toISOString(),
            nack: errorDetail.message,
          };
          log.warn(`agent rejected ${shortType(typeUrl)} version ${version} (nonce ${nonce}): ${errorDetail.message}`);
          bytes =
            this.kind === 'sotw'
              ? encodeSotwRequest({
                  typeUrl,
                  versionInfo: this.agentVersions.get(typeUrl),
                  responseNonce: nonce,
                  errorDetail,
                })
              : encodeDeltaRequest({ typeUrl, responseNonce: nonce, errorDetail });
        } else {
          this.ctx.counters.agent_acks_total++;
          this.agentVersions.set(typeUrl, version);
          t.envoy = { version, nonce, at: new Date().toISOString() };
          bytes =
            this.kind === 'sotw'
              ? encodeSotwRequest({ typeUrl, versionInfo: version, responseNonce: nonce })
              : encodeDeltaRequest({ typeUrl, responseNonce: nonce });
        }
        this.sendUpstream(up, typeUrl, bytes);
      })
      .catch((e) => log.error(`handling ${shortType(typeUrl)} failed: ${errorMessage(e)}`));
    this.agentChains.set(typeUrl, next);
  }

  // ---- upstream -> Envoy ----

  private onUpstreamMessage(up: Upstream, buf: Buffer): void {
    up.reading = false;
    if (up !== this.upstream || up.ended) return;
    const c = this.ctx.counters;
    c.responses_from_upstream++;
    c.response_bytes_from_upstream += buf.length;
    let typeUrl: string;
    let version: string;
    let nonce: string;
    let count: number;
    let removed: number | undefined;
    let delta: DeltaResponse | undefined;
    try {
      if (this.subs.kind === 'sotw') {
        const r = parseSotwResponse(buf);
        ({ typeUrl, versionInfo: version, nonce, resourceCount: count } = r);
      } else {
        const r = (delta = parseDeltaResponse(buf));
        ({ typeUrl, systemVersionInfo: version, nonce } = r);
        count = r.resources.length;
        removed = r.removed.length;
        // A rewritten type's response is recorded as its parts reach Envoy (rewriteAndForward).
        if (typeUrl && !this.ctx.handler(typeUrl) && !this.ctx.rewriter(typeUrl)) this.subs.recordResponse(r);
      }
      if (!typeUrl) throw new Error('no type_url');
    } catch (e) {
      c.bad_messages_total++;
      this.endUpstream(
        up,
        `malformed ${UPSTREAM_RESPONSE[this.kind]} from ${this.ctx.upstream.address} (${buf.length} bytes): ${errorMessage(e)}`,
      );
      return;
    }
    if (log.enabled('debug'))
      log.debug(
        `stream ${this.id}: ${shortType(typeUrl)} ${version.slice(0, 200)} from upstream, ${count} resource(s), nonce ${nonce.slice(0, 200)}`,
      );
    up.gotResponse = true;
    up.issued.add(typeUrl, nonce);
    this.typeDebug(typeUrl).upstream = { version, nonce, resources: count, removed, at: new Date().toISOString() };
    if (this.ctx.handler(typeUrl)) {
      this.handleAgentResponse(up, buf, delta, typeUrl, version, nonce);
      this.readNext(up);
      return;
    }
    const rewriter = this.ctx.rewriter(typeUrl);
    if (rewriter) {
      this.rewriteAndForward(up, buf, delta, typeUrl, nonce, rewriter);
      this.readNext(up);
      return;
    }
    // Before Envoy sees the response: it may open SDS streams for the names at once.
    if (SECRET_REFERENCING_TYPES.has(typeUrl)) {
      try {
        this.noteSecretReferences(typeUrl, buf, delta);
      } catch (e) {
        // The response still goes to Envoy; its file names are then not served (and refused, logged, by SDS).
        log.warn(`cannot read the SDS names of ${shortType(typeUrl)} ${version}: ${errorMessage(e)}`);
      }
    }
    this.forwardToEnvoy(buf);
    this.readNext(up);
  }

  private forwardToEnvoy(buf: Buffer): void {
    const c = this.ctx.counters;
    c.responses_to_envoy++;
    c.response_bytes_to_envoy += buf.length;
    // Envoy reads slower than the server pushes: stop reading upstream until Envoy has taken most of it, so
    // the proxy holds about one large push at a time instead of everything the server sends.
    this.downstreamPending += buf.length;
    this.call.write(buf, () => {
      this.downstreamPending -= buf.length;
      if (this.downstreamBlocked && this.downstreamPending <= DOWNSTREAM_LOW_WATER) {
        this.downstreamBlocked = false;
        if (this.upstream) this.readNext(this.upstream);
      }
    });
    if (this.downstreamPending > DOWNSTREAM_HIGH_WATER) this.downstreamBlocked = true;
  }

  /**
   * Holds one response while the rewriter works on it (other responses, of this type too, go on), then forwards
   * it, or NACKs it upstream as Go does. Resources that need no waiting (a cached module, not a Wasm filter) go to
   * Envoy at once, in a response of their own with the same nonce and version, and the rest follow when they are
   * done, so one slow module does not hold up the other plugins of the push (Go holds the whole response). Go
   * also forwards each converted response when its goroutine ends, so a slow fetch can let an older response
   * overwrite a newer one; here a resource that a later response has already brought to Envoy is left out of the
   * earlier one, and a response left with nothing is dropped (Envoy ACKs the later one).
   */
  private rewriteAndForward(
    up: Upstream,
    buf: Buffer,
    delta: DeltaResponse | undefined,
    typeUrl: string,
    nonce: string,
    rewrite: ResourceRewriter,
  ): void {
    const seq = ++this.rewriteSeq;
    const present = delta?.resources.filter((r) => r.any);
    const resources = present ? present.map((r) => r.any!) : sotwResources(buf);
    const stale = () => up !== this.upstream || up.ended || this.done;
    const nack = (err: unknown) => {
      if (stale()) return;
      this.ctx.counters.rewrite_nacks_total++;
      const errorDetail = { code: NACK_CODE, message: errorMessage(err) };
      log.warn(
        `agent rejected ${shortType(typeUrl)} (nonce ${nonce}) for Envoy's stream ${this.id}: ` + errorDetail.message,
      );
      // SotW: on Envoy's latest request (its names, the version it accepted), so the server sees no change of
      // subscription (Go sends no names, which reads as a wildcard request).
      const bytes =
        this.subs.kind === 'sotw'
          ? Buffer.concat([
              this.subs.latest(typeUrl) ?? Buffer.alloc(0),
              encodeSotwRequest({ typeUrl, responseNonce: nonce, errorDetail }),
            ])
          : encodeDeltaRequest({ typeUrl, responseNonce: nonce, errorDetail });
      this.sendUpstream(up, typeUrl, bytes);
    };
    let pending: Array<Promise<{ name: string; any: Buffer }>>;
    try {
      pending = rewrite(resources);
      if (pending.length !== resources.length) {
        throw new Error(`rewriter returned ${pending.length} resources for ${resources.length}`);
      }
    } catch (err) {
      nack(err);
      return;
    }
    const out: Array<{ name: string; any: Buffer } | undefined> = new Array(resources.length);
    const sent = new Array<boolean>(resources.length).fill(false);
    let removalsSent = false;
    let finished = false;
    const emit = (ready: number[]) => {
      if (stale()) return; // the reconnect's stream brings them again
      const newer = (name: string) => (this.rewrittenSeq.get(name) ?? 0) > seq;
      const name = (i: number) => (present ? present[i]!.name : out[i]!.name);
      const keep = ready.filter((i) => !newer(name(i)));
      for (const i of ready) sent[i] = true;
      const removed = removalsSent ? [] : (delta?.removed ?? []).filter((n) => !newer(n));
      const hadAny = ready.length + (removalsSent ? 0 : (delta?.removed.length ?? 0)) > 0;
      removalsSent = true;
      if (hadAny && keep.length + removed.length === 0) {
        log.debug(`${shortType(typeUrl)} nonce ${nonce}: left out, later responses brought its resources to Envoy`);
        return;
      }
      for (const n of [...keep.map(name), ...removed]) this.rewrittenSeq.set(n, seq);
      const chosen = new Set(keep);
      if (delta && this.subs.kind === 'delta') {
        this.subs.recordResponse({ ...delta, resources: present!.filter((_, i) => chosen.has(i)), removed });
      }
      const bytes = delta
        ? withDeltaResources(
            buf,
            out.map((r, i) => (chosen.has(i) ? r!.any : undefined)),
            (n) => removed.includes(n),
          )
        : withSotwResources(
            buf,
            keep.map((i) => out[i]!.any),
          );
      this.ctx.counters.responses_rewritten_total++;
      this.forwardToEnvoy(bytes);
    };
    pending.forEach(
      (p, i) =>
        void p.then(
          (r) => (out[i] = r),
          () => undefined,
        ),
    );
    Promise.all(pending)
      .then(() => {
        finished = true;
        const rest = out.map((_, i) => i).filter((i) => !sent[i]);
        if (rest.length || !removalsSent) emit(rest);
      }, nack)
      .catch((e) => log.error(`forwarding ${shortType(typeUrl)} failed: ${errorMessage(e)}`));
    // What needed no I/O has resolved by the next turn of the event loop: it goes now, the rest when ready.
    setImmediate(() => {
      if (finished) return;
      const ready = out.map((r, i) => (r ? i : -1)).filter((i) => i >= 0);
      try {
        if (ready.length) emit(ready);
      } catch (e) {
        log.error(`forwarding part of ${shortType(typeUrl)} failed: ${errorMessage(e)}`);
      }
    });
  }

  /** SotW: the response is every listener (cluster); Delta: each resource replaces or removes its own names. */
  private noteSecretReferences(typeUrl: string, buf: Buffer, delta: DeltaResponse | undefined): void {
    const sink = this.ctx.secretReferences;
    if (!sink) return;
    const set = (key: string, names: string[]) => {
      if (!names.length && !this.secretSources.has(key)) return;
      sink.set(key, names);
      if (names.length) this.secretSources.add(key);
      else this.secretSources.delete(key);
    };
    const prefix = `xds/${this.id}/${typeUrl}`;
    if (!delta) {
      set(prefix, mayNameFile(buf) ? sotwResources(buf).flatMap(fileSecretNames) : []);
      return;
    }
    for (const r of delta.resources) set(`${prefix}/${r.name}`, r.any ? fileSecretNames(r.any) : []);
    for (const name of delta.removed) set(`${prefix}/${name}`, []);
  }

  // ---- upstream lifecycle ----

  /** Envoy's first request: the stream becomes primary and its upstream is opened (the request goes on it next). */
  private start(): void {
    this.hasStarted = true;
    this.ctx.started(this);
    this.ctx.streamLog('info', `Envoy connected: ${METHOD[this.kind]} stream ${this.id}`, {
      peer: this.call.peer,
    });
    this.connect();
  }

  private connect(): void {
    this.reconnectTimer = undefined;
    if (this.done) return;
    const c = this.ctx.counters;
    const gen = ++this.gen;
    if (gen > 1) c.upstream_reconnects_total++;
    let handle: UpstreamCall;
    let up: Upstream | undefined;
    try {
      handle = openUpstream(
        this.ctx.upstream,
        this.kind,
        this.ctx.maxMessageBytes,
        {
          onMessage: (b) => up && this.onUpstreamMessage(up, b),
          onStatus: (st) => up && this.onUpstreamStatus(up, st),
        },
        gen === 1 ? this.ctx.spareChannel?.() : undefined,
      );
    } catch (e) {
      c.upstream_failures_total++;
      c.upstream_dial_failures_total++;
      this.lastUpstreamError = errorMessage(e);
      this.scheduleReconnect(`cannot connect to ${this.ctx.upstream.address}: ${this.lastUpstreamError}`);
      return;
    }
    const cur: Upstream = (up = {
      gen,
      up: handle,
      connected: false,
      ended: false,
      queue: [],
      writing: false,
      reading: false,
      sentAny: false,
      issued: new IssuedNonces(),
      sentNames: new Map(),
      agentInjected: false,
      gotResponse: false,
      openedAt: Date.now(),
    });
    this.upstream = cur;
    this.readNext(cur);
    handle.whenReady(this.ctx.dialTimeoutMs, (err) => {
      if (cur.ended) return;
      if (err) {
        this.endUpstream(cur, err.message);
        return;
      }
      cur.connected = true;
      c.upstream_connects_total++;
      const lost =
        this.lostAt === undefined
          ? ''
          : `, ${((performance.now() - this.lostAt) / 1000).toFixed(1)} s after it was lost`;
      const again = gen > 1 ? ` (reconnect ${gen - 1}${lost})` : '';
      this.ctx.streamLog(
        'info',
        `connected to upstream ${this.ctx.upstream.address} for Envoy's stream ${this.id}${again}`,
      );
      this.lastReconnectWhy = '';
    });
    // The first upstream stream gets Envoy's first request as it came (the caller forwards it next); a later one
    // is brought to what Envoy is subscribed to.
    if (gen > 1) for (const r of this.subs.resend()) this.sendUpstream(cur, r.typeUrl, r.bytes, r.names);
  }

  /** Ends an upstream stream from this side; Envoy's stream stays open and a reconnect is scheduled. */
  private endUpstream(up: Upstream, why: string): void {
    if (up.ended) return;
    up.endReason = why;
    up.up.cancel(why);
    // The CANCELLED status may arrive now or later; either way the reason above is what gets logged.
    this.onUpstreamStatus(up, { code: 1, details: why });
  }

  private onUpstreamStatus(up: Upstream, s: { code: number; details: string }): void {
    if (up.ended) return;
    up.ended = true;
    const wasConnected = up.connected;
    up.connected = false;
    up.queue.length = 0;
    up.up.close();
    if (this.upstream === up) this.upstream = undefined;
    if (this.done) return;
    this.ctx.counters.upstream_failures_total++;
    if (wasConnected) {
      this.ctx.counters.upstream_terminations_total++;
      if (!up.endReason && expectedEnd(s)) this.ctx.counters.istiod_stream_cancellations_total++;
      else this.ctx.counters.istiod_stream_errors_total++;
    } else this.ctx.counters.upstream_dial_failures_total++;
    if (s.code === 8 /* RESOURCE_EXHAUSTED: a message over the size limit */) this.ctx.counters.bad_messages_total++;
    // Start the backoff over only after a stream that worked for a while, so a server that answers once and
    // then fails (a crash loop, a push over the size limit) is not hammered every initialMs.
    if (up.gotResponse && Date.now() - up.openedAt >= HEALTHY_STREAM_MS) this.lostAt = undefined;
    this.lastUpstreamError =
      up.endReason ?? `${grpcStatusName(s.code)}: ${s.details.replace(/ Resolution note: *$/, '')}`;
    // A server that served this stream and then closed it (istiod's max connection age, a rollout) is routine.
    const routine = up.gotResponse && !up.endReason && (s.code === 0 || s.code === 14);
    this.scheduleReconnect(`upstream xDS stream ended (${this.lastUpstreamError})`, routine);
  }

  private scheduleReconnect(why: string, routine = false): void {
    if (this.done) return;
    const now = performance.now();
    this.lostAt ??= now;
    const delay = backoffDelay(now - this.lostAt, this.ctx.backoff);
    // An outage of minutes fails dozens of attempts the same way: the first at warn, the repeats at debug.
    const line = `${why}; Envoy's stream ${this.id} stays open, reconnecting in ${delay} ms`;
    if (!routine && why === this.lastReconnectWhy) log.debug(line);
    else this.ctx.streamLog(routine ? 'info' : 'warn', line);
    this.lastReconnectWhy = why;
    this.reconnectTimer = setTimeout(() => this.connect(), delay);
    this.reconnectTimer.unref();
  }

  // ---- shutdown ----

  /** Envoy's stream ended (or failed): counted once, as Go counts its terminations, then closed. */
  private envoyEnded(kind: 'cancelled' | 'error', why: string, graceful: boolean, abnormal = false): void {
    if (this.done) return;
    if (kind === 'cancelled') this.ctx.counters.envoy_stream_cancellations_total++;
    else this.ctx.counters.envoy_stream_errors_total++;
    this.close(why, graceful, abnormal);
  }

  private endDownstream(code: number, details: string): void {
    this.envoyEnded('error', details, false, true);
    // A status error ends only this call; the server and other streams carry on.
    this.call.fail(code, details);
  }

  /** Ends the session. `graceful`: also end Envoy's side with OK; `abnormal`: log as a warning. */
  close(why: string, graceful: boolean, abnormal = false): void {
    if (this.done) return;
    this.done = true;
    if (this.reconnectTimer) clearTimeout(this.reconnectTimer);
    const up = this.upstream;
    this.upstream = undefined;
    if (up && !up.ended) {
      up.ended = true;
      up.up.cancel("Envoy's stream closed");
      up.up.close();
    }
    if (graceful) {
      this.call.end();
    }
    for (const key of this.secretSources) this.ctx.secretReferences?.set(key, []);
    this.secretSources.clear();
    const line = `Envoy's xDS stream ${this.id} closed: ${why}`;
    if (this.hasStarted || abnormal) this.ctx.streamLog(abnormal ? 'warn' : 'info', line);
    else log.debug(`${line} (before its first request)`);
    this.ctx.closed(this);
  }

  // ---- /debug/xds ----

  private typeDebug(typeUrl: string): TypeDebug {
    let t = this.types.get(typeUrl);
    if (!t) this.types.set(typeUrl, (t = {}));
    return t;
  }

  debugState(): Record<string, unknown> {
    const up = this.upstream;
    const types: Record<string, unknown> = {};
    for (const [k, v] of this.types) {
      const extra = this.subs.kind === 'delta' && !v.agent ? { ackedResources: this.subs.versions(k)?.size ?? 0 } : {};
      types[k] = { ...v, ...extra };
    }
    return {
      id: this.id,
      kind: this.kind,
      node: nodeId(this.subs.node),
      peer: this.call.peer,
      openedAt: this.openedAt.toISOString(),
      primary: this.ctx.isPrimary(this),
      started: this.hasStarted,
      upstream: {
        connected: up?.connected ?? false,
        stream: this.gen,
        since: up ? new Date(up.openedAt).toISOString() : undefined,
        queued: up?.queue.length ?? 0,
        lastError: this.lastUpstreamError || undefined,
        reconnectScheduled: this.reconnectTimer !== undefined,
      },
      types,
    };
  }
}

function hasNode(bytes: Buffer, kind: XdsKind): boolean {
  return kind === 'sotw' ? parseSotwRequest(bytes).node !== undefined : parseDeltaRequest(bytes).node !== undefined;
}

/** `type.googleapis.com/envoy.config.cluster.v3.Cluster` -> `Cluster`, for log lines. */
export function shortType(typeUrl: string): string {
  return typeUrl.slice(typeUrl.lastIndexOf('.') + 1) || typeUrl;
}

/** Go's GRPCErrorType: the peer went away (EOF, Canceled, DeadlineExceeded, Unavailable for a lost connection). */
function expectedEnd(s: { code: number; details: string }): boolean {
  if (s.code === 0 || s.code === 1 || s.code === 4) return true;
  return (
    s.code === 14 &&
    /connection dropped|ECONNRESET|EOF|transport is closing|client disconnected|GOAWAY/i.test(s.details)
  );
}
