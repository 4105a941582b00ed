// The xDS proxy between a raw ADS client (playing Envoy, so every byte can be checked) and the in-test control
// plane, over a real Unix socket and a real TCP port.

import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { configureLogging, resetLogging } from '../lib/log';
import { decodeNameTable, encodeNameTable, HEALTH_INFO_TYPE, NAME_TABLE_TYPE } from '../lib/xds-istio';
import { XdsProxy, type XdsProxyOptions } from '../lib/xds-proxy';
import { bulkClusters, CLUSTER, ControlPlane, edsCluster, ENDPOINT, endpoints, FakeEnvoy, LISTENER, listener, NODE_ID, type Resource } from './helpers/control-plane';
import { sleep, tempDir, waitFor, type TempDir } from './helpers/harness';

interface Rig {
  dir: TempDir;
  cp: ControlPlane;
  proxy: XdsProxy;
  socket: string;
  clients: FakeEnvoy[];
  logs: string[];
  envoy(kind: 'sotw' | 'delta', maxMessageBytes?: number): FakeEnvoy;
  done(): Promise<void>;
}

async function rig(opts: Partial<XdsProxyOptions> = {}, cpMax?: number): Promise<Rig> {
  const dir = tempDir('pa-xds-');
  const logs: string[] = [];
  configureLogging({ write: (l) => logs.push(l) });
  const cp = new ControlPlane({ maxMessageBytes: cpMax });
  await cp.start(0);
  const socket = path.join(dir.path, 'XDS');
  const proxy = new XdsProxy({
    socketPath: socket,
    upstream: { address: cp.address, tls: false },
    backoff: { initialMs: 50, maxMs: 400 },
    ...opts,
  });
  const clients: FakeEnvoy[] = [];
  const r: Rig = {
    dir, cp, proxy, socket, clients, logs,
    envoy(kind, max) {
      const c = new FakeEnvoy(`unix://${socket}`, kind, { maxMessageBytes: max });
      clients.push(c);
      return c;
    },
    async done() {
      for (const c of clients) c.close();
      await proxy.close();
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

const nameTable = (ip: string): Resource => ({
  name: 'nds',
  any: { type_url: NAME_TABLE_TYPE, value: encodeNameTable({ table: { 'svc.ns.svc.cluster.local': { ips: [ip], registry: 'Kubernetes', shortname: 'svc', namespace: 'ns' } } }) },
});

test('a 10 MB response of 10,000 resources reaches Envoy byte for byte', async () => {
  const r = await rig();
  try {
    r.cp.set(CLUSTER, 'v1', bulkClusters(10_000, 1000));
    const env = r.envoy('sotw');
    env.request({ typeUrl: CLUSTER });
    const got = await env.waitForResponse('the CDS response', (x) => x.typeUrl === CLUSTER);
    assert.ok(got.raw.length > 10_000_000, `response is ${got.raw.length} bytes`);
    assert.ok(r.cp.lastSent.get(CLUSTER)!.equals(got.raw), 'the bytes Envoy got differ from those the server sent');
    const m = r.proxy.metrics();
    assert.is(m.xds_proxy_response_bytes_from_upstream, got.raw.length);
    assert.is(m.xds_proxy_response_bytes_to_envoy, got.raw.length);
    assert.is(m.xds_proxy_requests_from_envoy, 1);
    assert.is(m.xds_proxy_requests_to_upstream, 1);
    assert.is(m.xds_proxy_request_bytes_to_upstream, m.xds_proxy_request_bytes_from_envoy);
    assert.is(m.xds_proxy_upstream_connected, 1);
  } finally {
    await r.done();
  }
});

test('the first stream\'s upstream connection is made as the proxy starts listening, and that stream uses it', async () => {
  // A counting TCP relay in front of the control plane: how many connections the proxy opens, and when.
  const cp = new ControlPlane({});
  await cp.start(0);
  const [cpHost, cpPort] = [cp.address.slice(0, cp.address.lastIndexOf(':')), Number(cp.address.slice(cp.address.lastIndexOf(':') + 1))];
  let connections = 0;
  const relays = new Set<net.Socket>();
  const relay = net.createServer((s) => {
    connections++;
    const u = net.connect(cpPort, cpHost);
    for (const x of [s, u]) {
      relays.add(x);
      x.on('error', () => x.destroy());
      x.on('close', () => (s.destroy(), u.destroy()));
    }
    s.pipe(u).pipe(s);
  });
  await new Promise<void>((res) => relay.listen(0, '127.0.0.1', res));
  const address = `127.0.0.1:${(relay.address() as net.AddressInfo).port}`;
  const dir = tempDir('pa-xds-');
  const proxies: XdsProxy[] = [];
  const envoys: FakeEnvoy[] = [];
  try {
    for (const preconnect of [true, false]) {
      connections = 0;
      const socket = path.join(dir.path, `XDS-${preconnect}`);
      const proxy = new XdsProxy({ socketPath: socket, upstream: { address, tls: false }, preconnect });
      proxies.push(proxy);
      await proxy.start();
      if (preconnect) await waitFor('the spare connection', async () => connections === 1, 5000);
      else {
        await sleep(300);
        assert.is(connections, 0, 'preconnect: false dials only when Envoy asks');
      }
      cp.set(CLUSTER, 'v1', [edsCluster('a')]);
      const env = new FakeEnvoy(`unix://${socket}`, 'delta');
      envoys.push(env);
      env.request({ typeUrl: CLUSTER });
      const cds = await env.waitForResponse('CDS', (x) => x.typeUrl === CLUSTER);
      assert.equal(cds.names, ['a']);
      assert.is(connections, 1, 'one connection for the first stream, either way');
      assert.is(proxy.metrics().xds_proxy_upstream_connected, 1);
      // A second stream (a hot restart's) gets a channel of its own, as before.
      const env2 = new FakeEnvoy(`unix://${socket}`, 'delta');
      envoys.push(env2);
      env2.request({ typeUrl: CLUSTER });
      await env2.waitForResponse('CDS on the second stream', (x) => x.typeUrl === CLUSTER);
      assert.is(connections, 2);
    }
  } finally {
    for (const e of envoys) e.close();
    for (const p of proxies) await p.close();
    for (const x of relays) x.destroy();
    await new Promise((res) => relay.close(res));
    await cp.stop();
    dir.cleanup();
  }
});

test('Delta: subscriptions and ACKs pass through; an Envoy NACK is counted and logged', async () => {
  const r = await rig();
  try {
    r.cp.set(CLUSTER, 'v1', [edsCluster('a'), edsCluster('b')]);
    r.cp.set(ENDPOINT, 'v1', [endpoints('a', 1001), endpoints('b', 1002)]);
    const env = r.envoy('delta');
    env.request({ typeUrl: CLUSTER });
    const cds = await env.waitForResponse('CDS', (x) => x.typeUrl === CLUSTER);
    assert.equal(cds.names.sort(), ['a', 'b']);
    env.request({ typeUrl: ENDPOINT, subscribe: ['b'] });
    env.request({ typeUrl: CLUSTER, nonce: cds.nonce });
    const eds = await env.waitForResponse('EDS', (x) => x.typeUrl === ENDPOINT);
    assert.equal(eds.names, ['b']);
    env.request({ typeUrl: ENDPOINT, nonce: eds.nonce, error: 'endpoint b is bad' });
    const nack = await r.cp.waitForRequest('the NACK upstream', (q) => q.typeUrl === ENDPOINT && q.nonce === eds.nonce);
    assert.is(nack.error, 'endpoint b is bad');
    assert.ok(await r.cp.waitForRequest('the CDS ACK upstream', (q) => q.typeUrl === CLUSTER && q.nonce === cds.nonce && !q.error));
    assert.is(r.proxy.metrics().xds_proxy_envoy_nacks_total, 1);
    assert.ok(r.logs.some((l) => /\twarn\txdsproxy\tEnvoy rejected ClusterLoadAssignment .*endpoint b is bad/.test(l)), r.logs.join('\n'));
    const first = r.cp.requests.filter((q) => q.stream === 1);
    assert.ok(first[0]!.hasNode && first[0]!.nodeId === NODE_ID);
  } finally {
    await r.done();
  }
});

test('SotW upstream restart: Envoy\'s stream stays open, subscriptions are re-sent with the accepted versions, stale ACKs are dropped', async () => {
  const r = await rig();
  let cp2: ControlPlane | undefined;
  try {
    r.cp.set(CLUSTER, 'c1', [edsCluster('a')]);
    r.cp.set(ENDPOINT, 'e1', [endpoints('a', 1001)]);
    r.cp.set(LISTENER, 'l1', [listener('l', 1234, 'r')]);
    const env = r.envoy('sotw');
    env.request({ typeUrl: CLUSTER });
    const cds = await env.waitForResponse('CDS', (x) => x.typeUrl === CLUSTER);
    env.request({ typeUrl: ENDPOINT, names: ['a'] });
    env.request({ typeUrl: CLUSTER, version: 'c1', nonce: cds.nonce });
    const eds = await env.waitForResponse('EDS', (x) => x.typeUrl === ENDPOINT);
    env.request({ typeUrl: ENDPOINT, names: ['a'], version: 'e1', nonce: eds.nonce });
    env.request({ typeUrl: LISTENER });
    const lds = await env.waitForResponse('LDS', (x) => x.typeUrl === LISTENER);
    // LDS stays un-ACKed across the restart: Envoy ACKs it against a server that no longer exists.

    await r.cp.stop();
    await waitFor('the proxy to see the upstream go', () => r.proxy.metrics().xds_proxy_upstream_connected === 0);
    await sleep(300); // a few failed reconnects
    cp2 = new ControlPlane({ noncePrefix: 'second-' });
    cp2.set(CLUSTER, 'c1', [edsCluster('a')]);
    cp2.set(ENDPOINT, 'e1', [endpoints('a', 1001)]);
    cp2.set(LISTENER, 'l1', [listener('l', 1234, 'r')]);
    await cp2.start(r.cp.port);

    const c = await cp2.waitForRequest('CDS re-sent', (q) => q.typeUrl === CLUSTER);
    assert.is(c.versionInfo, 'c1');
    assert.is(c.nonce, '');
    assert.ok(c.hasNode && c.nodeId === NODE_ID, 'the first message of the new stream carries the node');
    const e = await cp2.waitForRequest('EDS re-sent', (q) => q.typeUrl === ENDPOINT);
    assert.equal([e.versionInfo, e.names, e.nonce], ['e1', ['a'], '']);
    const l = await cp2.waitForRequest('LDS re-sent', (q) => q.typeUrl === LISTENER);
    assert.equal([l.versionInfo, l.nonce], ['', '']);
    assert.equal(cp2.requests.slice(0, 3).map((q) => q.typeUrl), [CLUSTER, ENDPOINT, LISTENER], 'in the order Envoy subscribed');

    env.request({ typeUrl: LISTENER, version: 'l1', nonce: lds.nonce });
    await env.waitForResponse('CDS from the new server', (x) => x.typeUrl === CLUSTER && x.nonce.startsWith('second-'));
    cp2.set(CLUSTER, 'c2', [edsCluster('a'), edsCluster('b')]);
    const c2 = await env.waitForResponse('the change made after the restart', (x) => x.version === 'c2');
    assert.ok(c2.nonce.startsWith('second-'));
    await sleep(100);
    assert.not.ok(cp2.requests.some((q) => q.nonce === lds.nonce), 'an ACK for the old server\'s nonce reached the new server');
    assert.is(env.status, undefined, 'Envoy\'s stream was ended');
    const m = r.proxy.metrics();
    assert.is(m.xds_proxy_downstream_streams_total, 1);
    assert.is(m.xds_proxy_downstream_streams, 1);
    assert.ok(m.xds_proxy_upstream_reconnects_total >= 1);
    assert.is(m.xds_proxy_upstream_connected, 1);
    assert.is(cp2.streamsOpened, 1);
  } finally {
    await cp2?.stop();
    await r.done();
  }
});

test('Delta upstream restart: subscriptions are re-sent with the versions Envoy ACKed, so nothing unchanged is sent again', async () => {
  const r = await rig();
  let cp2: ControlPlane | undefined;
  try {
    const clusters = [edsCluster('a'), edsCluster('b')];
    r.cp.set(CLUSTER, 'c1', clusters);
    r.cp.set(ENDPOINT, 'e1', [endpoints('a', 1001), endpoints('b', 1002)]);
    const env = r.envoy('delta');
    env.request({ typeUrl: CLUSTER });
    const cds = await env.waitForResponse('CDS', (x) => x.typeUrl === CLUSTER);
    env.request({ typeUrl: ENDPOINT, subscribe: ['a'] });
    env.request({ typeUrl: CLUSTER, nonce: cds.nonce });
    const eds = await env.waitForResponse('EDS', (x) => x.typeUrl === ENDPOINT);
    env.request({ typeUrl: ENDPOINT, nonce: eds.nonce });
    await r.cp.waitForRequest('the EDS ACK', (q) => q.nonce === eds.nonce);
    const before = r.cp.requests.length;

    await r.cp.stop();
    await waitFor('the proxy to see the upstream go', () => r.proxy.metrics().xds_proxy_upstream_connected === 0);
    cp2 = new ControlPlane({ noncePrefix: 'second-' });
    cp2.set(CLUSTER, 'c1', clusters);
    cp2.set(ENDPOINT, 'e1', [endpoints('a', 1001), endpoints('b', 1002)]);
    await cp2.start(r.cp.port);

    const c = await cp2.waitForRequest('CDS re-sent', (q) => q.typeUrl === CLUSTER);
    assert.ok(c.hasNode);
    assert.equal(c.subscribe, [], 'still the legacy wildcard form');
    assert.equal(Object.keys(c.initialVersions!).sort(), ['a', 'b']);
    const e = await cp2.waitForRequest('EDS re-sent', (q) => q.typeUrl === ENDPOINT);
    assert.equal(e.subscribe, ['a']);
    assert.equal(Object.keys(e.initialVersions!), ['a']);
    const resent = await env.waitForResponse('the new server\'s answer', (x) => x.nonce.startsWith('second-') && x.typeUrl === CLUSTER);
    assert.equal(resent.names, [], 'unchanged clusters were sent again');
    assert.is(r.cp.requests.length, before);

    cp2.set(ENDPOINT, 'e2', [endpoints('a', 2001), endpoints('b', 1002)]);
    const changed = await env.waitForResponse('the change made after the restart', (x) => x.version === 'e2');
    assert.equal(changed.names, ['a']);
    assert.is(env.status, undefined);
    assert.is(r.proxy.metrics().xds_proxy_downstream_streams_total, 1);
  } finally {
    await cp2?.stop();
    await r.done();
  }
});

for (const kind of ['sotw', 'delta'] as const) {
  test(`${kind}: agent types go to their handler after the first LDS request, are ACKed or NACKed upstream, and never reach Envoy`, async () => {
    const r = await rig();
    try {
      const seen: Array<{ ip: string; version: string }> = [];
      r.proxy.registerHandler(NAME_TABLE_TYPE, (resources, meta) => {
        const ip = decodeNameTable(resources[0]!).table['svc.ns.svc.cluster.local']!.ips[0]!;
        seen.push({ ip, version: meta.version });
        if (ip === '10.0.0.2') throw new Error('table rejected');
      });
      r.proxy.send({ typeUrl: HEALTH_INFO_TYPE });
      r.cp.set(NAME_TABLE_TYPE, 'n1', [nameTable('10.0.0.1')]);
      r.cp.set(CLUSTER, 'c1', [edsCluster('a')]);
      r.cp.set(LISTENER, 'l1', [listener('l', 1234, 'r')]);
      const env = r.envoy(kind);
      env.request({ typeUrl: CLUSTER });
      await env.waitForResponse('CDS', (x) => x.typeUrl === CLUSTER);
      await sleep(100);
      assert.not.ok(r.cp.requests.some((q) => q.typeUrl === NAME_TABLE_TYPE), 'NDS was requested before LDS');
      env.request({ typeUrl: LISTENER });
      await waitFor('the handler to get the table', () => seen.length === 1);
      assert.equal(seen[0], { ip: '10.0.0.1', version: 'n1' });
      const sub = await r.cp.waitForRequest('the NDS subscription', (q) => q.typeUrl === NAME_TABLE_TYPE);
      assert.is(sub.nonce, '');
      const ack = await r.cp.waitForRequest('the NDS ACK', (q) => q.typeUrl === NAME_TABLE_TYPE && q.nonce !== '');
      assert.is(ack.error, undefined);
      if (kind === 'sotw') assert.is(ack.versionInfo, 'n1');
      await r.cp.waitForRequest('the health report', (q) => q.typeUrl === HEALTH_INFO_TYPE);

      r.cp.set(NAME_TABLE_TYPE, 'n2', [nameTable('10.0.0.2')]);
      const nack = await r.cp.waitForRequest('the NDS NACK', (q) => q.typeUrl === NAME_TABLE_TYPE && !!q.error);
      assert.is(nack.error, 'table rejected');
      if (kind === 'sotw') assert.is(nack.versionInfo, 'n1', 'a NACK names the last accepted version');

      r.proxy.send({ typeUrl: HEALTH_INFO_TYPE, errorDetail: { code: 500, message: 'probe failed' } });
      await r.cp.waitForRequest('the unhealthy report', (q) => q.typeUrl === HEALTH_INFO_TYPE && q.error === 'probe failed');
      await env.waitForResponse('LDS', (x) => x.typeUrl === LISTENER);
      assert.not.ok(env.responses.some((x) => x.typeUrl === NAME_TABLE_TYPE), 'Envoy got an agent type');
      const m = r.proxy.metrics();
      assert.is(m.xds_proxy_agent_acks_total, 1);
      assert.is(m.xds_proxy_agent_nacks_total, 1);
      assert.ok(r.logs.some((l) => /agent rejected NameTable version n2 .*table rejected/.test(l)));
      const dbg = r.proxy.debugState() as { streams: Array<{ types: Record<string, any> }> };
      assert.is(dbg.streams[0]!.types[NAME_TABLE_TYPE].upstream.version, 'n2');
      assert.is(dbg.streams[0]!.types[NAME_TABLE_TYPE].envoy.nack, 'table rejected');
      assert.is(dbg.streams[0]!.types[CLUSTER].upstream.version, kind === 'sotw' ? 'c1' : 'c1');
    } finally {
      await r.done();
    }
  });
}

test('two Envoy streams at once (a hot restart): the newest feeds the agent\'s handlers, and the older takes over when it goes', async () => {
  const r = await rig();
  try {
    const versions: string[] = [];
    r.proxy.registerHandler(NAME_TABLE_TYPE, (_res, meta) => {
      versions.push(meta.version);
    });
    r.cp.set(NAME_TABLE_TYPE, 'n1', [nameTable('10.0.0.1')]);
    r.cp.set(LISTENER, 'l1', [listener('l', 1234, 'r')]);
    const old = r.envoy('sotw');
    old.request({ typeUrl: LISTENER });
    await waitFor('the first table', () => versions.length === 1);
    const young = r.envoy('delta');
    young.request({ typeUrl: LISTENER });
    await waitFor('the table on the new stream', () => versions.length === 2);
    r.cp.set(NAME_TABLE_TYPE, 'n2', [nameTable('10.0.0.2')]);
    // Both upstream streams get n2 and both ACK it, but the handler runs once.
    await waitFor('both ACKs', () => r.cp.requests.filter((q) => q.typeUrl === NAME_TABLE_TYPE && q.nonce !== '' && !q.error).length === 4);
    assert.equal(versions, ['n1', 'n1', 'n2']);
    r.proxy.send({ typeUrl: HEALTH_INFO_TYPE });
    const h = await r.cp.waitForRequest('the health report', (q) => q.typeUrl === HEALTH_INFO_TYPE);
    assert.is(h.kind, 'delta', 'sent on the newest stream');
    young.close();
    const h2 = await r.cp.waitForRequest('the health report re-sent on the older stream', (q) => q.typeUrl === HEALTH_INFO_TYPE && q.kind === 'sotw');
    assert.ok(h2);
    r.cp.set(NAME_TABLE_TYPE, 'n3', [nameTable('10.0.0.3')]);
    await waitFor('the older stream to feed the handler', () => versions.includes('n3'));
  } finally {
    await r.done();
  }
});

test('bad input from Envoy (a garbage frame, an oversized message) closes only that stream, and says why', async () => {
  const r = await rig({ maxMessageBytes: 64 * 1024 });
  try {
    r.cp.set(CLUSTER, 'c1', [edsCluster('a')]);
    const good = r.envoy('sotw');
    good.request({ typeUrl: CLUSTER });
    await good.waitForResponse('CDS', (x) => x.typeUrl === CLUSTER);

    const garbage = r.envoy('sotw');
    garbage.sendRaw(Buffer.from([0x0a, 0xff, 0xff, 0xff, 0x0f, 0x01, 0x02]));
    const st = await garbage.waitForStatus();
    assert.is(st.code, 3);
    assert.match(st.details, /malformed DiscoveryRequest/);
    assert.ok(r.logs.some((l) => /\twarn\txdsproxy\tclosing Envoy's xDS stream 2: malformed DiscoveryRequest from Envoy \(7 bytes\): .*claims/.test(l)), r.logs.join('\n'));

    const big = r.envoy('delta');
    big.request({ typeUrl: CLUSTER, subscribe: ['x'.repeat(100 * 1024)] });
    const st2 = await big.waitForStatus();
    assert.is(st2.code, 8);
    await waitFor('the log line', () => r.logs.some((l) => /\twarn\txdsproxy\tEnvoy's xDS stream 3 closed: gRPC ended it: Received message larger than max \(\d+ vs 65536\)/.test(l)));

    r.cp.set(CLUSTER, 'c2', [edsCluster('b')]);
    await good.waitForResponse('CDS c2 on the good stream', (x) => x.version === 'c2');
    assert.is(good.status, undefined);
    const m = r.proxy.metrics();
    assert.is(m.xds_proxy_downstream_streams, 1);
    assert.is(m.xds_proxy_bad_messages_total, 2);
  } finally {
    await r.done();
  }
});

test('bad input from the control plane resets only the upstream stream; Envoy\'s stays open and is served after the reconnect', async () => {
  const r = await rig({ maxMessageBytes: 64 * 1024 });
  try {
    r.cp.set(CLUSTER, 'c1', [edsCluster('a')]);
    const env = r.envoy('sotw');
    env.request({ typeUrl: CLUSTER });
    const first = await env.waitForResponse('CDS', (x) => x.typeUrl === CLUSTER);
    env.request({ typeUrl: CLUSTER, version: 'c1', nonce: first.nonce });

    r.cp.sendRaw(Buffer.from('this is not protobuf'));
    await waitFor('the garbage log line', () => r.logs.some((l) => /\twarn\txdsproxy\tupstream xDS stream ended \(malformed DiscoveryResponse from 127\.0\.0\.1:\d+ \(20 bytes\): .*\); Envoy's stream 1 stays open, reconnecting in \d+ ms/.test(l)));
    await env.waitForResponse('CDS after the reconnect', (x) => x.typeUrl === CLUSTER && x.nonce !== first.nonce);

    r.cp.set(CLUSTER, 'big', bulkClusters(100, 1000));
    await waitFor('the oversized log line', () => r.logs.some((l) => /upstream xDS stream ended \(RESOURCE_EXHAUSTED: Received message larger than max \(\d+ vs 65536\)\)/.test(l)));
    r.cp.set(CLUSTER, 'small', [edsCluster('b')]);
    await env.waitForResponse('the next good push', (x) => x.version === 'small');
    assert.not.ok(env.responses.some((x) => x.version === 'big'));
    assert.is(env.status, undefined);
    const m = r.proxy.metrics();
    assert.is(m.xds_proxy_downstream_streams_total, 1);
    assert.ok(m.xds_proxy_bad_messages_total >= 2, 'garbage and oversized messages counted');
  } finally {
    await r.done();
  }
});

test('requests from Envoy are not blocked while the control plane is away, and the latest state is what gets re-sent', async () => {
  const r = await rig();
  let cp2: ControlPlane | undefined;
  try {
    r.cp.set(ENDPOINT, 'e1', []);
    const env = r.envoy('sotw');
    env.request({ typeUrl: ENDPOINT, names: ['n0'] });
    await env.waitForResponse('EDS', (x) => x.typeUrl === ENDPOINT);
    await r.cp.stop();
    await waitFor('the upstream to go', () => r.proxy.metrics().xds_proxy_upstream_connected === 0);
    for (let i = 1; i <= 2000; i++) env.request({ typeUrl: ENDPOINT, names: [`n${i}`] });
    await waitFor('Envoy\'s requests to be read', () => r.proxy.metrics().xds_proxy_requests_from_envoy === 2001);
    cp2 = new ControlPlane();
    cp2.set(ENDPOINT, 'e1', []);
    await cp2.start(r.cp.port);
    const q = await cp2.waitForRequest('EDS re-sent', (x) => x.typeUrl === ENDPOINT);
    assert.equal(q.names, ['n2000']);
    await sleep(100);
    assert.is(cp2.requests.length, 1, 'only the latest state is sent, not the backlog');
  } finally {
    await cp2?.stop();
    await r.done();
  }
});

test('an Envoy that reads slowly makes the proxy stop reading upstream instead of buffering every push', async () => {
  const r = await rig();
  try {
    const mb = bulkClusters(1000, 1000);
    r.cp.set(CLUSTER, 'v0', [edsCluster('a')]);
    const env = r.envoy('sotw');
    env.request({ typeUrl: CLUSTER });
    await env.waitForResponse('CDS', (x) => x.version === 'v0');
    env.pause();
    // 60 pushes of 1 MB. The paused client still takes 16 into its stream buffer; then the proxy holds up to
    // 16 MB for Envoy, stops asking upstream for more, and the rest waits in the control plane.
    for (let i = 1; i <= 60; i++) r.cp.set(CLUSTER, `v${i}`, mb);
    await sleep(1000);
    const read = r.proxy.metrics().xds_proxy_responses_from_upstream - 1;
    assert.ok(read <= 40, `the proxy read ${read} of 60 pushes while Envoy was not reading`);
    env.resume();
    await env.waitForResponse('the last push', (x) => x.version === 'v60', 20_000);
    assert.equal(env.responses.map((x) => x.version), Array.from({ length: 61 }, (_, i) => `v${i}`), 'in order, none lost');
  } finally {
    await r.done();
  }
});

test('closing the proxy in the middle of an outage leaves no timer, socket or server behind', async () => {
  const count = () => {
    const m: Record<string, number> = {};
    for (const k of process.getActiveResourcesInfo()) if (/Timeout|Wrap/.test(k)) m[k] = (m[k] ?? 0) + 1;
    return m;
  };
  await sleep(50);
  const before = count();
  // A reconnect delay longer than the wait below, so a timer left behind would still be there.
  const r = await rig({ backoff: { initialMs: 5000, maxMs: 5000 } });
  r.cp.set(CLUSTER, 'c1', [edsCluster('a')]);
  const env = r.envoy('delta');
  env.request({ typeUrl: CLUSTER });
  await env.waitForResponse('CDS', (x) => x.typeUrl === CLUSTER);
  await r.cp.stop();
  await waitFor('a reconnect to be pending', () => (r.proxy.debugState() as { streams: Array<{ upstream: { reconnectScheduled: boolean } }> }).streams[0]!.upstream.reconnectScheduled);
  await r.done();
  await waitFor('handles to close', () => JSON.stringify(count()) === JSON.stringify(before), 2000).catch(() => undefined);
  assert.equal(count(), before);
});

test('the socket: a stale file is replaced, a live one or a non-socket is refused, mode 0660; close() is safe twice', async () => {
  const dir = tempDir('pa-xds-sock-');
  const upstream = { address: '127.0.0.1:1', tls: false };
  configureLogging({ write: () => undefined });
  try {
    const sock = path.join(dir.path, 'XDS');
    // A stale socket: bound once, its server gone without unlinking.
    const stale = net.createServer();
    await new Promise<void>((res) => stale.listen(sock, res));
    // Node removes the file when the server closes; a second link to it survives as the stale file.
    const linked = path.join(dir.path, 'keep');
    fs.linkSync(sock, linked);
    await new Promise<void>((res) => stale.close(() => res()));
    fs.renameSync(linked, sock);
    assert.ok(fs.lstatSync(sock).isSocket());

    const p = new XdsProxy({ socketPath: sock, upstream });
    await p.start();
    assert.is(fs.statSync(sock).mode & 0o777, 0o660);
    const p2 = new XdsProxy({ socketPath: sock, upstream });
    try {
      await p2.start();
      assert.unreachable('a second proxy took over a live socket');
    } catch (e) {
      assert.match((e as Error).message, /failed to start xDS proxy on .*: .* is in use by another process/);
      assert.is((e as { code?: string }).code, 'IO');
    }
    assert.instance(await p2.closed, Error);
    await p.close();
    await p.close();
    assert.is(await p.closed, undefined);
    assert.not.ok(fs.existsSync(sock), 'the socket file was left behind');

    const file = path.join(dir.path, 'not-a-socket');
    fs.writeFileSync(file, 'data');
    const p3 = new XdsProxy({ socketPath: file, upstream });
    try {
      await p3.start();
      assert.unreachable('a regular file was replaced');
    } catch (e) {
      assert.match((e as Error).message, /exists and is not a socket/);
    }
    assert.is(fs.readFileSync(file, 'utf8'), 'data');
  } finally {
    resetLogging();
    dir.cleanup();
  }
});

test.run();
