// Config changes reach a real Envoy while it serves load: a route edit, an endpoint removal, an invalid file
// (nothing changes), and a service port that is already taken on the host (reported, the rest served).

import * as net from 'node:net';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { configureLogging, resetLogging } from '../lib/log';
import { fetchText } from './helpers/discovery-envoy';
import { destinationRule, HOST, serviceEntry, type Stack, startStack, virtualService } from './helpers/discovery-fixtures';
import { freePort, sleep, waitFor } from './helpers/harness';
import { startLoad } from './helpers/load';

let stack: Stack;
const logLines: string[] = [];

test.before(async () => {
  configureLogging({ write: (l) => logLines.push(l) });
  stack = await startStack(['v1', 'v2'], ({ servicePort, backends }) => ({
    'service.yaml': serviceEntry(servicePort, [{ port: backends.v1!.port, version: 'v1' }, { port: backends.v2!.port, version: 'v2' }]),
    'dr.yaml': destinationRule(['v1', 'v2']),
    'vs.yaml': virtualService({ v1: 100 }),
  }));
  await stack.addEnvoy('sidecar', true);
  await waitFor('the sidecar to serve v1', async () => (await fetchText(url())) === 'v1');
});

test.after(async () => {
  resetLogging();
  await stack?.stop();
});

const url = (p = '/') => `http://127.0.0.1:${stack.servicePort}${p}`;

/** Waits until the server has pushed and then stayed on one version for a while (files read, debounce over). */
async function settle(): Promise<void> {
  let last = '';
  let since = Date.now();
  await waitFor('the config to settle', () => {
    const v = stack.server.status().version;
    if (v !== last) {
      last = v;
      since = Date.now();
    }
    return Date.now() - since > 400;
  }, 10_000, 50);
}

test('editing a VirtualService reaches Envoy while load runs, with zero failed requests', async () => {
  const load = startLoad({ url: url(), concurrency: 4, countBodies: true });
  try {
    await waitFor('load to start', () => load.snapshot().ok > 50);
    const before = stack.server.status().version;
    const t0 = Date.now();
    stack.write('vs.yaml', virtualService({ v2: 100 }));
    await waitFor('v2 to be served', () => (load.snapshot().bodies.v2 ?? 0) > 0, 5000, 5);
    const ms = Date.now() - t0;
    assert.is.not(stack.server.status().version, before);
    // Behaviour, not timing, is asserted; the benchmark measures it. Logged for the curious.
    logLines.push(`edit reached Envoy after ${ms} ms`);
    await sleep(200);
  } finally {
    const r = await load.stop();
    assert.is(r.failed, 0, r.errors.join('\n'));
  }
  for (let i = 0; i < 20; i++) assert.is(await fetchText(url()), 'v2');
});

test('removing an endpoint stops traffic to it, with zero failed requests', async () => {
  stack.write('vs.yaml', virtualService({ v1: 50, v2: 50 }));
  // Route to the service itself (all endpoints) by pinning a header route to the default cluster.
  stack.write('vs.yaml', `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: web, namespace: test}
spec:
  hosts: [${HOST}]
  http:
  - route:
    - destination: {host: ${HOST}}
`);
  await waitFor('both endpoints to serve', async () => {
    const seen = new Set<string>();
    for (let i = 0; i < 10; i++) seen.add(await fetchText(url()));
    return seen.has('v1') && seen.has('v2');
  });
  const load = startLoad({ url: url(), concurrency: 4, countBodies: true });
  let r;
  try {
    await waitFor('load to start', () => load.snapshot().ok > 50);
    stack.write('service.yaml', serviceEntry(stack.servicePort, [{ port: stack.backends.v1!.port, version: 'v1' }]));
    // Once v2's count stays flat for a while, the endpoint is gone from Envoy.
    let last = -1;
    await waitFor('v2 to stop receiving traffic', async () => {
      const now = stack.backends.v2!.requests;
      const still = now === last;
      last = now;
      return still;
    }, 5000, 300);
    const frozen = stack.backends.v2!.requests;
    const v1Before = stack.backends.v1!.requests;
    await sleep(300);
    assert.is(stack.backends.v2!.requests, frozen, 'no request reached the removed endpoint');
    assert.ok(stack.backends.v1!.requests > v1Before, 'traffic continued to the remaining endpoint');
  } finally {
    r = await load.stop();
  }
  assert.is(r.failed, 0, r.errors.join('\n'));
});

test('an invalid file changes nothing Envoy serves, and the error names the file and the field', async () => {
  stack.write('service.yaml', serviceEntry(stack.servicePort, [{ port: stack.backends.v1!.port, version: 'v1' }, { port: stack.backends.v2!.port, version: 'v2' }]));
  stack.write('vs.yaml', virtualService({ v1: 100 }));
  await settle();
  for (let i = 0; i < 5; i++) assert.is(await fetchText(url()), 'v1');
  const version = stack.server.status().version;
  const pushes = stack.server.status().pushes;
  logLines.length = 0;
  // Weights that do not add up, in a file that otherwise sends everything to v2.
  stack.write('vs.yaml', virtualService({ v1: 0, v2: 90 }));
  const line = await waitFor('the error to be logged', () => logLines.find((l) => l.includes('\terror\t') && l.includes('vs.yaml')), 5000);
  assert.match(line, /vs\.yaml:\d+:\d+: document 1 \(VirtualService test\/web\): field spec\.http\[0\]\.route: destination weights add up to 90, not 100/);
  // A route to a host nobody defines is a cross-file error: also rejected, also named.
  stack.write('vs.yaml', virtualService({ v1: 100 }).replace(`{host: ${HOST}, subset: v1}`, '{host: missing.test.local}'));
  const line2 = await waitFor('the reference error to be logged', () => logLines.find((l) => l.includes('route to unknown host')), 5000);
  assert.match(line2, /vs\.yaml:\d+:\d+: document 1 \(VirtualService test\/web\): field spec\.http\[0\]\.route\[0\]\.destination\.host/);
  await sleep(300);
  assert.is(stack.server.status().version, version, 'no push happened');
  assert.is(stack.server.status().pushes, pushes);
  assert.ok(stack.server.status().issues.length > 0);
  for (let i = 0; i < 20; i++) assert.is(await fetchText(url()), 'v1');
  stack.write('vs.yaml', virtualService({ v2: 100 }));
  await waitFor('the fixed file to apply', async () => (await fetchText(url())) === 'v2');
  assert.equal(stack.server.status().issues, []);
});

test('a service port already bound on the host is reported as a NACK; the other ports keep working', async () => {
  const taken = await freePort();
  const squatter = net.createServer();
  await new Promise<void>((r) => squatter.listen(taken, '127.0.0.1', () => r()));
  try {
    stack.write('other.yaml', serviceEntry(taken, [{ port: stack.backends.v1!.port, version: 'v1' }], 'other.test.local'));
    const listener = `127.0.0.1_${taken}`;
    const nack = await waitFor('the NACK', () => stack.server.status().nacks.find((n) => n.names.includes(listener)), 5000);
    assert.match(nack.detail, /bind|address already in use/i);
    assert.ok(logLines.some((l) => l.includes('\twarn\t') && l.includes(listener)), 'the rejection is logged');
    assert.is(await fetchText(url()), 'v2');
    // An unrelated change pushes listeners again; the rejected one is not sent again.
    stack.write('vs.yaml', virtualService({ v1: 100 }));
    await waitFor('v1', async () => (await fetchText(url())) === 'v1');
    await sleep(200);
    assert.is(stack.server.status().nacks.filter((n) => n.names.includes(listener)).length, 1);
  } finally {
    squatter.close();
  }
});

test.run();
