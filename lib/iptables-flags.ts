// The flags and environment variables of `pilot-agent istio-iptables`, parsed as Istio's command parses them
// (pflag syntax; a flag wins over its variable), and checked before anything touches the machine.

import { AgentError, errorMessage } from './errors';
import { IPTABLES_ENV as E, type Env } from './env';
import { parseOutputLevels, scope } from './log';
import { DEFAULT_SETTINGS, parsePrefix, separateV4V6, splitList, type CaptureSettings } from './iptables-rules';

const log = scope('iptables');

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
  {
    name: 'envoy-port',
    short: 'p',
    kind: 'string',
    def: '15001',
    help: 'Envoy port to which all outbound TCP traffic is redirected',
  },
  {
    name: 'inbound-capture-port',
    short: 'z',
    kind: 'string',
    env: ['INBOUND_CAPTURE_PORT'],
    def: '15006',
    help: 'Port to which all inbound TCP traffic is redirected',
  },
  {
    name: 'inbound-tunnel-port',
    short: 'e',
    kind: 'string',
    env: ['INBOUND_TUNNEL_PORT'],
    def: '15008',
    help: 'Istio tunnel port for inbound TCP traffic',
  },
  {
    name: 'proxy-uid',
    short: 'u',
    kind: 'string',
    env: ['PROXY_UID'],
    def: '',
    help: "UID(s) whose traffic is not redirected (the proxy's)",
  },
  {
    name: 'proxy-gid',
    short: 'g',
    kind: 'string',
    env: ['PROXY_GID'],
    def: '',
    help: 'GID(s) whose traffic is not redirected (default: the UID)',
  },
  {
    name: 'istio-inbound-interception-mode',
    short: 'm',
    kind: 'string',
    env: ['ISTIO_INBOUND_INTERCEPTION_MODE'],
    def: '',
    help: 'REDIRECT or TPROXY',
  },
  {
    name: 'istio-inbound-ports',
    short: 'b',
    kind: 'string',
    env: ['ISTIO_INBOUND_PORTS'],
    def: '',
    help: 'Inbound ports redirected to Envoy ("*" for all, empty for none)',
  },
  {
    name: 'istio-local-exclude-ports',
    short: 'd',
    kind: 'string',
    env: ['ISTIO_LOCAL_EXCLUDE_PORTS'],
    def: '',
    help: 'Inbound ports excluded when -b is "*"',
  },
  {
    name: 'istio-exclude-interfaces',
    short: 'c',
    kind: 'string',
    env: ['ISTIO_EXCLUDE_INTERFACES'],
    def: '',
    help: 'Interfaces whose traffic is never captured',
  },
  {
    name: 'istio-service-cidr',
    short: 'i',
    kind: 'string',
    env: ['ISTIO_SERVICE_CIDR'],
    def: '',
    help: 'Outbound CIDRs redirected to Envoy ("*" for all, empty for none)',
  },
  {
    name: 'istio-service-exclude-cidr',
    short: 'x',
    kind: 'string',
    env: ['ISTIO_SERVICE_EXCLUDE_CIDR'],
    def: '',
    help: 'Outbound CIDRs excluded',
  },
  {
    name: 'istio-outbound-ports',
    short: 'q',
    kind: 'string',
    env: ['ISTIO_OUTBOUND_PORTS'],
    def: '',
    help: 'Outbound ports always redirected',
  },
  {
    name: 'istio-local-outbound-ports-exclude',
    short: 'o',
    kind: 'string',
    env: ['ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE'],
    def: '',
    help: 'Outbound ports never redirected',
  },
  {
    name: 'kube-virt-interfaces',
    short: 'k',
    kind: 'string',
    env: ['KUBE_VIRT_INTERFACES'],
    def: '',
    help: 'Virtual interfaces whose inbound traffic is treated as outbound',
  },
  {
    name: 'istio-inbound-tproxy-mark',
    short: 't',
    kind: 'string',
    env: ['ISTIO_INBOUND_TPROXY_MARK'],
    def: '1337',
    help: 'TPROXY packet mark',
  },
  {
    name: 'istio-inbound-tproxy-route-table',
    short: 'r',
    kind: 'string',
    env: ['ISTIO_INBOUND_TPROXY_ROUTE_TABLE'],
    def: '133',
    help: 'TPROXY routing table',
  },
  {
    name: 'dry-run',
    short: 'n',
    kind: 'bool',
    env: ['DRY_RUN'],
    def: 'false',
    help: 'Print the rules; change nothing',
  },
  {
    name: 'iptables-probe-port',
    kind: 'uint16',
    env: ['IPTABLES_PROBE_PORT'],
    def: '15002',
    help: 'Port the --run-validation probe connects to',
  },
  {
    name: 'probe-timeout',
    kind: 'duration',
    env: ['PROBE_TIMEOUT'],
    def: '5s',
    help: 'How long --run-validation waits',
  },
  { name: 'skip-rule-apply', kind: 'bool', env: ['SKIP_RULE_APPLY'], def: 'false', help: 'Apply nothing' },
  {
    name: 'run-validation',
    kind: 'bool',
    env: ['RUN_VALIDATION'],
    def: 'false',
    help: 'Check that a connection from this user is captured (run as the proxy uid)',
  },
  {
    name: 'redirect-dns',
    kind: 'bool',
    env: ['ISTIO_META_DNS_CAPTURE', 'REDIRECT_DNS'],
    def: 'false',
    help: 'Capture DNS to the agent on 15053',
  },
  {
    name: 'drop-invalid',
    kind: 'bool',
    env: ['INVALID_DROP', 'DROP_INVALID'],
    def: 'false',
    help: 'Drop packets conntrack marks INVALID',
  },
  {
    name: 'dual-stack',
    kind: 'bool',
    env: ['ISTIO_DUAL_STACK', 'DUAL_STACK'],
    def: 'false',
    help: 'IPv4 and IPv6 redirects',
  },
  {
    name: 'capture-all-dns',
    kind: 'bool',
    env: ['CAPTURE_ALL_DNS'],
    def: 'false',
    help: "Capture DNS to any server, not only resolv.conf's (with --redirect-dns)",
  },
  {
    name: 'network-namespace',
    kind: 'string',
    env: ['NETWORK_NAMESPACE'],
    def: '',
    help: 'Path of the network namespace to program',
  },
  { name: 'cni-mode', kind: 'bool', env: ['CNI_MODE'], def: 'false', help: 'Accepted for compatibility' },
  {
    name: 'reconcile',
    kind: 'bool',
    env: ['RECONCILE'],
    def: 'false',
    help: 'Replace differing Istio rules left by an earlier run',
  },
  {
    name: 'cleanup-only',
    kind: 'bool',
    env: ['CLEANUP_ONLY'],
    def: 'false',
    help: 'Remove the Istio rules and add none',
  },
  {
    name: 'force-apply',
    kind: 'bool',
    env: ['FORCE_APPLY'],
    def: 'false',
    help: 'Apply even when the rules seem to be in place',
  },
  {
    name: 'native-nftables',
    kind: 'bool',
    env: ['NATIVE_NFTABLES'],
    def: 'false',
    help: 'Not supported by this agent',
  },
  { name: 'force-iptables-binary', kind: 'string', env: ['FORCE_IPTABLES_BINARY'], def: '', help: 'legacy or nft' },
  // pilot-agent's global logging flags
  { name: 'log_output_level', kind: 'string', def: '', help: 'Per-scope log levels, <scope>:<level>,...' },
  { name: 'log_as_json', kind: 'bool', def: 'false', help: 'Log JSON lines' },
  { name: 'log_caller', kind: 'string', def: '', help: 'Scopes whose lines carry the caller (file:line), or all' },
  {
    name: 'log_stacktrace_level',
    kind: 'string',
    def: '',
    help: '<scope>:<level>,... at and above which lines carry a stack trace',
  },
  {
    name: 'log_target',
    kind: 'array',
    def: '',
    help: 'Where the log goes: stdout, stderr (default) or a file; repeatable',
  },
  { name: 'vklog', kind: 'string', def: '', help: 'Accepted for compatibility' },
  { name: 'help', short: 'h', kind: 'bool', def: 'false', help: 'Show this help' },
];

const usageError = (msg: string) => new AgentError('BAD_INPUT', msg);

/** A command line that cannot be parsed (exit 2, as the agent's other commands), unlike a bad value (exit 1). */
export class IptablesSyntaxError extends AgentError {
  constructor(message: string) {
    super('BAD_INPUT', message);
  }
}
const syntaxError = (msg: string) => new IptablesSyntaxError(msg);

/** Go's strconv.ParseBool. */
export function parseBool(v: string): boolean | undefined {
  if (['1', 't', 'T', 'TRUE', 'true', 'True'].includes(v)) return true;
  if (['0', 'f', 'F', 'FALSE', 'false', 'False'].includes(v)) return false;
  return undefined;
}

function checkValue(def: FlagDef, value: string, from: string): void {
  const v = JSON.stringify(value);
  if (def.kind === 'bool' && parseBool(value) === undefined)
    throw syntaxError(`invalid ${from}: ${v} is not a boolean`);
  if (def.kind === 'uint16' && !(/^\d+$/.test(value) && Number(value) <= 65535))
    throw syntaxError(`invalid ${from}: ${v} is not a port`);
  if (def.kind === 'duration' && !/^(\d+(\.\d+)?(ns|us|\u00b5s|ms|s|m|h))+$|^0$/.test(value))
    throw syntaxError(`invalid ${from}: ${v} is not a duration`);
}

export interface ParsedFlags {
  /** Every flag's value by its long name (its default when neither the command line nor a variable set it). */
  values: Map<string, string>;
  /** Where a value came from, for error messages: the variable's name when a variable set it. */
  from: Map<string, string>;
}

/** pflag's syntax: --name=v, --name v, -x v, -xv, -x=v, grouped boolean shorthands; `--` ends the flags. */
export function parseIptablesFlags(args: readonly string[], env: Env): ParsedFlags {
  const byName = new Map(FLAGS.map((f) => [f.name, f]));
  const byShort = new Map(FLAGS.filter((f) => f.short).map((f) => [f.short!, f]));
  const values = new Map<string, string>();
  const from = new Map<string, string>();
  const set = (def: FlagDef, value: string, flag: string) => {
    checkValue(def, value, flag);
    values.set(def.name, def.kind === 'array' && values.has(def.name) ? `${values.get(def.name)},${value}` : value);
  };
  for (let i = 0; i < args.length; i++) {
    const arg = args[i]!;
    if (arg === '--') {
      if (i + 1 < args.length)
        throw syntaxError(`unexpected argument "${args[i + 1]}": istio-iptables takes only flags`);
      break;
    }
    if (arg.startsWith('--')) {
      const eq = arg.indexOf('=');
      const name = eq < 0 ? arg.slice(2) : arg.slice(2, eq);
      const def = byName.get(name);
      if (!def) throw syntaxError(`unknown flag: --${name}`);
      if (eq >= 0) set(def, arg.slice(eq + 1), `--${name}`);
      else if (def.kind === 'bool') set(def, 'true', `--${name}`);
      else if (i + 1 < args.length) set(def, args[++i]!, `--${name}`);
      else throw syntaxError(`flag needs an argument: --${name}`);
      continue;
    }
    if (arg.startsWith('-') && arg.length > 1) {
      for (let k = 1; k < arg.length; k++) {
        const c = arg[k]!;
        const def = byShort.get(c);
        if (!def) throw syntaxError(`unknown shorthand flag: '${c}' in ${arg}`);
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
        else throw syntaxError(`flag needs an argument: '${c}' in -${c}`);
        break;
      }
      continue;
    }
    throw syntaxError(
      `unexpected argument "${arg}": istio-iptables takes only flags (quote "*" so the shell does not expand it)`,
    );
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
        from.set(def.name, name);
        break;
      } catch (e) {
        log.warn(`ignoring ${name}: ${errorMessage(e)}`);
      }
    }
  }
  for (const def of FLAGS) if (!values.has(def.name)) values.set(def.name, def.def);
  return { values, from };
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
  /** The logging flags, for the caller to apply. */
  logging: { outputLevel?: string; json: boolean; callers?: string; stacktraceLevel?: string; targets?: string[] };
  help: boolean;
}

// ---- what may reach the iptables-restore text ----
// Every value below becomes words of an iptables-restore line. One that held a newline, a blank or a quote would
// add rules or options of its own choosing (seen: `-c $'x\n-I OUTPUT 1 -m owner --uid-owner 1000 -j RETURN'`
// let uid 1000 escape capture), so each is checked against what it can legitimately be before anything runs.

const q = (v: string) => JSON.stringify(v);
const PORT = /^\d{1,5}(:\d{1,5})?$/;
const U32 = 0xffffffff;

function checkPorts(list: string, where: string, wildcard = false): void {
  if (wildcard && list === '*') return;
  for (const p of splitList(list)) {
    const [lo, hi = lo] = p.split(':').map(Number) as [number, number?];
    if (!PORT.test(p) || lo > 65535 || hi! > 65535 || lo > hi!)
      throw usageError(`invalid ${where}: ${q(p)} is not a port (or a:b range, a <= b)`);
  }
}

/**
 * Why `name` cannot be an interface of -i/-o, or undefined when it can. Linux's rules (dev_valid_name: 1-15 bytes,
 * not "." or "..", no '/', ':' or whitespace; a ':' alias such as eth0:1 is an address label, never a device, so
 * a rule naming it would silently match nothing), iptables' trailing '+' wildcard, and what the restore text
 * cannot carry: only printable ASCII, no quote or backslash (iptables-restore's quoting), no leading '-' or '!'
 * (an option or a negation).
 */
export function interfaceNameProblem(name: string): string | undefined {
  if (/\s/.test(name)) return 'it has whitespace';
  if (Buffer.byteLength(name) > 15) return 'longer than 15 characters';
  if (name === '.' || name === '..') return 'not a name Linux allows';
  if (/[/:]/.test(name)) return `it has ${q(name.match(/[/:]/)![0])}, which Linux does not allow in a device name`;
  if (!/^[!-~]+$/.test(name)) return 'only printable ASCII characters are accepted';
  if (/["'\\]/.test(name)) return 'quotes and backslashes are not accepted';
  if (/^[-!]/.test(name)) return 'it may not start with "-" or "!"';
  if (name.slice(0, -1).includes('+')) return '"+" is only accepted last (iptables\' wildcard)';
  return undefined;
}

function checkInterfaces(list: string, where: string): void {
  for (const nic of splitList(list)) {
    const why = interfaceNameProblem(nic);
    if (why) throw usageError(`invalid ${where}: ${q(nic)} is not an interface name: ${why}`);
  }
}

// --uid-owner / --gid-owner take a number, a min-max range or a user or group name.
const ID_NAME = /^[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?$/;
function checkIds(list: string, where: string, what: string): void {
  for (const id of splitList(list)) {
    const range = /^(\d{1,10})(?:-(\d{1,10}))?$/.exec(id);
    const ok = range
      ? Number(range[1]) < U32 && Number(range[2] ?? range[1]) < U32 && Number(range[1]) <= Number(range[2] ?? range[1])
      : ID_NAME.test(id);
    if (!ok) throw usageError(`invalid ${where}: ${q(id)} is not a ${what} (a number, a min-max range or a name)`);
  }
}

function checkU32(value: string, where: string): void {
  if (!/^\d{1,10}$/.test(value) || Number(value) > U32)
    throw usageError(`invalid ${where} ${q(value)}: not a number from 0 to ${U32}`);
}

/** Flags and variables -> the command's settings, before anything is read from the machine. Throws on bad input. */
export function iptablesCommandFromArgs(args: readonly string[], env: Env): IptablesCommand {
  const { values: v, from } = parseIptablesFlags(args, env);
  const s = (name: string) => v.get(name)!;
  const b = (name: string) => parseBool(s(name)) === true;
  const byName = new Map(FLAGS.map((f) => [f.name, f]));
  // "-c/--istio-exclude-interfaces", or "ISTIO_EXCLUDE_INTERFACES (-c/--istio-exclude-interfaces)" when a variable set it.
  const where = (name: string) => {
    const f = byName.get(name)!;
    const flag = `${f.short ? `-${f.short}/` : ''}--${name}`;
    return from.has(name) ? `${from.get(name)} (${flag})` : flag;
  };

  const mode = s('istio-inbound-interception-mode');
  if (!['', 'REDIRECT', 'TPROXY'].includes(mode))
    throw usageError(`invalid ${where('istio-inbound-interception-mode')} ${q(mode)}: want REDIRECT or TPROXY`);
  for (const name of ['envoy-port', 'inbound-capture-port', 'inbound-tunnel-port']) {
    const p = s(name);
    if (!/^\d{1,5}$/.test(p) || Number(p) < 1 || Number(p) > 65535)
      throw usageError(`invalid ${where(name)} ${q(p)}: not a port`);
  }
  if (s('envoy-port') === s('inbound-capture-port')) {
    throw usageError(`conflicting -p and -z: outbound and inbound capture cannot share port ${s('envoy-port')}`);
  }
  checkPorts(s('istio-inbound-ports'), where('istio-inbound-ports'), true);
  checkPorts(s('istio-local-exclude-ports'), where('istio-local-exclude-ports'));
  checkPorts(s('istio-outbound-ports'), where('istio-outbound-ports'));
  checkPorts(s('istio-local-outbound-ports-exclude'), where('istio-local-outbound-ports-exclude'));
  checkIds(s('proxy-uid'), where('proxy-uid'), 'user id');
  checkIds(s('proxy-gid'), where('proxy-gid'), 'group id');
  checkInterfaces(s('istio-exclude-interfaces'), where('istio-exclude-interfaces'));
  checkInterfaces(s('kube-virt-interfaces'), where('kube-virt-interfaces'));
  for (const name of ['istio-service-cidr', 'istio-service-exclude-cidr']) {
    try {
      separateV4V6(s(name));
    } catch (e) {
      throw usageError(`invalid ${where(name)}: ${errorMessage(e)}`);
    }
  }
  if (s('istio-service-exclude-cidr') === '*')
    throw usageError(
      `invalid ${where('istio-service-exclude-cidr')} "*": exclude specific ranges, or capture nothing with -i ""`,
    );
  checkU32(s('istio-inbound-tproxy-mark'), where('istio-inbound-tproxy-mark'));
  checkU32(s('istio-inbound-tproxy-route-table'), where('istio-inbound-tproxy-route-table'));
  const forceBinary = s('force-iptables-binary');
  if (!['', 'legacy', 'nft'].includes(forceBinary))
    throw usageError(`invalid ${where('force-iptables-binary')} ${q(forceBinary)}: want legacy or nft`);
  if (b('native-nftables'))
    throw usageError('--native-nftables is not supported by this agent: it programs iptables (legacy or nft backend)');
  if (b('cleanup-only') && b('skip-rule-apply')) throw usageError('conflicting --cleanup-only and --skip-rule-apply');
  if (b('cleanup-only') && b('run-validation')) throw usageError('conflicting --cleanup-only and --run-validation');
  if (b('run-validation') && s('network-namespace') !== '') {
    throw usageError(
      'conflicting --run-validation and --network-namespace: the validation probe runs in the current network namespace',
    );
  }
  for (const flag of ['log_output_level', 'log_stacktrace_level']) {
    if (s(flag) === '') continue;
    try {
      parseOutputLevels(s(flag));
    } catch (e) {
      throw usageError(`invalid --${flag}: ${errorMessage(e)}`);
    }
  }

  const loopback = E.ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR.get(env);
  const lp = parsePrefix(loopback);
  const bits = Number(loopback.split('/')[1]);
  if (!lp || lp.v6 || !lp.loopback || bits < 8) {
    throw usageError(
      `invalid ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR ${q(loopback)}: want an IPv4 loopback CIDR with a mask of 8 to 32 bits`,
    );
  }
  const groupsInclude = E.ISTIO_OUTBOUND_OWNER_GROUPS.get(env);
  if (groupsInclude !== '*' && splitList(groupsInclude).length > 64) {
    throw usageError(`invalid ISTIO_OUTBOUND_OWNER_GROUPS: at most 64 groups, got ${splitList(groupsInclude).length}`);
  }
  if (groupsInclude !== '*') checkIds(groupsInclude, 'ISTIO_OUTBOUND_OWNER_GROUPS', 'group id');
  const groupsExclude = E.ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE.get(env);
  checkIds(groupsExclude, 'ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE', 'group id');

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
      ownerGroupsExclude: groupsExclude,
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
    logging: {
      outputLevel: s('log_output_level') || undefined,
      json: b('log_as_json'),
      callers: s('log_caller') || undefined,
      stacktraceLevel: s('log_stacktrace_level') || undefined,
      // Repeated values were joined with commas (a path holding a comma cannot be a target here).
      targets: s('log_target') ? s('log_target').split(',') : undefined,
    },
    help: b('help'),
  };
}

function goDurationMs(text: string): number {
  const unit: Record<string, number> = { ns: 1e-6, us: 1e-3, µs: 1e-3, ms: 1, s: 1000, m: 60_000, h: 3_600_000 };
  let ms = 0;
  for (const m of text.matchAll(/(\d+(?:\.\d+)?)(ns|us|\u00b5s|ms|s|m|h)/g)) ms += Number(m[1]) * unit[m[2]!]!;
  return ms;
}

/** Every flag's long form (`--dry-run`), for shell completion. */
export function iptablesFlagNames(): string[] {
  return FLAGS.map((f) => `--${f.name}`);
}

export function iptablesUsage(command = 'istio-iptables'): string {
  const lines = FLAGS.map((f) => {
    const name = `${f.short ? `-${f.short}, ` : '    '}--${f.name}${f.kind === 'bool' ? '' : ` ${f.kind}`}`;
    const extra = [
      f.env?.length ? `env ${f.env.join(' or ')}` : '',
      f.def && f.def !== 'false' ? `default "${f.def}"` : '',
    ]
      .filter(Boolean)
      .join('; ');
    return `  ${name.padEnd(48)} ${f.help}${extra ? ` (${extra})` : ''}`;
  });
  const what =
    command === 'istio-iptables'
      ? 'Set up iptables rules for the Istio sidecar'
      : "Remove the Istio sidecar's iptables rules";
  return `${what}.\n\nUsage:\n  pilot-agent ${command} [flags]\n\nFlags:\n${lines.join('\n')}\n`;
}
