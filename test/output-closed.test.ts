// A serving agent whose log reader goes away (the pipe of `pilot-agent proxy ... | tee`, a log shipper that died)
// keeps serving and still shuts down in order: the Go agent dies on the broken pipe and leaves Envoy behind.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';
import { agentFixture } from './helpers/agent-fixture';
import { freePort, httpRequest, pidAlive, waitFor } from './helpers/harness';

function serviceYaml(servicePort: number, backendPort: number, body: string): string {
  return `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: web, namespace: test, labels: { body: ${body} } }
spec:
  hosts: [web.test.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{ number: ${servicePort}, name: http, protocol: HTTP }]
  endpoints: [{ address: 127.0.0.1, ports: { http: ${backendPort} } }]
`;
}

test('proxy keeps serving, hot-restarts and drains in order after its stdout and stderr readers close', async () => {
  const agent = await agentFixture({ prefix: 'pa-outclosed-' });
  const server = http.createServer((req, res) => {
    req.resume();
    res.end('ok');
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const backendPort = (server.address() as AddressInfo).port;
  const servicePort = await freePort();
  const cfgDir = path.join(agent.dir.path, 'mesh');
  fs.mkdirSync(cfgDir);
  fs.writeFileSync(path.join(cfgDir, 'web.yaml'), serviceYaml(servicePort, backendPort, 'a'));
  const url = `http://127.0.0.1:${servicePort}/`;
  const epochs = async () =>
    JSON.parse((await httpRequest(`http://127.0.0.1:${agent.ports.status}/debug/epochs`)).body) as {
      epochs: { epoch: number; state: string; pid: number }[];
    };
  try {
    const running = await agent.start({
      args: ['proxy', 'sidecar', '--standalone', cfgDir, '--log_output_level=default:debug'],
    });
    await waitFor('served through Envoy', async () => (await httpRequest(url)).body === 'ok', 10_000);
    const envoyPids = (await epochs()).epochs.map((e) => e.pid);

    // The reader goes away: every later write of the agent (and of Envoy, which shares its stdout) meets EPIPE.
    running.proc.stdout!.destroy();
    running.proc.stderr!.destroy();

    // Work that logs a lot: a config edit, then a hot restart.
    fs.writeFileSync(path.join(cfgDir, 'web.yaml'), serviceYaml(servicePort, backendPort, 'b'));
    running.proc.kill('SIGHUP');
    await waitFor('epoch 1 live after the readers closed', async () =>
      (await epochs()).epochs.some((e) => e.epoch === 1 && e.state === 'live'), 20_000);
    assert.is((await httpRequest(url)).body, 'ok');
    assert.is((await httpRequest(`http://127.0.0.1:${agent.ports.envoyStatus}/healthz/ready`)).status, 200);
    assert.ok(pidAlive(running.pid), 'the agent is still running');
    const allPids = [...envoyPids, ...(await epochs()).epochs.map((e) => e.pid)];

    running.proc.kill('SIGTERM');
    const end = await running.exited;
    assert.equal(end, { code: 0, signal: null }, 'an orderly exit after the drain');
    for (const pid of allPids) assert.not.ok(pidAlive(pid), `Envoy ${pid} is gone`);
  } finally {
    server.close();
    await agent.close();
  }
});

test.run();
