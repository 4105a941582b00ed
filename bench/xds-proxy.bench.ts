// Benchmark: what the xDS proxy adds. A raw ADS client (playing Envoy) asks the in-test control plane for a 1 KB
// and a 10 MB response (10,000 resources of 1,000 bytes), directly over TCP and through the proxy's Unix socket.
// The control plane and the proxy each run in their own process, as in a pod. Prints medians, the ratio, the
// added latency, and throughput of back-to-back 10 MB pushes.
// Run: npx tsx bench/xds-proxy.bench.ts [rounds-1k] [rounds-10m]

import { fork, type ChildProcess } from 'node:child_process';
import * as os from 'node:os';
import * as path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { messageType } from '../lib/envoy-protos';
import { XdsProxy } from '../lib/xds-proxy';
import { openUpstream, type UpstreamCall } from '../lib/xds-upstream';
import { PILOT_AGENT_V8_FLAGS } from '../lib/env';
import { applyV8Flags } from '../lib/heap';
import { formatMem, procMemKiB, type ProcMem } from './proc-mem';
import { bulkClusters, CLUSTER, ControlPlane, ENDPOINT, NODE_ID } from '../test/helpers/control-plane';
import { tempDir } from '../test/helpers/harness';

const ROUNDS_1K = Number(process.argv[2] ?? 300);
const ROUNDS_10M = Number(process.argv[3] ?? 20);
const BURST = 10;
const SMALL = ENDPOINT; // 1 KB
const LARGE = CLUSTER; // 10 MB

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

// ---- child processes ----

async function controlPlaneChild(): Promise<void> {
  const cp = new ControlPlane();
  cp.set(SMALL, 'v1', bulkClusters(1, 1000));
  cp.set(LARGE, 'v1', bulkClusters(10_000, 1000));
  await cp.start(0);
  process.send!({ port: cp.port, sizes: { small: 0, large: 0 } });
}

async function proxyChild(socket: string, address: string): Promise<void> {
  // The heap flags the agent sets on itself (PILOT_AGENT_V8_FLAGS; empty for V8's defaults).
  applyV8Flags(PILOT_AGENT_V8_FLAGS.get(process.env));
  const proxy = new XdsProxy({ socketPath: socket, upstream: { address, tls: false } });
  await proxy.start();
  process.on('message', (m: { cmd: string }) => {
    if (m.cmd === 'stats') process.send!({ mem: procMemKiB('self'), metrics: proxy.metrics() });
  });
  process.send!({ ready: true });
}

function child(args: string[]): Promise<{ proc: ChildProcess; first: any }> {
  const proc = fork(__filename, args, { execArgv: process.execArgv, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  return new Promise((resolve, reject) => {
    proc.once('message', (first) => resolve({ proc, first }));
    proc.once('exit', (code) => reject(new Error(`${args[0]} exited with ${code}`)));
  });
}

// ---- the measuring client ----

const identity = (b: Buffer) => b;
const PATH = '/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources';

interface AdsClient {
  ask(typeUrl: string): Promise<Buffer>;
  close(): void;
}

/** The proxy's own upstream ADS client (lib/xds-upstream.ts), straight to the control plane: its share of "added". */
class AgentClient implements AdsClient {
  private readonly call: UpstreamCall;
  private waiters: Array<(b: Buffer) => void> = [];
  private first = true;
  constructor(address: string) {
    this.call = openUpstream({ address, tls: false }, 'sotw', 2 ** 31 - 1, {
      onMessage: (b) => {
        this.waiters.shift()?.(b);
        this.call.startRead();
      },
      onStatus: () => undefined,
    });
    this.call.startRead();
  }
  ask(typeUrl: string): Promise<Buffer> {
    const T = messageType('envoy.service.discovery.v3.DiscoveryRequest');
    const node = this.first ? { id: NODE_ID } : undefined;
    this.first = false;
    const p = new Promise<Buffer>((r) => this.waiters.push(r));
    this.call.write(Buffer.from(T.encode({ node, type_url: typeUrl }).finish()), () => undefined);
    return p;
  }
  close(): void {
    this.call.close();
  }
}

class Client implements AdsClient {
  private readonly client: grpc.Client;
  private readonly call: grpc.ClientDuplexStream<Buffer, Buffer>;
  private waiters: Array<(b: Buffer) => void> = [];
  private first = true;
  constructor(target: string) {
    // Windows as large as Envoy's own (256 MB): the client plays Envoy.
    this.client = new grpc.Client(target, grpc.credentials.createInsecure(), {
      'grpc.max_receive_message_length': -1, 'grpc.max_send_message_length': -1, 'grpc-node.flow_control_window': 256 * 1024 * 1024,
    });
    this.call = this.client.makeBidiStreamRequest(PATH, identity, identity, new grpc.Metadata(), {});
    this.call.on('data', (b: Buffer) => this.waiters.shift()?.(b));
    this.call.on('error', () => undefined);
  }
  /** Sends a request with no nonce (the server answers each with its full state) and waits for the response. */
  ask(typeUrl: string): Promise<Buffer> {
    const T = messageType('envoy.service.discovery.v3.DiscoveryRequest');
    const node = this.first ? { id: NODE_ID } : undefined;
    this.first = false;
    const p = new Promise<Buffer>((r) => this.waiters.push(r));
    this.call.write(Buffer.from(T.encode({ node, type_url: typeUrl }).finish()));
    return p;
  }
  close(): void {
    this.call.cancel();
    this.client.close();
  }
}

async function roundTrips(c: AdsClient, typeUrl: string, n: number): Promise<{ ms: number[]; bytes: number }> {
  let bytes = 0;
  for (let i = 0; i < Math.max(2, n / 10); i++) bytes = (await c.ask(typeUrl)).length; // warm-up
  const ms: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = process.hrtime.bigint();
    await c.ask(typeUrl);
    ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  return { ms, bytes };
}

async function burst(c: AdsClient, typeUrl: string, n: number): Promise<number> {
  const t0 = process.hrtime.bigint();
  const all = await Promise.all(Array.from({ length: n }, () => c.ask(typeUrl)));
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  return all.reduce((a, b) => a + b.length, 0) / 1e6 / s;
}

async function main(): Promise<void> {
  const dir = tempDir('pa-xds-bench-');
  const socket = path.join(dir.path, 'XDS');
  const procs: ChildProcess[] = [];
  try {
    const cp = await child(['control-plane']);
    procs.push(cp.proc);
    const address = `127.0.0.1:${cp.first.port}`;
    const px = await child(['proxy', socket, address]);
    procs.push(px.proc);

    const direct = new Client(address);
    const proxied = new Client(`unix://${socket}`);
    const own = new AgentClient(address);
    const results: Record<string, { direct: number; proxied: number; own: number; bytes: number }> = {};
    for (const [label, type, n] of [['1 KB', SMALL, ROUNDS_1K], ['10 MB', LARGE, ROUNDS_10M]] as const) {
      // Interleave the two paths so that machine noise hits both alike.
      const d: number[] = [];
      const p: number[] = [];
      const o: number[] = [];
      let bytes = 0;
      for (let round = 0; round < 4; round++) {
        const a = await roundTrips(direct, type, Math.ceil(n / 4));
        const b = await roundTrips(proxied, type, Math.ceil(n / 4));
        const c = await roundTrips(own, type, Math.ceil(n / 4));
        for (const x of a.ms) d.push(x);
        for (const x of b.ms) p.push(x);
        for (const x of c.ms) o.push(x);
        bytes = b.bytes;
      }
      results[label] = { direct: median(d), proxied: median(p), own: median(o), bytes };
    }
    const tDirect = await burst(direct, LARGE, BURST);
    const tProxied = await burst(proxied, LARGE, BURST);
    const stats = await new Promise<{ mem: ProcMem; metrics: Record<string, number> }>((resolve) => {
      px.proc.once('message', (m) => resolve(m as { mem: ProcMem; metrics: Record<string, number> }));
      px.proc.send({ cmd: 'stats' });
    });
    direct.close();
    proxied.close();
    own.close();

    console.log(`xDS proxy benchmark, ${new Date().toISOString().slice(0, 10)}, Node ${process.version}, ${os.cpus().length} CPUs (${os.cpus()[0]?.model ?? '?'})`);
    for (const [label, r] of Object.entries(results)) {
      console.log(`${label.padEnd(5)} response (${r.bytes} B): direct median ${r.direct.toFixed(2)} ms, through the proxy ${r.proxied.toFixed(2)} ms, ` +
        `added ${(r.proxied - r.direct).toFixed(2)} ms, ratio ${(r.proxied / r.direct).toFixed(2)}x; ` +
        `direct with the proxy's own upstream client ${r.own.toFixed(2)} ms (${(r.own / r.direct).toFixed(2)}x grpc-js's)`);
    }
    console.log(`throughput, ${BURST} x 10 MB back to back: direct ${tDirect.toFixed(0)} MB/s, through the proxy ${tProxied.toFixed(0)} MB/s`);
    console.log(`proxy process after the run: ${formatMem(stats.mem)}; forwarded ${(stats.metrics.xds_proxy_response_bytes_to_envoy! / 1e6).toFixed(0)} MB in ${stats.metrics.xds_proxy_responses_to_envoy} responses`);
  } finally {
    for (const p of procs) p.kill('SIGKILL');
    dir.cleanup();
  }
}

const [role, ...rest] = process.argv.slice(2);
const run = role === 'control-plane' ? controlPlaneChild() : role === 'proxy' ? proxyChild(rest[0]!, rest[1]!) : main();
run.catch((e) => {
  console.error(e);
  process.exit(1);
});
