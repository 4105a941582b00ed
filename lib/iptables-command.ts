// `pilot-agent istio-iptables` and `pilot-agent istio-clean-iptables`: Istio's flags and environment variables,
// the iptables backend detected as Istio's command does (legacy when it already holds rules, else nft, else
// plain), and the rules applied with one iptables-restore per IP family. A run that finds its own rules
// already in place changes nothing; a failed restore puts the previous tables back.

import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import * as os from 'node:os';
import * as net from 'node:net';
import { isIPv4, isIPv6 } from 'node:net';
import { AgentError, errorMessage } from './errors';
import { IPTABLES_ENV as E, type Env } from './env';
import { configureLogging, scope } from './log';
import {
  buildCaptureRules, checkCommands, cleanupTables, DEFAULT_SETTINGS, hasIstioState, parsePrefix, parseSave,
  renderRestore, restoreTables, sameShape, separateV4V6, splitList, type CaptureSettings, type Rule, type TableLines,
} from './iptables-rules';

const log = scope('iptables');

export interface IptablesRunOptions {
  /** Environment (default process.env); its PATH finds the iptables binaries. */
  env?: Env;
  /** Where --dry-run and --help print (default stdout). */
  out?: (text: string) => void;
  /** Default /etc/resolv.conf, as Istio's command reads. */
  resolvConf?: string;
}

type Kind = 'string' | 'bool' | 'uint16' | 'duration' | 'array';
interface FlagDef {
  name: string;
  short?: string;
  kind: Kind;
  /** Variables read when the flag is not given, first match wins (Istio: the extra name overrides the flag's). */
  env?: readonly string[];
  def: string;
  help: string;
}

// Istio's names, shorthands, variables and defaults (tools/istio-iptables/pkg/cmd/root.go).
const FLAGS: readonly FlagDef[] = [
  { name: 'envoy-port', short: 'p', kind: 'string', def: '15001', help: 'Envoy port to which all outbound TCP traffic is redirected' },
  { name: 'inbound-capture-port', short: 'z', kind: 'string', env: ['INBOUND_CAPTURE_PORT'], def: '15006', help: 'Port to which all inbound TCP traffic is redirected' },
  { name: 'inbound-tunnel-port', short: 'e', kind: 'string', env: ['INBOUND_TUNNEL_PORT'], def: '15008', help: 'Istio tunnel port for inbound TCP traffic' },
  { name: 'proxy-uid', short: 'u', kind: 'string', env: ['PROXY_UID'], def: '', help: 'UID(s) whose traffic is not redirected (the proxy\'s)' },
  { name: 'proxy-gid', short: 'g', kind: 'string', env: ['PROXY_GID'], def: '', help: 'GID(s) whose traffic is not redirected (default: the UID)' },
  { name: 'istio-inbound-interception-mode', short: 'm', kind: 'string', env: ['ISTIO_INBOUND_INTERCEPTION_MODE'], def: '', help: 'REDIRECT or TPROXY' },
  { name: 'istio-inbound-ports', short: 'b', kind: 'string', env: ['ISTIO_INBOUND_PORTS'], def: '', help: 'Inbound ports redirected to Envoy ("*" for all, empty for none)' },
  { name: 'istio-local-exclude-ports', short: 'd', kind: 'string', env: ['ISTIO_LOCAL_EXCLUDE_PORTS'], def: '', help: 'Inbound ports excluded when -b is "*"' },
  { name: 'istio-exclude-interfaces', short: 'c', kind: 'string', env: ['ISTIO_EXCLUDE_INTERFACES'], def: '', help: 'Interfaces whose traffic is never captured' },
  { name: 'istio-service-cidr', short: 'i', kind: 'string', env: ['ISTIO_SERVICE_CIDR'], def: '', help: 'Outbound CIDRs redirected to Envoy ("*" for all, empty for none)' },
  { name: 'istio-service-exclude-cidr', short: 'x', kind: 'string', env: ['ISTIO_SERVICE_EXCLUDE_CIDR'], def: '', help: 'Outbound CIDRs excluded' },
  { name: 'istio-outbound-ports', short: 'q', kind: 'string', env: ['ISTIO_OUTBOUND_PORTS'], def: '', help: 'Outbound ports always redirected' },
  { name: 'istio-local-outbound-ports-exclude', short: 'o', kind: 'string', env: ['ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE'], def: '', help: 'Outbound ports never redirected' },
  { name: 'kube-virt-interfaces', short: 'k', kind: 'string', env: ['KUBE_VIRT_INTERFACES'], def: '', help: 'Virtual interfaces whose inbound traffic is treated as outbound' },
  { name: 'istio-inbound-tproxy-mark', short: 't', kind: 'string', env: ['ISTIO_INBOUND_TPROXY_MARK'], def: '1337', help: 'TPROXY packet mark' },
  { name: 'istio-inbound-tproxy-route-table', short: 'r', kind: 'string', env: ['ISTIO_INBOUND_TPROXY_ROUTE_TABLE'], def: '133', help: 'TPROXY routing table' },
  { name: 'dry-run', short: 'n', kind: 'bool', env: ['DRY_RUN'], def: 'false', help: 'Print the rules; change nothing' },
  { name: 'iptables-probe-port', kind: 'uint16', env: ['IPTABLES_PROBE_PORT'], def: '15002', help: 'Port the --run-validation probe connects to' },
  { name: 'probe-timeout', kind: 'duration', env: ['PROBE_TIMEOUT'], def: '5s', help: 'How long --run-validation waits' },
  { name: 'skip-rule-apply', kind: 'bool', env: ['SKIP_RULE_APPLY'], def: 'false', help: 'Apply nothing' },
  { name: 'run-validation', kind: 'bool', env: ['RUN_VALIDATION'], def: 'false', help: 'Check that a connection from this user is captured (run as the proxy uid)' },
  { name: 'redirect-dns', kind: 'bool', env: ['ISTIO_META_DNS_CAPTURE', 'REDIRECT_DNS'], def: 'false', help: 'Capture DNS to the agent on 15053' },
  { name: 'drop-invalid', kind: 'bool', env: ['INVALID_DROP', 'DROP_INVALID'], def: 'false', help: 'Drop packets conntrack marks INVALID' },
  { name: 'dual-stack', kind: 'bool', env: ['ISTIO_DUAL_STACK', 'DUAL_STACK'], def: 'false', help: 'IPv4 and IPv6 redirects' },
  { name: 'capture-all-dns', kind: 'bool', env: ['CAPTURE_ALL_DNS'], def: 'false', help: 'Capture DNS to any server, not only resolv.conf\'s (with --redirect-dns)' },
  { name: 'network-namespace', kind: 'string', env: ['NETWORK_NAMESPACE'], def: '', help: 'Path of the network namespace to program' },
  { name: 'cni-mode', kind: 'bool', env: ['CNI_MODE'], def: 'false', help: 'Accepted for compatibility' },
  { name: 'reconcile', kind: 'bool', env: ['RECONCILE'], def: 'false', help: 'Replace differing Istio rules left by an earlier run' },
  { name: 'cleanup-only', kind: 'bool', env: ['CLEANUP_ONLY'], def: 'false', help: 'Remove the Istio rules and add none' },
  { name: 'force-apply', kind: 'bool', env: ['FORCE_APPLY'], def: 'false', help: 'Apply even when the rules seem to be in place' },
  { name: 'native-nftables', kind: 'bool', env: ['NATIVE_NFTABLES'], def: 'false', help: 'Not supported by this agent' },
  { name: 'force-iptables-binary', kind: 'string', env: ['FORCE_IPTABLES_BINARY'], def: '', help: 'legacy or nft' },
  // pilot-agent's global logging flags
  { name: 'log_output_level', kind: 'string', def: '', help: 'Per-scope log levels, <scope>:<level>,...' },
  { name: 'log_as_json', kind: 'bool', def: 'false', help: 'Log JSON lines' },
  { name: 'log_caller', kind: 'string', def: '', help: 'Accepted for compatibility' },
  { name: 'log_stacktrace_level', kind: 'string', def: '', help: 'Accepted for compatibility' },
  { name: 'log_target', kind: 'array', def: '', help: 'Accepted for compatibility' },
  { name: 'vklog', kind: 'string', def: '', help: 'Accepted for compatibility' },
  { name: 'help', short: 'h', kind: 'bool', def: 'false', help: 'Show this help' },
];

const usageError = (msg: string) => new AgentError('BAD_INPUT', msg);

/** Go's strconv.ParseBool. */
function parseBool(v: string): boolean | undefined {
  if (['1', 't', 'T', 'TRUE', 'true', 'True'].includes(v)) return true;
  if (['0', 'f', 'F', 'FALSE', 'false', 'False'].includes(v)) return false;
  return undefined;
}

function checkValue(def: FlagDef, value: string, from: string): void {
  if (def.kind === 'bool' && parseBool(value) === undefined) throw usageError(`invalid ${from}: "${value}" is not a boolean`);
  if (def.kind === 'uint16' && !(/^\d+$/.test(value) && Number(value) <= 65535)) throw usageError(`invalid ${from}: "${value}" is not a port`);
  if (def.kind === 'duration' && !/^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$|^0$/.test(value)) throw usageError(`invalid ${from}: "${value}" is not a duration`);
}

/** pflag's syntax: --name=v, --name v, -x v, -xv, -x=v, grouped boolean shorthands; `--` ends the flags. */
export function parseIptablesFlags(args: readonly string[], env: Env): Map<string, string> {
  const byName = new Map(FLAGS.map((f) => [f.name, f]));
  const byShort = new Map(FLAGS.filter((f) => f.short).map((f) => [f.short!, f]));
  const values = new Map<string, string>();
  const set = (def: FlagDef, value: string, from: string) => {
    checkValue(def, value, from);
    values.set(def.name, def.kind === 'array' && values.has(def.name) ? `${values.get(def.name)},${value}` : value);
  };
  for (let i = 0; i < args.length; i++) {
    const arg = args[i]!;
    if (arg === '--') {
      if (i + 1 < args.length) throw usageError(`unexpected argument "${args[i + 1]}": istio-iptables takes only flags`);
      break;
    }
    if (arg.startsWith('--')) {
      const eq = arg.indexOf('=');
      const name = eq < 0 ? arg.slice(2) : arg.slice(2, eq);
      const def = byName.get(name);
      if (!def) throw usageError(`unknown flag: --${name}`);
      if (eq >= 0) set(def, arg.slice(eq + 1), `--${name}`);
      else if (def.kind === 'bool') set(def, 'true', `--${name}`);
      else if (i + 1 < args.length) set(def, args[++i]!, `--${name}`);
      else throw usageError(`flag needs an argument: --${name}`);
      continue;
    }
    if (arg.startsWith('-') && arg.length > 1) {
      for (let k = 1; k < arg.length; k++) {
        const c = arg[k]!;
        const def = byShort.get(c);
        if (!def) throw usageError(`unknown shorthand flag: '${c}' in ${arg}`);
        const rest = arg.slice(k + 1);
        if (def.kind === 'bool') {
          if (rest.startsWith('=')) {
            set(def, rest.slice(1), `-${c}`);
            break;
          }
          set(def, 'true', `-${c}`);
          continue;
        }
        if (rest !== '') set(def, rest.startsWith('=') ? rest.slice(1) : rest, `-${c}`);
        else if (i + 1 < args.length) set(def, args[++i]!, `-${c}`);
        else throw usageError(`flag needs an argument: '${c}' in -${c}`);
        break;
      }
      continue;
    }
    throw usageError(`unexpected argument "${arg}": istio-iptables takes only flags (quote "*" so the shell does not expand it)`);
  }
  // Variables fill what the command line left unset. Like Istio, a variable that does not parse is ignored.
  for (const def of FLAGS) {
    if (values.has(def.name) || !def.env) continue;
    for (const name of def.env) {
      const v = env[name];
      if (v === undefined) continue;
      try {
        checkValue(def, v, name);
        values.set(def.name, v);
        break;
      } catch (e) {
        log.warn(`ignoring ${name}: ${errorMessage(e)}`);
      }
    }
  }
  for (const def of FLAGS) if (!values.has(def.name)) values.set(def.name, def.def);
  return values;
}

export interface IptablesCommand {
  settings: CaptureSettings;
  dryRun: boolean;
  cleanupOnly: boolean;
  skipRuleApply: boolean;
  reconcile: boolean;
  forceApply: boolean;
  runValidation: boolean;
  dualStack: boolean;
  tproxyRouteTable: string;
  networkNamespace: string;
  forceBinary: '' | 'legacy' | 'nft';
  probePort: number;
  probeTimeoutMs: number;
  help: boolean;
}

const PORT = /^\d{1,5}(:\d{1,5})?$/;
function checkPorts(list: string, flag: string, wildcard = false): void {
  if (wildcard && list === '*') return;
  for (const p of splitList(list)) {
    if (!PORT.test(p) || p.split(':').some((x) => Number(x) > 65535)) throw usageError(`invalid ${flag}: "${p}" is not a port (or a:b range)`);
  }
}

/** Flags and variables -> the command's settings, before anything is read from the machine. Throws on bad input. */
export function iptablesCommandFromArgs(args: readonly string[], env: Env): IptablesCommand {
  const v = parseIptablesFlags(args, env);
  const s = (name: string) => v.get(name)!;
  const b = (name: string) => parseBool(s(name)) === true;

  const mode = s('istio-inbound-interception-mode');
  if (!['', 'REDIRECT', 'TPROXY'].includes(mode)) throw usageError(`invalid -m/--istio-inbound-interception-mode "${mode}": want REDIRECT or TPROXY`);
  for (const [flag, name] of [['-p', 'envoy-port'], ['-z', 'inbound-capture-port'], ['-e', 'inbound-tunnel-port']] as const) {
    const p = s(name);
    if (!/^\d{1,5}$/.test(p) || Number(p) < 1 || Number(p) > 65535) throw usageError(`invalid ${flag}/--${name} "${p}": not a port`);
  }
  if (s('envoy-port') === s('inbound-capture-port')) {
    throw usageError(`conflicting -p and -z: outbound and inbound capture cannot share port ${s('envoy-port')}`);
  }
  checkPorts(s('istio-inbound-ports'), '-b/--istio-inbound-ports', true);
  checkPorts(s('istio-local-exclude-ports'), '-d/--istio-local-exclude-ports');
  checkPorts(s('istio-outbound-ports'), '-q/--istio-outbound-ports');
  checkPorts(s('istio-local-outbound-ports-exclude'), '-o/--istio-local-outbound-ports-exclude');
  for (const [flag, name] of [['-u', 'proxy-uid'], ['-g', 'proxy-gid']] as const) {
    for (const id of splitList(s(name))) if (!/^[A-Za-z0-9_.-]+$/.test(id)) throw usageError(`invalid ${flag}/--${name}: "${id}" is not a user or group id`);
  }
  for (const [flag, name] of [['-i', 'istio-service-cidr'], ['-x', 'istio-service-exclude-cidr']] as const) {
    try {
      separateV4V6(s(name));
    } catch (e) {
      throw usageError(`invalid ${flag}/--${name}: ${errorMessage(e)}`);
    }
  }
  if (s('istio-service-exclude-cidr') === '*') throw usageError('invalid -x/--istio-service-exclude-cidr "*": exclude specific ranges, or capture nothing with -i ""');
  for (const [flag, name] of [['-t', 'istio-inbound-tproxy-mark'], ['-r', 'istio-inbound-tproxy-route-table']] as const) {
    if (!/^\d+$/.test(s(name))) throw usageError(`invalid ${flag}/--${name} "${s(name)}": not a number`);
  }
  const forceBinary = s('force-iptables-binary');
  if (!['', 'legacy', 'nft'].includes(forceBinary)) throw usageError(`invalid --force-iptables-binary "${forceBinary}": want legacy or nft`);
  if (b('native-nftables')) throw usageError('--native-nftables is not supported by this agent: it programs iptables (legacy or nft backend)');
  if (b('cleanup-only') && b('skip-rule-apply')) throw usageError('conflicting --cleanup-only and --skip-rule-apply');
  if (b('cleanup-only') && b('run-validation')) throw usageError('conflicting --cleanup-only and --run-validation');
  if (b('run-validation') && s('network-namespace') !== '') {
    throw usageError('conflicting --run-validation and --network-namespace: the validation probe runs in the current network namespace');
  }
  if (s('log_output_level') !== '') configureLogging({ outputLevel: s('log_output_level') });
  if (b('log_as_json')) configureLogging({ json: true });

  const loopback = E.ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR.get(env);
  const lp = parsePrefix(loopback);
  const bits = Number(loopback.split('/')[1]);
  if (!lp || lp.v6 || !lp.loopback || bits < 8) {
    throw usageError(`invalid ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR "${loopback}": want an IPv4 loopback CIDR with a mask of 8 to 32 bits`);
  }
  const groupsInclude = E.ISTIO_OUTBOUND_OWNER_GROUPS.get(env);
  if (groupsInclude !== '*' && splitList(groupsInclude).length > 64) {
    throw usageError(`invalid ISTIO_OUTBOUND_OWNER_GROUPS: at most 64 groups, got ${splitList(groupsInclude).length}`);
  }

  return {
    settings: {
      ...DEFAULT_SETTINGS,
      proxyPort: s('envoy-port'),
      inboundCapturePort: s('inbound-capture-port'),
      inboundTunnelPort: s('inbound-tunnel-port'),
      proxyUid: s('proxy-uid'),
      proxyGid: s('proxy-gid'),
      inboundInterceptionMode: mode,
      inboundTProxyMark: s('istio-inbound-tproxy-mark'),
      inboundPortsInclude: s('istio-inbound-ports'),
      inboundPortsExclude: s('istio-local-exclude-ports'),
      ownerGroupsInclude: groupsInclude,
      ownerGroupsExclude: E.ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE.get(env),
      outboundPortsInclude: s('istio-outbound-ports'),
      outboundPortsExclude: s('istio-local-outbound-ports-exclude'),
      outboundIpRangesInclude: s('istio-service-cidr'),
      outboundIpRangesExclude: s('istio-service-exclude-cidr'),
      rerouteVirtualInterfaces: s('kube-virt-interfaces'),
      excludeInterfaces: s('istio-exclude-interfaces'),
      redirectDns: b('redirect-dns'),
      captureAllDns: b('capture-all-dns'),
      dropInvalid: b('drop-invalid'),
      hostIpv4LoopbackCidr: loopback,
    },
    dryRun: b('dry-run'),
    cleanupOnly: b('cleanup-only'),
    skipRuleApply: b('skip-rule-apply'),
    reconcile: b('reconcile'),
    forceApply: b('force-apply'),
    runValidation: b('run-validation'),
    dualStack: b('dual-stack'),
    tproxyRouteTable: s('istio-inbound-tproxy-route-table'),
    networkNamespace: s('network-namespace'),
    forceBinary: forceBinary as IptablesCommand['forceBinary'],
    probePort: Number(s('iptables-probe-port')),
    probeTimeoutMs: goDurationMs(s('probe-timeout')),
    help: b('help'),
  };
}

function goDurationMs(text: string): number {
  const unit: Record<string, number> = { ns: 1e-6, us: 1e-3, 'µs': 1e-3, ms: 1, s: 1000, m: 60_000, h: 3_600_000 };
  let ms = 0;
  for (const m of text.matchAll(/(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)/g)) ms += Number(m[1]) * unit[m[2]!]!;
  return ms;
}

export function iptablesUsage(command = 'istio-iptables'): string {
  const lines = FLAGS.map((f) => {
    const name = `${f.short ? `-${f.short}, ` : '    '}--${f.name}${f.kind === 'bool' ? '' : ` ${f.kind}`}`;
    const extra = [f.env?.length ? `env ${f.env.join(' or ')}` : '', f.def && f.def !== 'false' ? `default "${f.def}"` : ''].filter(Boolean).join('; ');
    return `  ${name.padEnd(48)} ${f.help}${extra ? ` (${extra})` : ''}`;
  });
  const what = command === 'istio-iptables' ? 'Set up iptables rules for the Istio sidecar' : 'Remove the Istio sidecar\'s iptables rules';
  return `${what}.\n\nUsage:\n  pilot-agent ${command} [flags]\n\nFlags:\n${lines.join('\n')}\n`;
}

// ---- running iptables ----

interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

class Runner {
  constructor(private readonly env: Env, private readonly netns: string) {}

  run(bin: string, args: readonly string[], stdin?: string): Promise<RunResult> {
    const [cmd, argv] = this.netns ? ['nsenter', [`--net=${this.netns}`, '--', bin, ...args]] : [bin, [...args]];
    return new Promise((resolve) => {
      const child = spawn(cmd, argv, { env: this.env as NodeJS.ProcessEnv, stdio: ['pipe', 'pipe', 'pipe'] });
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
      child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
      child.stdin.on('error', () => {});
      child.once('error', (err) => resolve({ code: 127, stdout, stderr: `${bin}: ${err.message}` }));
      child.once('close', (code) => resolve({ code: code ?? 1, stdout, stderr: stderr.trim() }));
      child.stdin.end(stdin ?? '');
    });
  }
}

export interface Backend {
  /** iptables, iptables-nft, ip6tables-legacy, ... */
  bin: string;
  save: string;
  restore: string;
  legacy: boolean;
  /** Extra arguments of writing commands (legacy's lock wait). */
  wait: string[];
}

function binaries(family: 4 | 6, variant: '' | 'legacy' | 'nft'): Backend {
  const base = family === 4 ? 'iptables' : 'ip6tables';
  const bin = variant ? `${base}-${variant}` : base;
  return { bin, save: `${bin}-save`, restore: `${bin}-restore`, legacy: variant === 'legacy', wait: [] };
}

/** A usable backend: its save binary runs and a no-op rule can be added to (and removed from) the nat table. */
async function probe(r: Runner, b: Backend): Promise<{ backend?: Backend; dump: string; problem?: string }> {
  const dump = await r.run(b.save, []);
  if (dump.code !== 0) return { dump: '', problem: `${b.save}: ${dump.stderr || `exit ${dump.code}`}` };
  const ver = await r.run(b.save, ['--version']);
  const nft = ver.stdout.includes('nf_tables');
  const m = /v(\d+)\.(\d+)\.(\d+)/.exec(ver.stdout);
  const atLeast162 = m ? Number(m[1]) * 10000 + Number(m[2]) * 100 + Number(m[3]) >= 10602 : false;
  const backend: Backend = { ...b, legacy: !nft, wait: !nft && atLeast162 ? ['--wait=30'] : [] };
  // Protocol 255 is reserved: the rule never matches anything.
  const test = ['-t', 'nat', '-A', 'INPUT', '-p', '255', '-j', 'RETURN', ...backend.wait];
  const add = await r.run(b.bin, test);
  if (add.code !== 0 || add.stderr.includes('does not exist')) {
    return { dump: dump.stdout, problem: `${b.bin} cannot be used (no kernel support for its nat table?): ${add.stderr || `exit ${add.code}`}` };
  }
  test[2] = '-D';
  await r.run(b.bin, test);
  return { backend, dump: dump.stdout };
}

/**
 * Istio's choice: legacy when it already holds rules in this namespace, else nft, else the plain binary.
 * Unlike Istio's, empty legacy tables (which its own probe leaves behind) do not count as rules, so a second run
 * does not switch backends.
 */
export async function detectBackend(r: Runner, family: 4 | 6, force: '' | 'legacy' | 'nft'): Promise<Backend> {
  const problems: string[] = [];
  const tryOne = async (variant: '' | 'legacy' | 'nft') => {
    const p = await probe(r, binaries(family, variant));
    if (p.problem) problems.push(p.problem);
    return p.backend;
  };
  if (force) {
    const b = await tryOne(force);
    if (b) return b;
  } else {
    const legacy = binaries(family, 'legacy');
    const dump = await r.run(legacy.save, []);
    if (dump.code === 0 && /^-A /m.test(dump.stdout)) {
      const b = await tryOne('legacy');
      if (b) return b;
    }
    const b = (await tryOne('nft')) ?? (await tryOne(''));
    if (b) return b;
  }
  const base = family === 4 ? 'iptables' : 'ip6tables';
  throw new AgentError('IO',
    `no usable ${base} binary (tried ${force ? `${base}-${force}` : `${base}-legacy, ${base}-nft, ${base}`}; install the iptables package): ${problems.join('; ')}`);
}

async function save(r: Runner, b: Backend): Promise<string> {
  const res = await r.run(b.save, []);
  if (res.code !== 0) throw new AgentError('IO', `${b.save} failed: ${res.stderr || `exit ${res.code}`}`);
  return res.stdout;
}

async function restore(r: Runner, b: Backend, text: string, noflush: boolean): Promise<void> {
  const res = await r.run(b.restore, [...(noflush ? ['--noflush'] : []), ...b.wait], text);
  if (res.code !== 0) throw new AgentError('IO', `${b.restore} failed: ${res.stderr || `exit ${res.code}`}`);
}

/** Puts the tables back as the dump had them; Istio chains in tables the dump lacked are removed. */
async function rollback(r: Runner, b: Backend, before: string): Promise<void> {
  try {
    const now = parseSave(await save(r, b));
    const had = new Set(parseSave(before).keys());
    const extra = new Map([...cleanupTables(now)].filter(([t]) => !had.has(t)));
    if (extra.size > 0) await restore(r, b, renderRestore(extra), true);
    if (had.size > 0) await restore(r, b, before, false);
  } catch (e) {
    log.error(`could not restore the previous ${b.save} state: ${errorMessage(e)}`);
  }
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
  const usable = addrs.map((a) => a.replace(/^::ffff:(\d+\.\d+\.\d+\.\d+)$/i, '$1')).filter((a) => {
    if (isIPv4(a)) return !a.startsWith('127.') && !a.startsWith('169.254.') && !a.startsWith('224.0.0.');
    if (isIPv6(a)) return a !== '::1' && !/^fe[89ab]/i.test(a) && !/^ff02:/i.test(a);
    return false;
  });
  if (usable.length === 0) throw new AgentError('IO', 'no valid local IP address found (Istio needs one to tell IPv4 from IPv6 pods)');
  return dualStack ? usable.some(isIPv6) : isIPv6(usable[0]!);
}

function resolvConfServers(path: string): { v4: string[]; v6: string[] } {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw new AgentError('IO', `failed to load ${path}: ${errorMessage(e)}`);
  }
  const servers = text.split('\n').map((l) => l.trim().split(/\s+/)).filter((w) => w[0] === 'nameserver' && w[1]).map((w) => w[1]!);
  return { v4: servers.filter((s) => isIPv4(s)), v6: servers.filter((s) => isIPv6(s)) };
}

function uidOf(user: string): string | undefined {
  try {
    for (const line of readFileSync('/etc/passwd', 'utf8').split('\n')) {
      const f = line.split(':');
      if (f[0] === user && f[2]) return f[2];
    }
  } catch {
    /* no passwd file: the default applies */
  }
  return undefined;
}

/** Fills what Istio reads from the machine: the proxy uid, IPv6 or not, resolv.conf's servers. */
async function completeSettings(cmd: IptablesCommand, r: Runner, env: Env, resolvConf: string): Promise<CaptureSettings> {
  const s = { ...cmd.settings };
  if (s.proxyUid === '') s.proxyUid = uidOf(E.ENVOY_USER.get(env)) ?? '1337';
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
      for (let i = 0; i < 20 && local !== undefined && !seen.has(local); i++) await new Promise((r) => setTimeout(r, 10));
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

async function planFamily(r: Runner, cmd: IptablesCommand, family: 4 | 6, backend: Backend, rules: Rule[]): Promise<FamilyPlan | undefined> {
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
    throw new AgentError('CONFIG_INVALID', `${name}: Istio rules from an earlier run differ from the requested ones; ` +
      'pass --reconcile to replace them, or remove them first with istio-clean-iptables');
  }
  log.info(`${name}: replacing the Istio rules of an earlier run`);
  return { family, backend, before, text: renderRestore(cleanupTables(current), wanted) };
}

async function tproxyRoutes(r: Runner, cmd: IptablesCommand, ipv6: boolean): Promise<void> {
  const ip = async (args: string[], tolerateExists: boolean) => {
    const res = await r.run('ip', args);
    if (res.code !== 0 && !(tolerateExists && /exists|already assigned/i.test(res.stderr))) throw new AgentError('IO', `ip ${args.join(' ')} failed: ${res.stderr}`);
  };
  if (ipv6) await ip(['-6', 'addr', 'add', '::6/128', 'dev', 'lo'], true);
  if (cmd.settings.inboundPortsInclude === '' || cmd.settings.inboundInterceptionMode !== 'TPROXY') return;
  const mark = cmd.settings.inboundTProxyMark;
  const table = cmd.tproxyRouteTable;
  for (const fam of ipv6 ? ['-4', '-6'] : ['-4']) {
    const rules = await r.run('ip', [fam, 'rule', 'show']);
    const hex = `0x${Number(mark).toString(16)}`;
    if (!new RegExp(`fwmark (${mark}|${hex}) lookup ${table}\\b`).test(rules.stdout)) await ip([fam, 'rule', 'add', 'fwmark', mark, 'lookup', table], false);
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
  if (s.proxyUid === '') s.proxyUid = uidOf(E.ENVOY_USER.get(env)) ?? '1337';
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
  if (!found) throw new AgentError('IO', 'no usable iptables binary (tried iptables-legacy-save, iptables-nft-save, iptables-save; install the iptables package)');
}

async function apply(r: Runner, cmd: IptablesCommand, settings: CaptureSettings, rules: { v4: Rule[]; v6: Rule[] }): Promise<void> {
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

function fail(e: unknown): number {
  log.error(errorMessage(e));
  return 1;
}

/** `pilot-agent istio-iptables [flags]`: the exit code (0 ok, 1 bad input or failure). */
export async function runIstioIptables(args: string[], opts: IptablesRunOptions = {}): Promise<number> {
  const env = opts.env ?? process.env;
  const out = opts.out ?? ((t: string) => void process.stdout.write(t));
  try {
    const cmd = iptablesCommandFromArgs(args, env);
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
