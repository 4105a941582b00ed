// The two listeners the generated bootstrap opens on every address (Prometheus 15090 -> Envoy's admin, readiness
// 15021 -> the agent's status port) forward exactly one path each. Requests are written raw over a TCP socket,
// so no client normalises `..`, `%2e` or `//` away, against the real agent running the real Envoy with the
// generated bootstrap (standalone mode supplies the xDS config Envoy waits for before its listeners serve).

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { debugEpochs, waitLiveEpoch, type RunningAgent } from './helpers/agent';
import { agentFixture } from './helpers/agent-fixture';
import { httpRequest, pidAlive, waitFor, type TempDir } from './helpers/harness';

interface Raw {
  status: number;
  head: string;
  body: string;
  /** The router adds this to every response that came from an upstream; a direct response or a reject has none. */
  forwarded: boolean;
}

/** One request exactly as written (HTTP/1.1, Connection: close); resolves with the parsed status line and body. */
function raw(port: number, method: string, target: string): Promise<Raw> {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    s.setTimeout(10_000, () => s.destroy(new Error(`${method} ${target}: no answer in 10 s`)));
    s.on('connect', () => s.write(`${method} ${target} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: 0\r\n\r\n`));
    // Envoy keeps a connection it answered locally open for its delayed-close timeout (1 s): stop reading
    // once a response with a Content-Length is complete.
    s.on('data', (c: Buffer) => {
      chunks.push(c);
      const text = Buffer.concat(chunks).toString('latin1');
      const split = text.indexOf('\r\n\r\n');
      const len = split < 0 ? undefined : /^content-length:\s*(\d+)/im.exec(text.slice(0, split));
      if (len && text.length - split - 4 >= Number(len[1])) s.destroy();
    });
    s.on('error', reject);
    s.on('close', () => {
      const text = Buffer.concat(chunks).toString('latin1');
      const split = text.indexOf('\r\n\r\n');
      const head = split < 0 ? text : text.slice(0, split);
      const m = /^HTTP\/1\.1 (\d{3})/.exec(head);
      if (!m) return reject(new Error(`${method} ${target}: not an HTTP response: ${JSON.stringify(text.slice(0, 200))}`));
      resolve({ status: Number(m[1]), head, body: split < 0 ? '' : text.slice(split + 4), forwarded: /^x-envoy-upstream-service-time:/im.test(head) });
    });
  });
}

interface Setup {
  dir: TempDir;
  agent: RunningAgent;
  status: number;
  admin: number;
  prom: number;
  ready: number;
  cleanup(): Promise<void>;
}

async function startStandaloneAgent(): Promise<Setup> {
  const fixture = await agentFixture({ prefix: 'pa-public-' });
  const { dir, ports: { status, admin, prometheus: prom, envoyStatus: ready } } = fixture;
  const mesh = path.join(dir.path, 'mesh');
  fs.mkdirSync(mesh);
  const cleanup = () => fixture.close();
  try {
    await fixture.start({ args: ['proxy', 'sidecar', '--standalone', mesh], env: { POD_NAME: 'public', ENVOY_RESTART_INITIAL_BACKOFF: '100ms' } });
    await waitFor('Envoy serves its readiness listener', async () => (await raw(ready, 'GET', '/healthz/ready')).status === 200, 10_000)
      .catch(fixture.withLog);
  } catch (e) {
    await cleanup();
    throw e;
  }
  return { dir, agent: fixture.agent, status, admin, prom, ready, cleanup };
}

// Every admin endpoint Envoy 1.40 has, and what the agent serves on its status port.
const ADMIN = ['quitquitquit', 'config_dump', 'clusters', 'drain_listeners', 'drain_listeners?graceful', 'logging', 'logging?level=trace',
  'healthcheck/fail', 'healthcheck/ok', 'runtime_modify?x=1', 'runtime', 'reset_counters', 'cpuprofiler?enable=y', 'heapprofiler?enable=y',
  'heap_dump', 'listeners', 'memory', 'server_info', 'stats', 'stats?format=json', 'certs', 'hot_restart_version', 'init_dump', 'ready',
  'contention', 'tap', 'reopen_logs', 'help', 'stats/recentlookups', 'stats/recentlookups/enable', 'stats/prometheus/../quitquitquit', ''];
const AGENT = ['quitquitquit', 'drain', 'debug/epochs', 'debug/xds', 'debug/ndsz', 'stats/prometheus', 'metrics', 'app-health/x/livez'];

/** Ways of spelling "go up from the allowed path to X" that a client which does not normalise would send. */
function escapes(allowed: string, x: string): string[] {
  const depth = allowed.split('/').length - 1;
  const up = (seg: string) => Array(depth).fill(seg).join('/');
  return [
    `/${x}`,
    `//${x}`,
    `${allowed}/${up('..')}/${x}`,
    `${allowed}/${up('%2e%2e')}/${x}`,
    `${allowed}/${up('%2E%2e')}/${x}`,
    `${allowed}/${up('.%2e')}/${x}`,
    `${allowed}//${up('..')}/${x}`,
    `${allowed}%2F${up('..').replace(/\//g, '%2F')}%2F${x}`,
    `${allowed}%2f${up('..').replace(/\//g, '%2f')}%2f${x}`,
    `${allowed}%5C..%5C..%5C${x}`,
    `/${up('..')}/${x}`,
    `../${x}`,
    `${allowed}#/${up('..')}/${x}`,
    `${allowed};/${up('..')}/${x}`,
    `http://127.0.0.1${allowed}/${up('..')}/${x}`,
    `http://127.0.0.1/${x}`,
  ];
}

function answersAs(allowed: string | undefined, body: string): boolean {
  if (allowed === '/stats/prometheus') return /^# TYPE envoy_/m.test(body);
  if (allowed === '/healthz/ready') return body === '' || body === '0\r\n\r\n'; // the agent's empty 200
  return false;
}

async function assertBlocked(port: number, method: string, target: string, allowed?: string): Promise<void> {
  const r = await raw(port, method, target).catch((e: Error) => ({ status: 0, head: e.message, body: '', forwarded: false }));
  // Some spellings normalise to the allowed path itself (`P//../../ready` is `/healthz/ready`; Envoy strips a
  // fragment, as Istio's runtime keeps http_reject_path_with_fragment off): then the answer is that path's.
  if (r.forwarded && method === 'GET' && r.status === 200 && answersAs(allowed, r.body)) return;
  assert.not.ok(r.forwarded, `${method} ${target} on port ${port} was forwarded: ${r.status}\n${r.head}\n${r.body.slice(0, 300)}`);
  // Envoy answers 404 (no route), 405 (wrong method), 400 (escaped slash, bad target) or closes a malformed request.
  assert.ok([0, 400, 404, 405].includes(r.status), `${method} ${target} on port ${port}: unexpected ${r.status}\n${r.head}`);
}

test('no request through the public 15090 and 15021 listeners reaches any other admin or agent endpoint; the one path each still works', async () => {
  const s = await startStandaloneAgent();
  try {
    const before = await waitLiveEpoch(s.status, 0);

    // What must keep working: scrapes (with a query) and readiness probes, GET and HEAD.
    for (const target of ['/stats/prometheus', '/stats/prometheus?x', '/stats/prometheus?usedonly', '/stats/prometheus/./', '/stats/./prometheus']) {
      const r = await raw(s.prom, 'GET', target);
      if (target.endsWith('/')) {
        assert.not.ok(r.forwarded, `${target} is not the exact path`);
        continue;
      }
      assert.is(r.status, 200, `GET ${target}: ${r.head}`);
      assert.ok(r.forwarded);
      assert.match(r.body, /envoy_server_live|envoy_cluster_/, `GET ${target} returns Envoy's metrics`);
    }
    assert.is((await raw(s.prom, 'HEAD', '/stats/prometheus')).status, 200);
    assert.is((await raw(s.ready, 'GET', '/healthz/ready')).status, 200);
    assert.is((await raw(s.ready, 'HEAD', '/healthz/ready')).status, 200);
    assert.is((await raw(s.ready, 'GET', '/healthz/ready?x=1')).status, 200);

    // Other methods on the allowed paths.
    for (const m of ['POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS']) {
      assert.is((await raw(s.prom, m, '/stats/prometheus')).status, 405, `${m} /stats/prometheus`);
      assert.is((await raw(s.ready, m, '/healthz/ready')).status, 405, `${m} /healthz/ready`);
    }
    // Near misses of the allowed paths.
    for (const t of ['/stats/prometheus/extra', '/stats/prometheus/', '/stats/prometheusx', '/STATS/PROMETHEUS', '/stats', '/stats/prometheus%2Fextra']) {
      await assertBlocked(s.prom, 'GET', t);
    }
    for (const t of ['/healthz/ready/extra', '/healthz/ready/', '/healthz/readyx', '/healthz']) await assertBlocked(s.ready, 'GET', t);

    // Every admin endpoint through 15090 and 15021, every escape, both methods.
    for (const x of ADMIN) {
      for (const m of ['GET', 'POST']) {
        for (const t of escapes('/stats/prometheus', x)) await assertBlocked(s.prom, m, t, '/stats/prometheus');
        for (const t of escapes('/healthz/ready', x)) await assertBlocked(s.ready, m, t, '/healthz/ready');
      }
    }
    // The agent trusts loopback peers, which is what Envoy is: its lifecycle endpoints must be out of reach too.
    for (const x of AGENT) {
      for (const m of ['GET', 'POST']) {
        for (const t of escapes('/healthz/ready', x)) await assertBlocked(s.ready, m, t, '/healthz/ready');
        for (const t of escapes('/stats/prometheus', x)) await assertBlocked(s.prom, m, t, '/stats/prometheus');
      }
    }

    // The proof that nothing reached admin: the same Envoy is live, the agent never restarted it, and it serves.
    assert.ok(pidAlive(before.pid), 'Envoy is still running');
    assert.is(s.agent.proc.exitCode, null, 'the agent is still running');
    const d = await debugEpochs(s.status);
    assert.equal(d.epochs.map((e) => [e.epoch, e.pid, e.state]), [[0, before.pid, 'live']]);
    assert.is(d.restartBudgetLeft, 10);
    const info = JSON.parse((await httpRequest(`http://127.0.0.1:${s.admin}/server_info`)).body) as { state: string; command_line_options: { log_level: string } };
    assert.is(info.state, 'LIVE', 'not draining, not failing health checks');
    assert.is((await raw(s.prom, 'GET', '/stats/prometheus')).status, 200);
    assert.is((await httpRequest(`http://127.0.0.1:${s.status}/healthz/ready`)).status, 200);
    const logging = (await httpRequest(`http://127.0.0.1:${s.admin}/logging`, { method: 'POST' })).body;
    assert.not.match(logging, /: trace/, 'no log level was changed');
  } finally {
    await s.cleanup();
  }
});

test('an Envoy that exits 0 without the agent asking is restarted; the agent\'s own /quitquitquit ends it with 0', async () => {
  const s = await startStandaloneAgent();
  try {
    const first = await waitLiveEpoch(s.status, 0);
    // Someone on the host tells Envoy itself to quit: for a supervisor that keeps Envoy up, that is an outage.
    assert.is((await httpRequest(`http://127.0.0.1:${s.admin}/quitquitquit`, { method: 'POST' })).status, 200);
    await waitFor('Envoy exited', () => !pidAlive(first.pid), 10_000);
    const again = await waitFor('a new epoch live', async () => (await debugEpochs(s.status)).epochs.find((e) => e.state === 'live' && e.pid !== first.pid), 30_000)
      .catch((e: Error) => { throw new Error(`${e.message}\n${s.agent.log()}`); });
    assert.is(again.epoch, 0);
    assert.is(s.agent.proc.exitCode, null, 'the agent did not end');
    assert.match(s.agent.log(), /exited with code 0 without the agent asking/);
    const d = await debugEpochs(s.status);
    assert.is(d.restartBudgetLeft, 9, 'an unrequested exit spends the budget like a crash');
    await waitFor('ready again', async () => (await httpRequest(`http://127.0.0.1:${s.status}/healthz/ready`)).status === 200, 20_000);
    // The agent's own /quitquitquit is a request to end: exit 0.
    assert.is((await httpRequest(`http://127.0.0.1:${s.status}/quitquitquit`, { method: 'POST' })).status, 200);
    const exit = await waitFor('agent exit', () => s.agent.exited, 10_000);
    assert.is(exit.code, 0);
    assert.not.ok(pidAlive(again.pid));
  } finally {
    await s.cleanup();
  }
});

test.run();
