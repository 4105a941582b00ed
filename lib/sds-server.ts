// Envoy's SecretDiscoveryService on the Unix socket the bootstrap's sds-grpc cluster names: StreamSecrets (state
// of the world, what Envoy uses for `api_type: GRPC`) and DeltaSecrets (`DELTA_GRPC`). Secret values come from
// a SecretProvider (the secret cache); this file only speaks the protocol.
//
// A secret Envoy asks for is answered as soon as it exists (a stream may wait for the first workload
// certificate); push(name) re-sends it to every stream holding it when it changes. A NACK is logged and counted,
// and the stream keeps its last accepted secret. Keys are never logged: only names, versions and nonces.
//
// What a client may ask for is decided here, before the provider sees a name (admit()): `default` and `ROOTCA`,
// and a `file-cert:`/`file-root:` name only while this Envoy's configuration references it (`references`, fed by
// agent.ts from the bootstrap and the xDS proxy); anything else waits unserved, logged once and counted. A name
// held by no stream any more is released, so the provider stops watching its files; one stream holds at most
// maxNamesPerStream names (the rest are refused, logged and counted), and a response carries only the secrets
// that are new or changed for that stream (Envoy opens one state-of-the-world stream per secret, and the xDS
// protocol lets a server send a subset for types other than listeners and clusters).

import { createHash, randomBytes } from 'node:crypto';
import * as path from 'node:path';
import { GrpcServer, type ServerCall } from './grpc-server';
import { GrpcStatus } from './grpc-status';
import { Counter, type Registry } from './prom';
import { closedSignal, type Component } from './component';
import type { AnyMessage } from './envoy-protos';
import { AgentError, wrap } from './errors';
import { scope } from './log';
import { bindUnixSocket, type BoundUnixServer } from './grpc-unix';
import { parseSecretName, SecretReferences, namesFile } from './secret-names';
import {
  encodeDeltaResponse,
  encodeSotwResponse,
  nodeId,
  packAnyBytes,
  parseDeltaRequest,
  parseSotwRequest,
} from './xds-codec';

const log = scope('sds');

export const SECRET_TYPE = 'type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret';
export { ROOT_SECRET, WORKLOAD_SECRET } from './secret-names';
const SDS_SERVICE = 'envoy.service.secret.v3.SecretDiscoveryService';

export type SecretValue =
  { kind: 'tls'; certChainPem: string; keyPem: string } | { kind: 'root'; rootPem: string; crlPem?: string };

export interface SecretProvider {
  /** The secret's current value, or undefined while it does not exist (the stream waits for push(name)). */
  secret(name: string): SecretValue | undefined;
  /** A stream asked for this admitted name (a file-cert:/file-root: name may need a watch to be started). */
  requested?(name: string): void;
  /** No stream holds this name any more. */
  released?(name: string): void;
}

export interface SdsServerOptions {
  socketPath: string;
  provider: SecretProvider;
  /** Names one stream may hold (SDS_MAX_NAMES_PER_STREAM); more are refused. */
  maxNamesPerStream?: number;
}

export const DEFAULT_MAX_NAMES_PER_STREAM = 5000;
/** Refused names logged one by one; beyond that, only counted (a client cannot fill the log or the memory). */
const MAX_LOGGED_REFUSALS = 1000;
/** Two paths of PATH_MAX and the prefix: longer is no name this agent serves (and is not kept). */
const MAX_NAME_CHARS = 8200;
/** Names held but not served, over all streams: more are not even held (each stream is bounded, streams are not). */
const MAX_WAITING = 10_000;
/** SotW responses whose ACK is still awaited, per stream. */
const MAX_PENDING = 16;

type Refusal = 'unknown_name' | 'not_referenced' | 'too_many_names';

export function secretVersion(v: SecretValue): string {
  const h = createHash('sha256');
  if (v.kind === 'tls') h.update('tls\0').update(v.certChainPem).update('\0').update(v.keyPem);
  else
    h.update('root\0')
      .update(v.rootPem)
      .update(v.crlPem ? `\0crl\0${v.crlPem}` : '');
  return h.digest('hex').slice(0, 16);
}

// The few messages this server reads and writes are encoded by hand (lib/xds-codec.ts), not through protobufjs:
// building Envoy's descriptor (proto/envoy.json) took 150-600 ms of the event loop on Envoy's first SDS request,
// on the path to the first certificate, and ~3 MiB of heap kept for the agent's life.
// Field numbers: envoy.extensions.transport_sockets.tls.v3.Secret (name 1, tls_certificate 2, validation_context 4),
// TlsCertificate (certificate_chain 1, private_key 2), CertificateValidationContext (trusted_ca 1, crl 7),
// envoy.config.core.v3.DataSource (inline_bytes 2).
const SECRET_TYPE_NAME = 'envoy.extensions.transport_sockets.tls.v3.Secret';

function lenField(field: number, value: Buffer): Buffer {
  const head: number[] = [field * 8 + 2];
  for (let n = value.length; ; n = Math.floor(n / 128)) {
    if (n < 0x80) {
      head.push(n);
      break;
    }
    head.push((n % 128) | 0x80);
  }
  return Buffer.concat([Buffer.from(head), value]);
}
const inlineBytes = (field: number, pem: string) => lenField(field, lenField(2, Buffer.from(pem)));

/**
 * The Envoy Secret resource: certificate and key inline, or a validation context with the trusted roots (and the
 * plugged-in CA's CRL for ROOTCA, inline, so Envoy needs no access to the file and a change is one push).
 */
export function secretResource(name: string, v: SecretValue): AnyMessage {
  const body =
    v.kind === 'tls'
      ? lenField(2, Buffer.concat([inlineBytes(1, v.certChainPem), inlineBytes(2, v.keyPem)]))
      : lenField(4, Buffer.concat([inlineBytes(1, v.rootPem), ...(v.crlPem ? [inlineBytes(7, v.crlPem)] : [])]));
  const value = Buffer.concat([lenField(1, Buffer.from(name)), body]);
  return { type_url: `type.googleapis.com/${SECRET_TYPE_NAME}`, value };
}

interface DiscoveryRequest {
  version_info?: string;
  resource_names?: string[];
  response_nonce?: string;
  type_url?: string;
  error_detail?: { code?: number; message?: string };
  node?: { id?: string };
}

interface DeltaRequest {
  resource_names_subscribe?: string[];
  resource_names_unsubscribe?: string[];
  initial_resource_versions?: Record<string, string>;
  response_nonce?: string;
  type_url?: string;
  error_detail?: { code?: number; message?: string };
  node?: { id?: string };
}

// What the server reads, in the shape protobufjs gave (snake_case, absent fields undefined).
const status = (e: { code: number; message: string } | undefined) =>
  e && { code: e.code, message: e.message || undefined };
function readSotw(b: Buffer): DiscoveryRequest {
  const r = parseSotwRequest(b);
  return {
    version_info: r.versionInfo || undefined,
    resource_names: r.resourceNames,
    response_nonce: r.responseNonce || undefined,
    type_url: r.typeUrl || undefined,
    error_detail: status(r.errorDetail),
    node: r.node && { id: nodeId(r.node) },
  };
}
function readDelta(b: Buffer): DeltaRequest {
  const r = parseDeltaRequest(b);
  return {
    resource_names_subscribe: r.subscribe,
    resource_names_unsubscribe: r.unsubscribe,
    initial_resource_versions: Object.fromEntries(r.initialVersions),
    response_nonce: r.responseNonce || undefined,
    type_url: r.typeUrl || undefined,
    error_detail: status(r.errorDetail),
    node: r.node && { id: nodeId(r.node) },
  };
}
const anyBytes = (a: AnyMessage) =>
  packAnyBytes(a.type_url, Buffer.from(a.value.buffer, a.value.byteOffset, a.value.byteLength));
interface SotwAnswer {
  version_info: string;
  resources: AnyMessage[];
  type_url: string;
  nonce: string;
}
interface DeltaAnswer {
  system_version_info: string;
  resources: { name: string; version: string; resource: AnyMessage }[];
  type_url: string;
  nonce: string;
}
const writeSotw = (r: SotwAnswer): Buffer =>
  encodeSotwResponse({
    versionInfo: r.version_info,
    resources: r.resources.map(anyBytes),
    typeUrl: r.type_url,
    nonce: r.nonce,
  });
const writeDelta = (r: DeltaAnswer): Buffer =>
  encodeDeltaResponse({
    systemVersionInfo: r.system_version_info,
    typeUrl: r.type_url,
    nonce: r.nonce,
    resources: r.resources.map((x) => ({ name: x.name, version: x.version, any: anyBytes(x.resource) })),
  });

/** Envoy's requests are small; a larger one is refused before it is buffered (gRPC's default receive limit). */
const MAX_REQUEST_BYTES = 4 * 1024 * 1024;

interface Stream {
  id: number;
  kind: 'sotw' | 'delta';
  node: string;
  names: Set<string>;
  /** name -> version last sent on this stream. */
  sent: Map<string, string>;
  /** name -> version Envoy ACKed. */
  acked: Map<string, string>;
  /** nonce -> name -> version sent in that response (ACKs name the nonce). */
  pending: Map<string, Map<string, string>>;
  call: ServerCall;
  /** Sent on this stream: a version for state-of-the-world responses. */
  responses: number;
  /** The stream was told once that it asks for too many names. */
  overLimitLogged: boolean;
}

export interface SdsStreamStatus {
  id: number;
  kind: string;
  node: string;
  names: string[];
  acked: Record<string, string>;
}

export class SdsServer implements Component {
  readonly name = 'SDS server';
  readonly closed: Promise<Error | undefined>;
  private readonly signal = closedSignal();
  private server: GrpcServer | undefined;
  private bound: BoundUnixServer | undefined;
  private readonly streams = new Map<number, Stream>();
  private readonly socketPath: string;
  private nextId = 1;
  private state: 'new' | 'starting' | 'serving' | 'closed' = 'new';
  private readonly counts = { pushes: 0, nacks: 0, refused: new Map<Refusal, number>() };
  /** Name -> streams holding it. */
  private readonly holders = new Map<string, number>();
  /** Held names that are not served (not referenced, or unknown); an admitted one leaves this set. */
  private readonly waiting = new Set<string>();
  private readonly loggedRefusals = new Set<string>();
  private readonly maxNames: number;
  /** The file names this Envoy's configuration references; only these are served. */
  readonly references = new SecretReferences();

  constructor(private readonly o: SdsServerOptions) {
    this.closed = this.signal.closed;
    this.socketPath = path.resolve(o.socketPath);
    this.maxNames = o.maxNamesPerStream ?? DEFAULT_MAX_NAMES_PER_STREAM;
    this.references.onAdded((names) => this.admitWaiting(names));
  }

  async start(): Promise<void> {
    if (this.state !== 'new') throw new AgentError('INTERNAL', 'SDS server already started');
    this.state = 'starting';
    try {
      const server = new GrpcServer({
        methods: {
          [`/${SDS_SERVICE}/StreamSecrets`]: (call) => this.accept(call, 'sotw'),
          [`/${SDS_SERVICE}/DeltaSecrets`]: (call) => this.accept(call, 'delta'),
        },
        maxMessageBytes: MAX_REQUEST_BYTES,
        maxSendBytes: 0xffffffff,
        peerName: `unix:${this.socketPath}`,
      });
      this.server = server;
      this.bound = await bindUnixSocket(server, this.socketPath);
    } catch (e) {
      this.server?.close();
      this.state = 'closed';
      const err = wrap(
        `failed to start SDS server on ${this.socketPath}`,
        e,
        e instanceof AgentError ? undefined : 'IO',
      );
      this.signal.resolve(err);
      throw err;
    }
    if ((this.state as string) === 'closed') {
      this.bound.stop();
      return;
    }
    this.state = 'serving';
    log.info(`SDS server listening on ${this.socketPath}`);
  }

  async close(): Promise<void> {
    if (this.state === 'closed') return;
    this.state = 'closed';
    for (const s of this.streams.values()) {
      s.call.end();
      this.forgetStream(s);
    }
    this.streams.clear();
    // While the socket is still being bound, start() stops the server once it is.
    if (this.bound) this.bound.stop();
    else this.server?.close();
    this.signal.resolve(undefined);
  }

  /** The secret changed (or now exists): sends it to every stream holding it whose copy differs. */
  push(name: string): void {
    if (!this.holders.has(name) || this.waiting.has(name)) return;
    for (const s of this.streams.values()) if (s.names.has(name)) this.respond(s, [name]);
  }

  /** Names held by some stream, and how many of them are not served (for /debug and tests). */
  heldNames(): { held: number; waiting: number } {
    return { held: this.holders.size, waiting: this.waiting.size };
  }

  streamStatus(): SdsStreamStatus[] {
    return [...this.streams.values()].map((s) => ({
      id: s.id,
      kind: s.kind,
      node: s.node,
      names: [...s.names],
      acked: Object.fromEntries(s.acked),
    }));
  }

  registerMetrics(registry: Registry): void {
    const counts = this.counts;
    registry.registerMetric(
      new Counter({
        name: 'istio_agent_sds_pushes_total',
        help: 'Secrets sent to Envoy over SDS',
        registers: [],
        collect() {
          this.reset();
          this.inc(counts.pushes);
        },
      }),
    );
    registry.registerMetric(
      new Counter({
        name: 'istio_agent_sds_nacks_total',
        help: 'SDS responses Envoy rejected',
        registers: [],
        collect() {
          this.reset();
          this.inc(counts.nacks);
        },
      }),
    );
    registry.registerMetric(
      new Counter({
        name: 'istio_agent_sds_refused_names_total',
        help: 'SDS names not served, by reason',
        labelNames: ['reason'],
        registers: [],
        collect() {
          this.reset();
          for (const [reason, n] of counts.refused) this.inc({ reason }, n);
        },
      }),
    );
  }

  private accept(call: ServerCall, kind: 'sotw' | 'delta'): void {
    if (this.state !== 'serving') {
      call.fail(GrpcStatus.UNAVAILABLE, 'SDS server shutting down');
      return;
    }
    const s: Stream = {
      id: this.nextId++,
      kind,
      node: '',
      names: new Set(),
      sent: new Map(),
      acked: new Map(),
      pending: new Map(),
      call,
      responses: 0,
      overLimitLogged: false,
    };
    this.streams.set(s.id, s);
    const end = () => {
      if (!this.streams.delete(s.id)) return;
      log.debug(`SDS stream ${s.id} closed (${s.names.size} names)`);
      this.forgetStream(s);
    };
    call.on('message', (b: Buffer) => {
      try {
        if (kind === 'sotw') this.onSotw(s, readSotw(b));
        else this.onDelta(s, readDelta(b));
      } catch (e) {
        log.error(`SDS stream ${s.id}: ${(e as Error).message}`);
        call.fail(GrpcStatus.INTERNAL, (e as Error).message);
        end();
      }
    });
    call.on('halfClose', () => {
      end();
      call.end();
    });
    call.on('aborted', end);
  }

  private checkType(typeUrl: string | undefined): void {
    if (typeUrl && typeUrl !== SECRET_TYPE)
      throw new AgentError('BAD_INPUT', `stream asked for ${typeUrl}; this server serves only ${SECRET_TYPE}`);
  }

  /** Handles the ACK/NACK part of a request; false when the request is stale (names an old nonce). */
  private settle(s: Stream, nonce: string | undefined, error: { message?: string } | undefined): boolean {
    if (!nonce) return true;
    const sent = s.pending.get(nonce);
    if (!sent) return false;
    s.pending.delete(nonce);
    if (error) {
      this.counts.nacks++;
      log.warn(
        `Envoy rejected secret(s) ${[...sent.keys()].join(', ')} (stream ${s.id}, nonce ${nonce}): ${error.message ?? 'no message'}; it keeps the last accepted one`,
      );
    } else {
      for (const [n, v] of sent) s.acked.set(n, v);
    }
    return true;
  }

  private onSotw(s: Stream, req: DiscoveryRequest): void {
    this.checkType(req.type_url);
    if (req.node?.id) s.node = req.node.id;
    const fresh = this.settle(s, req.response_nonce, req.error_detail);
    // A request naming an older nonce carries nothing new (Envoy sends the current one after it).
    if (!fresh && !req.error_detail) return;
    const asked = new Set(req.resource_names ?? []);
    // Names the stream already holds keep their place under the limit; new ones are taken in request order.
    const names = new Set([...s.names].filter((n) => asked.has(n)));
    const added: string[] = [];
    let over = 0;
    for (const n of asked) {
      if (names.has(n)) continue;
      if (names.size >= this.maxNames) over++;
      else if (this.mayHold(s, n)) {
        names.add(n);
        added.push(n);
      }
    }
    const removed = [...s.names].filter((n) => !names.has(n));
    s.names = names;
    for (const n of removed) {
      s.sent.delete(n);
      this.release(n);
    }
    if (over) this.refuseOverLimit(s, asked.size, over);
    for (const n of added) this.hold(s, n);
    if (req.error_detail) return;
    // A request that adds nothing (an ACK, a name dropped) needs no answer: changes come through push().
    if (added.length) this.respond(s, added);
  }

  private onDelta(s: Stream, req: DeltaRequest): void {
    this.checkType(req.type_url);
    if (req.node?.id) s.node = req.node.id;
    this.settle(s, req.response_nonce, req.error_detail);
    for (const n of req.resource_names_unsubscribe ?? []) {
      s.sent.delete(n);
      if (s.names.delete(n)) this.release(n);
    }
    const added: string[] = [];
    const subscribe = req.resource_names_subscribe ?? [];
    let over = 0;
    for (const n of subscribe) {
      if (s.names.has(n)) continue;
      if (s.names.size >= this.maxNames) {
        over++;
        continue;
      }
      if (!this.mayHold(s, n)) continue;
      s.names.add(n);
      added.push(n);
      const known = req.initial_resource_versions?.[n];
      if (known) s.sent.set(n, known);
    }
    if (over) this.refuseOverLimit(s, s.names.size + over, over);
    for (const n of added) this.hold(s, n);
    if (added.length) this.respond(s, added);
  }

  // ---- which names are served ----

  /** Whether a name may be served now: the workload's own, or a file name this Envoy's configuration references. */
  private admit(name: string): Refusal | undefined {
    if (!parseSecretName(name)) return 'unknown_name';
    if (namesFile(name) && !this.references.has(name)) return 'not_referenced';
    return undefined;
  }

  private refused(reason: Refusal, message: string, key: string): void {
    this.counts.refused.set(reason, (this.counts.refused.get(reason) ?? 0) + 1);
    if (this.loggedRefusals.has(key) || this.loggedRefusals.size >= MAX_LOGGED_REFUSALS) return;
    this.loggedRefusals.add(key);
    log.warn(`SDS: ${message}`);
    if (this.loggedRefusals.size === MAX_LOGGED_REFUSALS) {
      log.warn(
        `SDS: ${MAX_LOGGED_REFUSALS} names refused; further refusals are only counted (istio_agent_sds_refused_names_total)`,
      );
    }
  }

  private refuseOverLimit(s: Stream, asked: number, over: number): void {
    this.counts.refused.set('too_many_names', (this.counts.refused.get('too_many_names') ?? 0) + over);
    if (s.overLimitLogged) return;
    s.overLimitLogged = true;
    const who = `SDS stream ${s.id}${s.node ? ` (${s.node})` : ''}`;
    log.warn(
      `${who} asks for ${asked} secrets; one stream may hold ${this.maxNames} (SDS_MAX_NAMES_PER_STREAM): ${over} not served`,
    );
  }

  /** Whether the stream may hold the name at all: a served name always, one that waits while few others do. */
  private mayHold(s: Stream, name: string): boolean {
    if (name.length > MAX_NAME_CHARS) {
      const why = `a name of ${name.length} characters; none is longer than ${MAX_NAME_CHARS}`;
      this.refused('unknown_name', `stream ${s.id} asks for ${why}`, `long-${s.id}`);
      return false;
    }
    if (this.holders.has(name) || this.waiting.size < MAX_WAITING || !this.admit(name)) return true;
    this.counts.refused.set('too_many_names', (this.counts.refused.get('too_many_names') ?? 0) + 1);
    if (!s.overLimitLogged) {
      s.overLimitLogged = true;
      log.warn(
        `SDS stream ${s.id}: ${MAX_WAITING} names already wait unserved; its further unservable names are not held`,
      );
    }
    return false;
  }

  /** A stream took a name: the first holder asks the provider for it, if it is admitted. */
  private hold(s: Stream, name: string): void {
    const n = this.holders.get(name) ?? 0;
    this.holders.set(name, n + 1);
    if (n > 0) return;
    const why = this.admit(name);
    if (!why) {
      log.debug(`SDS stream ${s.id} (${s.node}) asks for ${name}`);
      this.o.provider.requested?.(name);
      return;
    }
    this.waiting.add(name);
    const asked = `stream ${s.id} asks for ${JSON.stringify(name.slice(0, 200))}`;
    this.refused(
      why,
      why === 'unknown_name'
        ? `${asked}, which is not a secret this agent serves`
        : `${asked}, which this Envoy's configuration (bootstrap, listeners, clusters) does not reference: not served`,
      name,
    );
  }

  private release(name: string): void {
    const n = (this.holders.get(name) ?? 1) - 1;
    if (n > 0) {
      this.holders.set(name, n);
      return;
    }
    this.holders.delete(name);
    if (this.waiting.delete(name)) return;
    this.o.provider.released?.(name);
  }

  private forgetStream(s: Stream): void {
    for (const n of s.names) this.release(n);
    s.names.clear();
  }

  /** Names the configuration references now: streams waiting for them get them. */
  private admitWaiting(names: string[]): void {
    for (const name of names) {
      if (!this.waiting.has(name) || this.admit(name)) continue;
      this.waiting.delete(name);
      this.o.provider.requested?.(name);
      this.push(name);
    }
  }

  /** Sends the named secrets that exist and differ from what the stream has. */
  private respond(s: Stream, names: string[]): void {
    const changed: { name: string; value: SecretValue; version: string }[] = [];
    for (const name of names) {
      if (this.waiting.has(name)) continue;
      const value = this.o.provider.secret(name);
      if (!value) continue;
      const version = secretVersion(value);
      if (s.sent.get(name) === version) continue;
      changed.push({ name, value, version });
    }
    if (!changed.length) return;
    const nonce = randomBytes(8).toString('hex');
    if (s.kind === 'sotw') {
      const version = changed.length === 1 ? changed[0]!.version : `${s.id}.${++s.responses}`;
      const resources = changed.map((r) => secretResource(r.name, r.value));
      s.call.write(writeSotw({ version_info: version, resources, type_url: SECRET_TYPE, nonce }));
      s.pending.set(nonce, new Map(changed.map((r) => [r.name, r.version])));
      if (s.pending.size > MAX_PENDING) s.pending.delete(s.pending.keys().next().value as string);
      for (const r of changed) s.sent.set(r.name, r.version);
    } else {
      s.call.write(
        writeDelta({
          system_version_info: changed.map((r) => r.version).join('.'),
          resources: changed.map((r) => ({
            name: r.name,
            version: r.version,
            resource: secretResource(r.name, r.value),
          })),
          type_url: SECRET_TYPE,
          nonce,
        }),
      );
      s.pending.set(nonce, new Map(changed.map((r) => [r.name, r.version])));
      if (s.pending.size > MAX_PENDING) s.pending.delete(s.pending.keys().next().value as string);
      for (const r of changed) s.sent.set(r.name, r.version);
    }
    this.counts.pushes += changed.length;
    const what =
      changed.length > 10 ? `${changed.length} secrets` : changed.map((r) => `${r.name}@${r.version}`).join(', ');
    log.info(`SDS: sent ${what} to stream ${s.id}${s.node ? ` (${s.node})` : ''}`);
  }
}
