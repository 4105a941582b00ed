// DNS test tools: Debian's dnsmasq as a real upstream resolver on a loopback port, and the real client `dig`.
// Both are installed on first use when missing (CI starts on a fresh machine): dnsmasq-base is the resolver
// binary without the system service, which would start on install and take port 53 on the machine.

import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import * as dgram from 'node:dgram';
import { freePort, waitFor } from './harness';
import type { Netns } from './netns';

let ensured = false;
export function ensureDnsTools(): void {
  if (ensured) return;
  const missing = ['dig', 'dnsmasq'].filter((c) => {
    try {
      execFileSync('sh', ['-c', `command -v ${c}`], { stdio: 'ignore' });
      return false;
    } catch {
      return true;
    }
  });
  if (missing.length) {
    const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
    try {
      execFileSync('apt-get', ['install', '-y', '--no-install-recommends', 'dnsmasq-base', 'dnsutils'], { stdio: 'inherit', env });
    } catch {
      execFileSync('apt-get', ['update'], { stdio: 'inherit', env });
      execFileSync('apt-get', ['install', '-y', '--no-install-recommends', 'dnsmasq-base', 'dnsutils'], { stdio: 'inherit', env });
    }
  }
  ensured = true;
}

export interface Dnsmasq {
  port: number;
  address: string;
  stop(): Promise<void>;
}

/**
 * dnsmasq on 127.0.0.1:<free port> (or a given port inside a test's network namespace), authoritative for `.test`
 * (unknown names there are NXDOMAIN), no upstream.
 */
export async function startDnsmasq(args: string[] = [], where: { netns?: Netns; port?: number; listen?: string } = {}): Promise<Dnsmasq> {
  ensureDnsTools();
  const port = where.port ?? await freePort();
  const run = where.netns ? where.netns.spawn : (cmd: string, a: string[], o: object) => spawn(cmd, a, o);
  const child: ChildProcess = run('dnsmasq', [
    '--keep-in-foreground', '--no-resolv', '--no-hosts', '--conf-file=/dev/null', '--pid-file=', '--user=root',
    `--listen-address=${where.listen ?? '127.0.0.1'}`, '--bind-interfaces', `--port=${port}`, '--local=/test/', ...(args.some((a) => a.startsWith('--cache-size')) ? [] : ['--cache-size=0']), ...args,
  ], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (d) => (stderr += d));
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
    await exited;
  };
  try {
    await waitFor(`dnsmasq on port ${port}`, async () => {
      if (child.exitCode !== null) throw new Error(`dnsmasq exited: ${stderr}`);
      return (await dig(port, 'probe.test', 'A', [], where.listen ?? '127.0.0.1', where.netns)).status === 'NXDOMAIN';
    }, 10_000, 100);
  } catch (e) {
    await stop();
    throw e;
  }
  return { port, address: `${where.listen ?? '127.0.0.1'}:${port}`, stop };
}

export interface DigResult {
  status: string;
  flags: string[];
  answers: { name: string; ttl: number; type: string; data: string }[];
  retriedTcp: boolean;
  ednsUdp?: number;
  raw: string;
}

export function parseDig(out: string): DigResult {
  const status = /status: (\w+)/.exec(out)?.[1] ?? (/connection timed out|no servers could be reached/.test(out) ? 'TIMEOUT' : 'NONE');
  // After a TCP retry the last header is the one that counts.
  const flagLines = [...out.matchAll(/;; flags: ([^;]*);/g)];
  const flags = (flagLines.at(-1)?.[1] ?? '').trim().split(/\s+/).filter(Boolean);
  const answers: DigResult['answers'] = [];
  const sections = out.split(';; ANSWER SECTION:');
  const last = sections.length > 1 ? sections.at(-1)! : '';
  for (const line of last.split('\n').slice(1)) {
    if (!line.trim() || line.startsWith(';')) break;
    const [name, ttl, , type, ...data] = line.split(/\s+/);
    answers.push({ name: name!, ttl: Number(ttl), type: type!, data: data.join(' ') });
  }
  const udp = /EDNS: version: \d+, flags:[^;]*; udp: (\d+)/.exec(out)?.[1];
  return { status, flags, answers, retriedTcp: out.includes('Truncated, retrying in TCP mode'), ednsUdp: udp ? Number(udp) : undefined, raw: out };
}

/** Runs the real `dig` (asynchronously: the server under test may live in this process). */
export function dig(port: number, name: string, type = 'A', opts: string[] = [], server = '127.0.0.1', netns?: Netns): Promise<DigResult> {
  ensureDnsTools();
  const args = [`@${server}`, '-p', String(port), name, type, '+tries=1', '+time=5', ...opts];
  if (netns) return netns.run('dig', args).then((r) => parseDig(r.stdout));
  return new Promise((resolve) => {
    execFile('dig', args, { timeout: 30_000 }, (_err, stdout) => resolve(parseDig(String(stdout))));
  });
}

/** A UDP "resolver" that never answers, or answers every query with what `reply` returns. */
export async function fakeUpstream(reply?: (query: Buffer) => Buffer | undefined): Promise<{ address: string; received: () => number; close(): Promise<void> }> {
  const s = dgram.createSocket('udp4');
  let n = 0;
  s.on('message', (msg, r) => {
    n++;
    const out = reply?.(msg);
    if (out) s.send(out, r.port, r.address);
  });
  await new Promise<void>((res) => s.bind(0, '127.0.0.1', () => res()));
  return { address: `127.0.0.1:${s.address().port}`, received: () => n, close: () => new Promise((r) => s.close(() => r())) };
}
