// Packaging, for real: the proxy image built from packaging/Dockerfile and run with podman, and the systemd unit
// installed by scripts/install-vm.sh into a container that boots systemd 252, with the real agent and Envoy.
// Settings that work on this machine kind (test/packaging/podman.ts, from the containers-and-systemd reference):
// runc, cgroupfs, the file events logger, nofile no higher than `ulimit -Hn`, overlay storage in a temp dir;
// --network=host only to build.
// Installs debootstrap, podman and runc with apt when missing. The bookworm root file system is cached in
// $PACKAGING_CACHE (default /var/tmp/pilot-agent-packaging); everything else (storage, containers) is removed.
// SKIP_PACKAGING_TESTS=1 skips them (for a developer's machine; CI never sets it).

import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { agentBin } from './helpers/agent';
import { REPO, envoyBin } from './helpers/harness';
import { cleanStaleRuns, installTools, MIN, newPodman, type Podman, type RunOptions, sleep, until } from './packaging/podman';

const SKIP = process.env.SKIP_PACKAGING_TESTS === '1';
const BASE = 'localhost/pilot-agent-base:bookworm';
const PROXY = 'localhost/pilot-agent-proxy:test';
const SYSTEMD = 'localhost/pilot-agent-systemd:test';
const PROXY_C = `pa-pkg-proxy-${process.pid}`;
const SD_C = `pa-pkg-systemd-${process.pid}`;
const t0 = Date.now();
const phases: string[] = [];

let p: Podman | undefined;
const run = (cmd: string, args: string[], o?: RunOptions) => p!.run(cmd, args, o);
const podman = (args: string[], o?: RunOptions) => p!.podman(args, o);
/** A command inside a running container. */
const inC = (c: string, args: string[], o?: RunOptions) => p!.inC(c, args, o);
const sh = (c: string, script: string, o?: RunOptions) => p!.sh(c, script, o);
const get = (c: string, url: string, ...hdrs: string[]) => inC(c, ['/opt/node/node', '/opt/test/get.js', url, ...hdrs], { ok: () => true }).out.trim();

function phase<T>(name: string, fn: () => T): T {
  const start = Date.now();
  try {
    return fn();
  } finally {
    phases.push(`${name} ${((Date.now() - start) / 1000).toFixed(1)} s`);
  }
}

const mounts = () => [
  '-v', `${REPO}:/opt/src:ro`, '-v', `${path.join(REPO, 'test/packaging')}:/opt/test:ro`,
  '-v', `${process.execPath}:/opt/node/node:ro`, '-v', `${envoyBin()}:/opt/envoy:ro`,
];

function newestLiveEpoch(c: string): number {
  const j = JSON.parse(inC(c, ['/usr/local/bin/pilot-agent', 'request', 'GET', '/debug/epochs', '--debug-port', '15020']).out);
  const live = (j.epochs as { epoch: number; state: string }[]).filter((e) => e.state === 'live').map((e) => e.epoch);
  return live.length ? Math.max(...live) : -1;
}

interface LoadStats {
  ok: number;
  failed: number;
  errors: Record<string, number>;
  lastOkAt: number;
  firstFailAt: number;
}
function startLoad(c: string, name: string): { stats(): LoadStats | undefined; stop(): Promise<LoadStats> } {
  const out = `/tmp/${name}.json`;
  const stopFile = `/tmp/${name}.stop`;
  sh(c, `rm -f ${out} ${stopFile}`);
  podman(['exec', '-d', c, '/opt/node/node', '/opt/test/load.js', 'http://127.0.0.1:8088/', 'backend.example.local', out, stopFile]);
  const stats = () => {
    const r = inC(c, ['cat', out], { ok: () => true });
    return r.code === 0 && r.out ? (JSON.parse(r.out) as LoadStats) : undefined;
  };
  return {
    stats,
    async stop() {
      inC(c, ['touch', stopFile]);
      // The generator writes its last figures once every request in flight has ended.
      await sleep(1500);
      return await until('the load generator to end', () => (inC(c, ['pgrep', '-f', '/opt/test/load.js'], { ok: () => true }).code === 1 ? stats() : undefined), MIN);
    },
  };
}

const journal = (args: string[] = []) => inC(SD_C, ['journalctl', '-u', 'pilot-agent', '--no-pager', '-o', 'cat', ...args]).out;
/** journald reads a unit's output asynchronously: a line may land a moment after the command that caused it. */
async function inJournal(re: RegExp, args: string[] = []): Promise<void> {
  await until(`${re} in the journal${args.length ? ` (${args.join(' ')})` : ''}`, () => re.test(journal(args)), 30_000, () => `--- journal (tail)\n${journal().slice(-3000)}`);
}
const unitState = () =>
  Object.fromEntries(inC(SD_C, ['systemctl', 'show', '-p', 'ActiveState,SubState,Result,ExecMainStatus,MainPID', 'pilot-agent']).out.trim().split('\n').map((l) => l.split('=', 2) as [string, string]));

if (SKIP) {
  console.log('\n*** packaging tests SKIPPED (SKIP_PACKAGING_TESTS=1): the proxy image and the systemd unit were NOT tested ***\n');
} else {
  // uvu reports a failed hook without its error: print it.
  const loud = (fn: () => void) => () => {
    try {
      fn();
    } catch (err) {
      console.error(`\npackaging tests: setup failed: ${(err as Error).stack ?? err}\n`);
      throw err;
    }
  };

  test.before(loud(() => {
    phase('apt-get (debootstrap, podman, runc)', installTools);
    cleanStaleRuns();
    p = newPodman({ ENVOY_BIN: envoyBin() });
    agentBin();
    phase('base image (cached debootstrap rootfs, import)', () => run('bash', [path.join(REPO, 'scripts/build-image.sh'), 'base', '--tag', BASE], { timeoutMs: 20 * MIN }));
    phase('proxy image build', () => run('bash', [path.join(REPO, 'scripts/build-image.sh'), '--tag', PROXY, '--', '-q'], { timeoutMs: 15 * MIN }));
    phase('systemd image build (apt-get systemd)', () =>
      podman(['build', '-q', '--network=host', '--build-arg', `BASE=${BASE}`, '-f', path.join(REPO, 'test/packaging/Dockerfile.systemd'), '-t', SYSTEMD, path.join(REPO, 'test/packaging')], { timeoutMs: 15 * MIN }));
  }));

  test.after(() => {
    if (!p) return;
    p.cleanUp();
    console.log(`packaging tests: ${phases.join(', ')}; total ${((Date.now() - t0) / 1000).toFixed(0)} s`);
  });

  test('proxy image: the agent and Envoy at Istio\'s paths, user 1337, ENTRYPOINT pilot-agent, STOPSIGNAL SIGTERM', () => {
    const cfg = JSON.parse(podman(['image', 'inspect', PROXY]).out)[0].Config;
    assert.is(cfg.User, '1337:1337');
    assert.equal(cfg.Entrypoint, ['/usr/local/bin/pilot-agent']);
    assert.is(cfg.StopSignal, 'SIGTERM');
    assert.match(podman(['run', '--rm', '--network=none', PROXY, 'version', '-s']).out, /^\d+\.\d+\.\d+/);
    assert.match(podman(['run', '--rm', '--network=none', '--entrypoint', '/usr/local/bin/envoy', PROXY, '--version']).out, /version: [0-9a-f]+\/1\.\d+/);
    const ids = podman(['run', '--rm', '--network=none', '--entrypoint', 'sh', PROXY, '-c', 'id -u; id -g; id -un; stat -c %u:%g /etc/istio/proxy; test -w /etc/istio/proxy && test -d /var/lib/istio && echo ok']).out;
    assert.equal(ids.trim().split('\n'), ['1337', '1337', 'istio-proxy', '1337:1337', 'ok']);
  });

  test('proxy image: `proxy router --standalone` in a --network=none container serves routed responses, as uid 1337', async () => {
    podman(['run', '-d', '--name', PROXY_C, '--network=none', ...mounts(), PROXY, 'proxy', 'router', '--standalone', '/opt/src/examples/standalone/config']);
    podman(['exec', '-d', PROXY_C, '/opt/node/node', '/opt/src/examples/standalone/backends.js']);
    const logs = () => `--- container log\n${podman(['logs', PROXY_C], { ok: () => true }).err.slice(-4000)}`;
    await until('Envoy ready in the container', () => get(PROXY_C, 'http://127.0.0.1:15021/healthz/ready').startsWith('200'), 2 * MIN, logs);
    await until('a routed response', () => /^200 v[12] \/$/.test(get(PROXY_C, 'http://127.0.0.1:8088/', 'backend.example.local')), MIN, logs);
    assert.is(get(PROXY_C, 'http://127.0.0.1:8088/', 'backend.example.local', 'x-version:v2'), '200 v2 /');
    assert.is(get(PROXY_C, 'http://127.0.0.1:8088/v1/hello', 'backend.example.local'), '200 v1 /hello');
    assert.is(get(PROXY_C, 'http://127.0.0.1:8088/', 'unknown.example').split(' ')[0], '404');
    const envoyPid = JSON.parse(inC(PROXY_C, ['/usr/local/bin/pilot-agent', 'request', 'GET', '/debug/epochs', '--debug-port', '15020']).out).epochs[0].pid;
    assert.equal(sh(PROXY_C, `stat -c %u /proc/1 /proc/${envoyPid}`).out.trim().split('\n'), ['1337', '1337'], 'the agent and Envoy run as 1337');
  });

  test('proxy image: `pilot-agent istio-iptables --dry-run` runs in the image (the init container\'s command)', () => {
    // The host's network: the command needs a non-loopback address to tell an IPv4 from an IPv6 pod (as Istio's).
    // A dry run as uid 1337, with no capabilities, changes nothing there.
    const r = podman(['run', '--rm', '--network=host', PROXY, 'istio-iptables', '--dry-run', '-p', '15001', '-z', '15006', '-u', '1337', '-g', '1337', '-m', 'REDIRECT', '-i', '*', '-b', '*', '-d', '15090,15021,15020'], { ok: () => true });
    if (r.code === 2 && /unknown command: istio-iptables/i.test(r.err)) {
      console.log('  NOTE: check skipped: this build has no `istio-iptables` command yet (the capture issue adds it); the other image tests ran');
      return;
    }
    assert.is(r.code, 0, `istio-iptables --dry-run exits 0:\n${r.out}${r.err}`);
    assert.match(r.out, /-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN/);
    assert.match(podman(['run', '--rm', '--network=none', '--entrypoint', 'sh', PROXY, '-c', 'command -v iptables']).out, /iptables/, 'the image has iptables for the real run');
  });

  test('proxy image: `podman stop` (SIGTERM) drains Envoy and the container exits 0 within the grace period', () => {
    const start = Date.now();
    podman(['stop', '-t', '40', PROXY_C], { timeoutMs: 2 * MIN });
    const secs = (Date.now() - start) / 1000;
    const state = JSON.parse(podman(['inspect', PROXY_C]).out)[0].State;
    const log = podman(['logs', PROXY_C]).err;
    assert.is(state.ExitCode, 0, `exit code 0 (took ${secs.toFixed(1)} s)\n${log.slice(-3000)}`);
    assert.match(log, /asked epoch 0 to drain its listeners/);
    assert.match(log, /agent exiting with code 0/);
    assert.ok(secs < 40, `stopped by the agent, not by the SIGKILL after the grace period (${secs.toFixed(1)} s)`);
    podman(['rm', PROXY_C]);
  });

  test('proxy image, multi-stage: pilot-agent built inside the image build (npm ci, scripts/build.sh) runs the proxy', async () => {
    const build = (extra: string[]) => run('bash', [path.join(REPO, 'scripts/build-image.sh'), '--multi-stage', ...extra, '--tag', `${PROXY}-multi`, '--', '-q'], { timeoutMs: 20 * MIN, ok: () => true });
    // With no network, from the host's npm cache (filled by the test script's npm ci); else from the registry.
    let r = phase('multi-stage build (offline)', () => build(['--offline']));
    if (r.code !== 0) {
      console.log(`  NOTE: the offline multi-stage build failed (exit ${r.code}: ${r.err.trim().split('\n').slice(-3).join(' | ')}); building with the registry instead`);
      r = phase('multi-stage build (registry)', () => build([]));
    }
    assert.is(r.code, 0, `multi-stage build:\n${r.out.slice(-2000)}\n${r.err.slice(-3000)}`);
    assert.match(podman(['run', '--rm', '--network=none', `${PROXY}-multi`, 'version', '-s']).out, /^\d+\.\d+\.\d+/);
    const c = `${PROXY_C}-multi`;
    try {
      podman(['run', '-d', '--name', c, '--network=none', ...mounts(), `${PROXY}-multi`, 'proxy', 'router', '--standalone', '/opt/src/examples/standalone/config']);
      podman(['exec', '-d', c, '/opt/node/node', '/opt/src/examples/standalone/backends.js']);
      await until('a routed response from the multi-stage image', () => /^200 v[12] \/$/.test(get(c, 'http://127.0.0.1:8088/', 'backend.example.local')), 2 * MIN, () => podman(['logs', c], { ok: () => true }).err.slice(-3000));
    } finally {
      podman(['rm', '-f', '-t', '0', c], { ok: () => true });
    }
  });

  test('systemd: install-vm.sh installs the unit, binaries and config into a booted systemd, and again idempotently', async () => {
    podman(['run', '-d', '--name', SD_C, '--network=none', '--systemd=always', ...mounts(), SYSTEMD, '/sbin/init']);
    await until('systemd running in the container', () => /^(running|degraded)/.test(inC(SD_C, ['systemctl', 'is-system-running'], { ok: () => true }).out.trim()), 2 * MIN);
    const install = () => inC(SD_C, ['bash', '/opt/src/scripts/install-vm.sh', '--binary', '/opt/src/dist/pilot-agent', '--envoy', '/opt/envoy', '--standalone', '/opt/src/examples/standalone/config', '--type', 'router', '--no-start'], { timeoutMs: 3 * MIN });
    const first = install();
    assert.match(first.out, /wrote \/etc\/pilot-agent\/pilot-agent.env/);
    const files = '/usr/local/bin/pilot-agent /usr/local/bin/envoy /usr/local/lib/pilot-agent/pilot-agent-systemd /etc/systemd/system/pilot-agent.service /etc/pilot-agent/pilot-agent.env /etc/pilot-agent/mesh.yaml /etc/pilot-agent/standalone/routing.yaml';
    const sums = sh(SD_C, `sha256sum ${files}`).out;
    const second = install();
    assert.match(second.out, /kept \/etc\/pilot-agent\/pilot-agent.env/);
    assert.is(sh(SD_C, `sha256sum ${files}`).out, sums, 'a second install changes nothing');
    assert.is(inC(SD_C, ['id', '-u', 'istio-proxy']).out.trim(), '1337');
    assert.is(inC(SD_C, ['systemctl', 'is-enabled', 'pilot-agent']).out.trim(), 'enabled');
    assert.is(inC(SD_C, ['systemctl', 'is-active', 'pilot-agent'], { ok: () => true }).out.trim(), 'inactive', '--no-start');
  });

  test('systemd: `systemd-analyze security --offline=yes` rates the installed unit at 4.0 or lower', () => {
    const r = inC(SD_C, ['systemd-analyze', 'security', '--offline=yes', '--threshold=40', '/etc/systemd/system/pilot-agent.service'], { ok: () => true });
    const m = /Overall exposure level for pilot-agent\.service: (\d+\.\d+)/.exec(r.out);
    assert.ok(m, `an exposure line in:\n${r.out.slice(-2000)}${r.err}`);
    console.log(`  systemd-analyze security: exposure ${m![1]}`);
    assert.ok(Number(m![1]) <= 4.0, `exposure ${m![1]} > 4.0`);
    assert.is(r.code, 0, 'below --threshold=40');
  });

  test('systemd: `systemctl start` returns only once /healthz/ready is 200, and the proxy routes', async () => {
    podman(['exec', '-d', SD_C, '/opt/node/node', '/opt/src/examples/standalone/backends.js']);
    inC(SD_C, ['systemctl', 'start', 'pilot-agent'], { timeoutMs: 3 * MIN });
    // One request, no retry: ready at the moment start returned.
    assert.is(get(SD_C, 'http://127.0.0.1:15021/healthz/ready').split(' ')[0], '200', journal().slice(-3000));
    assert.is(unitState().ActiveState, 'active');
    assert.match(get(SD_C, 'http://127.0.0.1:8088/', 'backend.example.local'), /^200 v[12] \/$/);
    await inJournal(/ready: Envoy is ready/);
    // systemd gives services a soft open-files limit of 1024; the agent raises it to the hard one, for Envoy too.
    const envoyPid = JSON.parse(inC(SD_C, ['/usr/local/bin/pilot-agent', 'request', 'GET', '/debug/epochs', '--debug-port', '15020']).out).epochs[0].pid;
    const [soft, hard] = sh(SD_C, `grep 'Max open files' /proc/${envoyPid}/limits`).out.trim().split(/\s+/).slice(3, 5);
    const unitSoft = inC(SD_C, ['systemctl', 'show', '-p', 'LimitNOFILESoft', '--value', 'pilot-agent']).out.trim();
    console.log(`  open files: the unit's soft limit ${unitSoft}; Envoy's soft/hard ${soft}/${hard}`);
    assert.is(soft, hard, `Envoy's open-files soft limit ${soft} is its hard limit`);
  });

  test('systemd: `systemctl reload` under load goes to a new epoch with zero failed requests', async () => {
    const before = newestLiveEpoch(SD_C);
    const load = startLoad(SD_C, 'reload-load');
    try {
      await until('load running', () => (load.stats()?.ok ?? 0) > 50, MIN);
      inC(SD_C, ['systemctl', 'reload', 'pilot-agent'], { timeoutMs: 2 * MIN });
      // systemctl reload returned: the new epoch is live now.
      assert.ok(newestLiveEpoch(SD_C) > before, `an epoch newer than ${before} is live`);
      const at = load.stats()!.ok;
      await until('requests served by the new epoch', () => load.stats()!.ok > at + 50, MIN);
    } finally {
      const s = await load.stop();
      console.log(`  reload under load: ${s.ok} ok, ${s.failed} failed ${JSON.stringify(s.errors)}`);
      assert.is(s.failed, 0, `no failed request: ${JSON.stringify(s.errors)}`);
    }
    assert.is(unitState().ActiveState, 'active');
    await inJournal(/reload: epoch \d+ is live/);
  });

  test('systemd: journal lines carry their priority (journalctl -p warning filters) and no second timestamp', () => {
    const all = journal().split('\n');
    const agentLines = all.filter((l) => /^(debug|info|warn|error)\t/.test(l));
    assert.ok(agentLines.some((l) => /^info\tsupervisor\tepoch 0 is live/.test(l)), 'agent lines start with their level, no timestamp');
    assert.equal(all.filter((l) => /^\d{4}-\d\d-\d\dT[\d:.]+Z\t/.test(l)), [], 'no line has a timestamp of its own');
    const warnings = journal(['-p', 'warning']).split('\n').filter(Boolean);
    assert.equal(warnings.filter((l) => /^(debug|info)\t/.test(l)), [], '-p warning shows no info line');
    // Envoy warns at every hot restart ("shutting down admin due to child startup"): its level reached the journal.
    assert.ok(warnings.some((l) => /^warning\tenvoy /.test(l)), `Envoy's warnings are warnings:\n${warnings.join('\n')}`);
  });

  test('systemd: `systemctl reload` fails at once when Envoy rejects the new bootstrap, and the old epoch keeps serving', async () => {
    const before = newestLiveEpoch(SD_C);
    sh(SD_C, [
      'cp /etc/pilot-agent/mesh.yaml /tmp/good-mesh.yaml',
      `printf '%s\\n' '{"static_resources": {"listeners": [{"name": "x", "address": {"socket_address": {"port_value": "nope"}}}]}}' > /etc/pilot-agent/bad.json`,
      'chmod 0644 /etc/pilot-agent/bad.json',
      'echo "  customConfigFile: /etc/pilot-agent/bad.json" >> /etc/pilot-agent/mesh.yaml',
    ].join(' && '));
    try {
      const start = Date.now();
      const r = inC(SD_C, ['systemctl', 'reload', 'pilot-agent'], { ok: () => true, timeoutMs: 2 * MIN });
      const secs = (Date.now() - start) / 1000;
      assert.is.not(r.code, 0, `systemctl reload fails\n${journal().slice(-2000)}`);
      assert.ok(secs < 45, `it fails on the rejection, not at its 60 s timeout (${secs.toFixed(1)} s)`);
      await inJournal(/reload: Envoy rejected the new bootstrap; epoch \d+ keeps serving: .*invalid\s+number/, ['-p', 'err']);
      assert.is(unitState().ActiveState, 'active');
      assert.is(newestLiveEpoch(SD_C), before);
      assert.match(get(SD_C, 'http://127.0.0.1:8088/', 'backend.example.local'), /^200 v[12] \/$/);
    } finally {
      sh(SD_C, 'cp /tmp/good-mesh.yaml /etc/pilot-agent/mesh.yaml && rm -f /etc/pilot-agent/bad.json');
    }
    // The good config back: the next reload goes live again.
    inC(SD_C, ['systemctl', 'reload', 'pilot-agent'], { timeoutMs: 2 * MIN });
    assert.ok(newestLiveEpoch(SD_C) > before);
  });

  test('systemd: `systemctl stop` under load drains, exits 0 (Result=success) and leaves no Envoy', async () => {
    const load = startLoad(SD_C, 'stop-load');
    let s: LoadStats;
    let stopAt = 0;
    try {
      await until('load running', () => (load.stats()?.ok ?? 0) > 50, MIN);
      stopAt = Number(inC(SD_C, ['date', '+%s%3N']).out.trim());
      inC(SD_C, ['systemctl', 'stop', 'pilot-agent'], { timeoutMs: 2 * MIN });
    } finally {
      s = await load.stop();
    }
    const st = unitState();
    assert.is(st.ActiveState, 'inactive');
    assert.is(st.Result, 'success', JSON.stringify(st));
    assert.is(st.ExecMainStatus, '0');
    assert.is(sh(SD_C, 'pgrep -x envoy', { ok: () => true }).code, 1, 'no Envoy process left');
    assert.is(sh(SD_C, 'ls /dev/shm | grep -c envoy_shared_memory', { ok: () => true }).out.trim(), '0', 'no shared memory left');
    await inJournal(/asked epoch \d+ to drain its listeners/);
    await inJournal(/agent exiting with code 0/);
    console.log(`  stop under load: ${s.ok} ok, ${s.failed} failed; requests served ${((s.lastOkAt - stopAt) / 1000).toFixed(1)} s into the stop`);
    assert.ok(s.lastOkAt - stopAt > 1000, 'requests were still served during the drain');
  });

  test('systemd: a config Envoy rejects makes `systemctl start` fail at once, with the reason in the journal', async () => {
    sh(SD_C, [
      'cp /etc/pilot-agent/pilot-agent.env /tmp/good.env',
      `printf '%s\\n' '{"static_resources": {"listeners": [{"name": "x", "address": {"socket_address": {"port_value": "nope"}}}]}}' > /etc/pilot-agent/bad.json`,
      'chmod 0644 /etc/pilot-agent/bad.json',
      // JSON in the environment file: only the outer single quotes, as install-vm.sh's header says.
      `echo "PROXY_CONFIG='{\\"customConfigFile\\": \\"/etc/pilot-agent/bad.json\\"}'" >> /etc/pilot-agent/pilot-agent.env`,
    ].join(' && '));
    try {
      const start = Date.now();
      const r = inC(SD_C, ['systemctl', 'start', 'pilot-agent'], { ok: () => true, timeoutMs: 3 * MIN });
      const secs = (Date.now() - start) / 1000;
      assert.is.not(r.code, 0, 'systemctl start fails');
      assert.ok(secs < 60, `it fails when the agent exits, not at the readiness timeout (${secs.toFixed(1)} s)`);
      await inJournal(/Envoy rejects the bootstrap built from this config: .*invalid\s+number/);
      await inJournal(/ready: the agent \(pid \d+\) exited before Envoy was ready/, ['-p', 'err']);
      assert.match(inC(SD_C, ['systemctl', 'status', 'pilot-agent', '--no-pager'], { ok: () => true }).out, /status=1\/FAILURE/);
    } finally {
      inC(SD_C, ['systemctl', 'stop', 'pilot-agent'], { ok: () => true });
      sh(SD_C, 'cp /tmp/good.env /etc/pilot-agent/pilot-agent.env && rm -f /etc/pilot-agent/bad.json && systemctl reset-failed pilot-agent');
    }
  });

  test('systemd: install-vm.sh --uninstall removes the unit and binaries; --purge the config, state and user', () => {
    inC(SD_C, ['bash', '/opt/src/scripts/install-vm.sh', '--uninstall']);
    assert.is(sh(SD_C, 'ls /usr/local/bin/pilot-agent /usr/local/bin/envoy /etc/systemd/system/pilot-agent.service 2>/dev/null | wc -l').out.trim(), '0');
    assert.is(sh(SD_C, 'test -f /etc/pilot-agent/mesh.yaml && echo kept').out.trim(), 'kept');
    inC(SD_C, ['bash', '/opt/src/scripts/install-vm.sh', '--uninstall', '--purge']);
    assert.is(sh(SD_C, 'ls -d /etc/pilot-agent /var/lib/pilot-agent 2>/dev/null | wc -l').out.trim(), '0');
    assert.is(inC(SD_C, ['id', 'istio-proxy'], { ok: () => true }).code, 1);
  });

  test('systemd: install-vm.sh --istiod installs the root certificate, the token (0600, istio-proxy) and discoveryAddress', () => {
    sh(SD_C, 'echo "-----BEGIN CERTIFICATE-----" > /tmp/root.pem && echo token > /tmp/token');
    inC(SD_C, ['bash', '/opt/src/scripts/install-vm.sh', '--binary', '/opt/src/dist/pilot-agent', '--envoy', '/opt/envoy', '--istiod', 'istiod.example:15012', '--root-cert', '/tmp/root.pem', '--token', '/tmp/token', '--no-start']);
    assert.match(inC(SD_C, ['cat', '/etc/pilot-agent/mesh.yaml']).out, /discoveryAddress: istiod\.example:15012/);
    assert.match(inC(SD_C, ['cat', '/etc/pilot-agent/pilot-agent.env']).out, /XDS_ROOT_CA=\/etc\/pilot-agent\/root-cert\.pem/);
    assert.is(inC(SD_C, ['stat', '-c', '%a %U', '/var/lib/pilot-agent/var/run/secrets/tokens/istio-token']).out.trim(), '600 istio-proxy');
    // The agent creates its SDS and xDS sockets under ./var/run/secrets: the directories are its own, not root's.
    assert.is(inC(SD_C, ['stat', '-c', '%U', '/var/lib/pilot-agent/var/run/secrets', '/var/lib/pilot-agent/var/run/secrets/tokens']).out.trim(), 'istio-proxy\nistio-proxy');
    // The agent resolves this config (the bootstrap it would write points xDS at istiod over TLS).
    const boot = inC(SD_C, ['sh', '-c', 'cd /var/lib/pilot-agent && set -a && . /etc/pilot-agent/pilot-agent.env && set +a && /usr/local/bin/pilot-agent bootstrap --meshConfig /etc/pilot-agent/mesh.yaml']).out;
    assert.match(boot, /istiod\.example/);
    inC(SD_C, ['bash', '/opt/src/scripts/install-vm.sh', '--uninstall', '--purge']);
  });
}

test.run();
