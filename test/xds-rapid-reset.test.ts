// The xDS proxy's socket against a peer that churns streams (test/hostile-peers.md, finding 2): a rapid reset
// (CVE-2023-44487: HEADERS+RST_STREAM pairs in one write) from a raw HTTP/2 client in another process, more streams
// than the proxy serves at once, and idle streams. The upstream is the in-test control plane behind a TCP forwarder
// that counts the connections it gets; the proxy runs in this process, so its event loop is measured directly.

import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as http2 from 'node:http2';
import * as net from 'node:net';
import * as path from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { configureLogging, resetLogging } from '../lib/log';
import { encodeSotwRequest } from '../lib/xds-codec';
import { encodeNameTable, NAME_TABLE_TYPE } from '../lib/xds-istio';
import { XdsProxy } from '../lib/xds-proxy';
import { ADS_PATHS } from '../lib/xds-upstream';
import { CLUSTER, ControlPlane, edsCluster, FakeEnvoy, LISTENER, listener, type Resource } from './helpers/control-plane';
import { sleep, tempDir, waitFor, type TempDir } from './helpers/harness';
import { rapidReset } from './helpers/hostile';

/** A TCP forwarder to the control plane that counts the connections the proxy opens upstream. */
async function countingForwarder(port: number): Promise<{ address: string; connections: () => number; close: () => void }> {
  let n = 0;
  const open = new Set<net.Socket>();
  const server = net.createServer((c) => {
    n++;
    const u = net.connect(port, '127.0.0.1');
    for (const s of [c, u]) {
      open.add(s);
      s.on('error', () => undefined);
      s.on('close', () => {
        open.delete(s);
        c.destroy();
        u.destroy();
      });
    }
    c.pipe(u).pipe(c);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    address: `127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    connections: () => n,
    close: () => {
      for (const s of open) s.destroy();
      server.close();
    },
  };
}

interface Rig {
  dir: TempDir;
  cp: ControlPlane;
  fwd: Awaited<ReturnType<typeof countingForwarder>>;
  proxy: XdsProxy;
  socket: string;
  logs: string[];
  done(): Promise<void>;
}

async function rig(): Promise<Rig> {
  const dir = tempDir('pa-xds-reset-');
  const logs: string[] = [];
  configureLogging({ write: (l) => logs.push(l) });
  const cp = new ControlPlane();
  await cp.start(0);
  const fwd = await countingForwarder(cp.port);
  const socket = path.join(dir.path, 'XDS');
  const proxy = new XdsProxy({ socketPath: socket, upstream: { address: fwd.address, tls: false }, backoff: { initialMs: 50, maxMs: 400 } });
  const r: Rig = {
    dir, cp, fwd, proxy, socket, logs,
    async done() {
      await proxy.close();
      fwd.close();
      await cp.stop();
      resetLogging();
      dir.cleanup();
    },
  };
  try {
    await proxy.start();
  } catch (e) {
    await r.done();
    throw e;
  }
  return r;
}

/** Writes each file's bytes on a connection of its own to `socket`, from another process; resolves when it exits. */
function attackFromChild(socket: string, files: string[]): Promise<number | null> {
  const script = `
    const net = require('net'), fs = require('fs');
    const [sock, ...files] = process.argv.slice(1);
    (async () => {
      for (const f of files) await new Promise((done) => {
        const s = net.connect(sock);
        const t = setTimeout(() => s.destroy(), 3000);
        s.on('error', () => undefined);
        s.on('close', () => { clearTimeout(t); done(); });
        s.on('data', () => undefined);
        s.write(fs.readFileSync(f), () => s.end());
      });
    })();`;
  const child = spawn(process.execPath, ['-e', script, socket, ...files], { stdio: 'ignore' });
  return new Promise((r) => child.on('exit', (code) => r(code)));
}

/** A gRPC message frame around a protobuf message. */
function grpcFrame(msg: Buffer): Buffer {
  const h = Buffer.alloc(5);
  h.writeUInt32BE(msg.length, 1);
  return Buffer.concat([h, msg]);
}

interface RawStream {
  session: http2.ClientHttp2Session;
  /** grpc-status, from a trailers-only answer or the trailers; undefined while the stream is open. */
  status: () => string | undefined;
  messages: () => number;
}

/** One ADS stream on an HTTP/2 connection of its own; sends `request` (if any) and holds the stream open. */
function rawStream(socket: string, request?: Buffer): RawStream {
  const session = http2.connect('http://localhost', { createConnection: () => net.connect(socket) });
  session.on('error', () => undefined);
  const stream = session.request({ ':method': 'POST', ':path': ADS_PATHS.sotw, 'content-type': 'application/grpc', te: 'trailers' });
  stream.on('error', () => undefined);
  let status: string | undefined;
  let messages = 0;
  stream.on('response', (h) => (status ??= h['grpc-status'] as string | undefined));
  stream.on('trailers', (h) => (status ??= h['grpc-status'] as string | undefined));
  stream.on('data', () => messages++);
  if (request) stream.write(grpcFrame(request));
  return { session, status: () => status, messages: () => messages };
}

const infoLines = (logs: string[]) => logs.filter((l) => /\t(info|warn|error)\txdsproxy\t/.test(l));

test('a rapid reset (1000 streams opened and cancelled at once) opens nothing upstream, logs next to nothing, and the proxy keeps serving', async () => {
  const r = await rig();
  try {
    r.cp.set(CLUSTER, 'c1', [edsCluster('a')]);
    const envoy = new FakeEnvoy(`unix://${r.socket}`, 'sotw');
    try {
      envoy.request({ typeUrl: CLUSTER });
      await envoy.waitForResponse('CDS', (x) => x.version === 'c1');
      assert.is(r.fwd.connections(), 1, 'one upstream connection, for Envoy\'s stream');
      const files = (['sotw', 'delta'] as const).map((k) => {
        const f = path.join(r.dir.path, `reset-${k}`);
        fs.writeFileSync(f, rapidReset(ADS_PATHS[k], 500));
        return f;
      });
      const linesBefore = infoLines(r.logs).length;
      const delay = monitorEventLoopDelay({ resolution: 10 });
      delay.enable();
      const started = Date.now();
      await attackFromChild(r.socket, files);
      await sleep(300);
      delay.disable();
      const stallMs = Math.round(delay.max / 1e6);
      const m = r.proxy.metrics();
      const lines = infoLines(r.logs).slice(linesBefore);
      console.log(`  rapid reset: ${Date.now() - started} ms, longest event-loop stall ${stallMs} ms, `
        + `${m.xds_proxy_downstream_streams_total! - 1} streams served, ${m.xds_proxy_downstream_streams_refused_total} refused, `
        + `${lines.length} log lines at info or above, ${r.fwd.connections() - 1} upstream connections`);
      assert.is(r.fwd.connections(), 1, 'no upstream connection for a stream that never sent a request');
      assert.is(r.cp.streamsOpened, 1, 'no upstream stream either');
      assert.ok(m.xds_proxy_downstream_streams_total! + m.xds_proxy_downstream_streams_refused_total! > 1, 'the attack reached the proxy');
      assert.ok(lines.length <= 4, `a few lines for 1000 streams, not two each:\n${lines.join('\n')}`);
      // kubelet's probe timeout: the agent's status server shares this event loop.
      assert.ok(stallMs < 1000, `the event loop stalled ${stallMs} ms`);
      await waitFor('the attack\'s streams gone', () => r.proxy.metrics().xds_proxy_downstream_streams === 1, 5000);
      r.cp.set(CLUSTER, 'c2', [edsCluster('b')]);
      await envoy.waitForResponse('the next push on Envoy\'s stream', (x) => x.version === 'c2', 3000);
      assert.is(envoy.status, undefined, 'Envoy\'s stream is still open');
    } finally {
      envoy.close();
    }
  } finally {
    await r.done();
  }
});

test('at most 16 streams at once: the rest are refused with RESOURCE_EXHAUSTED (logged once, counted), and a closed stream frees its slot', async () => {
  const r = await rig();
  const streams: RawStream[] = [];
  try {
    r.cp.set(CLUSTER, 'c1', [edsCluster('a')]);
    const req = encodeSotwRequest({ typeUrl: CLUSTER });
    for (let i = 0; i < 20; i++) streams.push(rawStream(r.socket, req));
    await waitFor('16 served and 4 refused', () =>
      streams.filter((s) => s.messages() > 0).length === 16 && streams.filter((s) => s.status() !== undefined).length === 4);
    assert.ok(streams.filter((s) => s.status() !== undefined).every((s) => s.status() === '8'), 'refused with RESOURCE_EXHAUSTED');
    assert.is(r.fwd.connections(), 16, 'one upstream connection for each stream served, none for the refused');
    const m = r.proxy.metrics();
    assert.is(m.xds_proxy_downstream_streams, 16);
    assert.is(m.xds_proxy_downstream_streams_refused_total, 4);
    const warned = r.logs.filter((l) => /\twarn\txdsproxy\trefusing new xDS streams with RESOURCE_EXHAUSTED: 16 are open/.test(l));
    assert.is(warned.length, 1, 'one line for the burst');

    // One served stream goes away: the next stream is served, and the end of the burst is said once.
    const served = streams.find((s) => s.messages() > 0)!;
    served.session.destroy();
    await waitFor('the slot freed', () => r.proxy.metrics().xds_proxy_downstream_streams === 15);
    assert.ok(r.logs.some((l) => /\tinfo\txdsproxy\taccepting xDS streams again \(refused 4 while 16 were open\)/.test(l)), r.logs.join('\n'));
    const next = rawStream(r.socket, req);
    streams.push(next);
    await waitFor('the new stream served', () => next.messages() > 0);
    assert.is(next.status(), undefined);
  } finally {
    for (const s of streams) s.session.destroy();
    await r.done();
  }
});

const nameTable = (ip: string): Resource => ({
  name: 'nds',
  any: { type_url: NAME_TABLE_TYPE, value: encodeNameTable({ table: { 'svc.ns.svc.cluster.local': { ips: [ip], registry: 'Kubernetes', shortname: 'svc', namespace: 'ns' } } }) },
});

test('idle streams (opened, never a request) cost no upstream connection and do not take the agent\'s types from Envoy\'s stream', async () => {
  const r = await rig();
  const idle: RawStream[] = [];
  const envoy = new FakeEnvoy(`unix://${r.socket}`, 'sotw');
  try {
    const versions: string[] = [];
    r.proxy.registerHandler(NAME_TABLE_TYPE, (_res, meta) => {
      versions.push(meta.version);
    });
    r.cp.set(NAME_TABLE_TYPE, 'n1', [nameTable('10.0.0.1')]);
    r.cp.set(LISTENER, 'l1', [listener('l', 1234, 'r')]);
    envoy.request({ typeUrl: LISTENER });
    await waitFor('the first table', () => versions.includes('n1'));
    for (let i = 0; i < 5; i++) idle.push(rawStream(r.socket));
    await waitFor('the idle streams accepted', () => r.proxy.metrics().xds_proxy_downstream_streams === 6);
    r.cp.set(NAME_TABLE_TYPE, 'n2', [nameTable('10.0.0.2')]);
    await waitFor('the agent\'s handler fed from Envoy\'s stream', () => versions.includes('n2'));
    assert.is(r.fwd.connections(), 1, 'the idle streams opened nothing upstream');
    assert.ok(idle.every((s) => s.status() === undefined && s.messages() === 0), 'idle streams are left alone (Envoy\'s first request may be late)');
  } finally {
    envoy.close();
    for (const s of idle) s.session.destroy();
    await r.done();
  }
});

test.run();
