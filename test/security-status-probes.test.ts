// Issue 20 item 6: app probes run from 127.0.0.6 and hand the app's answer to whoever called the status port, who
// may be on another host. An app that redirects its probe to the agent's or Envoy's own ports must not give that
// caller a loopback-only page: the redirect is not followed, and 127.0.0.6 is no local admin on the status port.

import * as fs from 'node:fs';
import * as http from 'node:http';
import type * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { AppProbes, type AppProber } from '../lib/app-probe';
import { configureLogging, resetLogging } from '../lib/log';
import { StatusServer } from '../lib/status-server';
import { agentFixture } from './helpers/agent-fixture';
import { freePort, httpRequest, waitFor } from './helpers/harness';

const SECRET = 'loopback-only-debug-page';
const listen = (s: net.Server, host: string): Promise<number> => new Promise((r) => s.listen(0, host, () => r((s.address() as net.AddressInfo).port)));

let status: StatusServer;
let probes: AppProbes;
let app: http.Server;
let admin: http.Server;
let adminPort: number;
let appPort: number;
let ext: string;
const lines: string[] = [];

test.before(async () => {
  configureLogging({ write: (l) => lines.push(l) });
  const addr = Object.values(os.networkInterfaces()).flat().find((i) => i && i.family === 'IPv4' && !i.internal);
  assert.ok(addr, 'this test needs a non-loopback IPv4 address to call from');
  ext = addr!.address;
  // Stands in for Envoy's admin: answers anyone who reaches it on loopback.
  admin = http.createServer((_req, res) => res.end(`${SECRET} (admin)`));
  adminPort = await listen(admin, '127.0.0.1');
  // All interfaces: the remote caller comes in on the non-loopback address.
  status = new StatusServer({ port: 0, host: '0.0.0.0' });
  status.route('GET', '/debug/certs', () => ({ status: 200, body: SECRET }));
  await status.start();
  app = http.createServer((req, res) => {
    const to: Record<string, string> = {
      '/to-status': `http://127.0.0.1:${status.port}/debug/certs`,
      '/to-admin': `http://127.0.0.1:${adminPort}/config_dump`,
      '/to-self': `http://127.0.0.1:${appPort}/healthy`,
    };
    if (to[req.url!]) res.writeHead(302, { location: to[req.url!] }).end();
    else res.end('app is fine');
  });
  appPort = await listen(app, '127.0.0.1');
  const get = (path: string): AppProber => ({ httpGet: { path, port: appPort, scheme: 'http', httpHeaders: [] }, timeoutSeconds: 2 });
  probes = new AppProbes({
    probers: new Map([
      ['/app-health/web/livez', get('/to-status')],
      ['/app-health/web/readyz', get('/to-admin')],
      ['/app-health/web/startupz', get('/to-self')],
    ]),
    destination: '127.0.0.1',
    statusPort: status.port,
    ownPorts: [adminPort],
  });
  status.addRoutes(probes.routes());
  await probes.start();
});

test.after(async () => {
  await probes.close();
  await status.close();
  await new Promise((r) => app.close(r));
  await new Promise((r) => admin.close(r));
  resetLogging();
});

test('a remote caller probing an app that redirects to the status port gets no debug page', async () => {
  const r = await httpRequest(`http://${ext}:${status.port}/app-health/web/livez`);
  assert.not.match(r.body, new RegExp(SECRET));
  assert.is(r.status, 200, 'a redirect not followed counts as kubelet counts one');
  assert.ok(lines.some((l) => l.includes('/app-health/web/livez') && l.includes('not followed')), lines.join('\n'));
});

test('nor one that redirects to another of the agent\'s or Envoy\'s ports (admin)', async () => {
  const r = await httpRequest(`http://${ext}:${status.port}/app-health/web/readyz`);
  assert.not.match(r.body, new RegExp(SECRET));
});

test('redirects within the app are still followed', async () => {
  const r = await httpRequest(`http://${ext}:${status.port}/app-health/web/startupz`);
  assert.is(r.status, 200);
  assert.is(r.body, 'app is fine');
});

test('127.0.0.6, where probes come from, is not a local admin on the status port; 127.0.0.1 is', async () => {
  const from = (localAddress: string) => new Promise<number>((resolve, reject) => {
    http.get({ host: '127.0.0.1', port: status.port, path: '/debug/certs', localAddress, agent: false }, (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    }).on('error', reject);
  });
  assert.is(await from('127.0.0.6'), 403);
  assert.is(await from('127.0.0.1'), 200);
});

test('the real agent: a remote caller probing an app that redirects to Envoy\'s admin or the status port gets neither', async () => {
  const agent = await agentFixture({ prefix: 'pa-sec-probe-' });
  const { dir, ports: { status: statusPort, admin: adminPort } } = agent;
  fs.mkdirSync(path.join(dir.path, 'mesh'));
  const appPort2 = await freePort();
  const redirector = http.createServer((req, res) => {
    const to = req.url === '/admin' ? `http://127.0.0.1:${adminPort}/config_dump` : `http://127.0.0.1:${statusPort}/debug/epochs`;
    res.writeHead(302, { location: to }).end();
  });
  await new Promise<void>((r) => redirector.listen(appPort2, '127.0.0.1', () => r()));
  const probe = (p: string) => ({ httpGet: { path: p, port: appPort2 }, timeoutSeconds: 2 });
  try {
    await agent.start({
      args: ['proxy', 'sidecar', '--standalone', path.join(dir.path, 'mesh')],
      env: {
        POD_NAME: 'web-1',
        ISTIO_KUBE_APP_PROBERS: JSON.stringify({ '/app-health/web/livez': probe('/admin'), '/app-health/web/readyz': probe('/status') }),
      },
      ready: async () => (await httpRequest(`http://127.0.0.1:${adminPort}/config_dump`).catch(() => undefined))?.status === 200,
    });
    const own = await waitFor('the status port', () => httpRequest(`http://127.0.0.1:${statusPort}/debug/epochs`).catch(() => undefined), 30_000, 200);
    assert.match(own.body, /epochs/, 'the page exists for the owner');
    const admin = await httpRequest(`http://${ext}:${statusPort}/app-health/web/livez`);
    assert.not.match(admin.body, /configs|bootstrap/, 'Envoy\'s config_dump reached a remote caller');
    const epochs = await httpRequest(`http://${ext}:${statusPort}/app-health/web/readyz`);
    assert.not.match(epochs.body, /epochs/, 'the agent\'s /debug/epochs reached a remote caller');
  } finally {
    await new Promise((r) => redirector.close(r));
    await agent.close();
  }
});

test.run();
