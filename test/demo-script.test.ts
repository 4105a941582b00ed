// scripts/demo.sh as a newcomer runs it, with every port moved (DEMO_*_PORT) so it can run beside anything:
// the example routes through the real Envoy, and Ctrl-C leaves no process and no temporary directory behind.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { agentBin } from './helpers/agent';
import { REPO, envoyBin, freePort, httpRequest, tempDir, waitFor } from './helpers/harness';

const refused = (port: number) =>
  new Promise<boolean>((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    s.once('connect', () => (s.destroy(), resolve(false)));
    s.once('error', () => resolve(true));
  });

function groupAlive(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return true;
  } catch {
    return false;
  }
}

test('demo.sh with every port moved routes the example, and Ctrl-C leaves no process and no temp dir', async () => {
  agentBin();
  const tmp = tempDir('pa-demo-tmp-');
  const ports = {
    DEMO_PORT: await freePort(), DEMO_V1_PORT: await freePort(), DEMO_V2_PORT: await freePort(), DEMO_GATEWAY_PORT: await freePort(),
    DEMO_ADMIN_PORT: await freePort(), DEMO_STATUS_PORT: await freePort(), DEMO_ENVOY_STATUS_PORT: await freePort(), DEMO_PROMETHEUS_PORT: await freePort(),
  };
  const env: Record<string, string> = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: process.env.HOME ?? '/', ENVOY_BIN: envoyBin(), TMPDIR: tmp.path };
  for (const [k, v] of Object.entries(ports)) env[k] = String(v);
  // Its own process group, as a terminal gives it, so that Ctrl-C (SIGINT to the group) can be played.
  const demo = spawn('bash', [path.join(REPO, 'scripts/demo.sh')], { cwd: REPO, env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  demo.stdout!.on('data', (c: Buffer) => (out += c.toString()));
  demo.stderr!.on('data', (c: Buffer) => (out += c.toString()));
  const exited = new Promise<number | null>((r) => demo.once('exit', (code) => r(code)));
  try {
    const url = `http://127.0.0.1:${ports.DEMO_PORT}/`;
    await waitFor('the demo to serve', async () => /^v[12] \//.test((await httpRequest(url).catch(() => ({ body: '' }))).body), 60_000)
      .catch((e: Error) => { throw new Error(`${e.message}\n${out}`); });
    assert.match((await httpRequest(url, { headers: { 'x-version': 'v2' } })).body, /^v2 \//);
    assert.match((await httpRequest(`http://127.0.0.1:${ports.DEMO_PORT}/v1/hello`)).body, /^v1 \/hello/);
    await waitFor('the agent ready on the moved status port', async () => (await httpRequest(`http://127.0.0.1:${ports.DEMO_STATUS_PORT}/healthz/ready`)).status === 200, 30_000);
    assert.is(fs.readdirSync(tmp.path).filter((n) => n.startsWith('pilot-agent-demo.')).length, 1, 'one working directory while it runs');
  } finally {
    if (groupAlive(demo.pid!)) process.kill(-demo.pid!, 'SIGINT');
    await waitFor('the demo to end', () => exited.then(() => true), 30_000).catch(() => process.kill(-demo.pid!, 'SIGKILL'));
    await waitFor('every demo process gone', () => !groupAlive(demo.pid!), 15_000).catch(() => process.kill(-demo.pid!, 'SIGKILL'));
  }
  const left = fs.readdirSync(tmp.path);
  tmp.cleanup();
  assert.equal(left, [], 'no temporary directory left');
  for (const p of [ports.DEMO_PORT, ports.DEMO_V1_PORT, ports.DEMO_V2_PORT, ports.DEMO_STATUS_PORT, ports.DEMO_ADMIN_PORT]) assert.ok(await refused(p), `port ${p} closed`);
});

test('demo.sh refuses a port that is not a number', async () => {
  const r = await new Promise<{ code: number | null; err: string }>((resolve) => {
    const p = spawn('bash', [path.join(REPO, 'scripts/demo.sh')], { cwd: REPO, env: { PATH: process.env.PATH ?? '', DEMO_PORT: '80a' }, stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    p.stderr!.on('data', (c: Buffer) => (err += c.toString()));
    p.once('exit', (code) => resolve({ code, err }));
  });
  assert.is(r.code, 2);
  assert.match(r.err, /demo: port "80a" is not a number in 1-65535/);
});

test.run();
