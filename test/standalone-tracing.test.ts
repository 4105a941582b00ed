// The mesh config's tracing reaches the embedded discovery server through the agent: `proxy --standalone DIR
// --meshConfig FILE` with a zipkin defaultProviders.tracing makes Envoy trace (the backend sees sampled B3
// headers and the collector gets spans), and `pilot-agent discovery --meshConfig FILE` reads the same fields
// (a provider naming no extensionProviders entry stops it with the field named).

import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { agentBin } from './helpers/agent';
import { agentFixture } from './helpers/agent-fixture';
import { freePort, httpRequest, tempDir, waitFor } from './helpers/harness';

function listen(handler: http.RequestListener): Promise<{ server: http.Server; port: number }> {
  const server = http.createServer(handler);
  return new Promise((r) => server.listen(0, '127.0.0.1', () => r({ server, port: (server.address() as AddressInfo).port })));
}

test('proxy --standalone --meshConfig: a zipkin default provider traces requests through Envoy', async () => {
  const agent = await agentFixture({ prefix: 'pa-standalone-tracing-' });
  const { dir } = agent;
  const spans: Record<string, unknown>[] = [];
  const collector = await listen((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => {
      if (req.url === '/api/v2/spans') spans.push(...(JSON.parse(body) as Record<string, unknown>[]));
      res.statusCode = 202;
      res.end();
    });
  });
  const backend = await listen((req, res) => {
    req.resume();
    res.end(JSON.stringify(req.headers));
  });
  const [servicePort, zipkinPort] = [await freePort(), await freePort()];
  const cfgDir = path.join(dir.path, 'mesh');
  fs.mkdirSync(cfgDir);
  fs.writeFileSync(path.join(cfgDir, 'services.yaml'), `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: web, namespace: test }
spec:
  hosts: [web.test.local]
  ports: [{ number: ${servicePort}, name: http, protocol: HTTP }]
  endpoints: [{ address: 127.0.0.1, ports: { http: ${backend.port} } }]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: zipkin, namespace: istio-system }
spec:
  hosts: [zipkin.istio-system.svc.cluster.local]
  ports: [{ number: ${zipkinPort}, name: http, protocol: HTTP }]
  endpoints: [{ address: 127.0.0.1, ports: { http: ${collector.port} } }]
`);
  const meshFile = path.join(dir.path, 'mesh.yaml');
  fs.writeFileSync(meshFile, `defaultProviders: { tracing: [zipkin] }
extensionProviders:
- name: zipkin
  zipkin: { service: zipkin.istio-system.svc.cluster.local, port: ${zipkinPort} }
defaultConfig:
  tracing: { sampling: 100 }
`);
  try {
    await agent.start({
      args: ['proxy', 'sidecar', '--standalone', cfgDir, '--meshConfig', meshFile],
      proxyConfig: { parentShutdownDuration: undefined },
      env: { POD_NAME: 'web-client' },
    });
    const get = async () => {
      const r = await httpRequest(`http://127.0.0.1:${servicePort}/traced`, { headers: { host: 'web.test.local' } });
      if (r.status !== 200) throw new Error(`status ${r.status}`);
      return JSON.parse(r.body) as Record<string, string>;
    };
    const seen = await waitFor('the route to the backend', () => get().catch(() => undefined), 15_000, 200);
    assert.ok(seen['x-b3-traceid'], 'the backend sees a B3 trace id');
    assert.is(seen['x-b3-sampled'], '1', 'sampling 100 from the mesh file\'s defaultConfig');
    // Envoy's zipkin tracer flushes every 5 spans or 5 s.
    for (let i = 0; i < 5; i++) await get();
    const span = await waitFor('spans at the collector', () => spans.find((s) => String((s.tags as Record<string, string> | undefined)?.['http.url'] ?? '').includes('/traced')), 15_000, 200);
    assert.is((span.tags as Record<string, string>)['istio.namespace'], 'test');
  } finally {
    collector.server.close();
    backend.server.close();
    await agent.close();
  }
});

/** Runs `pilot-agent discovery --meshConfig <mesh text>` with an empty config dir; its exit code and output. */
async function discoveryWithMesh(meshText: string): Promise<{ code: number | null | string; out: string }> {
  const dir = tempDir('pa-discovery-mesh-');
  fs.writeFileSync(path.join(dir.path, 'mesh.yaml'), meshText);
  fs.mkdirSync(path.join(dir.path, 'config'));
  const proc = spawn(agentBin(), ['discovery', '--config-dir', path.join(dir.path, 'config'), '--grpc-addr', path.join(dir.path, 'xds.sock'), '--meshConfig', path.join(dir.path, 'mesh.yaml')], { stdio: ['ignore', 'pipe', 'pipe'] });
  const exited = new Promise<number | null>((r) => proc.once('exit', (c) => r(c)));
  let out = '';
  proc.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  proc.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  try {
    let timer: NodeJS.Timeout | undefined;
    const code = await Promise.race([exited, new Promise<string>((r) => (timer = setTimeout(() => r('still running'), 20_000)))]);
    clearTimeout(timer);
    return { code, out };
  } finally {
    // A server that did not read the mesh file runs until told to stop.
    if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
    await exited;
    dir.cleanup();
  }
}

test('discovery --meshConfig: the mesh file\'s tracing is read; a bad provider reference or bad YAML stops it with the file named', async () => {
  const bad = await discoveryWithMesh('defaultProviders: { tracing: [missing] }\n');
  assert.is(bad.code, 1, bad.out);
  assert.match(bad.out, /mesh\.yaml: defaultProviders\.tracing\[0\]: names no entry of extensionProviders/);
  const malformed = await discoveryWithMesh('enableTracing: [\n');
  assert.is(malformed.code, 1, malformed.out);
  assert.match(malformed.out, /mesh config \S*mesh\.yaml: /);
});

test.run();
