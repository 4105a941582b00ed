// An Envoy that cannot start is a start-up error, said once and plainly; failures are explained by Envoy's own
// line. Real agent executable, real Envoy (or a small wrapper around it that misbehaves on purpose).

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { debugEpochs, waitLiveEpoch, type RunningAgent } from './helpers/agent';
import { agentFixture } from './helpers/agent-fixture';
import { envoyBin, freePort, pidAlive, waitFor, type TempDir } from './helpers/harness';
import { staticBootstrap } from './helpers/static-bootstrap';

interface Run {
  dir: TempDir;
  agent: RunningAgent;
  ports: { admin: number; status: number; listen: number };
  cleanup(): Promise<void>;
}

async function run(opts: { binary?: (dir: string) => string; listen?: number; env?: Record<string, string> } = {}): Promise<Run> {
  const fixture = await agentFixture({ prefix: 'pa-start-' });
  const { dir } = fixture;
  const ports = { admin: fixture.ports.admin, status: fixture.ports.status, listen: opts.listen ?? (await freePort()) };
  const custom = path.join(dir.path, 'custom.json');
  fs.writeFileSync(custom, JSON.stringify(staticBootstrap(ports, 'up')));
  await fixture.start({
    proxyConfig: { ...(opts.binary ? { binaryPath: opts.binary(dir.path) } : {}), customConfigFile: custom },
    env: { POD_NAME: 'start', ...opts.env },
    ready: 'none',
  });
  // SIGKILL at once: some of these Envoys are scripts that would not drain.
  const cleanup = () => fixture.close(0);
  return { dir, agent: fixture.agent, ports, cleanup };
}

function script(dir: string, body: string): string {
  const f = path.join(dir, 'envoy');
  fs.writeFileSync(f, `#!/bin/sh\n${body}\n`, { mode: 0o755 });
  return f;
}

const count = (text: string, re: RegExp) => (text.match(new RegExp(re.source, 'g')) ?? []).length;

test('a binary that exits 0 at once is a start-up error: exit 1 after a second try, not ten restarts', async () => {
  const r = await run({ binary: (d) => script(d, 'exit 0') });
  try {
    const exit = await waitFor('agent exit', () => r.agent.exited, 30_000);
    assert.is(exit.code, 1, r.agent.log());
    assert.is(count(r.agent.log(), /epoch 0 started/), 2, r.agent.log());
    assert.match(r.agent.log(), /agent exiting with code 1: Envoy cannot start: Envoy epoch 0 exited \(code 0\) before it ever went live \(no output\)/);
  } finally {
    await r.cleanup();
  }
});

test('a listener port that is taken is a start-up error naming Envoy\'s bind error; no shared memory is left', async () => {
  const blocker = net.createServer();
  const port = await freePort();
  await new Promise<void>((res) => blocker.listen(port, '127.0.0.1', () => res()));
  // The real Envoy, noting the base id it chose each time (these epochs fail before the agent may read it).
  let ids = '';
  const r = await run({
    listen: port,
    binary: (d) => {
      ids = path.join(d, 'ids');
      return script(d, `p=; prev=; for a in "$@"; do [ "$prev" = --base-id-path ] && p="$a"; prev="$a"; done\n${envoyBin()} "$@"; rc=$?\n[ -n "$p" ] && cat "$p" >> ${ids} 2>/dev/null; echo >> ${ids}\nexit $rc`);
    },
  });
  try {
    const exit = await waitFor('agent exit', () => r.agent.exited, 30_000);
    assert.is(exit.code, 1, r.agent.log());
    assert.is(count(r.agent.log(), /epoch 0 started/), 2, r.agent.log().split('\n').filter((l) => /supervisor/.test(l)).join('\n'));
    assert.match(r.agent.log(), /agent exiting with code 1: Envoy cannot start: .*before it ever went live: .*(cannot bind|[Aa]ddress already in use)/);
    const chosen = fs.readFileSync(ids, 'utf8').split(/\s+/).filter(Boolean).map(Number);
    assert.is(chosen.length, 2, `both epochs chose a base id: ${chosen.join(' ')}`);
    for (const id of chosen) assert.not.ok(fs.existsSync(`/dev/shm/envoy_shared_memory_${id * 10}`), `segment of base id ${id} removed`);
  } finally {
    await r.cleanup();
    blocker.close();
  }
});

test('a status port that is taken ends the start before Envoy is spawned, naming the port and where it came from', async () => {
  const fixture = await agentFixture({ prefix: 'pa-start-' });
  const blocker = net.createServer();
  await new Promise<void>((res) => blocker.listen(fixture.ports.status, () => res()));
  const spawned = path.join(fixture.dir.path, 'spawned');
  try {
    await fixture.start({
      proxyConfig: { binaryPath: script(fixture.dir.path, `echo "$*" >> ${spawned}\nexec ${envoyBin()} "$@"`) },
      ready: 'none',
    });
    const exit = await waitFor('agent exit', () => fixture.exited, 30_000);
    assert.is(exit.code, 1, fixture.log());
    assert.match(fixture.log(), new RegExp(`cannot listen on status port ${fixture.ports.status} \\(statusPort from [^)]+\\): .*EADDRINUSE`));
    assert.not.ok(fs.existsSync(spawned), `Envoy was never run: ${fs.existsSync(spawned) ? fs.readFileSync(spawned, 'utf8') : ''}`);
  } finally {
    await fixture.close(0);
    blocker.close();
  }
});

test('a program that is not Envoy is reported as a binary that cannot run, not as a bootstrap Envoy rejects', async () => {
  const r = await run({ binary: (d) => script(d, 'echo "usage: something else" >&2; exit 1') });
  try {
    const exit = await waitFor('agent exit', () => r.agent.exited, 30_000);
    assert.is(exit.code, 1);
    assert.match(r.agent.log(), /invalid binaryPath .*: cannot run .*envoy as Envoy: `--mode validate` exited with code 1 \(usage: something else\)/);
    assert.not.match(r.agent.log(), /rejects the bootstrap/);
  } finally {
    await r.cleanup();
  }
});

test('an Envoy that goes live only at its second start does not report that as a start-up time', async () => {
  // Fails its first real start (not the validation run), then is the real Envoy.
  const r = await run({ binary: (d) => script(d, `case "$*" in *validate*) exec ${envoyBin()} "$@";; esac\n[ -e ${d}/tried ] || { touch ${d}/tried; exit 3; }\nexec ${envoyBin()} "$@"`) });
  try {
    await waitLiveEpoch(r.ports.status, 0, 30_000).catch((e: Error) => { throw new Error(`${e.message}\n${r.agent.log()}`); });
    assert.match(r.agent.log(), /trying once more/);
    assert.match(r.agent.log(), /Envoy is live \d+ ms after the agent started, at its 2nd start \(the earlier ones failed\)/);
  } finally {
    await r.cleanup();
  }
});

test('a new epoch that panics is reported by its panic line, not a backtrace address', async () => {
  const r = await run({ env: { ENVOY_RESTART_INITIAL_BACKOFF: '50ms' } });
  try {
    await waitLiveEpoch(r.ports.status, 0, 30_000).catch((e: Error) => { throw new Error(`${e.message}\n${r.agent.log()}`); });
    const { baseId } = await debugEpochs(r.ports.status);
    // What a second agent on the same configPath used to do: take the serving Envoy's shared memory away.
    fs.rmSync(`/dev/shm/envoy_shared_memory_${baseId! * 10}`);
    r.agent.proc.kill('SIGHUP');
    const reason = await waitFor('a failure reported', async () => (await debugEpochs(r.ports.status)).lastFailure?.reason, 30_000);
    assert.match(reason, /new epoch 1 exited \(signal SIGABRT\) before it went live; epoch 0 keeps serving: panic: cannot open shared memory region/);
    assert.not.match(reason, /0x[0-9a-f]+\]/);
  } finally {
    await r.cleanup();
  }
});

test('SIGTERM at any moment of start-up: the agent exits, Envoy is gone, no socket is left behind', async () => {
  // Envoy is spawned before gRPC and the servers load, with its sockets bound first: a signal in between must
  // neither be lost (Node drops a signal whose listener was replaced) nor leave sockets or an Envoy behind.
  for (let delay = 0; delay <= 300; delay += 10) {
    let pids = '';
    const r = await run({ binary: (d) => ((pids = path.join(d, 'pids')), script(d, `echo $$ >> ${path.join(d, 'pids')}\nexec ${envoyBin()} "$@"`)) });
    try {
      await new Promise((res) => setTimeout(res, delay));
      r.agent.proc.kill('SIGTERM');
      const exit = await waitFor(`agent exit after SIGTERM at ${delay} ms`, () => r.agent.exited, 15_000);
      // Before `proxy` starts (Node and the parser loading) the signal's default action ends the process.
      assert.ok(exit.code === 0 || exit.signal === 'SIGTERM', `SIGTERM at ${delay} ms: ${JSON.stringify(exit)}\n${r.agent.log()}`);
      const envoys = fs.existsSync(pids) ? fs.readFileSync(pids, 'utf8').split(/\s+/).filter(Boolean).map(Number) : [];
      await waitFor('Envoy gone', () => envoys.every((p) => !pidAlive(p)), 5_000);
      // Sockets exist only once `proxy` has started, and then the signal is handled: none may be left either way.
      const sockets = [path.join(r.dir.path, 'proxy', 'XDS'), path.join(r.dir.path, 'var/run/secrets/workload-spiffe-uds/socket')].filter((f) => fs.existsSync(f));
      assert.equal(sockets, [], `SIGTERM at ${delay} ms (${JSON.stringify(exit)}) left sockets\n${r.agent.log()}`);
    } finally {
      await r.cleanup();
    }
  }
});

test.run();
