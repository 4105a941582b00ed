// Istio's VM onboarding files (test/fixtures/istio-vm: cluster.env, mesh.yaml, root-cert.pem, istio-token, hosts in
// `istioctl x workload entry configure`'s format, and an operator's sidecar.env) read by
// packaging/systemd/pilot-agent-vm-env exactly as Istio's istio-start.sh reads them: the same pilot-agent calls
// with the same argv and environment as the golden recorded from Istio's own script (scripts/vm-env-golden.sh);
// the capture step, run with the real agent's istio-iptables in dry-run mode, programs what cluster.env says;
// without the files the wrapper changes nothing.

import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { mountedCertsDir } from '../lib/secret-cache';
import { agentBin } from './helpers/agent';
import { REPO, tempDir } from './helpers/harness';

const FX = path.join(REPO, 'test', 'fixtures', 'istio-vm');
const WRAPPER = path.join(REPO, 'packaging', 'systemd', 'pilot-agent-vm-env');
const GOLDEN = path.join(REPO, 'test', 'golden', 'vm-istio-start.txt');

/** As scripts/vm-env-golden.sh starts Istio's script: the same environment, from the fixtures directory. */
function run(args: string[], env: Record<string, string>): { code: number | null; out: string; err: string } {
  const r = spawnSync('bash', [WRAPPER, ...args], {
    cwd: FX, encoding: 'utf8', timeout: 30_000,
    env: { PATH: '/usr/bin:/bin', HOME: '/root', USER: 'root', EXEC_USER: 'root', POD_NAME: 'vm-1',
      ISTIO_SIDECAR_CONFIG: './sidecar.env', ISTIO_CLUSTER_CONFIG: './cluster.env', ...env },
  });
  return { code: r.status, out: r.stdout, err: r.stderr };
}

test('the same pilot-agent calls, argv and environment as Istio\'s istio-start.sh for istioctl\'s files', () => {
  const dir = tempDir('pa-vm-env-');
  try {
    const fake = path.join(dir.path, 'pilot-agent');
    fs.copyFileSync(path.join(FX, 'record-pilot-agent'), fake);
    fs.chmodSync(fake, 0o755);
    const rec = path.join(dir.path, 'rec');
    const env = { RECORD: rec, PILOT_AGENT_BIN: fake };
    // The unit's order: ExecStartPre (capture), ExecStart (the agent), then ExecStopPost.
    for (const args of [['iptables'], ['run', fake, 'proxy'], ['clean']]) {
      const r = run(args, env);
      assert.is(r.code, 0, `${args.join(' ')}: ${r.err}`);
    }
    // Another istiod port and namespace, capture left to the operator (as the golden's last start).
    const custom = { ...env, ISTIO_CUSTOM_IP_TABLES: 'true', ISTIO_PILOT_PORT: '15005', ISTIO_CP_AUTH: 'NONE', ISTIO_SYSTEM_NAMESPACE: 'istio-east' };
    for (const args of [['iptables'], ['run', fake, 'proxy']]) assert.is(run(args, custom).code, 0);
    const golden = fs.readFileSync(GOLDEN, 'utf8').split('\n').filter((l) => !l.startsWith('#')).join('\n');
    assert.fixture(fs.readFileSync(rec, 'utf8'), golden);
    // What the golden shows, spelled out: cluster.env wins over sidecar.env, shell quoting and syntax as bash's.
    assert.match(golden, /^ {2}ISTIO_NAMESPACE=shop$/m);
    assert.match(golden, /^ {2}OWNER_NOTE=it's the shop's VM$/m);
    assert.match(golden, /^ {2}ISTIO_META_REGION=eu-west-1$/m);
    assert.match(golden, /^argv: \[proxy\] \[--proxyLogLevel\] \[debug\] \[--concurrency\] \[1\]$/m);
    assert.match(golden, /^ {2}CA_ADDR=istiod\.istio-east\.svc:15005$/m);
    assert.match(golden, /^ {2}PROXY_CONFIG=\\ndiscoveryAddress: istiod\.istio-east\.svc:15005\\n$/m, 'Go\'s script drops its defaults then');
  } finally {
    dir.cleanup();
  }
});

test('the capture step gives the real istio-iptables cluster.env\'s ports, CIDRs and DNS capture (dry run)', () => {
  const r = run(['iptables'], { PILOT_AGENT_BIN: agentBin(), DRY_RUN: 'true' });
  assert.is(r.code, 0, r.err);
  const rules = r.out + r.err;
  // ISTIO_INBOUND_PORTS='*' with ISTIO_LOCAL_EXCLUDE_PORTS: every inbound port but those four.
  for (const p of ['22', '15090', '15021', '15020']) assert.match(rules, new RegExp(`-A ISTIO_INBOUND -p tcp (-m tcp )?--dport ${p} -j RETURN`), `port ${p} excluded\n${rules}`);
  assert.match(rules, /-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT/);
  // ISTIO_SERVICE_CIDR='*': all outbound; ISTIO_META_DNS_CAPTURE='true': DNS to the agent's 15053.
  assert.match(rules, /-A ISTIO_OUTPUT -j ISTIO_REDIRECT/);
  assert.match(rules, /-p udp --dport 53 (-d \S+ )?-j REDIRECT --to-ports? 15053/);
});

test('ISTIO_CUSTOM_IP_TABLES=true skips capture; without the files the command runs unchanged; TPROXY is refused', () => {
  const dir = tempDir('pa-vm-env-');
  try {
    const fake = path.join(dir.path, 'pilot-agent');
    fs.copyFileSync(path.join(FX, 'record-pilot-agent'), fake);
    fs.chmodSync(fake, 0o755);
    const rec = path.join(dir.path, 'rec');
    assert.is(run(['iptables'], { RECORD: rec, PILOT_AGENT_BIN: fake, ISTIO_CUSTOM_IP_TABLES: 'true' }).code, 0);
    assert.is(fs.existsSync(rec), false, 'istio-iptables was not called');

    const none = { RECORD: rec, PILOT_AGENT_BIN: fake, ISTIO_SIDECAR_CONFIG: path.join(dir.path, 'no-sidecar.env'), ISTIO_CLUSTER_CONFIG: path.join(dir.path, 'no-cluster.env'), POD_NAMESPACE: 'vm' };
    assert.is(run(['iptables'], none).code, 0);
    assert.is(fs.existsSync(rec), false, 'no capture without the files (the unit\'s default)');
    assert.is(run(['run', fake, 'proxy', 'sidecar'], none).code, 0);
    const got = fs.readFileSync(rec, 'utf8');
    assert.match(got, /^argv: \[proxy\] \[sidecar\]$/m);
    assert.match(got, /^ {2}POD_NAMESPACE=vm$/m);
    assert.not.match(got, /CA_ADDR|PROXY_CONFIG|INSTANCE_IP|OUTPUT_CERTS/, 'nothing derived without the files');

    const tproxy = run(['run', fake, 'proxy'], { RECORD: rec, PILOT_AGENT_BIN: fake, ISTIO_INBOUND_INTERCEPTION_MODE: 'TPROXY', ISTIO_SIDECAR_CONFIG: path.join(dir.path, 'none') });
    assert.is(tproxy.code, 2);
    assert.match(tproxy.err, /TPROXY .*needs Envoy to run as root with CAP_NET_ADMIN/);
  } finally {
    dir.cleanup();
  }
});

test('OUTPUT_CERTS=./etc/certs (the VM default): the agent\'s own files there are not read back as mounted certificates', () => {
  const has = (files: string[]) => (p: string) => files.includes(path.normalize(p));
  const issued = has(['etc/certs/cert-chain.pem', 'etc/certs/key.pem']);
  assert.is(mountedCertsDir(false, issued), './etc/certs', 'without OUTPUT_CERTS they are mounted certificates');
  assert.is(mountedCertsDir(false, issued, './etc/certs'), undefined, 'Go\'s outputToCertificatePath: the CA is asked');
  assert.is(mountedCertsDir(false, issued, path.resolve('etc/certs') + '/'), undefined, 'compared as directories');
  assert.is(mountedCertsDir(false, issued, '/var/run/elsewhere'), './etc/certs');
  assert.is(mountedCertsDir(true, issued, './etc/certs'), './etc/certs', 'FILE_MOUNTED_CERTS still wins');
});

test.run();
