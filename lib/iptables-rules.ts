// The traffic-capture rules of `istio-iptables`, as a pure function of its settings: the same rules, in the same
// order, that Istio's Go command writes for the same arguments (test/golden/iptables holds its output). Also the
// pure helpers around them: the iptables-restore text, `-C` checks, and the clean-up derived from iptables-save.

import { isIPv4, isIPv6 } from 'node:net';

export interface CaptureSettings {
  proxyPort: string;
  inboundCapturePort: string;
  inboundTunnelPort: string;
  proxyUid: string;
  proxyGid: string;
  /** REDIRECT (anything but TPROXY behaves as REDIRECT, as in Istio) or TPROXY. */
  inboundInterceptionMode: string;
  inboundTProxyMark: string;
  inboundPortsInclude: string;
  inboundPortsExclude: string;
  ownerGroupsInclude: string;
  ownerGroupsExclude: string;
  outboundPortsInclude: string;
  outboundPortsExclude: string;
  outboundIpRangesInclude: string;
  outboundIpRangesExclude: string;
  rerouteVirtualInterfaces: string;
  excludeInterfaces: string;
  redirectDns: boolean;
  captureAllDns: boolean;
  dropInvalid: boolean;
  enableIpv6: boolean;
  dnsServersV4: readonly string[];
  dnsServersV6: readonly string[];
  hostIpv4LoopbackCidr: string;
}

export const DEFAULT_SETTINGS: CaptureSettings = Object.freeze({
  proxyPort: '15001',
  inboundCapturePort: '15006',
  inboundTunnelPort: '15008',
  proxyUid: '1337',
  proxyGid: '1337',
  inboundInterceptionMode: '',
  inboundTProxyMark: '1337',
  inboundPortsInclude: '',
  inboundPortsExclude: '',
  ownerGroupsInclude: '*',
  ownerGroupsExclude: '',
  outboundPortsInclude: '',
  outboundPortsExclude: '',
  outboundIpRangesInclude: '',
  outboundIpRangesExclude: '',
  rerouteVirtualInterfaces: '',
  excludeInterfaces: '',
  redirectDns: false,
  captureAllDns: false,
  dropInvalid: false,
  enableIpv6: false,
  dnsServersV4: [],
  dnsServersV6: [],
  hostIpv4LoopbackCidr: '127.0.0.1/32',
});

export const DNS_LISTENER_PORT = '15053';
const OUTBOUND_MARK = '1338';
const BUILT_IN = new Set(['INPUT', 'OUTPUT', 'FORWARD', 'PREROUTING', 'POSTROUTING', 'ACCEPT', 'RETURN', 'DROP']);
const IP = '\0ip'; // stands for the family's address in a rule built for both families
// One word of an iptables-restore line: printable ASCII with no blank, quote or backslash (which would split it,
// or join it with the next words, in iptables-restore's parser).
const RESTORE_WORD = /^[!#-&(-[\]-~]+$/;

export interface Rule {
  readonly table: string;
  readonly chain: string;
  /** `-A CHAIN ...` or `-I CHAIN N ...` */
  readonly params: readonly string[];
}

export interface RuleSet {
  v4: Rule[];
  v6: Rule[];
}

/** Istio's comma list: empty items dropped, no trimming. */
export function splitList(s: string): string[] {
  return s === '' ? [] : s.split(',').filter((x) => x !== '');
}

export interface NetworkRange {
  wildcard: boolean;
  cidrs: string[];
  hasLoopback: boolean;
}

/** Splits a CIDR list into IPv4 and IPv6 ranges; throws on an entry that is not addr/bits. */
export function separateV4V6(list: string): { v4: NetworkRange; v6: NetworkRange } {
  if (list === '*')
    return {
      v4: { wildcard: true, cidrs: [], hasLoopback: false },
      v6: { wildcard: true, cidrs: [], hasLoopback: false },
    };
  const v4: NetworkRange = { wildcard: false, cidrs: [], hasLoopback: false };
  const v6: NetworkRange = { wildcard: false, cidrs: [], hasLoopback: false };
  for (const item of splitList(list)) {
    const p = parsePrefix(item);
    if (!p) throw new Error(`"${item}" is not a CIDR (address/bits)`);
    const r = p.v6 ? v6 : v4;
    r.cidrs.push(p.text);
    if (p.loopback) r.hasLoopback = true;
  }
  return { v4, v6 };
}

/** Parses addr/bits as Go's netip.ParsePrefix does (no masking); IPv6 is printed in its canonical form. */
export function parsePrefix(s: string): { text: string; v6: boolean; loopback: boolean } | undefined {
  const m = /^([^/]+)\/(\d{1,3})$/.exec(s);
  if (!m) return undefined;
  const [, addr, bitsText] = m as unknown as [string, string, string];
  const bits = Number(bitsText);
  if (isIPv4(addr) && !/(^|\.)0\d/.test(addr)) {
    if (bits > 32) return undefined;
    return { text: `${addr}/${bits}`, v6: false, loopback: addr.startsWith('127.') };
  }
  if (isIPv6(addr) && !addr.includes('%')) {
    if (bits > 128) return undefined;
    const canonical = new URL(`http://[${addr}]/`).hostname.slice(1, -1);
    return { text: `${canonical}/${bits}`, v6: true, loopback: canonical === '::1' };
  }
  return undefined;
}

class Builder {
  readonly v4: Rule[] = [];
  readonly v6: Rule[] = [];
  constructor(private readonly ipv6: boolean) {}

  appendV4(chain: string, table: string, ...params: string[]): void {
    this.v4.push({ table, chain, params: ['-A', chain, ...params] });
  }
  appendV6(chain: string, table: string, ...params: string[]): void {
    if (this.ipv6) this.v6.push({ table, chain, params: ['-A', chain, ...params] });
  }
  append(chain: string, table: string, ...params: string[]): void {
    this.appendV4(chain, table, ...params);
    this.appendV6(chain, table, ...params);
  }
  insertV4(chain: string, table: string, pos: number, ...params: string[]): void {
    this.v4.push({ table, chain, params: ['-I', chain, String(pos), ...params] });
  }
  insertV6(chain: string, table: string, pos: number, ...params: string[]): void {
    if (this.ipv6) this.v6.push({ table, chain, params: ['-I', chain, String(pos), ...params] });
  }
  insert(chain: string, table: string, pos: number, ...params: string[]): void {
    this.insertV4(chain, table, pos, ...params);
    this.insertV6(chain, table, pos, ...params);
  }
  /** One rule per family, with IP replaced by that family's address. */
  appendVersioned(v4addr: string, v6addr: string, chain: string, table: string, ...params: string[]): void {
    this.appendV4(chain, table, ...params.map((p) => (p === IP ? v4addr : p)));
    this.appendV6(chain, table, ...params.map((p) => (p === IP ? v6addr : p)));
  }
}

/** The rules for one run of istio-iptables. Throws (with the setting's name) on a CIDR list it cannot use. */
export function buildCaptureRules(c: CaptureSettings): RuleSet {
  const b = new Builder(c.enableIpv6);
  const tproxy = c.inboundInterceptionMode === 'TPROXY';
  const loop4 = c.hostIpv4LoopbackCidr;

  const exclude = separateV4V6(c.outboundIpRangesExclude);
  if (exclude.v4.wildcard) throw new Error('invalid value for OUTBOUND_IP_RANGES_EXCLUDE');
  const include = separateV4V6(c.outboundIpRangesInclude);

  const redirectDns = c.redirectDns && (c.captureAllDns || c.dnsServersV4.length > 0 || c.dnsServersV6.length > 0);

  for (const nic of splitList(c.excludeInterfaces)) {
    b.append('PREROUTING', 'nat', '-i', nic, '-j', 'RETURN');
    b.append('OUTPUT', 'nat', '-o', nic, '-j', 'RETURN');
  }
  if (tproxy) {
    for (const nic of splitList(c.excludeInterfaces)) {
      b.append('PREROUTING', 'mangle', '-i', nic, '-j', 'RETURN');
      b.append('OUTPUT', 'mangle', '-o', nic, '-j', 'RETURN');
    }
  }
  for (const nic of splitList(c.rerouteVirtualInterfaces)) b.insert('PREROUTING', 'nat', 1, '-i', nic, '-j', 'RETURN');

  if (c.dropInvalid) {
    b.append('PREROUTING', 'mangle', '-m', 'conntrack', '--ctstate', 'INVALID', '-j', 'ISTIO_DROP');
    b.append('ISTIO_DROP', 'mangle', '-j', 'DROP');
  }

  b.append('ISTIO_INBOUND', 'nat', '-p', 'tcp', '--dport', c.inboundTunnelPort, '-j', 'RETURN');
  b.append('ISTIO_REDIRECT', 'nat', '-p', 'tcp', '-j', 'REDIRECT', '--to-ports', c.proxyPort);
  b.append('ISTIO_IN_REDIRECT', 'nat', '-p', 'tcp', '-j', 'REDIRECT', '--to-ports', c.inboundCapturePort);

  inbound(b, c, tproxy);

  b.append('OUTPUT', 'nat', '-j', 'ISTIO_OUTPUT');
  for (const port of splitList(c.outboundPortsExclude)) {
    b.append('ISTIO_OUTPUT', 'nat', '-p', 'tcp', '--dport', port, '-j', 'RETURN');
    b.append('ISTIO_OUTPUT', 'nat', '-p', 'udp', '--dport', port, '-j', 'RETURN');
  }
  // Envoy's inbound passthrough connects from 127.0.0.6 (::6): never capture those.
  b.appendVersioned('127.0.0.6/32', '::6/128', 'ISTIO_OUTPUT', 'nat', '-o', 'lo', '-s', IP, '-j', 'RETURN');

  const loopbackIncluded = include.v4.hasLoopback || include.v6.hasLoopback;
  for (const [flag, ids] of [
    ['--uid-owner', splitList(c.proxyUid)],
    ['--gid-owner', splitList(c.proxyGid)],
  ] as const) {
    for (const id of ids) {
      // The proxy calling a local address other than the app's loopback (a service VIP routed back to this pod)
      // goes to Envoy's inbound side. With DNS capture the gid rule keeps its single port, as Istio's does.
      if (redirectDns && flag === '--uid-owner') {
        b.appendVersioned(
          loop4,
          '::1/128',
          'ISTIO_OUTPUT',
          'nat',
          '-o',
          'lo',
          '!',
          '-d',
          IP,
          '-p',
          'tcp',
          '-m',
          'multiport',
          '!',
          '--dports',
          `53,${c.inboundTunnelPort}`,
          '-m',
          'owner',
          flag,
          id,
          '-j',
          'ISTIO_IN_REDIRECT',
        );
      } else {
        b.appendVersioned(
          loop4,
          '::1/128',
          'ISTIO_OUTPUT',
          'nat',
          '-o',
          'lo',
          '!',
          '-d',
          IP,
          '-p',
          'tcp',
          '!',
          '--dport',
          c.inboundTunnelPort,
          '-m',
          'owner',
          flag,
          id,
          '-j',
          'ISTIO_IN_REDIRECT',
        );
      }
      // The app calling itself over lo is left alone, unless loopback was asked for explicitly (-i 127.0.0.1/32).
      if (!loopbackIncluded) {
        if (redirectDns) {
          b.append(
            'ISTIO_OUTPUT',
            'nat',
            '-o',
            'lo',
            '-p',
            'tcp',
            '!',
            '--dport',
            '53',
            '-m',
            'owner',
            '!',
            flag,
            id,
            '-j',
            'RETURN',
          );
        } else {
          b.append('ISTIO_OUTPUT', 'nat', '-o', 'lo', '-m', 'owner', '!', flag, id, '-j', 'RETURN');
        }
      }
      // Anything else the proxy sends is never captured again (no loops), whatever the protocol.
      b.append('ISTIO_OUTPUT', 'nat', '-m', 'owner', flag, id, '-j', 'RETURN');
    }
  }

  const groups = ownerGroupsFilter(c.ownerGroupsInclude, c.ownerGroupsExclude);
  if (groups.except) {
    for (const g of groups.values) b.append('ISTIO_OUTPUT', 'nat', '-m', 'owner', '--gid-owner', g, '-j', 'RETURN');
  } else {
    b.append(
      'ISTIO_OUTPUT',
      'nat',
      ...groups.values.flatMap((g) => ['-m', 'owner', '!', '--gid-owner', g]),
      '-j',
      'RETURN',
    );
  }

  if (redirectDns) dnsRules(b, c);

  b.appendVersioned(loop4, '::1/128', 'ISTIO_OUTPUT', 'nat', '-d', IP, '-j', 'RETURN');
  for (const cidr of exclude.v4.cidrs) b.appendV4('ISTIO_OUTPUT', 'nat', '-d', cidr, '-j', 'RETURN');
  for (const cidr of exclude.v6.cidrs) b.appendV6('ISTIO_OUTPUT', 'nat', '-d', cidr, '-j', 'RETURN');

  for (const port of splitList(c.outboundPortsInclude)) {
    b.append('ISTIO_OUTPUT', 'nat', '-p', 'tcp', '--dport', port, '-j', 'ISTIO_REDIRECT');
  }
  outboundInclude(include.v4, c, b.appendV4.bind(b), b.insertV4.bind(b));
  outboundInclude(include.v6, c, b.appendV6.bind(b), b.insertV6.bind(b));

  if (tproxy) tproxyMarks(b, c);
  for (const r of [...b.v4, ...b.v6]) {
    // The command checks every setting first; this only keeps a future caller from writing a line of its own.
    const bad = r.params.find((w) => !RESTORE_WORD.test(w));
    if (bad !== undefined) throw new Error(`refusing ${JSON.stringify(bad)} as a word of an iptables rule`);
  }
  return { v4: b.v4, v6: b.v6 };
}

function inbound(b: Builder, c: CaptureSettings, tproxy: boolean): void {
  if (c.inboundPortsInclude === '') return;
  const table = tproxy ? 'mangle' : 'nat';
  if (tproxy) {
    b.append('ISTIO_DIVERT', 'mangle', '-j', 'MARK', '--set-mark', c.inboundTProxyMark);
    b.append('ISTIO_DIVERT', 'mangle', '-j', 'ACCEPT');
    b.appendVersioned(
      c.hostIpv4LoopbackCidr,
      '::1/128',
      'ISTIO_TPROXY',
      'mangle',
      '!',
      '-d',
      IP,
      '-p',
      'tcp',
      '-j',
      'TPROXY',
      '--tproxy-mark',
      `${c.inboundTProxyMark}/0xffffffff`,
      '--on-port',
      c.inboundCapturePort,
    );
  }
  b.append('PREROUTING', table, '-p', 'tcp', '-j', 'ISTIO_INBOUND');
  if (c.inboundPortsInclude === '*') {
    for (const port of splitList(c.inboundPortsExclude))
      b.append('ISTIO_INBOUND', table, '-p', 'tcp', '--dport', port, '-j', 'RETURN');
    if (tproxy) {
      b.append(
        'ISTIO_INBOUND',
        'mangle',
        '-p',
        'tcp',
        '-m',
        'conntrack',
        '--ctstate',
        'RELATED,ESTABLISHED',
        '-j',
        'ISTIO_DIVERT',
      );
      b.append('ISTIO_INBOUND', 'mangle', '-p', 'tcp', '-j', 'ISTIO_TPROXY');
    } else {
      b.append('ISTIO_INBOUND', 'nat', '-p', 'tcp', '-j', 'ISTIO_IN_REDIRECT');
    }
    return;
  }
  for (const port of splitList(c.inboundPortsInclude)) {
    if (tproxy) {
      b.append(
        'ISTIO_INBOUND',
        'mangle',
        '-p',
        'tcp',
        '--dport',
        port,
        '-m',
        'conntrack',
        '--ctstate',
        'RELATED,ESTABLISHED',
        '-j',
        'ISTIO_DIVERT',
      );
      b.append('ISTIO_INBOUND', 'mangle', '-p', 'tcp', '--dport', port, '-j', 'ISTIO_TPROXY');
    } else {
      b.append('ISTIO_INBOUND', 'nat', '-p', 'tcp', '--dport', port, '-j', 'ISTIO_IN_REDIRECT');
    }
  }
}

function outboundInclude(
  range: NetworkRange,
  c: CaptureSettings,
  append: (chain: string, table: string, ...p: string[]) => void,
  insert: (chain: string, table: string, pos: number, ...p: string[]) => void,
): void {
  if (range.wildcard) {
    append('ISTIO_OUTPUT', 'nat', '-j', 'ISTIO_REDIRECT');
    for (const nic of splitList(c.rerouteVirtualInterfaces))
      insert('PREROUTING', 'nat', 1, '-i', nic, '-j', 'ISTIO_REDIRECT');
    return;
  }
  for (const cidr of range.cidrs) {
    for (const nic of splitList(c.rerouteVirtualInterfaces))
      insert('PREROUTING', 'nat', 1, '-i', nic, '-d', cidr, '-j', 'ISTIO_REDIRECT');
    append('ISTIO_OUTPUT', 'nat', '-d', cidr, '-j', 'ISTIO_REDIRECT');
  }
}

function ownerGroupsFilter(include: string, exclude: string): { values: string[]; except: boolean } {
  if (include === '*') return { values: splitList(exclude), except: true };
  return { values: splitList(include), except: false };
}

function dnsRules(b: Builder, c: CaptureSettings): void {
  const all = c.captureAllDns;
  b.append('OUTPUT', 'raw', '-j', 'ISTIO_OUTPUT_DNS');
  if (all || c.dnsServersV4.length > 0) b.appendV4('ISTIO_OUTPUT', 'nat', '-j', 'ISTIO_OUTPUT_DNS');
  if (all || c.dnsServersV6.length > 0) b.appendV6('ISTIO_OUTPUT', 'nat', '-j', 'ISTIO_OUTPUT_DNS');
  // Only the configured resolvers' port 53 is sent to the agent, so a local resolver's own upstream queries
  // (app -> agent -> dnsmasq -> upstream) do not loop; --capture-all-dns takes every destination.
  if (all) {
    b.append(
      'ISTIO_OUTPUT_DNS',
      'nat',
      '-p',
      'tcp',
      '--dport',
      '53',
      '-j',
      'REDIRECT',
      '--to-ports',
      DNS_LISTENER_PORT,
    );
  } else {
    for (const s of c.dnsServersV4)
      b.appendV4(
        'ISTIO_OUTPUT_DNS',
        'nat',
        '-p',
        'tcp',
        '--dport',
        '53',
        '-d',
        `${s}/32`,
        '-j',
        'REDIRECT',
        '--to-ports',
        DNS_LISTENER_PORT,
      );
    for (const s of c.dnsServersV6)
      b.appendV6(
        'ISTIO_OUTPUT_DNS',
        'nat',
        '-p',
        'tcp',
        '--dport',
        '53',
        '-d',
        `${s}/128`,
        '-j',
        'REDIRECT',
        '--to-ports',
        DNS_LISTENER_PORT,
      );
  }
  if (all) {
    b.append('ISTIO_OUTPUT_DNS', 'nat', '-p', 'udp', '--dport', '53', '-j', 'REDIRECT', '--to-port', DNS_LISTENER_PORT);
  } else {
    for (const s of c.dnsServersV4)
      b.appendV4(
        'ISTIO_OUTPUT_DNS',
        'nat',
        '-p',
        'udp',
        '--dport',
        '53',
        '-d',
        `${s}/32`,
        '-j',
        'REDIRECT',
        '--to-port',
        DNS_LISTENER_PORT,
      );
    for (const s of c.dnsServersV6)
      b.appendV6(
        'ISTIO_OUTPUT_DNS',
        'nat',
        '-p',
        'udp',
        '--dport',
        '53',
        '-d',
        `${s}/128`,
        '-j',
        'REDIRECT',
        '--to-port',
        DNS_LISTENER_PORT,
      );
  }
  // Separate conntrack zones for agent<->upstream (1) and app<->agent (2) UDP DNS, against conntrack races.
  for (const [flag, ids] of [
    ['--uid-owner', splitList(c.proxyUid)],
    ['--gid-owner', splitList(c.proxyGid)],
  ] as const) {
    for (const id of ids) {
      b.append(
        'ISTIO_OUTPUT_DNS',
        'raw',
        '-p',
        'udp',
        '--dport',
        '53',
        '-m',
        'owner',
        flag,
        id,
        '-j',
        'CT',
        '--zone',
        '1',
      );
      b.append(
        'ISTIO_OUTPUT_DNS',
        'raw',
        '-p',
        'udp',
        '--sport',
        DNS_LISTENER_PORT,
        '-m',
        'owner',
        flag,
        id,
        '-j',
        'CT',
        '--zone',
        '2',
      );
    }
  }
  if (all) {
    b.append('PREROUTING', 'raw', '-j', 'ISTIO_INBOUND');
    b.append('ISTIO_OUTPUT_DNS', 'raw', '-p', 'udp', '--dport', '53', '-j', 'CT', '--zone', '2');
    b.append('ISTIO_INBOUND', 'raw', '-p', 'udp', '--sport', '53', '-j', 'CT', '--zone', '1');
    return;
  }
  if (c.dnsServersV4.length > 0) b.appendV4('PREROUTING', 'raw', '-j', 'ISTIO_INBOUND');
  for (const s of c.dnsServersV4) {
    b.appendV4('ISTIO_OUTPUT_DNS', 'raw', '-p', 'udp', '--dport', '53', '-d', `${s}/32`, '-j', 'CT', '--zone', '2');
    b.appendV4('ISTIO_INBOUND', 'raw', '-p', 'udp', '--sport', '53', '-s', `${s}/32`, '-j', 'CT', '--zone', '1');
  }
  if (c.dnsServersV6.length > 0) b.appendV6('PREROUTING', 'raw', '-j', 'ISTIO_INBOUND');
  for (const s of c.dnsServersV6) {
    b.appendV6('ISTIO_OUTPUT_DNS', 'raw', '-p', 'udp', '--dport', '53', '-d', `${s}/128`, '-j', 'CT', '--zone', '2');
    b.appendV6('ISTIO_INBOUND', 'raw', '-p', 'udp', '--sport', '53', '-s', `${s}/128`, '-j', 'CT', '--zone', '1');
  }
}

function tproxyMarks(b: Builder, c: CaptureSettings): void {
  const mark = c.inboundTProxyMark;
  // The mark set by Envoy's original_src filter becomes the connection's mark, and is restored on the
  // workload's replies so policy routing sends them back through Envoy.
  b.append('PREROUTING', 'mangle', '-p', 'tcp', '-m', 'mark', '--mark', mark, '-j', 'CONNMARK', '--save-mark');
  b.append('OUTPUT', 'mangle', '-p', 'tcp', '-o', 'lo', '-m', 'mark', '--mark', mark, '-j', 'RETURN');
  for (const [flag, ids] of [
    ['--uid-owner', splitList(c.proxyUid)],
    ['--gid-owner', splitList(c.proxyGid)],
  ] as const) {
    for (const id of ids) {
      b.appendVersioned(
        c.hostIpv4LoopbackCidr,
        '::1/128',
        'OUTPUT',
        'mangle',
        '!',
        '-d',
        IP,
        '-p',
        'tcp',
        '-o',
        'lo',
        '-m',
        'owner',
        flag,
        id,
        '-j',
        'MARK',
        '--set-mark',
        OUTBOUND_MARK,
      );
    }
  }
  b.append('OUTPUT', 'mangle', '-p', 'tcp', '-m', 'connmark', '--mark', mark, '-j', 'CONNMARK', '--restore-mark');
  b.insert('ISTIO_INBOUND', 'mangle', 1, '-p', 'tcp', '-m', 'mark', '--mark', mark, '-j', 'RETURN');
  b.insertV4('ISTIO_INBOUND', 'mangle', 2, '-p', 'tcp', '-s', '127.0.0.6/32', '-i', 'lo', '-j', 'RETURN');
  b.insertV6('ISTIO_INBOUND', 'mangle', 2, '-p', 'tcp', '-s', '::6/128', '-i', 'lo', '-j', 'RETURN');
  b.insert(
    'ISTIO_INBOUND',
    'mangle',
    3,
    '-p',
    'tcp',
    '-i',
    'lo',
    '-m',
    'mark',
    '!',
    '--mark',
    OUTBOUND_MARK,
    '-j',
    'RETURN',
  );
}

export type TableLines = Map<string, string[]>;

/**
 * iptables-restore lines per table: `-N` for every non-built-in chain a rule is in or jumps to, then the rules
 * in order.
 */
export function restoreTables(rules: readonly Rule[]): TableLines {
  const tables: TableLines = new Map();
  const lines = (t: string) => tables.get(t) ?? (tables.set(t, []), tables.get(t)!);
  const created = new Set<string>();
  const create = (chain: string, table: string) => {
    const key = `${chain}:${table}`;
    if (created.has(key)) return;
    created.add(key);
    if (!BUILT_IN.has(chain)) lines(table).push(`-N ${chain}`);
  };
  for (const r of rules) create(r.chain, r.table);
  for (const r of rules) {
    const p = r.params;
    if (p.length >= 2 && p[p.length - 2] === '-j') create(p[p.length - 1]!, r.table);
  }
  for (const r of rules) lines(r.table).push(r.params.join(' '));
  return tables;
}

/** iptables-restore input, tables sorted by name, each part's lines in order (for example a clean-up, then rules). */
export function renderRestore(...parts: TableLines[]): string {
  const names = [...new Set(parts.flatMap((p) => [...p.keys()]))].sort();
  let out = '';
  for (const t of names) {
    const ls = parts.flatMap((p) => p.get(t) ?? []);
    if (ls.length > 0) out += `* ${t}\n${ls.join('\n')}\nCOMMIT\n`;
  }
  return out;
}

/** The iptables-restore input (for --noflush) that Istio's command feeds for these rules. */
export function restoreText(rules: readonly Rule[]): string {
  return renderRestore(restoreTables(rules));
}

/** `iptables -t T -C ...` argument lists that succeed only when every rule is present. */
export function checkCommands(rules: readonly Rule[]): string[][] {
  return rules.map((r) => {
    const [op, chain, ...rest] = r.params;
    const params = op === '-I' ? rest.slice(1) : rest;
    return ['-t', r.table, '-C', chain!, ...params];
  });
}

/** Per table, the chains and rules (as iptables-save prints them) of an iptables-save dump. */
export type SaveState = Map<string, Map<string, string[]>>;

/** Parses iptables-save (or restore) text; keeps built-in chains' rules and every ISTIO* chain. */
export function parseSave(text: string): SaveState {
  const state: SaveState = new Map();
  let table = '';
  for (const raw of text.split('\n')) {
    const line = raw.trimEnd();
    if (line.trim() === '' || line.startsWith('#') || line === 'COMMIT') continue;
    if (line.startsWith('*')) {
      table = line.slice(1).trim();
      if (!state.has(table)) state.set(table, new Map());
      continue;
    }
    const chains = state.get(table);
    if (!chains) continue;
    if (line.startsWith(':')) {
      const chain = line.slice(1).split(' ')[0]!;
      if (chain.startsWith('ISTIO') && !chains.has(chain)) chains.set(chain, []);
      continue;
    }
    const words = line.split(' ');
    if ((words[0] === '-A' || words[0] === '-I') && words[1]) {
      const chain = words[1];
      if (!chains.has(chain)) chains.set(chain, []);
      chains.get(chain)!.push(line);
    } else if (words[0] === '-N' && words[1]?.startsWith('ISTIO')) {
      if (!chains.has(words[1])) chains.set(words[1], []);
    }
  }
  return state;
}

function jumpsToIstio(rule: string): boolean {
  const w = rule.split(/\s+/);
  const j = w.findIndex((x) => x === '-j' || x === '--jump');
  return j >= 0 && (w[j + 1] ?? '').replace(/['"]/g, '').startsWith('ISTIO_');
}

/** True when the dump has any ISTIO_ chain or any rule jumping to one. */
export function hasIstioState(state: SaveState): boolean {
  for (const chains of state.values()) {
    for (const [chain, rules] of chains) {
      if (chain.startsWith('ISTIO_') || rules.some(jumpsToIstio)) return true;
    }
  }
  return false;
}

/**
 * iptables-restore lines (for --noflush) that remove every Istio chain and every jump to one found in the
 * dump, per table: jumps deleted, then all ISTIO_ chains flushed, then deleted.
 */
export function cleanupTables(state: SaveState): TableLines {
  const out: TableLines = new Map();
  for (const [table, chains] of state) {
    const deletes: string[] = [];
    const istio: string[] = [];
    for (const [chain, rules] of chains) {
      if (chain.startsWith('ISTIO_')) istio.push(chain);
      else for (const r of rules) if (jumpsToIstio(r)) deletes.push(r.replace(/^-[AI] /, '-D '));
    }
    if (deletes.length > 0 || istio.length > 0)
      out.set(table, [...deletes, ...istio.map((c) => `-F ${c}`), ...istio.map((c) => `-X ${c}`)]);
  }
  return out;
}

/**
 * Whether the dump already holds exactly the expected Istio state, as Istio judges it: every expected chain
 * present, ISTIO_ chains with the same number of rules, no extra ISTIO_ chain. The caller also runs the
 * `-C` checks, since iptables-save prints rules in its own normal form.
 */
export function sameShape(current: SaveState, expected: SaveState): boolean {
  for (const [table, chains] of expected) {
    const cur = current.get(table);
    if (!cur) return false;
    for (const [chain, rules] of chains) {
      const have = cur.get(chain);
      if (!have) return false;
      if (chain.startsWith('ISTIO_') && have.length !== rules.length) return false;
    }
  }
  for (const [table, chains] of current) {
    for (const chain of chains.keys()) {
      if (chain.startsWith('ISTIO_') && !expected.get(table)?.has(chain)) return false;
    }
  }
  return true;
}
