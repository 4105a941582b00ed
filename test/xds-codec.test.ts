// The lite xDS codec against protobufjs and the Envoy descriptor, the subscription state that a reconnect
// re-sends, the reconnect backoff, and the Istio schema kept in step with proto/istio/*.proto.

import * as path from 'node:path';
import * as protobuf from 'protobufjs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { messageType, packAny } from '../lib/envoy-protos';
import {
  encodeDeltaRequest, encodeSotwRequest, nodeId, parseDeltaRequest, parseDeltaResponse, parseSotwRequest, parseSotwResponse,
  sotwResources, unpackAnyBytes, withDeltaResources, withoutFields, withSotwResources,
} from '../lib/xds-codec';
import { decodeNameTable, encodeNameTable, ISTIO_DESCRIPTOR, NAME_TABLE_TYPE } from '../lib/xds-istio';
import { DeltaSubscriptions, SotwSubscriptions } from '../lib/xds-state';
import { backoffDelay } from '../lib/xds-upstream';
import { REPO } from './helpers/harness';

const REQ = 'envoy.service.discovery.v3.DiscoveryRequest';
const RESP = 'envoy.service.discovery.v3.DiscoveryResponse';
const DREQ = 'envoy.service.discovery.v3.DeltaDiscoveryRequest';
const DRESP = 'envoy.service.discovery.v3.DeltaDiscoveryResponse';
const CDS = 'type.googleapis.com/envoy.config.cluster.v3.Cluster';
const EDS = 'type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment';

const enc = (name: string, v: Record<string, unknown>) => Buffer.from(messageType(name).encode(messageType(name).fromObject(v)).finish());
const dec = (name: string, b: Buffer) => messageType(name).toObject(messageType(name).decode(b), { defaults: true, arrays: true, objects: true, longs: Number }) as Record<string, any>;
const node = { id: 'sidecar~10.0.0.1~p.ns~ns.svc.cluster.local', cluster: 'app', metadata: { fields: { A: { string_value: 'b' } } } };
const cluster = (name: string) => packAny('envoy.config.cluster.v3.Cluster', { name, type: 'STATIC' });

test('reads the top-level fields of a DiscoveryRequest that protobufjs wrote', () => {
  const b = enc(REQ, { version_info: 'v7', node, resource_names: ['a', 'b'], type_url: CDS, response_nonce: 'n3', error_detail: { code: 13, message: 'bad cluster' } });
  const r = parseSotwRequest(b);
  assert.equal([r.versionInfo, r.resourceNames, r.typeUrl, r.responseNonce], ['v7', ['a', 'b'], CDS, 'n3']);
  assert.equal(r.errorDetail, { code: 13, message: 'bad cluster' });
  assert.is(nodeId(r.node), node.id);
  assert.equal(dec('envoy.config.core.v3.Node', r.node!).cluster, 'app');
});

test('requests it writes decode with protobufjs to the same values', () => {
  const nodeBytes = enc('envoy.config.core.v3.Node', node);
  const s = dec(REQ, encodeSotwRequest({ typeUrl: CDS, versionInfo: 'v1', node: nodeBytes, resourceNames: ['x'], responseNonce: 'n', errorDetail: { code: 500, message: 'down' } }));
  assert.equal([s.type_url, s.version_info, s.resource_names, s.response_nonce, s.error_detail.code, s.error_detail.message, s.node.id], [CDS, 'v1', ['x'], 'n', 500, 'down', node.id]);
  const d = dec(DREQ, encodeDeltaRequest({ typeUrl: EDS, node: nodeBytes, subscribe: ['a', 'b'], unsubscribe: ['c'], initialVersions: new Map([['a', '1'], ['b', '2']]), responseNonce: 'n9' }));
  assert.equal([d.type_url, d.resource_names_subscribe, d.resource_names_unsubscribe, d.initial_resource_versions, d.response_nonce, d.node.id], [EDS, ['a', 'b'], ['c'], { a: '1', b: '2' }, 'n9', node.id]);
  const neg = dec(REQ, encodeSotwRequest({ typeUrl: CDS, errorDetail: { code: -1, message: '' } }));
  assert.is(neg.error_detail.code, -1);
});

test('reads responses without touching the resources, and hands out their Any bytes as they are', () => {
  const resources = [cluster('a'), cluster('b'), cluster('c')];
  const b = enc(RESP, { version_info: 'v2', resources, type_url: CDS, nonce: 'n1', canary: true, control_plane: { identifier: 'istiod-1' } });
  assert.equal(parseSotwResponse(b), { versionInfo: 'v2', typeUrl: CDS, nonce: 'n1', resourceCount: 3 });
  const anys = sotwResources(b);
  assert.is(anys.length, 3);
  const any = messageType('google.protobuf.Any');
  assert.ok(anys[1]!.equals(Buffer.from(any.encode(resources[1]!).finish())));
  assert.equal(unpackAnyBytes(anys[2]!).typeUrl, CDS);

  const d = enc(DRESP, {
    system_version_info: 's1', type_url: CDS, nonce: 'n2', removed_resources: ['old'],
    resources: [{ name: 'a', version: '1', resource: resources[0] }, { name: 'b', version: '2', resource: resources[1] }],
  });
  const p = parseDeltaResponse(d);
  assert.equal([p.systemVersionInfo, p.typeUrl, p.nonce, p.removed], ['s1', CDS, 'n2', ['old']]);
  assert.equal(p.resources.map((r) => [r.name, r.version]), [['a', '1'], ['b', '2']]);
  assert.ok(p.resources[1]!.any!.equals(Buffer.from(any.encode(resources[1]!).finish())));
  const q = parseDeltaRequest(enc(DREQ, { type_url: EDS, resource_names_subscribe: ['a'], initial_resource_versions: { a: '3' }, response_nonce: 'n' }));
  assert.equal([q.typeUrl, q.subscribe, [...q.initialVersions], q.responseNonce], [EDS, ['a'], [['a', '3']], 'n']);
});

test('malformed input is rejected with a reason, never a crash', () => {
  const cases: Array<[Buffer, RegExp]> = [
    [Buffer.from([0x0a, 0x05, 0x61]), /field 1 claims 5 bytes but only 1 remain/],
    [Buffer.from([0x0a]), /truncated varint/],
    [Buffer.from([0x0b]), /unsupported wire type 3/],
    [Buffer.from([0x00, 0x01]), /field number 0/],
    [Buffer.from([0x20, 0x01]), /field 4 has wire type 0, want length-delimited/],
    [Buffer.from(Array(12).fill(0xff)), /varint longer than 10 bytes/],
  ];
  for (const [b, re] of cases) {
    for (const parse of [parseSotwRequest, parseSotwResponse, parseDeltaRequest, parseDeltaResponse]) {
      try {
        parse(b);
      } catch (e) {
        assert.match((e as Error).message, re);
        assert.is((e as { code?: string }).code, 'BAD_INPUT');
        continue;
      }
      assert.unreachable(`${parse.name} accepted ${b.toString('hex')}`);
    }
  }
  // Unknown fields of any wire type are skipped.
  const withExtra = Buffer.concat([enc(REQ, { type_url: CDS }), Buffer.from([0xf8, 0x01, 0x05, 0xf9, 0x01, 1, 2, 3, 4, 5, 6, 7, 8, 0xfd, 0x01, 1, 2, 3, 4])]);
  assert.is(parseSotwRequest(withExtra).typeUrl, CDS);
});

test('withoutFields drops exactly the named fields and keeps the other bytes in order', () => {
  const b = enc(REQ, { version_info: 'v1', node, resource_names: ['a', 'b'], type_url: CDS, response_nonce: 'n3', error_detail: { message: 'x' } });
  const stripped = withoutFields(b, new Set([2, 5, 6]));
  const d = dec(REQ, stripped);
  assert.equal([d.version_info, d.resource_names, d.type_url, d.response_nonce, d.node, d.error_detail], ['v1', ['a', 'b'], CDS, '', null, null]);
  assert.is(withoutFields(b, new Set([9])), b, 'nothing to drop: same buffer');
});

test('SotW re-send: Envoy\'s latest request per type in subscription order, node on the first, no nonce or error', () => {
  const s = new SotwSubscriptions();
  const add = (v: Record<string, unknown>) => {
    const b = enc(REQ, v);
    s.record(b, parseSotwRequest(b));
  };
  add({ node, type_url: CDS });
  add({ type_url: EDS, resource_names: ['a'] });
  add({ type_url: CDS, version_info: 'c1', response_nonce: '1' });
  add({ type_url: EDS, resource_names: ['a', 'b'], version_info: 'e0', response_nonce: '2', error_detail: { message: 'nope' } });
  const out = s.resend().map((r): Record<string, any> => ({ ...dec(REQ, r.bytes), names: r.names }));
  assert.equal(out.map((r) => [r.type_url, r.version_info, r.resource_names, r.response_nonce, r.error_detail]), [
    [CDS, 'c1', [], '', null],
    [EDS, 'e0', ['a', 'b'], '', null],
  ]);
  assert.is(out[0]!.node.id, node.id);
  assert.is(out[1]!.node, null);
  assert.is(out[1]!.names, 'a\nb');
});

test('Delta re-send: subscriptions with the versions Envoy ACKed; NACKed and unanswered changes are not counted', () => {
  const s = new DeltaSubscriptions();
  const req = (v: Record<string, unknown>) => s.record(parseDeltaRequest(enc(DREQ, v)));
  const resp = (v: Record<string, unknown>) => s.recordResponse(parseDeltaResponse(enc(DRESP, v)));
  req({ node, type_url: CDS });
  resp({ type_url: CDS, nonce: '1', resources: [{ name: 'a', version: '1', resource: cluster('a') }, { name: 'b', version: '1', resource: cluster('b') }] });
  assert.is(req({ type_url: CDS, response_nonce: '1' }), 'ack');
  resp({ type_url: CDS, nonce: '2', resources: [{ name: 'a', version: '2', resource: cluster('a') }] });
  assert.is(req({ type_url: CDS, response_nonce: '2', error_detail: { message: 'bad' } }), 'nack');
  resp({ type_url: CDS, nonce: '3', removed_resources: ['b'] });
  assert.is(req({ type_url: CDS, response_nonce: '3' }), 'ack');
  resp({ type_url: CDS, nonce: '4', resources: [{ name: 'c', version: '1', resource: cluster('c') }] }); // never ACKed
  req({ type_url: EDS, resource_names_subscribe: ['a', 'b'], initial_resource_versions: { a: '7' } });
  req({ type_url: EDS, resource_names_unsubscribe: ['b'] });
  req({ type_url: 'type.googleapis.com/x.Y', resource_names_subscribe: ['only'] });
  req({ type_url: 'type.googleapis.com/x.Y', resource_names_unsubscribe: ['only'] });
  const out = s.resend().map((r) => dec(DREQ, r.bytes));
  assert.equal(out.map((r) => [r.type_url, r.resource_names_subscribe, r.initial_resource_versions]), [
    [CDS, [], { a: '1' }],
    [EDS, ['a'], { a: '7' }],
  ], 'a type subscribed to nothing is not re-sent (an empty first request would mean "all")');
  assert.is(out[0]!.node.id, node.id);
  assert.is(out[1]!.node, null);
  req({ type_url: CDS, resource_names_subscribe: ['z'] });
  assert.equal(dec(DREQ, s.resend()[0]!.bytes).resource_names_subscribe, ['*', 'z'], 'wildcard kept explicit next to names');
});

test('reconnect backoff: 15 % of the time the upstream has been lost, from the initial delay to the cap, jittered down by up to 20 %', () => {
  const b = { initialMs: 200, maxMs: 30_000 };
  assert.equal([0, 1000, 10_000, 100_000].map((t) => backoffDelay(t, b, () => 0)), [200, 200, 1500, 15_000]);
  assert.is(backoffDelay(10_000, b, () => 0.5), 1350);
  assert.is(backoffDelay(10_000, b, () => 0.999_999), 1200);
  assert.is(backoffDelay(0, b, () => 0.999_999), 160, 'the initial delay is jittered too');
  // The cap is the longest wait, jitter included, however long the outage.
  assert.is(backoffDelay(200_000, b, () => 0), 30_000);
  assert.is(backoffDelay(1e12, b, () => 0), 30_000);
  assert.is(backoffDelay(1e12, b, () => 0.999_999), 24_000);
  for (let i = 0; i < 10_000; i++) {
    const t = i * 97;
    const d = backoffDelay(t, b);
    const base = Math.min(30_000, Math.max(200, 0.15 * t));
    assert.ok(d <= base + 0.5 && d >= 0.8 * base - 0.5, `${d} ms after ${t} ms`);
  }
});

/** A seeded generator, so a failure here can be replayed. */
function prng(seed: number): () => number {
  return () => ((seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31) / 2 ** 31);
}

test('reconnect backoff: whenever the control plane returns, the next attempt is within max(1 s, 25 % of the outage), and a fleet does not return in one wave', () => {
  const b = { initialMs: 200, maxMs: 30_000 };
  const rand = prng(7);
  // Attempt times of one agent that lost its control plane at 0 (each attempt fails at once while it is away).
  const schedule = (until: number) => {
    const at: number[] = [];
    for (let t = 0; t <= until;) at.push((t += backoffDelay(t, b, rand)));
    return at;
  };
  for (let agent = 0; agent < 200; agent++) {
    const at = schedule(700_000);
    for (let outage = 100; outage <= 600_000; outage += 100) {
      const next = at.find((t) => t >= outage)!;
      assert.ok(next - outage <= Math.max(1000, outage / 4), `outage ${outage} ms: next attempt ${next - outage} ms after the return`);
    }
    assert.ok(at.filter((t) => t <= 30_000).length < 40, 'the attempts in a 30 s outage are bounded');
  }
  // 1000 agents that lost the same control plane at once, back after 30 s: no 100 ms holds more than 5 % of them.
  const back = Array.from({ length: 1000 }, () => schedule(31_000).find((t) => t >= 30_000)!);
  const buckets = new Map<number, number>();
  for (const t of back) buckets.set(Math.floor(t / 100), (buckets.get(Math.floor(t / 100)) ?? 0) + 1);
  assert.ok(Math.max(...buckets.values()) <= 50, `${Math.max(...buckets.values())} of 1000 agents reconnect in the same 100 ms`);
  assert.ok(Math.max(...back) - 30_000 <= 7500);
});

test('the Istio schema in lib/xds-istio.ts (NameTable, health, PCDS roots) matches proto/istio/*.proto', () => {
  const root = new protobuf.Root();
  root.loadSync(['nds', 'health', 'proxy-config'].map((f) => path.join(REPO, `proto/istio/${f}.proto`)), { keepCase: true });
  assert.equal(JSON.parse(JSON.stringify(root.toJSON())), JSON.parse(JSON.stringify(ISTIO_DESCRIPTOR)));
  const value = encodeNameTable({ table: { 'a.ns.svc.cluster.local': { ips: ['10.0.0.1', 'fd00::1'], registry: 'Kubernetes', shortname: 'a', namespace: 'ns' } } });
  const any = Buffer.from(messageType('google.protobuf.Any').encode({ type_url: NAME_TABLE_TYPE, value }).finish());
  assert.equal(decodeNameTable(any).table['a.ns.svc.cluster.local']!.ips, ['10.0.0.1', 'fd00::1']);
});

test('withSotwResources / withDeltaResources: resources replaced or left out, removed names filtered, every other field kept', () => {
  const Resp = messageType('envoy.service.discovery.v3.DiscoveryResponse');
  const DResp = messageType('envoy.service.discovery.v3.DeltaDiscoveryResponse');
  const any = (n: string) => ({ type_url: 'type.googleapis.com/x.Y', value: Buffer.from(n) });
  const sotw = Buffer.from(Resp.encode({ version_info: 'v9', type_url: 't', nonce: 'n1', resources: [any('a'), any('b')] }).finish());
  const newAny = Buffer.from(messageType('google.protobuf.Any').encode(any('c')).finish());
  const s2 = Resp.toObject(Resp.decode(withSotwResources(sotw, [newAny])), { bytes: String }) as Record<string, any>;
  assert.equal([s2.version_info, s2.type_url, s2.nonce, s2.resources.length], ['v9', 't', 'n1', 1]);
  assert.is(Buffer.from(s2.resources[0].value, 'base64').toString(), 'c');
  const delta = Buffer.from(DResp.encode({
    system_version_info: 's', type_url: 't', nonce: 'n2', removed_resources: ['gone1', 'gone2'],
    resources: [{ name: 'a', version: '1', resource: any('a') }, { name: 'b', version: '2', resource: any('b') }],
  }).finish());
  const d2 = DResp.toObject(DResp.decode(withDeltaResources(delta, [undefined, newAny], (n) => n === 'gone2')), { bytes: String }) as Record<string, any>;
  assert.equal([d2.system_version_info, d2.nonce, d2.removed_resources], ['s', 'n2', ['gone2']]);
  assert.equal(d2.resources.map((r: any) => [r.name, r.version, Buffer.from(r.resource.value, 'base64').toString()]), [['b', '2', 'c']]);
});

test.run();
