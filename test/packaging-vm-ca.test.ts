// The VM packaging with the embedded CA and the DNS proxy on :53, under the real systemd 252 of a container (as
// test/packaging.test.ts boots it): install-vm.sh --standalone with DIR/ca/identities installs the CA into the
// state directory with owner-only tokens, the unit (ProtectSystem=strict, istio-proxy) creates the root there on
// first start and gets the sidecar its certificate, a restart and a reinstall keep that root, and with
// --bind-low-ports the agent (uid 1337, CAP_NET_BIND_SERVICE and nothing else) serves DNS on 127.0.0.1:53.
// Issue 20 item 10: before, the install dropped ca/identities and the CA could not write under /etc (EROFS).
// SKIP_PACKAGING_TESTS=1 skips it, as it does test/packaging.test.ts.

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
const C = `pa-pkg-ca-${process.pid}`;
const ID = 'spiffe://cluster.local/ns/shop/sa/vm';
let p: Podman | undefined;
let cfgDir = '';

// A sidecar whose one service has an Istio-mTLS endpoint: Envoy asks SDS for `default`, so readiness needs a
// certificate from the embedded CA. Its address is what the DNS proxy answers for the host name.
const SERVICES = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: echo, namespace: shop }
spec:
  hosts: [echo.shop.local]
  addresses: [10.20.0.7]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{ number: 8080, name: http, protocol: HTTP }]
  endpoints:
  - { address: 127.0.0.1, ports: { http: 9081 }, labels: { security.istio.io/tlsMode: istio }, serviceAccount: echo }
`;

const P = () => p!;
const inC = (args: string[], o?: Parameters<Podman['inC']>[2]) => P().inC(C, args, o);
const sh = (script: string, o?: Parameters<Podman['sh']>[2]) => P().sh(C, script, o);
const stat = (f: string) => sh(`stat -c '%a %U' ${f}`).out.trim();
const journal = () => inC(['journalctl', '-u', 'pilot-agent', '--no-pager', '-o', 'cat'], { ok: () => true }).out;
const get = (url: string) => inC(['/opt/node/node', '/opt/test/get.js', url], { ok: () => true }).out.trim();
const install = (...extra: string[]) =>
  inC(['bash', '/opt/src/scripts/install-vm.sh', '--binary', '/opt/src/dist/pilot-agent', '--envoy', '/opt/envoy', '--standalone', '/opt/cfg',
    '--type', 'sidecar', '--namespace', 'shop', '--service-account', 'vm', '--no-start', ...extra], { timeoutMs: 3 * MIN });
const rootKeySum = () => sh('sha256sum /var/lib/pilot-agent/ca/root-key.pem /var/lib/pilot-agent/ca/root-cert.pem').out;
const certs = () => get('http://127.0.0.1:15020/debug/certs');

if (SKIP) {
  console.log('\n*** packaging tests SKIPPED (SKIP_PACKAGING_TESTS=1): the embedded CA under systemd was NOT tested ***\n');
} else {
  test.before(() => {
    try {
      installTools();
      cleanStaleRuns();
      p = newPodman({ ENVOY_BIN: envoyBin() });
      agentBin();
      P().run('bash', [path.join(REPO, 'scripts/build-image.sh'), 'base', '--tag', BASE], { timeoutMs: 20 * MIN });
      P().podman(['build', '-q', '--network=host', '--build-arg', `BASE=${BASE}`, '-f', path.join(REPO, 'test/packaging/Dockerfile.systemd'), '-t', SYSTEMD, path.join(REPO, 'test/packaging')], { timeoutMs: 15 * MIN });
      // The operator's directory, made the obvious way (umask 022: tokens 0644); the install makes them owner-only.
      cfgDir = path.join(P().work, 'cfg');
      fs.mkdirSync(path.join(cfgDir, 'ca', 'identities', 'shop'), { recursive: true });
      fs.writeFileSync(path.join(cfgDir, 'services.yaml'), SERVICES, { mode: 0o644 });
      fs.writeFileSync(path.join(cfgDir, 'ca', 'identities', 'shop', 'vm'), 'vm-token\n', { mode: 0o644 });
      fs.writeFileSync(path.join(cfgDir, 'ca', 'identities', 'shop', 'other'), 'other-token\n', { mode: 0o644 });
      P().podman(['run', '-d', '--name', C, '--network=none', '--systemd=always',
        '-v', `${REPO}:/opt/src:ro`, '-v', `${path.join(REPO, 'test/packaging')}:/opt/test:ro`, '-v', `${cfgDir}:/opt/cfg:ro`,
        '-v', `${process.execPath}:/opt/node/node:ro`, '-v', `${envoyBin()}:/opt/envoy:ro`, SYSTEMD, '/sbin/init']);
    } catch (err) {
      // uvu reports a failed hook without its error.
      console.error(`\npackaging tests: setup failed: ${(err as Error).stack ?? err}\n`);
      throw err;
    }
  });

  test.after(() => {
    p?.cleanUp();
  });

  test('install-vm.sh --standalone with ca/identities: the CA in the state directory, tokens 0600 istio-proxy, none dropped', async () => {
    await until('systemd running in the container', () => /^(running|degraded)/.test(inC(['systemctl', 'is-system-running'], { ok: () => true }).out.trim()), 2 * MIN);
    const r = install('--bind-low-ports');
    assert.match(r.out, /embedded CA: 2 identities in \/var\/lib\/pilot-agent\/ca\/identities/);
    assert.is(sh('readlink /etc/pilot-agent/standalone/ca').out.trim(), '/var/lib/pilot-agent/ca');
    assert.is(stat('/var/lib/pilot-agent/ca'), '700 istio-proxy');
    assert.is(stat('/var/lib/pilot-agent/ca/identities/shop'), '700 istio-proxy');
    assert.is(stat('/var/lib/pilot-agent/ca/identities/shop/vm'), '600 istio-proxy');
    assert.is(stat('/var/lib/pilot-agent/ca/identities/shop/other'), '600 istio-proxy');
    assert.is(stat('/var/lib/pilot-agent/var/run/secrets/tokens/istio-token'), '600 istio-proxy', 'this host\'s own token');
    assert.is(sh('cat /var/lib/pilot-agent/var/run/secrets/tokens/istio-token').out, 'vm-token\n');
    // The agent makes its sockets beside the token: the directories on the way are its own.
    assert.is(stat('/var/lib/pilot-agent/var/run/secrets'), '750 istio-proxy');
    assert.match(inC(['cat', '/etc/pilot-agent/pilot-agent.env']).out, /^SERVICE_ACCOUNT=vm$/m);
    assert.is(stat('/etc/systemd/system/pilot-agent.service.d/bind-low-ports.conf'), '644 root');
  });

  test('systemctl start: the CA creates its root under ProtectSystem=strict and the sidecar is ready with its certificate', () => {
    // The DNS proxy on :53, as a VM's resolver would use it (the next test asks it).
    sh('printf "ISTIO_META_DNS_CAPTURE=true\\nDNS_PROXY_ADDR=127.0.0.1:53\\n" >> /etc/pilot-agent/pilot-agent.env');
    const r = inC(['systemctl', 'start', 'pilot-agent'], { timeoutMs: 3 * MIN, ok: () => true });
    assert.is(r.code, 0, `systemctl start\n${r.err}\n--- journal (tail)\n${journal().slice(-4000)}`);
    assert.match(journal(), /embedded CA: created a new root in \/etc\/pilot-agent\/standalone\/ca/);
    assert.not.match(journal(), /EROFS|read-only file system/i);
    assert.is(stat('/var/lib/pilot-agent/ca/root-key.pem'), '600 istio-proxy');
    assert.match(certs(), new RegExp(`^200 .*${ID.replace(/[/.]/g, '\\$&')}`, 's'), 'the workload certificate from the embedded CA');
  });

  test('the DNS proxy serves 127.0.0.1:53 as uid 1337 with CAP_NET_BIND_SERVICE only, and answers the mesh\'s names', async () => {
    const pid = inC(['systemctl', 'show', '-p', 'MainPID', '--value', 'pilot-agent']).out.trim();
    const status = sh(`grep -E '^(Uid|CapEff):' /proc/${pid}/status`).out;
    assert.match(status, /^Uid:\s+1337\s/m);
    assert.match(status, /^CapEff:\s+0000000000000400$/m, 'CAP_NET_BIND_SERVICE and nothing else');
    const answer = await until('an answer from 127.0.0.1:53', () => {
      const a = inC(['/opt/node/node', '/opt/test/dns.js', '127.0.0.1', 'echo.shop.local'], { ok: () => true }).out.trim();
      return /^\d/.test(a) ? a : undefined;
    }, MIN, () => `--- journal (tail)\n${journal().slice(-3000)}`);
    assert.is(answer, '10.20.0.7');
    assert.not.match(journal(), /needs CAP_NET_BIND_SERVICE/);
  });

  test('a restart and a second install keep the root; an identity removed from DIR is removed; --purge removes it all', () => {
    const sums = rootKeySum();
    inC(['systemctl', 'restart', 'pilot-agent'], { timeoutMs: 3 * MIN });
    assert.match(certs(), /^200 /);
    assert.is(rootKeySum(), sums, 'the root is reused after a restart');
    fs.rmSync(path.join(cfgDir, 'ca', 'identities', 'shop', 'other'));
    const again = install();
    assert.match(again.out, /kept the embedded CA root/);
    assert.match(again.out, /embedded CA: 1 identities/);
    assert.is(sh('ls /var/lib/pilot-agent/ca/identities/shop').out.trim(), 'vm');
    assert.is(rootKeySum(), sums, 'the root is kept by a reinstall');
    assert.is(stat('/etc/systemd/system/pilot-agent.service.d/bind-low-ports.conf'), '644 root', 'kept without --no-bind-low-ports');
    inC(['systemctl', 'restart', 'pilot-agent'], { timeoutMs: 3 * MIN });
    assert.match(certs(), /^200 /);
    inC(['bash', '/opt/src/scripts/install-vm.sh', '--uninstall', '--purge']);
    assert.is(sh('ls -d /etc/pilot-agent /var/lib/pilot-agent /etc/systemd/system/pilot-agent.service.d 2>/dev/null | wc -l').out.trim(), '0');
  });
}

test.run();
