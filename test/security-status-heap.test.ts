// Issue 20 item 1: the status port's /debug/pprof/heap answers every local uid, so it must hold no memory contents.
// A standalone agent whose embedded CA has issued the workload's certificate (to a real Envoy, over SDS) holds two private keys (the CA's root
// key, the workload key); uid 65534 asks for the heap profile and finds neither, and parallel requests are bounded:
// one profile runs, the others are refused at once instead of piling up snapshots.

import { execFile } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { agentFixture } from './helpers/agent-fixture';
import { freePort, httpRequest, waitFor } from './helpers/harness';
import { startSdsEnvoy } from './helpers/sds-envoy';

/** curl as uid/gid 65534: the status code and the body. */
function curlAsNobody(url: string): Promise<{ status: number; body: Buffer; at: number }> {
  return new Promise((resolve, reject) => {
    const args = ['--reuid=65534', '--regid=65534', '--clear-groups', 'curl', '-s', '--max-time', '60', '-w', '\n%{http_code}', url];
    execFile('setpriv', args, { encoding: 'buffer', maxBuffer: 512 * 1024 * 1024 }, (err, stdout) => {
      if (err) return reject(err);
      const nl = stdout.lastIndexOf(0x0a);
      resolve({ status: Number(stdout.subarray(nl + 1).toString()), body: stdout.subarray(0, nl), at: Date.now() });
    });
  });
}

test('uid 65534 gets an allocation profile from /debug/pprof/heap, never a key; parallel profiles are refused, not stacked', async () => {
  const agent = await agentFixture({ prefix: 'pa-sec-heap-' });
  const { dir, ports: { status } } = agent;
  const cfgDir = path.join(dir.path, 'mesh');
  agent.writeTokens(cfgDir, { web: 'web-bootstrap-token' }, 'web', 0o600);
  let envoy: Awaited<ReturnType<typeof startSdsEnvoy>> | undefined;
  try {
    const base = `http://127.0.0.1:${status}`;
    await agent.start({ args: ['proxy', 'sidecar', '--standalone', cfgDir], env: { POD_NAME: 'web-1', SERVICE_ACCOUNT: 'web' } });
    // An Envoy asking for the workload certificate over SDS: from then on the agent holds its key.
    envoy = await startSdsEnvoy({ sdsSocket: path.join(dir.path, 'var/run/secrets/workload-spiffe-uds/socket'), inbound: { port: await freePort(), backendPort: await freePort() } });
    await waitFor('the workload certificate', async () => JSON.parse((await httpRequest(`${base}/debug/certs`)).body).certificate, 20_000, 200);
    // The root key's base64 lines: any one of them in a profile is key material.
    const rootKeyLines = fs.readFileSync(path.join(cfgDir, 'ca', 'root-key.pem'), 'utf8').split('\n').filter((l) => l.length >= 40 && !l.startsWith('-----'));
    assert.ok(rootKeyLines.length > 0);

    const heap = await curlAsNobody(`${base}/debug/pprof/heap?seconds=1`);
    assert.is(heap.status, 200, heap.body.toString().slice(0, 300));
    const text = heap.body.toString('latin1');
    assert.not.match(text, /PRIVATE KEY/);
    for (const l of rootKeyLines) assert.not.ok(text.includes(l), 'a line of the CA root key is in the heap profile');
    const profile = JSON.parse(text) as { head: { callFrame: { functionName: string } }; samples: unknown[] };
    assert.ok(profile.head && Array.isArray(profile.samples), 'a V8 sampling heap profile');

    // Full snapshots are off unless the operator turns them on.
    const snap = await curlAsNobody(`${base}/debug/pprof/heapsnapshot`);
    assert.is(snap.status, 403);
    assert.not.match(snap.body.toString('latin1'), /PRIVATE KEY/);

    // Four at once: one profile runs, three are refused before it ends.
    const four = await Promise.all([1, 2, 3, 4].map(() => curlAsNobody(`${base}/debug/pprof/heap?seconds=2`)));
    const ok = four.filter((r) => r.status === 200);
    const refused = four.filter((r) => r.status === 429);
    assert.is(ok.length, 1, `statuses: ${four.map((r) => r.status).join(', ')}`);
    assert.is(refused.length, 3, `statuses: ${four.map((r) => r.status).join(', ')}`);
    assert.ok(refused.every((r) => r.at < ok[0]!.at), 'the refusals come before the running profile ends');
    for (const r of four) assert.not.match(r.body.toString('latin1'), /PRIVATE KEY/);
  } finally {
    await envoy?.stop();
    await agent.close();
  }
});

test.run();
