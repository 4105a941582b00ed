// The gRPC side: serves envoy.service.discovery.v3.AggregatedDiscoveryService (StreamAggregatedResources and
// DeltaAggregatedResources) on TCP or a unix socket, creates a connection per stream from the first request's node,
// and fans pushes out to every connection.

import { once } from 'node:events';
import * as fs from 'node:fs';
import * as grpc from '@grpc/grpc-js';
import type * as protobuf from 'protobufjs';
import { messageType } from '../envoy-protos';
import { AgentError, errorMessage } from '../errors';
import { scope } from '../log';
import { prepareSocket } from '../unix-socket';
import { AdsConnection, type ConnectionHost, type DeltaRequest, type Nack, type SotwRequest } from './ads-connection';
import { HEALTH_INFO_TYPE } from '../xds-istio';
import { type Proxy, proxyFromNode, withIdentity } from './proxy';
import type { AuthVerdict } from './xds-auth';
import type { PushContext } from './push-context';
import { PushLimiter } from './push-queue';

const log = scope('discovery');
const SERVICE = '/envoy.service.discovery.v3.AggregatedDiscoveryService';
const MAX_NACKS_KEPT = 100;

export interface AdsServerOptions {
  current: () => PushContext;
  /** Connections pushing at once. */
  pushConcurrency?: number;
  /** A proxy's health event (istio.v1.HealthInformation): never a subscription, handed over here. */
  onHealth?: (proxy: Proxy, error: { code?: number; message?: string } | undefined) => void;
  /** Who the stream's caller is, from its metadata and first node (./xds-auth.ts); unset: everyone is anonymous. */
  authenticate?: (metadata: grpc.Metadata, proxy: Proxy) => AuthVerdict;
  /** Told of each stream refused. */
  onRefused?: (reason: string, fields: Record<string, unknown>) => void;
  /** Largest request accepted (default 4 MiB, istiod's ISTIO_GPRC_MAXRECVMSGSIZE); a larger one ends its stream. */
  maxReceiveMessageBytes?: number;
}

/**
 * Envoy's requests are small (names, versions, a node), and a peer that reaches a TCP --grpc-addr must not make the
 * server buffer a message of any size; istiod's default. Responses stay unbounded: a push can be large.
 */
export const DEFAULT_MAX_RECEIVE_MESSAGE_BYTES = 4 * 1024 * 1024;

type Call = grpc.ServerDuplexStream<Record<string, unknown>, Record<string, unknown>>;

function codec(t: protobuf.Type) {
  return {
    serialize: (o: Record<string, unknown>) => Buffer.from(t.encode(o).finish()),
    deserialize: (b: Buffer) =>
      t.toObject(t.decode(b), { longs: Number, enums: String, defaults: false, arrays: true }) as Record<
        string,
        unknown
      >,
  };
}

function serviceDefinition(): grpc.ServiceDefinition {
  const method = (name: string, req: string, res: string) => {
    const rq = codec(messageType(req));
    const rs = codec(messageType(res));
    return {
      path: `${SERVICE}/${name}`,
      requestStream: true,
      responseStream: true,
      requestSerialize: rq.serialize,
      requestDeserialize: rq.deserialize,
      responseSerialize: rs.serialize,
      responseDeserialize: rs.deserialize,
    };
  };
  return {
    StreamAggregatedResources: method(
      'StreamAggregatedResources',
      'envoy.service.discovery.v3.DiscoveryRequest',
      'envoy.service.discovery.v3.DiscoveryResponse',
    ),
    DeltaAggregatedResources: method(
      'DeltaAggregatedResources',
      'envoy.service.discovery.v3.DeltaDiscoveryRequest',
      'envoy.service.discovery.v3.DeltaDiscoveryResponse',
    ),
  } as grpc.ServiceDefinition;
}

export interface ConnectionStatus {
  id: string;
  proxy: string;
  /** `<ns>/<sa> (token|in-process)`, or `anonymous`. */
  identity: string;
  type: string;
  delta: boolean;
  subscriptions: ReturnType<AdsConnection['subscriptions']>;
}

const identityOf = (p: Proxy) =>
  p.identity ? `${p.identity.namespace}/${p.identity.serviceAccount} (${p.identity.via})` : 'anonymous';

export class AdsServer {
  private readonly server: grpc.Server;
  private readonly calls = new Map<AdsConnection, Call>();
  private readonly limiter: PushLimiter;
  private readonly nackLog: Nack[] = [];
  private socketPath: string | undefined;
  private closing = false;
  /** Called after a connection finished a push: for stats and benchmarks. */
  onPushed: (conn: AdsConnection, version: string, ms: number) => void = () => {};

  constructor(private readonly opts: AdsServerOptions) {
    this.limiter = new PushLimiter(opts.pushConcurrency ?? 100);
    this.server = new grpc.Server({
      'grpc.max_receive_message_length': opts.maxReceiveMessageBytes ?? DEFAULT_MAX_RECEIVE_MESSAGE_BYTES,
      'grpc.max_send_message_length': -1,
      'grpc.keepalive_permit_without_calls': 1,
      'grpc.http2.min_ping_interval_without_data_ms': 10_000,
    });
    this.server.addService(serviceDefinition(), {
      StreamAggregatedResources: (call: Call) => this.serve(call, false),
      DeltaAggregatedResources: (call: Call) => this.serve(call, true),
    });
  }

  /** Serves another gRPC service on the same port (the embedded CA); before listen(). */
  addService(definition: grpc.ServiceDefinition, implementation: grpc.UntypedServiceImplementation): void {
    this.server.addService(definition, implementation);
  }

  /** Binds `host:port`, `unix:/path` or `/path`; resolves to the bound address (the real port when 0 was asked). */
  async listen(address: string): Promise<string> {
    let target = address;
    if (address.startsWith('/') || address.startsWith('unix:')) {
      const p = address.startsWith('unix:') ? address.replace(/^unix:(\/\/)?/, '') : address;
      if (!p.startsWith('/')) throw new AgentError('CONFIG_INVALID', `unix socket path "${p}" must be absolute`);
      await prepareSocket(p);
      this.socketPath = p;
      target = `unix:${p}`;
    } else if (!/^(\[[0-9a-fA-F:.]+\]|[^:\s]+):\d{1,5}$/.test(address)) {
      throw new AgentError('CONFIG_INVALID', `"${address}" is not HOST:PORT, unix:/path or an absolute path`);
    }
    const port = await new Promise<number>((resolve, reject) => {
      this.server.bindAsync(target, grpc.ServerCredentials.createInsecure(), (err, p) =>
        err ? reject(new AgentError('IO', `cannot listen on ${address}: ${err.message}`, err)) : resolve(p),
      );
    });
    if (this.socketPath) {
      // Owner and group only: the agents that may pull the mesh config run as this user or in its group.
      fs.chmodSync(this.socketPath, 0o660);
      return `unix:${this.socketPath}`;
    }
    return address.replace(/:\d+$/, `:${port}`);
  }

  /** Asks every connection to push from the current push context. */
  pushAll(): void {
    for (const conn of this.calls.keys()) conn.push();
  }

  connectionCount(): number {
    return this.calls.size;
  }

  /** The proxies connected now. */
  proxies(): Proxy[] {
    return [...this.calls.keys()].map((c) => c.proxy);
  }

  status(): { connections: ConnectionStatus[]; nacks: Nack[] } {
    const connections = [...this.calls.keys()].map((c) => ({
      id: c.id,
      proxy: c.proxy.id,
      identity: identityOf(c.proxy),
      type: c.proxy.type,
      delta: c.delta,
      subscriptions: c.subscriptions(),
    }));
    return { connections, nacks: [...this.nackLog] };
  }

  async close(): Promise<void> {
    if (this.closing) return;
    this.closing = true;
    for (const [conn, call] of this.calls) {
      conn.close();
      call.end();
    }
    this.calls.clear();
    await new Promise<void>((resolve) => {
      const t = setTimeout(() => {
        this.server.forceShutdown();
        resolve();
      }, 1000);
      t.unref();
      this.server.tryShutdown(() => {
        clearTimeout(t);
        resolve();
      });
    });
    if (this.socketPath) fs.rmSync(this.socketPath, { force: true });
  }

  private serve(call: Call, delta: boolean): void {
    if (this.closing) {
      call.end();
      return;
    }
    let conn: AdsConnection | undefined;
    let refused = false;
    const refuse = (code: grpc.status, details: string) => {
      refused = true;
      call.emit('error', { code, details });
      call.destroy();
    };
    const host: ConnectionHost = {
      current: this.opts.current,
      write: (_c, msg) => this.write(call, msg),
      limit: (fn) => this.limiter.run(fn),
      onNack: (n) => this.recordNack(n),
      onPushed: (c, v, ms) => this.onPushed(c, v, ms),
    };
    call.on('data', (req: Record<string, unknown>) => {
      if (refused) return;
      if (!conn) {
        let proxy: Proxy;
        try {
          proxy = proxyFromNode(req.node as { id?: string });
        } catch (e) {
          log.warn('rejecting an xDS stream', { error: errorMessage(e) });
          return refuse(grpc.status.INVALID_ARGUMENT, errorMessage(e));
        }
        const verdict = this.opts.authenticate?.(call.metadata, proxy) ?? { ok: true };
        if (!verdict.ok) {
          this.opts.onRefused?.(verdict.reason, { proxy: proxy.id, peer: call.getPeer() });
          return refuse(verdict.code, verdict.reason);
        }
        if (verdict.identity) proxy = withIdentity(proxy, verdict.identity);
        conn = new AdsConnection(proxy, delta, host);
        this.calls.set(conn, call);
        log.info('proxy connected', {
          proxy: conn.proxy.id,
          kind: conn.proxy.type,
          identity: identityOf(proxy),
          protocol: delta ? 'delta' : 'sotw',
          connections: this.calls.size,
        });
      }
      if (req.type_url === HEALTH_INFO_TYPE)
        return this.opts.onHealth?.(conn.proxy, req.error_detail as { message?: string } | undefined);
      if (delta) conn.onDeltaRequest(req as DeltaRequest);
      else conn.onSotwRequest(req as SotwRequest);
    });
    const done = () => {
      if (!conn || !this.calls.has(conn)) return;
      conn.close();
      this.calls.delete(conn);
      log.info('proxy disconnected', { proxy: conn.proxy.id, connections: this.calls.size });
    };
    call.on('end', () => {
      done();
      call.end();
    });
    call.on('cancelled', done);
    call.on('close', done);
    call.on('error', (e: Error) => {
      log.debug('xDS stream error', { error: e.message });
      done();
    });
  }

  private async write(call: Call, msg: Record<string, unknown>): Promise<void> {
    if (call.destroyed || call.writableEnded) return;
    if (call.write(msg)) return;
    await Promise.race([once(call, 'drain'), once(call, 'close')]);
  }

  private recordNack(n: Nack): void {
    this.nackLog.push(n);
    if (this.nackLog.length > MAX_NACKS_KEPT) this.nackLog.shift();
    const what = n.names.length ? n.names.join(', ') : 'the whole response';
    log.warn(
      `proxy rejected ${what} (${n.typeUrl.split('.').pop()}); not sending it again until its config changes: ${n.detail}`,
      { proxy: n.proxy, version: n.version },
    );
  }
}
