// The component shape and how the agent composes it: readiness with every reason, start order with rollback,
// the first component to end, and the status server's loopback-only debug pages.

import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import * as http from 'node:http';
import * as os from 'node:os';
import * as zlib from 'node:zlib';
import { closedSignal, closeAll, composeReadiness, firstToEnd, startAll, type Component, type Condition } from '../lib/component';
import { counterFrom, gaugeFrom, newRegistry } from '../lib/metrics';
import { StatusServer } from '../lib/status-server';
import { freePort, httpRequest } from './helpers/harness';

const t = suite('components');

function fake(name: string, opts: { failStart?: boolean; cond?: Condition | (() => Condition); log?: string[] } = {}): Component & { end(err?: Error): void } {
  const sig = closedSignal();
  return {
    name,
    closed: sig.closed,
    end: (err) => sig.resolve(err),
    start: async () => {
      if (opts.failStart) throw new Error(`${name} cannot start`);
      opts.log?.push(`start ${name}`);
    },
    close: async () => {
      opts.log?.push(`close ${name}`);
      sig.resolve();
    },
    readiness: opts.cond === undefined ? undefined : () => (typeof opts.cond === 'function' ? opts.cond() : opts.cond!),
  };
}

t('readiness is the conjunction of every condition, and the 503 body lists each unmet reason', async () => {
  const a = fake('a', { cond: { ready: true, reason: '' } });
  const b = fake('b', { cond: { ready: false, reason: 'no certificate yet' } });
  const c = fake('c', { cond: { ready: false, reason: 'no name table yet' } });
  const d = fake('d', { cond: () => { throw new Error('boom'); } });
  const none = fake('none');
  assert.equal(await composeReadiness([a, none]), { ready: true, reason: '' });
  const r = await composeReadiness([a, b, c, d, none]);
  assert.is(r.ready, false);
  assert.is(r.reason, 'no certificate yet\nno name table yet\nd: boom');
});

t('a component that fails to start closes those started before it, in reverse order', async () => {
  const log: string[] = [];
  const cs = [fake('one', { log }), fake('two', { log }), fake('three', { failStart: true, log }), fake('four', { log })];
  const err = await startAll(cs).then(() => undefined, (e: Error) => e);
  assert.match(err?.message ?? '', /three cannot start/);
  assert.equal(log, ['start one', 'start two', 'close two', 'close one']);
});

t('the first component to end is reported with its error; closeAll is reverse order and tolerates throws', async () => {
  const log: string[] = [];
  const a = fake('a', { log });
  const b = fake('b', { log });
  const bad: Component = { ...fake('bad'), close: async () => { log.push('close bad'); throw new Error('x'); } };
  setTimeout(() => b.end(new Error('socket gone')), 5);
  const first = await firstToEnd([a, b, bad]);
  assert.is(first.component.name, 'b');
  assert.is(first.err?.message, 'socket gone');
  await closeAll([a, bad, b]);
  assert.equal(log, ['close b', 'close bad', 'close a']);
  // closedSignal resolves once.
  const s = closedSignal();
  s.resolve(new Error('first'));
  s.resolve(new Error('second'));
  assert.is((await s.closed)?.message, 'first');
});

function nonLoopbackAddress(): string | undefined {
  for (const list of Object.values(os.networkInterfaces())) for (const a of list ?? []) if (!a.internal && a.family === 'IPv4') return a.address;
  return undefined;
}

t('status server: a registry given as a function is made at the first scrape, once; what it reads was kept meanwhile', async () => {
  let made = 0;
  let calls = 0;
  const port = await freePort();
  const s = new StatusServer({
    port,
    metrics: {
      registry: () => {
        made++;
        const r = newRegistry({ defaultMetrics: false });
        counterFrom(r, 'istio_agent_test_calls_total', 'calls counted before the registry existed', () => calls);
        return r;
      },
      sources: [],
    },
  });
  await s.start();
  try {
    calls = 3;
    assert.is(made, 0, 'not made before a scrape');
    assert.match((await httpRequest(`http://127.0.0.1:${port}/stats/prometheus`)).body, /^istio_agent_test_calls_total 3$/m);
    calls = 5;
    assert.match((await httpRequest(`http://127.0.0.1:${port}/metrics`)).body, /^istio_agent_test_calls_total 5$/m);
    assert.match((await httpRequest(`http://127.0.0.1:${port}/metrics`)).body, /^istio_agent_scrapes_total 3$/m);
    assert.is(made, 1);
  } finally {
    await s.close();
  }
});

t('status server: readiness body, merged metrics from the registry, /debug/ pages for loopback peers only', async () => {
  const registry = newRegistry();
  gaugeFrom(registry, 'istio_agent_test_value', 'a test gauge', () => 42);
  let ready = false;
  const port = await freePort();
  const s = new StatusServer({
    port,
    startedAt: Date.now() - 1500,
    readiness: async () => (ready ? { ready: true, reason: '' } : { ready: false, reason: 'Envoy is not live' }),
    metrics: { registry, sources: [{ name: 'envoy', type: 'envoy', scrape: async () => ({ ok: true, text: 'envoy_thing 1\n' }) }, { name: 'dead', type: 'application', scrape: () => Promise.reject(new Error('down')) }] },
  });
  s.addRoutes([{ method: 'GET', path: '/debug/thing', handler: () => ({ status: 200, body: 'secret\n' }) }]);
  await s.start();
  try {
    let r = await httpRequest(`http://127.0.0.1:${port}/healthz/ready`);
    assert.equal([r.status, r.body], [503, 'Envoy is not live\n']);
    ready = true;
    assert.is((await httpRequest(`http://127.0.0.1:${port}/healthz/ready`)).status, 200);
    const m = (await httpRequest(`http://127.0.0.1:${port}/stats/prometheus`)).body;
    assert.match(m, /^istio_agent_test_value 42$/m);
    assert.match(m, /^istio_agent_startup_duration_seconds 1\.\d+$/m, 'start to first readiness');
    assert.match(m, /^istio_agent_process_resident_memory_bytes \d+/m, 'process metrics under Go agent names');
    assert.match(m, /^envoy_thing 1$/m, 'Envoy text merged');
    assert.match(m, /^istio_agent_scrape_failures_total\{type="application"\} 1$/m, 'the dead source counted');
    const om = await httpRequest(`http://127.0.0.1:${port}/metrics`, { headers: { accept: 'application/openmetrics-text; version=1.0.0' } });
    assert.match(String(om.headers['content-type']), /openmetrics/);
    const gz = await new Promise<Buffer>((resolve, reject) => http.get({ host: '127.0.0.1', port, path: '/stats/prometheus', headers: { 'accept-encoding': 'gzip' } }, (res) => {
      assert.is(res.headers['content-encoding'], 'gzip');
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c)).on('end', () => resolve(Buffer.concat(chunks)));
    }).on('error', reject));
    assert.match(zlib.gunzipSync(gz).toString(), /^envoy_thing 1$/m, 'gzip when asked');
    assert.ok(om.body.endsWith('# EOF\n') && om.body.indexOf('# EOF') === om.body.length - 6, 'one # EOF, at the end');
    assert.is((await httpRequest(`http://127.0.0.1:${port}/debug/thing`)).status, 200);
    const ext = nonLoopbackAddress();
    if (ext) {
      r = await new Promise<typeof r>((resolve, reject) => {
        http.get({ host: ext, port, path: '/debug/thing', localAddress: ext }, (res) => {
          let body = '';
          res.on('data', (c) => (body += c));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body, headers: res.headers }));
        }).on('error', reject);
      });
      assert.is(r.status, 403, 'a /debug/ page refused to a non-loopback peer');
    }
  } finally {
    await s.close();
    await s.close();
  }
  assert.is(await s.closed, undefined);
});

t.run();
