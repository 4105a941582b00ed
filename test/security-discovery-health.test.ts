// Issue 20 item 3: two unauthenticated istio.v1.HealthInformation messages under a made-up node id withdrew a
// WorkloadEntry's endpoints from every proxy, for good. Against the real `pilot-agent discovery` (a child process),
// uid 65534 reports vm-a and vm-b unhealthy (as vm-a's own node id, and as a made-up one), another identity of the
// namespace reports vm-a, and vm-a's own token under another address does: every proxy keeps both endpoints, and
// the server counts and logs what it ignored. Only vm-a's agent (its token, its address) withdraws vm-a, and
// uid 65534 cannot bring it back.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { unpackAny } from '../lib/envoy-protos';
import { AdsClient, type Response } from './helpers/discovery-client';
import { attack, discoveryListening, startDiscoveryProcess } from './helpers/discovery-process';
import type { AdsAttack } from './helpers/discovery-attacker';
import { freePort, tempDir } from './helpers/harness';

const EDS = 'type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment';
const HEALTH = 'type.googleapis.com/istio.v1.HealthInformation';
const NOBODY = 65534;
const DOWN = { code: 13, message: 'app answered 500' };

function mesh(servicePort: number): string {
  const we = (name: string, port: number) => `apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: ${name}, namespace: test}
spec: {address: 127.0.0.1, labels: {app: vm}, ports: {http: ${port}}, serviceAccount: vm}
`;
  return `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: vm, namespace: test}
spec:
  hosts: [vm.test.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: ${servicePort}, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: vm}}
---
${we('vm-a', 18001)}---
${we('vm-b', 18002)}`;
}

const ports = (r: Response) => r.resources.flatMap((x) => {
  const cla = unpackAny(x as never) as { endpoints?: { lb_endpoints?: { endpoint: { address: { socket_address: { port_value: number } } } }[] }[] };
  return (cla.endpoints ?? []).flatMap((l) => (l.lb_endpoints ?? []).map((e) => e.endpoint.address.socket_address.port_value));
}).sort();

test('health reports from uid 65534, a made-up node, another identity or another address withdraw nothing; the entry\'s own agent does', async () => {
  const dir = tempDir('pa-sec-disc-health-');
  const cfg = path.join(dir.path, 'mesh');
  fs.mkdirSync(path.join(cfg, 'ca', 'identities', 'test'), { recursive: true });
  fs.writeFileSync(path.join(cfg, 'ca', 'identities', 'test', 'vm'), 'vm-token\n', { mode: 0o600 });
  fs.writeFileSync(path.join(cfg, 'ca', 'identities', 'test', 'other'), 'other-token\n', { mode: 0o600 });
  const servicePort = await freePort();
  fs.writeFileSync(path.join(cfg, 'vm.yaml'), mesh(servicePort));
  fs.chmodSync(dir.path, 0o755);
  const address = `127.0.0.1:${await freePort()}`;
  const server = startDiscoveryProcess(cfg, address);
  let observer: AdsClient | undefined;
  const report = (nodeId: string, workloadEntry: string, error: typeof DOWN | undefined, token?: string): AdsAttack => ({
    mode: 'ads', address, nodeId, metadata: { WORKLOAD_ENTRY: workloadEntry }, ...(token && { token }),
    requests: [{ type_url: HEALTH, ...(error && { error_detail: error }) }, { type_url: HEALTH, ...(error && { error_detail: error }) }], waitMs: 800,
  });
  try {
    await discoveryListening(server);
    // Another sidecar's view of the service.
    const cluster = `outbound|${servicePort}||vm.test.local`;
    const c = AdsClient.connect(address, false);
    observer = c;
    c.send({ node: { id: 'sidecar~10.0.0.5~client.test~test.svc.cluster.local' }, type_url: EDS, resource_names: [cluster] });
    const ack = (r: Response) => c.send({ type_url: EDS, resource_names: [cluster], version_info: r.version_info, response_nonce: r.nonce });
    const first = await c.next(EDS);
    ack(first);
    assert.equal(ports(first), [18001, 18002]);

    const attacks = [
      attack(NOBODY, report('sidecar~127.0.0.1~vm-a.test~test.svc.cluster.local', 'vm-a', DOWN)),
      attack(NOBODY, report('sidecar~6.6.6.6~evil.test~test.svc.cluster.local', 'vm-b', DOWN)),
      attack(NOBODY, report('sidecar~127.0.0.1~vm-a.test~test.svc.cluster.local', 'vm-a', DOWN, 'guessed')),
      attack(0, report('sidecar~127.0.0.1~vm-a.test~test.svc.cluster.local', 'vm-a', DOWN, 'other-token')),
      attack(0, report('sidecar~10.9.9.9~vm-a.test~test.svc.cluster.local', 'vm-a', DOWN, 'vm-token')),
    ];
    const results = await Promise.all(attacks);
    assert.ok(await c.quiet(EDS, 2000), 'an ignored report changed the endpoints other proxies get');
    assert.is(results[2]!.code, 16, 'a guessed token: the stream is refused');

    const out = server.out();
    assert.match(out, /ignored a health report: proxy sidecar~127\.0\.0\.1~vm-a\.test~test\.svc\.cluster\.local reports for WorkloadEntry test\/vm-a without authenticating/);
    assert.match(out, /ignored a health report: proxy sidecar~6\.6\.6\.6~evil\.test~test\.svc\.cluster\.local reports for WorkloadEntry test\/vm-b without authenticating/);
    assert.match(out, /ignored a health report: proxy .* is authenticated as test\/other; WorkloadEntry test\/vm-a runs as test\/vm/);
    assert.match(out, /ignored a health report: proxy sidecar~10\.9\.9\.9~.* claims 10\.9\.9\.9; WorkloadEntry test\/vm-a is at 127\.0\.0\.1/);
    assert.is(out.match(/without authenticating/g)?.length, 2, 'each reason once, though the peer sent two reports');
    assert.not.match(out, /is unhealthy/);

    // vm-a's agent: its token, its address. Its report withdraws vm-a, and the state outlives its stream.
    await attack(0, report('sidecar~127.0.0.1~vm-a.test~test.svc.cluster.local', 'vm-a', DOWN, 'vm-token'));
    const down = await c.next(EDS, 10_000);
    ack(down);
    assert.equal(ports(down), [18002]);
    assert.match(server.out(), /WorkloadEntry test\/vm-a is unhealthy/);

    // uid 65534 cannot bring it back.
    await attack(NOBODY, report('sidecar~127.0.0.1~vm-a.test~test.svc.cluster.local', 'vm-a', undefined));
    assert.ok(await c.quiet(EDS, 2000), 'an anonymous healthy report restored the endpoint');
    assert.not.match(server.out(), /healthy again/);
  } finally {
    observer?.close();
    await server.stop();
    dir.cleanup();
  }
});

test.run();
