// istio-iptables against the real kernel: each test makes its own network namespace (lo plus a veth with an
// IPv4 or IPv6 address, as a pod has), runs the command into it with --network-namespace, and compares
// iptables-save with what Istio's Go command left for the same arguments (test/golden/iptables).

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { isIPv4, isIPv6 } from 'node:net';
import { runIstioCleanIptables, runIstioIptables } from '../lib/iptables-command';
import { iptablesCommandFromArgs } from '../lib/iptables-flags';
import { buildCaptureRules, restoreText } from '../lib/iptables-rules';
import { configureLogging, resetLogging } from '../lib/log';
import { agentBin } from './helpers/agent';

interface Case {
  name: string;
  net: 'v4' | 'v6';
  env?: Record<string, string>;
  resolv?: string[];
  args: string[];
}

const goldenDir = path.join(__dirname, 'golden', 'iptables');
const cases = JSON.parse(readFileSync(path.join(goldenDir, 'cases.json'), 'utf8')) as Case[];
const golden = (name: string, ext: string) => readFileSync(path.join(goldenDir, `${name}.${ext}`), 'utf8');
const byName = (name: string) => cases.find((c) => c.name === name)!;

let seq = 0;
interface Netns {
  name: string;
  path: string;
  save(family: 4 | 6): string;
}

/** A fresh namespace for fn, deleted afterwards whatever happens. */
async function withNetns(net: 'v4' | 'v6', fn: (ns: Netns) => Promise<void>): Promise<void> {
  const name = `ipt-test-${process.pid}-${++seq}`;
  const ip = (...args: string[]) => execFileSync('ip', args, { stdio: ['ignore', 'pipe', 'pipe'] });
  ip('netns', 'add', name);
  try {
    ip('-n', name, 'link', 'set', 'lo', 'up');
    ip('-n', name, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'eth1');
    if (net === 'v4') ip('-n', name, 'addr', 'add', '10.1.0.5/24', 'dev', 'eth0');
    else ip('-n', name, '-6', 'addr', 'add', 'fd00:1::5/64', 'dev', 'eth0', 'nodad');
    ip('-n', name, 'link', 'set', 'eth0', 'up');
    ip('-n', name, 'link', 'set', 'eth1', 'up');
    const nsPath = `/var/run/netns/${name}`;
    await fn({
      name,
      path: nsPath,
      save: (family) =>
        normalise(execFileSync('nsenter', [`--net=${nsPath}`, '--', family === 4 ? 'iptables-save' : 'ip6tables-save'], { stdio: ['ignore', 'pipe', 'ignore'] }).toString()),
    });
  } finally {
    ip('netns', 'del', name);
  }
}

function normalise(save: string): string {
  return save.split('\n').filter((l) => !l.startsWith('#')).map((l) => l.replace(/\[\d+:\d+\]/, '[0:0]')).join('\n');
}

/** Runs one case's command into ns; returns the exit code, what it printed and what it logged. */
async function run(c: Pick<Case, 'env' | 'resolv'>, args: string[], ns: Netns, clean = false) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ipt-test-'));
  const logs: string[] = [];
  configureLogging({ write: (l) => logs.push(l) });
  try {
    const resolvConf = path.join(dir, 'resolv.conf');
    writeFileSync(resolvConf, (c.resolv ?? []).map((s) => `nameserver ${s}\n`).join(''));
    let out = '';
    const opts = { env: { PATH: process.env.PATH, ...c.env }, resolvConf, out: (t: string) => void (out += t) };
    const fullArgs = ['--network-namespace', ns.path, ...args];
    const code = clean ? await runIstioCleanIptables(fullArgs, opts) : await runIstioIptables(fullArgs, opts);
    return { code, out, logs: logs.join('\n') };
  } finally {
    resetLogging();
    rmSync(dir, { recursive: true, force: true });
  }
}

const noIstio = (save: string) => !/ISTIO/.test(save) && !/^-A /m.test(save);

test('the pure rule builder alone gives the Go command\'s iptables-restore input for every case', () => {
  try {
    for (const c of cases) {
      const s = { ...iptablesCommandFromArgs(c.args, c.env ?? {}).settings, enableIpv6: c.net === 'v6' };
      s.proxyUid ||= '1337';
      s.proxyGid ||= s.proxyUid;
      if (s.redirectDns && !s.captureAllDns) {
        s.dnsServersV4 = (c.resolv ?? []).filter((a) => isIPv4(a));
        s.dnsServersV6 = (c.resolv ?? []).filter((a) => isIPv6(a));
      }
      const rules = buildCaptureRules(s);
      assert.fixture(restoreText(rules.v4) + (s.enableIpv6 ? restoreText(rules.v6) : ''), golden(c.name, 'dry-run'), c.name);
    }
  } finally {
    resetLogging();
  }
});

for (const c of cases) {
  test(`${c.name}: iptables-save equals the Go command's, a second run changes nothing, clean leaves empty tables`, async () => {
    await withNetns(c.net, async (ns) => {
      const first = await run(c, c.args, ns);
      assert.is(first.code, 0, first.logs);
      assert.fixture(ns.save(4), golden(c.name, 'v4'));
      assert.fixture(ns.save(6), golden(c.name, 'v6'));
      const ip = (...a: string[]) => execFileSync('ip', ['-n', ns.name, ...a]).toString();
      // Routes Istio sets beside the rules: ::6 on lo for IPv6 pods, TPROXY's mark -> local route table 133.
      if (c.net === 'v6') assert.match(ip('-6', 'addr', 'show', 'dev', 'lo'), /inet6 ::6\/128/);
      if (c.args.includes('TPROXY')) {
        assert.match(ip('rule', 'show'), /fwmark 0x539 lookup 133/);
        assert.match(ip('route', 'show', 'table', '133'), /local default dev lo/);
      }

      const second = await run(c, c.args, ns);
      assert.is(second.code, 0, second.logs);
      assert.match(second.logs, /already in place/);
      if (c.args.includes('TPROXY')) assert.is(ip('rule', 'show').match(/fwmark 0x539/g)?.length, 1, 'one ip rule after two runs');
      assert.fixture(ns.save(4), golden(c.name, 'v4'));
      assert.fixture(ns.save(6), golden(c.name, 'v6'));

      // Like Istio's --cleanup-only, the rules the arguments put in built-in chains need the same arguments.
      const cleaned = await run(c, c.args, ns, true);
      assert.is(cleaned.code, 0, cleaned.logs);
      assert.ok(noIstio(ns.save(4)), ns.save(4));
      assert.ok(noIstio(ns.save(6)), ns.save(6));
      assert.match(ns.save(4), /^\*nat\n:PREROUTING ACCEPT \[0:0\]\n:INPUT ACCEPT \[0:0\]\n:OUTPUT ACCEPT \[0:0\]\n:POSTROUTING ACCEPT \[0:0\]\nCOMMIT$/m);
    });
  });

  test(`${c.name}: --dry-run prints the Go command's iptables-restore input and changes nothing`, async () => {
    await withNetns(c.net, async (ns) => {
      const before = ns.save(4) + ns.save(6);
      const r = await run(c, [...c.args, '--dry-run'], ns);
      assert.is(r.code, 0, r.logs);
      assert.fixture(r.out, golden(c.name, 'dry-run'));
      assert.is(ns.save(4) + ns.save(6), before);
    });
  });
}

test('istio-clean-iptables also removes rules that other arguments made, and --cleanup-only does the same', async () => {
  const tproxy = byName('tproxy');
  const dns = byName('capture-all-dns');
  await withNetns('v6', async (ns) => {
    assert.is((await run(tproxy, tproxy.args, ns)).code, 0);
    const r = await run({}, ['--cleanup-only', '-m', 'TPROXY', '-b', '*'], ns);
    assert.is(r.code, 0, r.logs);
    assert.ok(noIstio(ns.save(4)) && noIstio(ns.save(6)), ns.save(4) + ns.save(6));
    assert.is((await run(dns, dns.args, ns)).code, 0);
    assert.is((await run({}, [], ns, true)).code, 0);
    assert.ok(noIstio(ns.save(4)) && noIstio(ns.save(6)), ns.save(4) + ns.save(6));
  });
});

test('legacy backend: forced with --force-iptables-binary, then chosen because it holds rules, and cleaned', async () => {
  const a = byName('injector-default');
  await withNetns('v4', async (ns) => {
    const legacySave = () => normalise(execFileSync('nsenter', [`--net=${ns.path}`, '--', 'iptables-legacy-save'], { stdio: ['ignore', 'pipe', 'ignore'] }).toString());
    const forced = await run(a, [...a.args, '--force-iptables-binary', 'legacy'], ns);
    assert.is(forced.code, 0, forced.logs);
    assert.match(forced.logs, /using iptables-legacy\b/);
    assert.fixture(legacySave(), golden(a.name, 'v4'));
    const again = await run(a, a.args, ns);
    assert.is(again.code, 0, again.logs);
    assert.match(again.logs, /using iptables-legacy\b[^]*already in place/);
    assert.not.match(ns.save(4), /ISTIO/, 'no second copy in nft');
    assert.is((await run(a, [], ns, true)).code, 0);
    assert.ok(noIstio(legacySave()), legacySave());
  });
});

test('rules from an earlier run with other arguments: refused without --reconcile, replaced with it', async () => {
  const a = byName('injector-default');
  const b = byName('inbound-ports');
  await withNetns('v4', async (ns) => {
    assert.is((await run(a, a.args, ns)).code, 0);
    const refused = await run(b, b.args, ns);
    assert.is(refused.code, 1);
    assert.match(refused.logs, /differ from the requested ones; pass --reconcile/);
    assert.fixture(ns.save(4), golden(a.name, 'v4'));
    const replaced = await run(b, [...b.args, '--reconcile'], ns);
    assert.is(replaced.code, 0, replaced.logs);
    assert.fixture(ns.save(4), golden(b.name, 'v4'));
  });
});

test('a restore the kernel rejects leaves the previous rules exactly as they were', async () => {
  const a = byName('injector-default');
  // Well-formed, so only iptables-restore can refuse it: it finds no such user.
  const noUser = ['-u', 'no-such-user-x', '-g', '1337'];
  await withNetns('v4', async (ns) => {
    const fresh = await run(a, [...a.args, ...noUser], ns);
    assert.is(fresh.code, 1);
    assert.match(fresh.logs, /iptables-nft-restore failed/);
    assert.ok(noIstio(ns.save(4)), ns.save(4));

    assert.is((await run(a, a.args, ns)).code, 0);
    const r = await run(byName('tproxy'), [...byName('tproxy').args, ...noUser, '--reconcile'], ns);
    assert.is(r.code, 1);
    assert.fixture(ns.save(4), golden(a.name, 'v4'));
  });
});

test('a value that would add words to the iptables-restore text: one error line naming where it came from, no rule touched', async () => {
  const a = byName('injector-default');
  // Issue 20: this -c made the Go-compatible restore text carry a rule of the caller's own, so all TCP of uid 1000
  // escaped capture, and clean-up with the same arguments left rules behind.
  const inject = 'x\n-I OUTPUT 1 -p tcp -m owner --uid-owner 1000 -j RETURN\n-A OUTPUT -o x';
  const escaped = /--uid-owner 1000|-o x\b|-i x\b/;
  const bad: [string[], Record<string, string>, RegExp][] = [
    [['-c', inject], {}, /invalid -c\/--istio-exclude-interfaces: "x\\n-I OUTPUT 1 .*" is not an interface name: it has whitespace$/],
    [['-k', 'eth0 -p udp'], {}, /invalid -k\/--kube-virt-interfaces: "eth0 -p udp" is not an interface name: it has whitespace$/],
    [[], { ISTIO_EXCLUDE_INTERFACES: inject }, /invalid ISTIO_EXCLUDE_INTERFACES \(-c\/--istio-exclude-interfaces\): "x\\n-I/],
    [[], { KUBE_VIRT_INTERFACES: 'veth0,eth0\t-j' }, /invalid KUBE_VIRT_INTERFACES \(-k\/--kube-virt-interfaces\): "eth0\\t-j"/],
    [['-c', 'eth0,an-interface-name-far-too-long'], {}, /"an-interface-name-far-too-long" is not an interface name: longer than 15 characters/],
    [['-c', 'eth0:1'], {}, /"eth0:1" is not an interface name: it has ":", which Linux does not allow/],
    [['-c', 'a/b'], {}, /"a\/b" is not an interface name: it has "\/"/],
    [['-c', 'eth0"'], {}, /is not an interface name: quotes and backslashes are not accepted/],
    [['-k', '-jDROP'], {}, /"-jDROP" is not an interface name: it may not start with "-" or "!"/],
    [['-c', 'et+h0'], {}, /"\+" is only accepted last/],
    [['-c', '..'], {}, /"\.\." is not an interface name/],
    [['-u', '1337 -j ACCEPT'], {}, /invalid -u\/--proxy-uid: "1337 -j ACCEPT" is not a user id/],
    [['-g', '-1'], {}, /invalid -g\/--proxy-gid: "-1" is not a group id/],
    [[], { ISTIO_OUTBOUND_OWNER_GROUPS: '1000\n-I OUTPUT 1 -j RETURN' }, /invalid ISTIO_OUTBOUND_OWNER_GROUPS: "1000\\n-I OUTPUT 1 -j RETURN" is not a group id/],
    [[], { ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE: '1 --gid-owner 2' }, /invalid ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE: "1 --gid-owner 2"/],
    [['-m', 'TPROXY', '-t', '1337 -j DROP'], {}, /invalid -t\/--istio-inbound-tproxy-mark "1337 -j DROP": not a number/],
    [['-m', 'TPROXY', '-t', '4294967296'], {}, /invalid -t\/--istio-inbound-tproxy-mark "4294967296"/],
    [[], { ISTIO_INBOUND_TPROXY_ROUTE_TABLE: '133 x' }, /invalid ISTIO_INBOUND_TPROXY_ROUTE_TABLE \(-r\/--istio-inbound-tproxy-route-table\) "133 x"/],
    [['-b', '90:80'], {}, /invalid -b\/--istio-inbound-ports: "90:80" is not a port \(or a:b range, a <= b\)/],
  ];
  const oneError = (logs: string, what: string) => {
    const errors = logs.split('\n').filter((l) => /\terror\t/.test(l));
    assert.is(errors.length, 1, `${what}: one error line\n${logs}`);
    return errors[0]!;
  };
  await withNetns('v4', async (ns) => {
    // Nothing in place yet: nothing is added.
    const fresh = await run({}, [...a.args, '-c', inject], ns);
    assert.is(fresh.code, 1, fresh.logs);
    oneError(fresh.logs, '-c');
    assert.ok(noIstio(ns.save(4)), ns.save(4));

    // Rules in place: each bad value leaves them exactly as they were.
    assert.is((await run(a, a.args, ns)).code, 0);
    for (const [args, env, message] of bad) {
      const what = `${args.join(' ')} ${JSON.stringify(env)}`;
      // A later flag wins over the injector's; a variable counts where the injector's arguments set no flag.
      const r = await run({ env }, [...a.args, ...args], ns);
      assert.is(r.code, 1, `${what}\n${r.logs}`);
      assert.match(oneError(r.logs, what), message, what);
      assert.fixture(ns.save(4), golden(a.name, 'v4'));
    }
    // Clean-up with the same arguments is refused the same way and removes nothing; with good ones it removes all.
    const cleanBad = await run({}, ['-c', inject], ns, true);
    assert.is(cleanBad.code, 1, cleanBad.logs);
    oneError(cleanBad.logs, 'clean -c');
    assert.fixture(ns.save(4), golden(a.name, 'v4'));
    assert.is((await run({}, ['--cleanup-only', '-c', 'x,eth0+'], ns)).code, 0);
    assert.ok(noIstio(ns.save(4)), ns.save(4));
    assert.not.match(ns.save(4), escaped);
  });
});

/** dist/pilot-agent ARGS as its own process inside ns, as uid/gid `as` (nsenter -S/-G), as an init container runs it. */
function runAs(ns: Netns, as: number, args: string[]): { code: number; output: string } {
  const r = spawnSync('nsenter', [`--net=${ns.path}`, '-S', String(as), '-G', String(as), '--', agentBin(), ...args], {
    cwd: '/',
    env: { PATH: process.env.PATH, HOME: '/' },
    encoding: 'utf8',
    timeout: 60_000,
  });
  return { code: r.status ?? -1, output: `${r.stdout}${r.stderr}` };
}

test('the executable: pilot-agent istio-iptables with the injector\'s arguments, then istio-clean-iptables', async () => {
  const a = byName('injector-default');
  await withNetns('v4', async (ns) => {
    const r = runAs(ns, 0, ['istio-iptables', ...a.args]);
    assert.is(r.code, 0, r.output);
    assert.fixture(ns.save(4), golden(a.name, 'v4'));
    const c = runAs(ns, 0, ['istio-clean-iptables']);
    assert.is(c.code, 0, c.output);
    assert.ok(noIstio(ns.save(4)), ns.save(4));
    const bad = runAs(ns, 0, ['istio-iptables', '-m', 'NAT']);
    assert.is(bad.code, 1);
    assert.match(bad.output, /want REDIRECT or TPROXY/);
    const typo = runAs(ns, 0, ['istio-iptables', '--envoy-prot', '15001']);
    assert.is(typo.code, 2);
    assert.match(typo.output, /unknown flag: --envoy-prot/);
  });
});

test('--run-validation: a connection from the proxy uid reaches the capture port (exit 0); not captured: exit 126', async () => {
  const a = byName('injector-default');
  const validate = ['istio-iptables', '-p', '15001', '-z', '15006', '-u', '1337', '--skip-rule-apply', '--run-validation', '--probe-timeout', '2s'];
  await withNetns('v4', async (ns) => {
    const before = runAs(ns, 1337, validate);
    assert.is(before.code, 126, before.output);
    assert.match(before.output, /iptables validation failed; workload is not ready for Istio/);

    assert.is((await run(a, a.args, ns)).code, 0);
    const ok = runAs(ns, 1337, validate);
    assert.is(ok.code, 0, ok.output);
    assert.match(ok.output, /validation passed/);
    // root's own loopback calls are the app's: never captured, so validation as root fails.
    assert.is(runAs(ns, 0, validate).code, 126);
  });
});

test('--run-validation: a peer that resets connections to the probe ports meanwhile does not end the command (exit 126, no crash)', async () => {
  const validate = ['istio-iptables', '-p', '15001', '-z', '15006', '-u', '1337', '--skip-rule-apply', '--run-validation', '--probe-timeout', '3s'];
  // Connects to both probe listeners over and over and resets each connection at once (SO_LINGER 0), for 4 s.
  const peer = `
    const net = require('net');
    const until = Date.now() + 4000;
    let n = 0;
    const one = (port) => new Promise((done) => {
      const s = net.connect(port, '127.0.0.1');
      s.on('error', () => done());
      s.on('connect', () => { n++; s.resetAndDestroy(); done(); });
    });
    (async () => {
      while (Date.now() < until) await Promise.all([one(15001), one(15006), one(15001), one(15006)]);
      console.log(n);
    })();`;
  await withNetns('v4', async (ns) => {
    const exit = (c: ReturnType<typeof spawn>) => new Promise<number | null>((r) => c.on('exit', (code) => r(code)));
    let output = '';
    let resets = '';
    const cmd = spawn('nsenter', [`--net=${ns.path}`, '-S', '1337', '-G', '1337', '--', agentBin(), ...validate], { cwd: '/', env: { PATH: process.env.PATH, HOME: '/' } });
    cmd.stdout!.on('data', (b: Buffer) => (output += b));
    cmd.stderr!.on('data', (b: Buffer) => (output += b));
    const cmdExit = exit(cmd);
    // Started once the command listens (it logs nothing before validating; 300 ms is ample for a start-up).
    await new Promise((r) => setTimeout(r, 300));
    const attacker = spawn('nsenter', [`--net=${ns.path}`, '--', process.execPath, '-e', peer], { env: { PATH: process.env.PATH } });
    attacker.stdout!.on('data', (b: Buffer) => (resets += b));
    try {
      const code = await cmdExit;
      assert.is(code, 126, output);
      assert.match(output, /iptables validation failed; workload is not ready for Istio/);
      assert.not.match(output, /ECONNRESET|EPIPE|Unhandled|uncaught/i, output);
    } finally {
      await exit(attacker);
    }
    assert.ok(Number(resets) > 100, `the peer reset connections to the validation ports (${resets.trim()})`);
  });
});

test('unknown or conflicting flags and bad values: one clear error, exit 1, nothing applied', async () => {
  // Exit 2: the command line cannot be parsed; exit 1: a value that cannot be used.
  const bad: [string[], RegExp, number][] = [
    [['--no-such-flag'], /unknown flag: --no-such-flag \(see pilot-agent istio-iptables --help\)/, 2],
    [['-y', '1'], /unknown shorthand flag: 'y'/, 2],
    [['-p'], /flag needs an argument/, 2],
    [['-i', '*', 'extra'], /unexpected argument "extra"/, 2],
    [['--dry-run=maybe'], /"maybe" is not a boolean/, 2],
    [['-p', '15001', '-z', '15001'], /conflicting -p and -z/, 1],
    [['-m', 'NAT'], /invalid -m\/--istio-inbound-interception-mode "NAT": want REDIRECT or TPROXY/, 1],
    [['-i', '*', '-x', '*'], /invalid -x\/--istio-service-exclude-cidr "\*"/, 1],
    [['-i', '10.0.0.0/33'], /invalid -i\/--istio-service-cidr: "10.0.0.0\/33" is not a CIDR/, 1],
    [['-b', '80,http'], /invalid -b\/--istio-inbound-ports: "http" is not a port/, 1],
    [['--native-nftables'], /--native-nftables is not supported/, 1],
    [['--force-iptables-binary', 'xtables'], /want legacy or nft/, 1],
    [['--log_output_level=default:loud'], /invalid --log_output_level: unknown log level/, 1],
    [['--cleanup-only', '--run-validation'], /conflicting --cleanup-only and --run-validation/, 1],
    [['--run-validation'], /conflicting --run-validation and --network-namespace/, 1],
  ];
  await withNetns('v4', async (ns) => {
    for (const [args, message, code] of bad) {
      const r = await run({}, args, ns);
      assert.is(r.code, code, args.join(' '));
      assert.match(r.logs, message, args.join(' '));
      assert.is(r.logs.split('\n').filter((l) => /\terror\t/.test(l)).length, 1, r.logs);
    }
    assert.ok(noIstio(ns.save(4)), ns.save(4));
  });
});

test('no iptables binary on PATH: a clear error naming the package, exit 1, nothing applied', async () => {
  const a = byName('injector-default');
  const empty = mkdtempSync(path.join(os.tmpdir(), 'ipt-nobin-'));
  try {
    await withNetns('v4', async (ns) => {
      // nsenter and ip stay reachable by full path through a PATH holding only them.
      for (const tool of ['nsenter', 'ip']) {
        const where = execFileSync('sh', ['-c', `command -v ${tool}`]).toString().trim();
        execFileSync('ln', ['-s', where, path.join(empty, tool)]);
      }
      const r = await run({ env: { PATH: empty } }, a.args, ns);
      assert.is(r.code, 1);
      assert.match(r.logs, /no usable iptables binary \(tried iptables-legacy, iptables-nft, iptables; install the iptables package\)/);
      const c = await run({ env: { PATH: empty } }, [], ns, true);
      assert.is(c.code, 1);
      assert.match(c.logs, /install the iptables package/);
      assert.ok(noIstio(ns.save(4)));
    });
  } finally {
    rmSync(empty, { recursive: true, force: true });
  }
});

test('environment variables are read like the flags; a flag wins over its variable', async () => {
  const a = byName('injector-default');
  await withNetns('v4', async (ns) => {
    const env = { ISTIO_INBOUND_PORTS: '9080,9443', ISTIO_LOCAL_EXCLUDE_PORTS: '15020', ISTIO_SERVICE_CIDR: '*', INBOUND_CAPTURE_PORT: '15006' };
    const r = await run({ env }, ['-p', '15001', '-u', '1337', '-m', 'REDIRECT'], ns);
    assert.is(r.code, 0, r.logs);
    assert.fixture(ns.save(4), golden('inbound-ports', 'v4'));
    assert.is((await run({}, [], ns, true)).code, 0);
    const flagWins = await run({ env: { ISTIO_INBOUND_PORTS: '9080' } }, a.args, ns);
    assert.is(flagWins.code, 0, flagWins.logs);
    assert.fixture(ns.save(4), golden(a.name, 'v4'));
  });
});

test.run();
