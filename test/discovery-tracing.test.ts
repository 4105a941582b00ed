// Tracing as istiod configures it: meshConfig defaultProviders.tracing naming a zipkin extension provider puts the
// provider in every HTTP connection manager (the collector reached through its service's outbound cluster), and
// `enableTracing` alone leaves the provider to the bootstrap's `zipkin` cluster. A real Envoy sends the spans to a
// small zipkin collector (POST /api/v2/spans) and B3 headers to the backend; sampling decides both.

import * as fs from 'node:fs';
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { DiscoveryServer } from '../lib/discovery/index';
import { generate } from '../lib/discovery/generate';
import { readMeshTracing } from '../lib/discovery/mesh-tracing';
import { proxyFromNode } from '../lib/discovery/proxy';
import { TYPE_URLS } from '../lib/discovery/resources';
import { unpackAny } from '../lib/envoy-protos';
import { adsBootstrap } from './helpers/ads-bootstrap';
import { spawnTestEnvoy } from './helpers/discovery-envoy';
import { freePort, httpRequest, sleep, tempDir, waitFor } from './helpers/harness';

interface Server {
  port: number;
  close(): Promise<void>;
}

async function listen(handler: http.RequestListener): Promise<Server> {
  const s = http.createServer(handler);
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', () => r()));
  return {
    port: (s.address() as AddressInfo).port,
    close: () => new Promise<void>((r) => {
      s.closeAllConnections();
      s.close(() => r());
    }),
  };
}

/** Zipkin's v2 JSON API: every span POSTed to /api/v2/spans. */
async function zipkinCollector(): Promise<Server & { spans: Record<string, any>[] }> {
  const spans: Record<string, any>[] = [];
  const s = await listen((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => {
      if (req.method === 'POST' && req.url === '/api/v2/spans') spans.push(...(JSON.parse(body) as Record<string, any>[]));
      res.statusCode = 202;
      res.end();
    });
  });
  return { ...s, spans };
}

/** Answers with the request headers it got, as JSON. */
const echoBackend = () => listen((req, res) => {
  req.resume();
  res.end(JSON.stringify(req.headers));
});

function config(servicePort: number, backendPort: number, zipkinServicePort: number, collectorPort: number): string {
  return `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: web, namespace: test }
spec:
  hosts: [web.test.local]
  ports: [{ number: ${servicePort}, name: http, protocol: HTTP }]
  endpoints: [{ address: 127.0.0.1, ports: { http: ${backendPort} } }]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: zipkin, namespace: istio-system }
spec:
  hosts: [zipkin.istio-system.svc.cluster.local]
  ports: [{ number: ${zipkinServicePort}, name: http, protocol: HTTP }]
  endpoints: [{ address: 127.0.0.1, ports: { http: ${collectorPort} } }]
`;
}

async function run(meshYaml: Record<string, unknown>, extraBootstrap: (b: Record<string, any>, collectorPort: number) => void, fn: (ctx: { get(): Promise<Record<string, string>>; collector: { spans: Record<string, any>[] } }) => Promise<void>): Promise<void> {
  const dir = tempDir('pa-tracing-');
  const collector = await zipkinCollector();
  const backend = await echoBackend();
  let server: DiscoveryServer | undefined;
  let envoy: Awaited<ReturnType<typeof spawnTestEnvoy>> | undefined;
  try {
    const [servicePort, zipkinPort, adminPort] = [await freePort(), await freePort(), await freePort()];
    fs.writeFileSync(path.join(dir.path, 'config.yaml'), config(servicePort, backend.port, zipkinPort, collector.port));
    const mesh = JSON.parse(JSON.stringify(meshYaml).replaceAll('"ZIPKIN_PORT"', String(zipkinPort))) as Record<string, unknown>;
    server = new DiscoveryServer({ configDir: dir.path, listen: `unix:${path.join(dir.path, 'xds.sock')}`, mesh: { tracing: readMeshTracing(mesh, 'test mesh') } });
    await server.start();
    const bootstrap = adsBootstrap({ nodeId: 'sidecar~127.0.0.1~web-0.test~test.svc.cluster.local', adminPort, delta: false, xdsAddress: server.address, metadata: { MESH_ID: 'mesh1' } }) as Record<string, any>;
    extraBootstrap(bootstrap, collector.port);
    envoy = await spawnTestEnvoy(bootstrap, adminPort, 'pa-tracing-envoy-');
    const get = async () => {
      const r = await httpRequest(`http://127.0.0.1:${servicePort}/some/path`, { headers: { host: 'web.test.local', 'x-team': 'blue' }, timeoutMs: 5000 });
      if (r.status !== 200) throw new Error(`status ${r.status}: ${r.body}`);
      return JSON.parse(r.body) as Record<string, string>;
    };
    await waitFor('the route to the backend', () => get().then(() => true, () => false), 20_000, 200);
    await fn({ get, collector });
    assert.equal(server.status().nacks, [], 'no NACK');
  } finally {
    await envoy?.stop();
    await server?.close();
    await collector.close();
    await backend.close();
    dir.cleanup();
  }
}

const PROVIDER = (sampling: number) => ({
  defaultProviders: { tracing: ['zipkin'] },
  extensionProviders: [{ name: 'zipkin', zipkin: { service: 'zipkin.istio-system.svc.cluster.local', port: 'ZIPKIN_PORT' } }],
  defaultConfig: { tracing: { sampling, maxPathTagLength: 64, customTags: { team: { header: { name: 'x-team' } }, env: { literal: { value: 'test' } } } } },
});

test('defaultProviders.tracing zipkin: spans reach the collector through its service cluster, with Istio\'s and custom tags', async () => {
  await run(PROVIDER(100), () => undefined, async ({ get, collector }) => {
    const seen = await get();
    assert.ok(seen['x-b3-traceid'], 'the backend sees a B3 trace id');
    assert.is(seen['x-b3-sampled'], '1');
    // Envoy's zipkin tracer flushes every 5 s (or every 5 spans): the span of the request above may come in a
    // later batch than the first one (the requests that waited for the route count too), so wait for that span.
    for (let i = 0; i < 4; i++) await get();
    const span = await waitFor('the span of the backend\'s trace at the collector', () => collector.spans.find((s) => s.traceId === seen['x-b3-traceid']), 15_000, 200);
    assert.match(span.tags['http.url'], /\/some\/path/);
    assert.is(span.tags.team, 'blue', 'header custom tag');
    assert.is(span.tags.env, 'test', 'literal custom tag');
    assert.is(span.tags['istio.namespace'], 'test');
    assert.is(span.tags['istio.mesh_id'], 'mesh1');
    assert.is(span.tags['istio.canonical_service'], 'unknown');
  });
});

test('sampling near 0: the backend sees x-b3-sampled 0 and the collector gets no span', async () => {
  // ProxyConfig sampling 0 means unset to istiod (its 1% default), so the smallest value stands in for "off".
  await run(PROVIDER(0.0001), () => undefined, async ({ get, collector }) => {
    for (let i = 0; i < 5; i++) assert.is((await get())['x-b3-sampled'], '0');
    await sleep(6000); // longer than Envoy's 5 s zipkin flush interval
    assert.equal(collector.spans, []);
  });
});

test('enableTracing without a provider: the HCM samples, the bootstrap\'s zipkin tracer reports', async () => {
  const mesh = { enableTracing: true, defaultConfig: { tracing: { sampling: 100, zipkin: { address: 'ignored:9411' } } } };
  await run(mesh, (b, collectorPort) => {
    // What the agent's bootstrap holds for ProxyConfig tracing.zipkin.address (lib/bootstrap.ts).
    b.static_resources.clusters.push({ name: 'zipkin', type: 'STATIC', connect_timeout: '1s', load_assignment: { cluster_name: 'zipkin', endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: '127.0.0.1', port_value: collectorPort } } } }] }] } });
    b.tracing = { http: { name: 'envoy.tracers.zipkin', typed_config: { '@type': 'type.googleapis.com/envoy.config.trace.v3.ZipkinConfig', collector_cluster: 'zipkin', collector_endpoint: '/api/v2/spans', collector_endpoint_version: 'HTTP_JSON', trace_id_128bit: true, shared_span_context: false } } };
  }, async ({ get, collector }) => {
    assert.is((await get())['x-b3-sampled'], '1');
    for (let i = 0; i < 4; i++) await get();
    const span = await waitFor('spans at the collector', () => collector.spans.find((s) => s.tags?.['http.url']?.includes('/some/path')), 15_000, 200);
    assert.is(span.tags['istio.namespace'], 'test');
  });
});

test('the tracing block on outbound and gateway HCMs (plaintext and HTTPS servers): routers spawn an upstream span; no mesh tracing, no block', async () => {
  const dir = tempDir('pa-tracing-gen-');
  try {
    fs.writeFileSync(path.join(dir.path, 'c.yaml'), `${config(8080, 9080, 9411, 9411)}---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: { name: gw, namespace: test }
spec:
  selector: { istio: ingressgateway }
  servers:
  - { port: { number: 8081, name: http, protocol: HTTP }, hosts: ["*"] }
  - { port: { number: 8443, name: https, protocol: HTTPS }, hosts: ["*"], tls: { mode: SIMPLE, serverCertificate: /etc/gw/cert.pem, privateKey: /etc/gw/key.pem } }
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: own, namespace: test }
spec:
  hosts: [own.test.local]
  location: MESH_INTERNAL
  ports: [{ number: 9090, name: http, protocol: HTTP }]
  endpoints: [{ address: 10.0.0.7 }]
`);
    const mesh = { tracing: readMeshTracing(JSON.parse(JSON.stringify(PROVIDER(25)).replace('"ZIPKIN_PORT"', '9411')), 'm') };
    const { push, off } = await buildPush(dir.path, mesh);
    {
      const hcmOf = (l: any) => unpackAny(l.filter_chains[0].filters[0].typed_config) as Record<string, any>;
      const listeners = (p: ReturnType<typeof proxyFromNode>, pk: typeof push) => [...generate(pk, p, TYPE_URLS.listener).values()].map((r) => unpackAny(r.any) as Record<string, any>);
      const sidecar = proxyFromNode({ id: 'sidecar~10.0.0.1~a.test~test.svc.cluster.local' });
      const out = hcmOf(listeners(sidecar, push).find((l) => l.name === '127.0.0.1_8080'));
      assert.equal(out.tracing.random_sampling, { value: 25 });
      assert.equal(out.tracing.client_sampling, { value: 100 });
      assert.equal(out.tracing.max_path_tag_length, { value: 64 });
      assert.is(out.tracing.provider.name, 'envoy.tracers.zipkin');
      const zc = unpackAny(out.tracing.provider.typed_config) as Record<string, any>;
      assert.is(zc.collector_cluster, 'outbound|9411||zipkin.istio-system.svc.cluster.local');
      assert.is(zc.collector_hostname, 'zipkin.istio-system.svc.cluster.local');
      assert.is(zc.trace_id_128bit, true);
      assert.is(out.tracing.spawn_upstream_span, undefined, 'a sidecar spawns no upstream span');
      assert.equal(out.tracing.custom_tags.map((t: any) => t.tag), [...out.tracing.custom_tags.map((t: any) => t.tag)].sort(), 'tags sorted');
      assert.ok(out.tracing.custom_tags.some((t: any) => t.tag === 'istio.authorization.dry_run.allow_policy.name'));
      const router = proxyFromNode({ id: 'router~10.0.0.3~gw.test~test.svc.cluster.local', metadata: { fields: { LABELS: { structValue: { fields: { istio: { stringValue: 'ingressgateway' } } } } } } });
      const gw = hcmOf(listeners(router, push).find((l) => l.name === '0.0.0.0_8081'));
      assert.equal(gw.tracing.spawn_upstream_span, { value: true });
      // An HTTPS server's filter chain (TLS terminated, its own route name) has the same block.
      const https = listeners(router, push).find((l) => l.name === '0.0.0.0_8443')!;
      assert.ok(https.filter_chains[0].transport_socket, 'the HTTPS chain terminates TLS');
      assert.equal(hcmOf(https).tracing, gw.tracing);
      assert.is(hcmOf(listeners(router, off).find((l) => l.name === '0.0.0.0_8443')).tracing, undefined);
      assert.is(hcmOf(listeners(sidecar, off).find((l) => l.name === '127.0.0.1_8080')).tracing, undefined);
      // The inbound HCM of a sidecar's own workload carries the same block.
      const own = proxyFromNode({ id: 'sidecar~10.0.0.7~own.test~test.svc.cluster.local' });
      const inbound = listeners(own, push).find((l) => l.name === 'inbound_10.0.0.7_9090');
      assert.ok(inbound, 'the inbound listener');
      assert.equal(hcmOf(inbound).tracing.random_sampling, { value: 25 });
    }
  } finally {
    dir.cleanup();
  }
});

async function buildPush(dir: string, mesh: Record<string, unknown>) {
  const { MemoryConfigStore } = await import('../lib/discovery/config-store');
  const { ServiceEntryRegistry } = await import('../lib/discovery/registry');
  const { FileConfigSource } = await import('../lib/discovery/file-source');
  const { PushContext } = await import('../lib/discovery/push-context');
  const { DEFAULT_MESH } = await import('../lib/discovery/model');
  const store = new MemoryConfigStore();
  const reg = new ServiceEntryRegistry(store);
  reg.run();
  await new FileConfigSource({ dir, store }).sync({ report: false });
  return { push: PushContext.build('x', store, reg, undefined, { ...DEFAULT_MESH, ...mesh }), off: PushContext.build('y', store, reg) };
}

test('meshConfig tracing errors name the field', () => {
  assert.throws(() => readMeshTracing({ defaultProviders: { tracing: ['nope'] } }, 'mesh.yaml'), /mesh\.yaml: defaultProviders\.tracing\[0\]: names no entry of extensionProviders/);
  assert.throws(() => readMeshTracing({ defaultProviders: { tracing: ['otel'] }, extensionProviders: [{ name: 'otel', opentelemetry: { service: 'x', port: 4317 } }] }, 'm'), /extensionProviders\[0\]: tracing provider "opentelemetry" is not supported/);
  assert.throws(() => readMeshTracing({ enableTracing: true, defaultConfig: { tracing: { sampling: 'x' } } }, 'm'), /defaultConfig\.tracing\.sampling: must be a percentage/);
  assert.is(readMeshTracing({ enableTracing: false }, 'm'), undefined);
});

test.run();
