// A bare ADS client on grpc-js for protocol tests and benchmarks: sends requests exactly as written and queues
// every response, so a test can play Envoy's part (ACK, NACK, stale nonces) step by step.

import * as grpc from '@grpc/grpc-js';
import { messageType } from '../../lib/envoy-protos';

export interface Response {
  type_url: string;
  nonce: string;
  version_info?: string;
  system_version_info?: string;
  resources: { type_url?: string; name?: string; version?: string; resource?: unknown }[];
  removed_resources?: string[];
}

const SERVICE = '/envoy.service.discovery.v3.AggregatedDiscoveryService';

export class AdsClient {
  private readonly queue: Response[] = [];
  private waiters: (() => void)[] = [];
  private ended = false;

  private constructor(private readonly client: grpc.Client, private readonly call: grpc.ClientDuplexStream<Record<string, unknown>, Response>) {
    call.on('data', (r: Response) => {
      this.queue.push(r);
      this.wake();
    });
    call.on('error', () => {});
    call.on('end', () => {
      this.ended = true;
      this.wake();
    });
  }

  /** `metadata`: the stream's headers (e.g. authorization). */
  static connect(address: string, delta: boolean, metadata: Record<string, string> = {}): AdsClient {
    const req = messageType(delta ? 'envoy.service.discovery.v3.DeltaDiscoveryRequest' : 'envoy.service.discovery.v3.DiscoveryRequest');
    const res = messageType(delta ? 'envoy.service.discovery.v3.DeltaDiscoveryResponse' : 'envoy.service.discovery.v3.DiscoveryResponse');
    const client = new grpc.Client(address, grpc.credentials.createInsecure(), { 'grpc.max_receive_message_length': -1 });
    const md = new grpc.Metadata();
    for (const [k, v] of Object.entries(metadata)) md.set(k, v);
    const call = client.makeBidiStreamRequest(
      `${SERVICE}/${delta ? 'DeltaAggregatedResources' : 'StreamAggregatedResources'}`,
      (o: Record<string, unknown>) => Buffer.from(req.encode(req.fromObject(o)).finish()),
      (b: Buffer) => res.toObject(res.decode(b), { longs: Number, enums: String, defaults: false, arrays: true }) as Response,
      md,
    );
    return new AdsClient(client, call);
  }

  send(req: Record<string, unknown>): void {
    this.call.write(req);
  }

  /** The next response (of `typeUrl` if given; others stay queued), or throws after timeoutMs. */
  async next(typeUrl?: string, timeoutMs = 5000): Promise<Response> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const i = this.queue.findIndex((r) => !typeUrl || r.type_url === typeUrl);
      if (i >= 0) return this.queue.splice(i, 1)[0]!;
      if (this.ended) throw new Error('stream ended');
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no ${typeUrl ?? 'response'} within ${timeoutMs} ms`);
      await new Promise<void>((r) => {
        const t = setTimeout(r, left);
        this.waiters.push(() => {
          clearTimeout(t);
          r();
        });
      });
    }
  }

  /** Resolves to true if no response (of `typeUrl`) arrives within ms. */
  async quiet(typeUrl: string | undefined, ms: number): Promise<boolean> {
    try {
      await this.next(typeUrl, ms);
      return false;
    } catch {
      return true;
    }
  }

  close(): void {
    this.call.cancel();
    this.client.close();
  }

  private wake(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }
}
