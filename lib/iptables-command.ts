// `pilot-agent istio-iptables` and `pilot-agent istio-clean-iptables`: what Istio's command reads from the
// machine (the proxy uid, IPv6 or not, resolv.conf), then the rules of lib/iptables-rules.ts applied with one
// iptables-restore per IP family. A run that finds its own rules already in place changes nothing; a failed
// restore puts the previous tables back. Flags: lib/iptables-flags.ts; binaries: lib/iptables-exec.ts.

import { readFileSync } from 'node:fs';
import * as os from 'node:os';
import * as net from 'node:net';
import { AgentError, errorMessage } from './errors';
import { IPTABLES_ENV as E, type Env } from './env';
import { configureLogging, scope } from './log';
import {
  buildCaptureRules,
  checkCommands,
  cleanupTables,
  hasIstioState,
  parseSave,
  renderRestore,
  restoreTables,
  sameShape,
  type CaptureSettings,
  type Rule,
  type TableLines,
} from './iptables-rules';
import { iptablesCommandFromArgs, IptablesSyntaxError, iptablesUsage, type IptablesCommand } from './iptables-flags';
import { binaries, detectBackend, restore, rollback, Runner, save, type Backend } from './iptables-exec';
import { systemIds } from './os-users';

const log = scope('iptables');

export interface IptablesRunOptions {
  /** Environment (default process.env); its PATH finds the iptables binaries. */
  env?: Env;
  /** Where --dry-run and --help print (default stdout). */
  out?: (text: string) => void;
  /** Default /etc/resolv.conf, as Istio's command reads. */
  resolvConf?: string;
}

// ---- the machine's facts Istio's command reads ----

/** Istio's rule: the first non-loopback, non-link-local address decides (with --dual-stack, any IPv6 one). */
async function detectIpv6(r: Runner, netns: string, dualStack: boolean): Promise<boolean> {
  let addrs: string[] = [];
  const res = await r.run('ip', ['-j', 'addr', 'show']);
  if (res.code === 0) {
    const links = JSON.parse(res.stdout) as { addr_info?: { local?: string }[] }[];
    addrs = links.flatMap((l) => (l.addr_info ?? []).map((a) => a.local ?? ''));
  } else if (!netns) {
    addrs = Object.values(os.networkInterfaces()).flatMap((l) => (l ?? []).map((a) => a.address));
  } else {
    throw new AgentError('IO', `cannot list the addresses in ${netns}: ip: ${res.stderr}`);
  }
  const usable = addrs
    .map((a) => a.replace(/^::ffff:(\d+\.\d+\.\d+\.\d+)$/i, '$1'))
    .filter((a) => {
      if (net.isIPv4(a)) return !a.startsWith('127.') && !a.startsWith('169.254.') && !a.startsWith('224.0.0.');
      if (net.isIPv6(a)) return a !== '::1' && !/^fe[89ab]/i.test(a) && !/^ff02:/i.test(a);
      return false;
    });
  if (usable.length === 0)
    throw new AgentError('IO', 'no valid local IP address found (Istio needs one to tell IPv4 from IPv6 pods)');
  return dualStack ? usable.some(net.isIPv6) : net.isIPv6(usable[0]!);
}

function resolvConfServers(path: string): { v4: string[]; v6: string[] } {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw new AgentError('IO', `failed to load ${path}: ${errorMessage(e)}`);
  }
  const servers = text
    .split('\n')
    .map((l) => l.trim().split(/\s+/))
    .filter((w) => w[0] === 'nameserver' && w[1])
    .map((w) => w[1]!);
  // A scoped address (fe80::1%eth0) cannot be an iptables -d: leave it out rather than fail the whole restore.
  for (const s of servers.filter((a) => a.includes('%')))
    log.warn(`${path}: nameserver ${s} has a zone; its DNS is not captured`);
  const plain = servers.filter((a) => !a.includes('%'));
  return { v4: plain.filter((s) => net.isIPv4(s)), v6: plain.filter((s) => net.isIPv6(s)) };
}

/** Fills what Istio reads from the machine: the proxy uid, IPv6 or not, resolv.conf's servers. */
async function completeSettings(
  cmd: IptablesCommand,
  r: Runner,
  env: Env,
  resolvConf: string,
): Promise<CaptureSettings> {
  const s = { ...cmd.settings };
  if (s.proxyUid === '') s.proxyUid = String(systemIds.user(E.ENVOY_USER.get(env)) ?? 1337);
  if (s.proxyGid === '') s.proxyGid = s.proxyUid;
  s.enableIpv6 = await detectIpv6(r, cmd.networkNamespace, cmd.dualStack);
  if (s.redirectDns && !s.captureAllDns) {
    const servers = resolvConfServers(resolvConf);
    s.dnsServersV4 = servers.v4;
    s.dnsServersV6 = servers.v6;
  }
  if (s.redirectDns && !s.captureAllDns && s.dnsServersV4.length === 0 && s.dnsServersV6.length === 0) {
    log.warn('REDIRECT_DNS is set, but CAPTURE_ALL_DNS is false, and no DNS servers provided. DNS capture disabled.');
  }
  return s;
}

// ---- --run-validation ----

/** Istio's exit code for a failed validation. */
export const VALIDATION_FAILED = 126;

/**
 * Istio's check that capture works: listen on the loopback proxy ports, connect from loopback to 127.0.0.6
 * (::6) on the probe port, where nothing listens, and wait for that very connection to arrive at one of our
 * listeners. Run as the proxy uid, as Istio's validation container does, the owner rules send it to the
 * inbound port. (Istio reads the original destination port; matching the client's port is the same proof.)
 */
export async function validateCapture(cmd: IptablesCommand, ipv6: boolean): Promise<boolean> {
  const listenHost = ipv6 ? '::1' : '127.0.0.1';
  const target = ipv6 ? '::6' : '127.0.0.6';
  const seen = new Set<number>();
  const servers: net.Server[] = [];
  for (const port of [cmd.settings.proxyPort, cmd.settings.inboundCapturePort]) {
    const server = net.createServer((c) => {
      // A peer that resets the connection before the answer is written must not end the command.
      c.on('error', () => c.destroy());
      if (c.remotePort) seen.add(c.remotePort);
      c.end(String(port));
    });
    const ok = await new Promise<boolean>((resolve) => {
      server.once('error', (e) => {
        log.warn(`validation cannot listen on ${listenHost}:${port}: ${errorMessage(e)}`);
        resolve(false);
      });
      server.listen(Number(port), listenHost, () => resolve(true));
    });
    if (ok) servers.push(server);
  }
  try {
    if (servers.length === 0) return false;
    const deadline = Date.now() + cmd.probeTimeoutMs;
    while (Date.now() < deadline) {
      const local = await new Promise<number | undefined>((resolve) => {
        const c = net.connect({ host: target, port: cmd.probePort, localAddress: listenHost, timeout: 1000 });
        c.once('connect', () => {
          const p = c.localPort;
          c.destroy();
          resolve(p);
        });
        c.once('error', () => resolve(undefined));
        c.once('timeout', () => {
          c.destroy();
          resolve(undefined);
        });
      });
      // The server's accept may land just after the client's connect.
      for (let i = 0; i < 20 && local !== undefined && !seen.has(local); i++)
        await new Promise((r) => setTimeout(r, 10));
      if (local !== undefined && seen.has(local)) return true;
      await new Promise((r) => setTimeout(r, Math.min(1000, Math.max(0, deadline - Date.now()))));
    }
    return false;
  } finally {
    for (const s of servers) s.close();
  }
}

const VALIDATION_MESSAGE = `iptables validation failed; workload is not ready for Istio.
When using Istio CNI, this can occur if a pod is scheduled before the node is ready.`;

// ---- the commands ----

interface FamilyPlan {
  family: 4 | 6;
  backend: Backend;
  before: string;
  text: string;
}

async function planFamily(
  r: Runner,
  cmd: IptablesCommand,
  family: 4 | 6,
  backend: Backend,
  rules: Rule[],
): Promise<FamilyPlan | undefined> {
  const before = await save(r, backend);
  const current = parseSave(before);
  const wanted = restoreTables(rules);
  const name = `IPv${family}`;
  if (!hasIstioState(current)) {
    if (rules.length === 0) return undefined;
    return { family, backend, before, text: renderRestore(wanted) };
  }
  let same = sameShape(current, parseSave(renderRestore(wanted)));
  if (same) {
    for (const check of checkCommands(rules)) {
      if ((await r.run(backend.bin, check)).code !== 0) {
        same = false;
        break;
      }
    }
  }
  if (same && !cmd.forceApply) {
    log.info(`${name}: the Istio rules are already in place; nothing to do`);
    return undefined;
  }
  if (!same && !cmd.reconcile) {
    throw new AgentError(
      'CONFIG_INVALID',
      `${name}: Istio rules from an earlier run differ from the requested ones; ` +
        'pass --reconcile to replace them, or remove them first with istio-clean-iptables',
    );
  }
  log.info(`${name}: replacing the Istio rules of an earlier run`);
  return { family, backend, before, text: renderRestore(cleanupTables(current), wanted) };
}

async function tproxyRoutes(r: Runner, cmd: IptablesCommand, ipv6: boolean): Promise<void> {
  const ip = async (args: string[], tolerateExists: boolean) => {
    const res = await r.run('ip', args);
    if (res.code !== 0 && !(tolerateExists && /exists|already assigned/i.test(res.stderr)))
      throw new AgentError('IO', `ip ${args.join(' ')} failed: ${res.stderr}`);
  };
  if (ipv6) await ip(['-6', 'addr', 'add', '::6/128', 'dev', 'lo'], true);
  if (cmd.settings.inboundPortsInclude === '' || cmd.settings.inboundInterceptionMode !== 'TPROXY') return;
  const mark = cmd.settings.inboundTProxyMark;
  const table = cmd.tproxyRouteTable;
  for (const fam of ipv6 ? ['-4', '-6'] : ['-4']) {
    const rules = await r.run('ip', [fam, 'rule', 'show']);
    const hex = `0x${Number(mark).toString(16)}`;
    if (!new RegExp(`fwmark (${mark}|${hex}) lookup ${table}\\b`).test(rules.stdout))
      await ip([fam, 'rule', 'add', 'fwmark', mark, 'lookup', table], false);
    await ip([fam, 'route', 'add', 'local', 'default', 'dev', 'lo', 'table', table], true);
  }
}

/** Deletes of the arguments' own rules in built-in chains that are present (a jump to an ISTIO_ chain is found anyway). */
async function argumentDeletes(r: Runner, bin: string, rules: readonly Rule[]): Promise<TableLines> {
  const out: TableLines = new Map();
  const checks = checkCommands(rules);
  for (let i = 0; i < rules.length; i++) {
    const rule = rules[i]!;
    const target = rule.params[rule.params.indexOf('-j') + 1] ?? '';
    if (rule.chain.startsWith('ISTIO_') || target.startsWith('ISTIO_')) continue;
    if ((await r.run(bin, checks[i]!)).code !== 0) continue;
    const line = ['-D', ...checks[i]!.slice(3)].join(' ');
    out.set(rule.table, [...(out.get(rule.table) ?? []), line]);
  }
  return out;
}

/**
 * Removes every ISTIO_ chain and every jump to one, in both families and every backend that has them, plus
 * the rules the given arguments put in built-in chains (TPROXY's marks, -c and -k returns), as Istio's
 * --cleanup-only does with the same arguments.
 */
async function clean(r: Runner, cmd: IptablesCommand, env: Env): Promise<void> {
  const s = { ...cmd.settings, enableIpv6: true };
  if (s.proxyUid === '') s.proxyUid = String(systemIds.user(E.ENVOY_USER.get(env)) ?? 1337);
  if (s.proxyGid === '') s.proxyGid = s.proxyUid;
  const rules = buildCaptureRules(s);
  let found = false;
  for (const family of [4, 6] as const) {
    for (const variant of cmd.forceBinary ? [cmd.forceBinary] : (['legacy', 'nft', ''] as const)) {
      const b = binaries(family, variant);
      const dump = await r.run(b.save, []);
      if (dump.code !== 0) continue;
      found = true;
      const state = parseSave(dump.stdout);
      if (!/^-A /m.test(dump.stdout)) continue;
      const extra = await argumentDeletes(r, b.bin, family === 4 ? rules.v4 : rules.v6);
      if (!hasIstioState(state) && extra.size === 0) continue;
      const ver = await r.run(b.save, ['--version']);
      const backend = { ...b, legacy: !ver.stdout.includes('nf_tables') };
      backend.wait = backend.legacy ? ['--wait=30'] : [];
      log.info(`removing Istio rules with ${b.restore}`);
      await restore(r, backend, renderRestore(extra, cleanupTables(state)), true);
    }
  }
  if (!found)
    throw new AgentError(
      'IO',
      'no usable iptables binary (tried iptables-legacy-save, iptables-nft-save, iptables-save; install the iptables package)',
    );
}

async function apply(
  r: Runner,
  cmd: IptablesCommand,
  settings: CaptureSettings,
  rules: { v4: Rule[]; v6: Rule[] },
): Promise<void> {
  const v4 = await detectBackend(r, 4, cmd.forceBinary);
  let v6: Backend | undefined;
  try {
    v6 = await detectBackend(r, 6, cmd.forceBinary);
  } catch (e) {
    if (settings.enableIpv6) throw e;
    log.warn(`no working ip6tables; continuing because this pod has no IPv6 address: ${errorMessage(e)}`);
  }
  log.info(`using ${v4.bin}${v6 && settings.enableIpv6 ? ` and ${v6.bin}` : ''}`);
  const plans: FamilyPlan[] = [];
  const p4 = await planFamily(r, cmd, 4, v4, rules.v4);
  if (p4) plans.push(p4);
  if (settings.enableIpv6 && v6) {
    const p6 = await planFamily(r, cmd, 6, v6, rules.v6);
    if (p6) plans.push(p6);
  }
  const done: FamilyPlan[] = [];
  for (const p of plans) {
    log.info(`running ${p.backend.restore} with:\n${p.text.trim()}`);
    try {
      await restore(r, p.backend, p.text, true);
      done.push(p);
    } catch (e) {
      for (const q of [p, ...done.reverse()]) await rollback(r, q.backend, q.before);
      throw e;
    }
  }
  await tproxyRoutes(r, cmd, settings.enableIpv6);
}

/** One error line; exit 2 for a command line that cannot be parsed, 1 for anything else. */
function fail(e: unknown): number {
  if (e instanceof IptablesSyntaxError) {
    log.error(`${e.message} (see pilot-agent istio-iptables --help)`);
    return 2;
  }
  log.error(errorMessage(e));
  return 1;
}

/** `pilot-agent istio-iptables [flags]`: the exit code (0 ok, 1 bad value or failure, 2 unparsable flags, 126 failed validation). */
export async function runIstioIptables(args: string[], opts: IptablesRunOptions = {}): Promise<number> {
  const env = opts.env ?? process.env;
  const out = opts.out ?? ((t: string) => void process.stdout.write(t));
  try {
    const cmd = iptablesCommandFromArgs(args, env);
    configureLogging(cmd.logging);
    if (cmd.help) {
      out(iptablesUsage());
      return 0;
    }
    const r = new Runner(env, cmd.networkNamespace);
    if (cmd.cleanupOnly) {
      if (cmd.dryRun) {
        log.info('dry run: would remove every ISTIO_ chain and every jump to one');
        return 0;
      }
      await clean(r, cmd, env);
      return 0;
    }
    const settings = await completeSettings(cmd, r, env, opts.resolvConf ?? '/etc/resolv.conf');
    let rules;
    try {
      rules = buildCaptureRules(settings);
    } catch (e) {
      throw new AgentError('BAD_INPUT', errorMessage(e));
    }
    if (cmd.dryRun) {
      out(renderRestore(restoreTables(rules.v4)));
      if (settings.enableIpv6) out(renderRestore(restoreTables(rules.v6)));
      return 0;
    }
    if (cmd.skipRuleApply) log.info('--skip-rule-apply: no rules applied');
    else await apply(r, cmd, settings, rules);
    if (cmd.runValidation) {
      log.info('validating that connections from this user are captured');
      if (!(await validateCapture(cmd, settings.enableIpv6))) {
        log.error(VALIDATION_MESSAGE);
        return VALIDATION_FAILED;
      }
      log.info('validation passed, iptables rules established');
    }
    return 0;
  } catch (e) {
    return fail(e);
  }
}

/** `pilot-agent istio-clean-iptables [flags]`: removes every Istio chain and jump, in IPv4 and IPv6, in every backend. */
export async function runIstioCleanIptables(args: string[], opts: IptablesRunOptions = {}): Promise<number> {
  const env = opts.env ?? process.env;
  const out = opts.out ?? ((t: string) => void process.stdout.write(t));
  try {
    const cmd = iptablesCommandFromArgs(args, env);
    configureLogging(cmd.logging);
    if (cmd.help) {
      out(iptablesUsage('istio-clean-iptables'));
      return 0;
    }
    if (cmd.dryRun) {
      log.info('dry run: would remove every ISTIO_ chain and every jump to one');
      return 0;
    }
    await clean(new Runner(env, cmd.networkNamespace), cmd, env);
    return 0;
  } catch (e) {
    return fail(e);
  }
}
