// An in-test xDS control plane (ADS, state of the world and Delta) written with grpc-js on a real TCP port, plus a
// raw ADS client that plays Envoy when a test must see every byte. Requests are decoded with the project's Envoy
// descriptor; responses are built from cached encodings so that 10 MB pushes stay cheap. Test code only.

import { createHash } from 'node:crypto';
import * as grpc from '@grpc/grpc-js';
import * as protobuf from 'protobufjs';
import { messageType, packAny, type AnyMessage } from '../../lib/envoy-protos';
import { waitFor } from './harness';

export const CLUSTER = 'type.googleapis.com/envoy.config.cluster.v3.Cluster';
export const LISTENER = 'type.googleapis.com/envoy.config.listener.v3.Listener';
export const ROUTE = 'type.googleapis.com/envoy.config.route.v3.RouteConfiguration';
export const ENDPOINT = 'type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment';
export const NODE_ID = 'sidecar~127.0.0.1~pod.ns~ns.svc.cluster.local';

const PATHS = {
  sotw: '/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources',
  delta: '/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources',
} as const;
type Kind = keyof typeof PATHS;

const identity = (b: Buffer) => b;
const T = {
  req: () => messageType('envoy.service.discovery.v3.DiscoveryRequest'),
  resp: () => messageType('envoy.service.discovery.v3.DiscoveryResponse'),
  dreq: () => messageType('envoy.service.discovery.v3.DeltaDiscoveryRequest'),
  dresp: () => messageType('envoy.service.discovery.v3.DeltaDiscoveryResponse'),
  any: () => messageType('google.protobuf.Any'),
  resource: () => messageType('envoy.service.discovery.v3.Resource'),
};
const toObj = (t: protobuf.Type, b: Buffer) => t.toObject(t.decode(b), { longs: Number, enums: String, defaults: true, arrays: true, objects: true }) as Record<string, any>;

function lenField(field: number, bytes: Uint8Array): Buffer {
  return Buffer.from(protobuf.Writer.create().uint32((field << 3) | 2).bytes(bytes).finish());
}

// ---- resources ----

export interface Resource {
  name: string;
  any: AnyMessage;
}

export function listener(name: string, port: number, routeName: string): Resource {
  const hcm = packAny('envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager', {
    stat_prefix: name,
    rds: { route_config_name: routeName, config_source: { ads: {}, resource_api_version: 'V3' } },
    http_filters: [{ name: 'envoy.filters.http.router', typed_config: packAny('envoy.extensions.filters.http.router.v3.Router', {}) }],
  });
  return {
    name,
    any: packAny('envoy.config.listener.v3.Listener', {
      name,
      address: { socket_address: { address: '127.0.0.1', port_value: port } },
      filter_chains: [{ filters: [{ name: 'envoy.filters.network.http_connection_manager', typed_config: hcm }] }],
    }),
  };
}

export function route(name: string, cluster: string): Resource {
  return {
    name,
    any: packAny('envoy.config.route.v3.RouteConfiguration', {
      name,
      virtual_hosts: [{ name: 'all', domains: ['*'], routes: [{ match: { prefix: '/' }, route: { cluster } }] }],
    }),
  };
}

/** An EDS cluster, so Envoy also subscribes to its endpoints by name. */
export function edsCluster(name: string): Resource {
  return {
    name,
    any: packAny('envoy.config.cluster.v3.Cluster', {
      name,
      type: 'EDS',
      connect_timeout: { seconds: 1 },
      eds_cluster_config: { eds_config: { ads: {}, resource_api_version: 'V3' } },
    }),
  };
}

export function endpoints(cluster: string, port: number): Resource {
  return {
    name: cluster,
    any: packAny('envoy.config.endpoint.v3.ClusterLoadAssignment', {
      cluster_name: cluster,
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: '127.0.0.1', port_value: port } } } }] }],
    }),
  };
}

/** `count` opaque resources of about `bytes` each (a Cluster with a long name pads it). */
export function bulkClusters(count: number, bytes: number): Resource[] {
  const out: Resource[] = [];
  for (let i = 0; i < count; i++) {
    const name = `c${i}-`.padEnd(bytes - 20, 'x');
    out.push({ name, any: packAny('envoy.config.cluster.v3.Cluster', { name, type: 'STATIC' }) });
  }
  return out;
}

// ---- the control plane ----

interface Cached {
  name: string;
  version: string;
  /** field 2 of DiscoveryResponse (Any) with tag. */
  sotwField: Buffer;
  /** field 2 of DeltaDiscoveryResponse (Resource) with tag. */
  deltaField: Buffer;
}

interface Snapshot {
  version: string;
  resources: Map<string, Cached>;
}

export interface RecordedRequest {
  kind: Kind;
  stream: number;
  typeUrl: string;
  nonce: string;
  hasNode: boolean;
  nodeId: string;
  versionInfo?: string;
  names?: string[];
  subscribe?: string[];
  unsubscribe?: string[];
  initialVersions?: Record<string, string>;
  error?: string;
}

interface SotwTypeState {
  names: string[];
  lastNonce: string;
}
interface DeltaTypeState {
  wildcard: boolean;
  names: Set<string>;
  known: Map<string, string>;
  lastNonce: string;
}
interface StreamState {
  id: number;
  kind: Kind;
  call: grpc.ServerDuplexStream<Buffer, Buffer>;
  sotw: Map<string, SotwTypeState>;
  delta: Map<string, DeltaTypeState>;
}

export interface ControlPlaneOptions {
  /** Serve TLS; with clientCa, require a client certificate it signed. */
  tls?: { key: Buffer; cert: Buffer; clientCa?: Buffer };
  maxMessageBytes?: number;
  /** Prefix of every nonce, to tell two instances' nonces apart. */
  noncePrefix?: string;
  /** Listen on this Unix socket instead of a TCP port on 127.0.0.1. */
  socketPath?: string;
}

export class ControlPlane {
  port = 0;
  readonly requests: RecordedRequest[] = [];
  readonly metadata: Record<string, string>[] = [];
  streamsOpened = 0;
  responsesSent = 0;
  /** The last response written for each type URL, as bytes. */
  readonly lastSent = new Map<string, Buffer>();
  private server: grpc.Server | undefined;
  private readonly snapshots = new Map<string, Snapshot>();
  private readonly streams = new Set<StreamState>();
  private nonce = 0;
  private nextStream = 1;

  constructor(private readonly opts: ControlPlaneOptions = {}) {}

  get address(): string {
    return this.opts.socketPath ? `unix://${this.opts.socketPath}` : `127.0.0.1:${this.port}`;
  }

  get openStreams(): number {
    return this.streams.size;
  }

  async start(port = this.port): Promise<number> {
    const max = this.opts.maxMessageBytes ?? 512 * 1024 * 1024;
    const server = new grpc.Server({ 'grpc.max_receive_message_length': max, 'grpc.max_send_message_length': max });
    const def = (kind: Kind) => ({ path: PATHS[kind], requestStream: true, responseStream: true, requestSerialize: identity, requestDeserialize: identity, responseSerialize: identity, responseDeserialize: identity });
    server.addService({ StreamAggregatedResources: def('sotw'), DeltaAggregatedResources: def('delta') } as grpc.ServiceDefinition, {
      StreamAggregatedResources: (call: grpc.ServerDuplexStream<Buffer, Buffer>) => this.accept(call, 'sotw'),
      DeltaAggregatedResources: (call: grpc.ServerDuplexStream<Buffer, Buffer>) => this.accept(call, 'delta'),
    });
    const creds = this.opts.tls
      ? grpc.ServerCredentials.createSsl(this.opts.tls.clientCa ?? null, [{ private_key: this.opts.tls.key, cert_chain: this.opts.tls.cert }], !!this.opts.tls.clientCa)
      : grpc.ServerCredentials.createInsecure();
    const where = this.opts.socketPath ? `unix://${this.opts.socketPath}` : `127.0.0.1:${port}`;
    this.port = await new Promise<number>((resolve, reject) => server.bindAsync(where, creds, (e, p) => (e ? reject(e) : resolve(p))));
    this.server = server;
    return this.port;
  }

  /** Stops abruptly, like a control plane that crashes or is rolled: every stream is reset. */
  async stop(): Promise<void> {
    for (const s of this.streams) s.call.destroy();
    this.streams.clear();
    this.server?.forceShutdown();
    this.server = undefined;
  }

  /** Replaces the resources of a type and pushes them to every stream that watches it. */
  set(typeUrl: string, version: string, resources: Resource[]): void {
    const Any = T.any();
    const Res = T.resource();
    const map = new Map<string, Cached>();
    for (const r of resources) {
      const anyBytes = Any.encode(r.any).finish();
      const v = createHash('sha256').update(anyBytes).digest('hex').slice(0, 12);
      map.set(r.name, {
        name: r.name,
        version: v,
        sotwField: lenField(2, anyBytes),
        deltaField: lenField(2, Res.encode({ name: r.name, version: v, resource: r.any }).finish()),
      });
    }
    this.snapshots.set(typeUrl, { version, resources: map });
    for (const s of this.streams) {
      if (s.kind === 'sotw' && s.sotw.has(typeUrl)) this.pushSotw(s, typeUrl);
      if (s.kind === 'delta' && s.delta.has(typeUrl)) this.pushDelta(s, typeUrl, false);
    }
  }

  /** Writes bytes as they are to every open stream (garbage, oversized messages). */
  sendRaw(bytes: Buffer): void {
    for (const s of this.streams) s.call.write(bytes);
  }

  waitForRequest(what: string, pred: (r: RecordedRequest) => boolean, timeoutMs = 10_000): Promise<RecordedRequest> {
    return waitFor(what, () => this.requests.find(pred), timeoutMs);
  }

  private accept(call: grpc.ServerDuplexStream<Buffer, Buffer>, kind: Kind): void {
    const s: StreamState = { id: this.nextStream++, kind, call, sotw: new Map(), delta: new Map() };
    this.streamsOpened++;
    this.metadata.push(Object.fromEntries(Object.entries(call.metadata.getMap()).map(([k, v]) => [k, String(v)])));
    this.streams.add(s);
    call.on('data', (b: Buffer) => {
      try {
        if (kind === 'sotw') this.onSotw(s, b);
        else this.onDelta(s, b);
      } catch (e) {
        call.emit('error', { code: grpc.status.INVALID_ARGUMENT, details: `control plane: ${(e as Error).message}` });
      }
    });
    const gone = () => this.streams.delete(s);
    call.on('cancelled', gone);
    call.on('error', gone);
    call.on('end', () => {
      gone();
      call.end();
    });
  }

  private onSotw(s: StreamState, b: Buffer): void {
    const r = toObj(T.req(), b);
    const err = r.error_detail && (r.error_detail.message || r.error_detail.code) ? String(r.error_detail.message) : undefined;
    this.requests.push({
      kind: 'sotw', stream: s.id, typeUrl: r.type_url, nonce: r.response_nonce, hasNode: !!r.node, nodeId: r.node?.id ?? '',
      versionInfo: r.version_info, names: r.resource_names, error: err,
    });
    let t = s.sotw.get(r.type_url);
    const namesChanged = !t || t.names.join('\n') !== r.resource_names.join('\n');
    if (!t) s.sotw.set(r.type_url, (t = { names: r.resource_names, lastNonce: '' }));
    t.names = r.resource_names;
    if (r.response_nonce === '' || (r.response_nonce === t.lastNonce && namesChanged)) this.pushSotw(s, r.type_url);
  }

  private pushSotw(s: StreamState, typeUrl: string): void {
    const snap = this.snapshots.get(typeUrl);
    const t = s.sotw.get(typeUrl);
    if (!snap || !t) return;
    const wildcard = t.names.length === 0 || t.names.includes('*');
    const nonce = `${this.opts.noncePrefix ?? ''}${++this.nonce}`;
    const head = Buffer.from(T.resp().encode({ version_info: snap.version, type_url: typeUrl, nonce }).finish());
    const parts: Buffer[] = [head];
    for (const c of snap.resources.values()) if (wildcard || t.names.includes(c.name)) parts.push(c.sotwField);
    t.lastNonce = nonce;
    this.write(s, typeUrl, Buffer.concat(parts));
  }

  private onDelta(s: StreamState, b: Buffer): void {
    const r = toObj(T.dreq(), b);
    const err = r.error_detail && (r.error_detail.message || r.error_detail.code) ? String(r.error_detail.message) : undefined;
    this.requests.push({
      kind: 'delta', stream: s.id, typeUrl: r.type_url, nonce: r.response_nonce, hasNode: !!r.node, nodeId: r.node?.id ?? '',
      subscribe: r.resource_names_subscribe, unsubscribe: r.resource_names_unsubscribe, initialVersions: r.initial_resource_versions, error: err,
    });
    let t = s.delta.get(r.type_url);
    const first = !t;
    if (!t) {
      const subs: string[] = r.resource_names_subscribe;
      t = { wildcard: subs.length === 0 || subs.includes('*'), names: new Set(), known: new Map(Object.entries(r.initial_resource_versions as Record<string, string>)), lastNonce: '' };
      s.delta.set(r.type_url, t);
    }
    for (const n of r.resource_names_subscribe as string[]) {
      if (n === '*') t.wildcard = true;
      else t.names.add(n);
    }
    for (const n of r.resource_names_unsubscribe as string[]) {
      if (n === '*') t.wildcard = false;
      t.names.delete(n);
      t.known.delete(n);
    }
    if (first || r.resource_names_subscribe.length > 0) this.pushDelta(s, r.type_url, first);
  }

  private pushDelta(s: StreamState, typeUrl: string, always: boolean): void {
    const t = s.delta.get(typeUrl)!;
    const snap = this.snapshots.get(typeUrl);
    if (!snap) return;
    const parts: Buffer[] = [];
    const removed: string[] = [];
    for (const c of snap.resources.values()) {
      if (!t.wildcard && !t.names.has(c.name)) continue;
      if (t.known.get(c.name) === c.version) continue;
      t.known.set(c.name, c.version);
      parts.push(c.deltaField);
    }
    for (const n of [...t.known.keys()]) {
      if (!snap.resources.has(n)) {
        removed.push(n);
        t.known.delete(n);
      }
    }
    if (!parts.length && !removed.length && !always) return;
    const nonce = `${this.opts.noncePrefix ?? ''}${++this.nonce}`;
    const head = Buffer.from(T.dresp().encode({ system_version_info: snap.version, type_url: typeUrl, nonce, removed_resources: removed }).finish());
    t.lastNonce = nonce;
    this.write(s, typeUrl, Buffer.concat([head, ...parts]));
  }

  private write(s: StreamState, typeUrl: string, bytes: Buffer): void {
    this.responsesSent++;
    this.lastSent.set(typeUrl, bytes);
    s.call.write(bytes);
  }
}

// ---- a raw ADS client playing Envoy ----

export interface FakeEnvoyResponse {
  raw: Buffer;
  typeUrl: string;
  version: string;
  nonce: string;
  names: string[];
  removed: string[];
}

export class FakeEnvoy {
  readonly responses: FakeEnvoyResponse[] = [];
  status: grpc.StatusObject | undefined;
  private readonly client: grpc.Client;
  private readonly call: grpc.ClientDuplexStream<Buffer, Buffer>;
  private sentNode = false;

  constructor(target: string, readonly kind: Kind, opts: { maxMessageBytes?: number; credentials?: grpc.ChannelCredentials } = {}) {
    const max = opts.maxMessageBytes ?? 512 * 1024 * 1024;
    this.client = new grpc.Client(target, opts.credentials ?? grpc.credentials.createInsecure(), {
      'grpc.max_receive_message_length': max,
      'grpc.max_send_message_length': max,
    });
    this.call = this.client.makeBidiStreamRequest(PATHS[kind], identity, identity, new grpc.Metadata(), {});
    this.call.on('data', (b: Buffer) => this.responses.push(this.decode(b)));
    this.call.on('error', () => undefined);
    this.call.on('status', (s) => (this.status = s));
  }

  private decode(b: Buffer): FakeEnvoyResponse {
    if (this.kind === 'sotw') {
      const r = toObj(T.resp(), b);
      return { raw: b, typeUrl: r.type_url, version: r.version_info, nonce: r.nonce, names: [], removed: [] };
    }
    const r = toObj(T.dresp(), b);
    return { raw: b, typeUrl: r.type_url, version: r.system_version_info, nonce: r.nonce, names: r.resources.map((x: { name: string }) => x.name), removed: r.removed_resources };
  }

  /** SotW: version_info, resource_names, response_nonce, error_detail. The first request carries the node. */
  request(r: { typeUrl: string; version?: string; names?: string[]; nonce?: string; error?: string; subscribe?: string[]; unsubscribe?: string[]; initialVersions?: Record<string, string> }): void {
    const node = this.sentNode ? undefined : { id: NODE_ID, cluster: 'test' };
    this.sentNode = true;
    const error_detail = r.error ? { code: 13, message: r.error } : undefined;
    const msg = this.kind === 'sotw'
      ? T.req().encode({ node, type_url: r.typeUrl, version_info: r.version ?? '', resource_names: r.names ?? [], response_nonce: r.nonce ?? '', error_detail }).finish()
      : T.dreq().encode({ node, type_url: r.typeUrl, resource_names_subscribe: r.subscribe ?? [], resource_names_unsubscribe: r.unsubscribe ?? [], initial_resource_versions: r.initialVersions ?? {}, response_nonce: r.nonce ?? '', error_detail }).finish();
    this.call.write(Buffer.from(msg));
  }

  sendRaw(b: Buffer): void {
    this.call.write(b);
  }

  /** Stops reading responses (like an Envoy busy applying config) until resume(). */
  pause(): void {
    this.call.pause();
  }

  resume(): void {
    this.call.resume();
  }

  waitForResponse(what: string, pred: (r: FakeEnvoyResponse) => boolean, timeoutMs = 10_000): Promise<FakeEnvoyResponse> {
    return waitFor(what, () => this.responses.find(pred), timeoutMs);
  }

  waitForStatus(timeoutMs = 10_000): Promise<grpc.StatusObject> {
    return waitFor('the stream to end', () => this.status, timeoutMs);
  }

  close(): void {
    this.call.cancel();
    this.client.close();
  }
}
