// Istio's VM onboarding with install-vm.sh, under the real systemd 252 of a container (as test/packaging.test.ts
// boots it): `install-vm.sh --istio-vm DIR` takes the directory `istioctl x workload entry configure` writes
// (test/fixtures/istio-vm, plus an operator's sidecar.env), puts cluster.env and sidecar.env where Istio's VM start
// reads them, and the unit then starts the agent with the environment Istio's istio-start.sh would give it
// (checked in /proc/<MainPID>/environ), runs the capture from cluster.env before the start and its cleanup after the
// stop (here in istio-iptables' dry-run mode, set in sidecar.env), and resolves istiod through the hosts line.
// No istiod runs here: the agent is started, checked and stopped, never ready. SKIP_PACKAGING_TESTS=1 skips it.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { agentBin } from './helpers/agent';
import { REPO, envoyBin } from './helpers/harness';
import { cleanStaleRuns, installTools, MIN, newPodman, type Podman, until } from './packaging/podman';

const SKIP = process.env.SKIP_PACKAGING_TESTS === '1';
const BASE = 'localhost/pilot-agent-base:bookworm';
const SYSTEMD = 'localhost/pilot-agent-systemd:test';
const C = `pa-pkg-istio-vm-${process.pid}`;
let p: Podman | undefined;

const P = () => p!;
const inC = (args: string[], o?: Parameters<Podman['inC']>[2]) => P().inC(C, args, o);
const sh = (script: string, o?: Parameters<Podman['sh']>[2]) => P().sh(C, script, o);
const stat = (f: string) => sh(`stat -c '%a %U %G' ${f}`).out.trim();
const journal = () => inC(['journalctl', '-u', 'pilot-agent', '--no-pager', '-o', 'cat'], { ok: () => true }).out;
const mainPid = () => inC(['systemctl', 'show', '-p', 'MainPID', '--value', 'pilot-agent']).out.trim();

if (SKIP) {
  console.log('\n*** packaging tests SKIPPED (SKIP_PACKAGING_TESTS=1): Istio VM onboarding under systemd was NOT tested ***\n');
} else {
  test.before(() => {
    try {
      installTools();
      cleanStaleRuns();
      p = newPodman({ ENVOY_BIN: envoyBin() });
      agentBin();
      P().run('bash', [path.join(REPO, 'scripts/build-image.sh'), 'base', '--tag', BASE], { timeoutMs: 20 * MIN });
      P().podman(['build', '-q', '--network=host', '--build-arg', `BASE=${BASE}`, '-f', path.join(REPO, 'test/packaging/Dockerfile.systemd'), '-t', SYSTEMD, path.join(REPO, 'test/packaging')], { timeoutMs: 15 * MIN });
      // istioctl's output directory as an operator copies it to the VM, with their sidecar.env beside it.
      const cfg = path.join(P().work, 'istio-vm');
      fs.mkdirSync(cfg);
      const fx = path.join(REPO, 'test', 'fixtures', 'istio-vm');
      for (const f of ['cluster.env', 'mesh.yaml', 'root-cert.pem', 'istio-token', 'hosts', 'sidecar.env']) fs.copyFileSync(path.join(fx, f), path.join(cfg, f));
      // Capture in istio-iptables' dry-run mode: the rules are printed to the journal, the container's are untouched.
      fs.appendFileSync(path.join(cfg, 'sidecar.env'), 'DRY_RUN=true\n');
      P().podman(['run', '-d', '--name', C, '--network=none', '--systemd=always',
        '-v', `${REPO}:/opt/src:ro`, '-v', `${cfg}:/opt/istio-vm:ro`, '-v', `${envoyBin()}:/opt/envoy:ro`, SYSTEMD, '/sbin/init']);
      // A VM has an address besides loopback (istio-iptables refuses to run without one, as Go's): cluster.env's
      // ISTIO_SVC_IP on a veth pair inside the container's own network namespace (both ends), made from the host.
      const pid = P().podman(['inspect', '-f', '{{.State.Pid}}', C]).out.trim();
      const ipSteps = [['link', 'add', 'vm0', 'type', 'veth', 'peer', 'name', 'vm1'], ['addr', 'add', '10.10.10.10/24', 'dev', 'vm0'],
        ['link', 'set', 'vm1', 'up'], ['link', 'set', 'vm0', 'up']];
      for (const args of ipSteps) {
        P().run('nsenter', ['-t', pid, '-n', 'ip', ...args]);
      }
    } catch (err) {
      console.error(`\npackaging tests: setup failed: ${(err as Error).stack ?? err}\n`);
      throw err;
    }
  });

  test.after(() => {
    p?.cleanUp();
  });

  test('install-vm.sh --istio-vm DIR: cluster.env and sidecar.env at Istio\'s path, root and token where the agent reads them', async () => {
    await until('systemd running in the container', () => /^(running|degraded)/.test(inC(['systemctl', 'is-system-running'], { ok: () => true }).out.trim()), 2 * MIN);
    const r = inC(['bash', '/opt/src/scripts/install-vm.sh', '--binary', '/opt/src/dist/pilot-agent', '--envoy', '/opt/envoy', '--istio-vm', '/opt/istio-vm', '--no-start'], { timeoutMs: 3 * MIN });
    assert.match(r.out, /installed \/var\/lib\/istio\/envoy\/cluster\.env/);
    assert.is(stat('/var/lib/istio/envoy/cluster.env'), '640 root istio-proxy');
    assert.is(stat('/var/lib/istio/envoy/sidecar.env'), '640 root istio-proxy');
    assert.is(sh('cmp /opt/istio-vm/cluster.env /var/lib/istio/envoy/cluster.env && echo same').out.trim(), 'same');
    assert.is(stat('/var/lib/pilot-agent/etc/certs'), '750 istio-proxy istio-proxy');
    assert.is(stat('/var/lib/pilot-agent/etc/certs/root-cert.pem'), '644 istio-proxy istio-proxy');
    assert.is(stat('/var/lib/pilot-agent/var/run/secrets/tokens/istio-token'), '600 istio-proxy istio-proxy');
    assert.match(sh('cat /etc/hosts').out, /^10\.10\.10\.11 istiod\.istio-system\.svc$/m);
    const mesh = sh('cat /etc/pilot-agent/mesh.yaml').out;
    assert.match(mesh, /^ {2}discoveryAddress: istiod\.istio-system\.svc:15012$/m, 'istioctl\'s mesh.yaml');
    assert.match(mesh, /^ {2}configPath: \/var\/lib\/pilot-agent\/proxy$/m, 'with this host\'s config path');
    assert.match(mesh, /^ {4}OWNER_NOTE: it's the shop's VM$/m);
    assert.not.match(sh('cat /etc/pilot-agent/pilot-agent.env').out, /^POD_NAMESPACE=/m, 'the namespace comes from cluster.env');
    // Twice: the hosts line is not added again, mesh.yaml is rewritten the same.
    inC(['bash', '/opt/src/scripts/install-vm.sh', '--binary', '/opt/src/dist/pilot-agent', '--envoy', '/opt/envoy', '--istio-vm', '/opt/istio-vm', '--no-start'], { timeoutMs: 3 * MIN });
    assert.is(sh('grep -c "istiod.istio-system.svc" /etc/hosts').out.trim(), '1');
    assert.is(sh('cat /etc/pilot-agent/mesh.yaml').out, mesh);
  });

  test('systemctl start: capture from cluster.env first, then the agent with istio-start.sh\'s environment; stop cleans up', async () => {
    inC(['systemctl', 'start', '--no-block', 'pilot-agent']);
    const pid = await until('the agent as the unit\'s main process', () => {
      const m = mainPid();
      return m !== '0' && /pilot-agent/.test(sh(`cat /proc/${m}/cmdline 2>/dev/null | tr '\\0' ' '`, { ok: () => true }).out) ? m : undefined;
    }, MIN, () => journal().slice(-3000));
    // Another uid's environ needs ptrace rights, which a plain `podman exec` does not have.
    const environ = P().podman(['exec', '--privileged', C, 'sh', '-c', `tr '\\0' '\\n' < /proc/${pid}/environ`]).out;
    for (const kv of ['POD_NAMESPACE=shop', 'INSTANCE_IP=10.10.10.10', 'SERVICE_ACCOUNT=vm', 'CA_ADDR=istiod.istio-system.svc:15012',
      'PROV_CERT=./etc/certs', 'OUTPUT_CERTS=./etc/certs', 'ISTIO_META_DNS_CAPTURE=true', 'OWNER_NOTE=it\'s the shop\'s VM', 'ISTIO_META_REGION=eu-west-1',
      'ISTIO_METAJSON_LABELS={"app":"web","service.istio.io/canonical-name":"web","service.istio.io/canonical-revision":"v1"}']) {
      assert.ok(environ.split('\n').includes(kv), `${kv} in the agent's environment:\n${environ}`);
    }
    assert.match(environ, /^PROXY_CONFIG=$/m, 'PROXY_CONFIG starts with a newline, as istio-start.sh writes it');
    assert.match(environ, /^serviceCluster: web\.shop$/m);
    const cmdline = sh(`tr '\\0' ' ' < /proc/${pid}/cmdline`).out;
    assert.match(cmdline, /proxy sidecar --meshConfig \/etc\/pilot-agent\/mesh\.yaml +--proxyLogLevel debug --concurrency 1/, cmdline);
    assert.match(sh(`grep -E '^Uid:' /proc/${pid}/status`).out, /^Uid:\s+1337\s/m);
    // ExecStartPre ran istio-iptables from cluster.env (dry run): every inbound port but cluster.env's exclusions.
    const j = journal();
    assert.match(j, /-A ISTIO_INBOUND -p tcp (-m tcp )?--dport 22 -j RETURN/, j.slice(-4000));
    assert.match(j, /REDIRECT --to-ports? 15053/, 'ISTIO_META_DNS_CAPTURE');
    // istiod's name resolves through the hosts line (nothing listens there: the agent keeps trying).
    await until('a connection attempt to istiod at the hosts file\'s address', () => /10\.10\.10\.11/.test(journal()), MIN, () => journal().slice(-3000));
    inC(['systemctl', 'stop', 'pilot-agent'], { timeoutMs: 2 * MIN });
    // ExecStartPre's --cleanup-only said it once; ExecStopPost's says it again.
    const cleanups = (journal().match(/dry run: would remove every ISTIO_ chain/g) ?? []).length;
    assert.is(cleanups, 2, journal().slice(-3000));
  });

  test('--uninstall --purge removes the onboarding files too', () => {
    inC(['bash', '/opt/src/scripts/install-vm.sh', '--uninstall', '--purge']);
    assert.is(sh('ls /var/lib/istio/envoy/cluster.env /var/lib/istio/envoy/sidecar.env /usr/local/lib/pilot-agent/pilot-agent-vm-env 2>/dev/null | wc -l').out.trim(), '0');
  });
}

test.run();
