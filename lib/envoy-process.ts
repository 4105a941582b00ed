// Envoy behind a small process interface, so the supervisor's logic can run against a fake in unit tests.
// Envoy runs in its own process group (a Ctrl-C or a group signal aimed at the agent does not reach it
// directly), and with hot restart enabled Envoy sets PR_SET_PDEATHSIG itself, so it dies with the agent.

import { spawn as nodeSpawn, execFile } from 'node:child_process';
import * as fs from 'node:fs';
import type { Readable } from 'node:stream';
import { DNS_PROXY_ADDR, ENVOY_GID, ENVOY_UID, type Env } from './env';
import { configError } from './errors';
import { systemIds, type IdLookup } from './os-users';

export interface ExitStatus {
  code: number | null;
  signal: NodeJS.Signals | null;
}

export interface EnvoyProcess {
  readonly pid: number;
  /** Resolves once the process has exited (never rejects; a spawn failure is an exit with code 127). */
  readonly exited: Promise<ExitStatus>;
  /** Signals the whole process group; a no-op after exit. */
  kill(signal: NodeJS.Signals): void;
}

export interface SpawnOptions {
  /** Extra lines of Envoy's output are logged at this scope; the last few are kept for error reports. */
  epoch: number;
  env?: NodeJS.ProcessEnv;
  /** Where each line of Envoy's log goes (the agent's stderr). */
  passThrough: (line: string) => void;
  /** Run Envoy as this user and group (the agent must be root); see envoyCredentials. */
  credentials?: EnvoyCredentials;
}

/** The user and group Envoy runs as when the agent, running as root, starts it as someone else. */
export interface EnvoyCredentials {
  /** Unset: Envoy keeps the agent's uid (root) and only changes group, as Istio's TPROXY sidecar does. */
  uid?: number;
  gid: number;
  /** Why: for the log line. */
  reason: string;
}

/** Istio's proxy uid and gid: what `istio-iptables -u/-g` exclude from capture by default. */
export const ISTIO_PROXY_ID = 1337;

/**
 * Whether Envoy runs as another user than the agent. ENVOY_UID / ENVOY_GID (ours: numbers or names) ask for
 * it; otherwise Istio's own rule applies: an agent running as root whose DNS proxy listens on port 53 starts
 * Envoy as 1337:1337 (pkg/istio-agent: the mode for containers that run as root without iptables). In a
 * Kubernetes pod neither applies: the container itself runs as 1337 (as root with group 1337 for TPROXY).
 */
export function envoyCredentials(
  env: Env,
  agentUid: number,
  lookup: IdLookup = systemIds,
): EnvoyCredentials | undefined {
  const uidText = ENVOY_UID.get(env);
  const gidText = ENVOY_GID.get(env);
  if (uidText !== '' || gidText !== '') {
    const uid = uidText === '' ? undefined : resolveId(uidText, 'ENVOY_UID', lookup.user);
    const gid =
      gidText !== ''
        ? resolveId(gidText, 'ENVOY_GID', lookup.group)
        : uid !== undefined
          ? (lookup.primaryGroup(uid) ?? uid)
          : 0;
    if (agentUid !== 0) {
      if (uid === agentUid && gidText === '') return undefined;
      const name = uidText !== '' ? ENVOY_UID.name : ENVOY_GID.name;
      throw configError(
        name,
        `environment variable ${name}`,
        `the agent runs as uid ${agentUid}, not root, so it cannot start Envoy as another user or group`,
      );
    }
    return {
      uid,
      gid,
      reason: `${uidText !== '' ? 'ENVOY_UID' : ''}${uidText !== '' && gidText !== '' ? '/' : ''}${gidText !== '' ? 'ENVOY_GID' : ''}`,
    };
  }
  if (agentUid === 0 && DNS_PROXY_ADDR.get(env).endsWith(':53')) {
    return {
      uid: ISTIO_PROXY_ID,
      gid: ISTIO_PROXY_ID,
      reason: "the agent runs as root with DNS_PROXY_ADDR on port 53 (Istio's rule)",
    };
  }
  return undefined;
}

const CAP_DAC_OVERRIDE = 1;

/** Whether this process's effective capabilities include `bit` (Linux /proc/self/status; elsewhere assumed). */
export function hasCapability(
  bit: number,
  status: () => string = () => fs.readFileSync('/proc/self/status', 'utf8'),
): boolean {
  let text: string;
  try {
    text = status();
  } catch {
    return true;
  }
  const m = /^CapEff:\s*([0-9a-f]+)$/m.exec(text);
  return !m || ((BigInt(`0x${m[1]}`) >> BigInt(bit)) & 1n) === 1n;
}

/**
 * ENVOY_ADMIN_MODE=uds with Envoy as another uid: the socket is Envoy's and 0600, so the root agent reaches it only
 * through CAP_DAC_OVERRIDE (a container that drops it would leave the agent blind: no readiness, no drain).
 * Undefined when the agent can connect; otherwise why not.
 */
export function adminSocketUnreachable(
  credentials: EnvoyCredentials | undefined,
  agentUid: number,
  dacOverride = () => hasCapability(CAP_DAC_OVERRIDE),
): string | undefined {
  if (credentials?.uid === undefined || credentials.uid === agentUid || dacOverride()) return undefined;
  return (
    `Envoy runs as uid ${credentials.uid} (${credentials.reason}) and owns its 0600 admin socket, which the agent (uid ${agentUid}) ` +
    'can reach only with CAP_DAC_OVERRIDE, and it does not have it'
  );
}

function resolveId(text: string, name: string, byName: (n: string) => number | undefined): number {
  if (/^\d+$/.test(text)) return Number(text);
  const id = byName(text);
  if (id === undefined)
    throw configError(name, `environment variable ${name}`, `"${text}" is neither a number nor a known name`);
  return id;
}

export type Spawner = (binary: string, args: string[], opts: SpawnOptions) => EnvoyProcess;

/** Keeps the tail of a process's output for failure reports. */
export class OutputTail {
  private lines: string[] = [];
  constructor(private readonly max = 30) {}
  push(line: string): void {
    this.lines.push(line);
    if (this.lines.length > this.max) this.lines.shift();
  }
  text(): string {
    return this.lines.join('\n');
  }
  /**
   * The most telling line: a `panic:` line first, then Envoy's last critical/error line that is not part of a
   * backtrace (frame addresses say nothing to an operator), then the signal it caught; in any of Envoy's log
   * formats (Istio's text, JSON, and Envoy's default, which it uses before logging is set up).
   */
  reason(): string {
    const lines = [...this.lines].reverse();
    const bad = (l: string) => /\t(critical|error)\t|"level":"(critical|error)"|\]\[(critical|error)\]/.test(l);
    const backtrace = (l: string) => /\]\[backtrace\]|\tenvoy backtrace |"scope":"envoy backtrace"/.test(l);
    const line =
      lines.find((l) => /\bpanic: /.test(l)) ??
      lines.find((l) => bad(l) && !backtrace(l)) ??
      lines.find((l) => backtrace(l) && /\bCaught /.test(l)) ??
      lines[0] ??
      '';
    const json = /"msg":"((?:[^"\\]|\\.)*)"/.exec(line);
    if (json) return JSON.parse(`"${json[1]}"`) as string;
    const text = line.split('\t');
    if (text.length >= 4) return text[3]!.trim();
    // [time][pid][level][logger] [file:line] message
    return line.replace(/^\[[^\]]*\]\[\d+\](\[[^\]]*\]){2}\s*(\[[^\]]*\]\s*)?/, '').trim();
  }
}

export interface RealEnvoyProcess extends EnvoyProcess {
  readonly output: OutputTail;
}

/** The longest line passed on whole: a longer run without a newline is cut there (Envoy's lines are far shorter). */
export const MAX_LINE_CHARS = 64 * 1024;

/**
 * Calls `fn` with each line of a child's output (without its `\n` or `\r\n`), and with the last unterminated part at
 * its end. node:readline did this before, loaded right after Envoy's fork: 1.5-2 ms of the main thread while the CSR
 * and the xDS proxy wait to be made.
 */
export function eachLine(stream: Readable, fn: (line: string) => void): void {
  let rest = '';
  const emit = (line: string) => fn(line.endsWith('\r') ? line.slice(0, -1) : line);
  stream.setEncoding('utf8');
  stream.on('data', (chunk: string) => {
    const lines = (rest + chunk).split('\n');
    rest = lines.pop()!;
    for (const l of lines) emit(l);
    while (rest.length > MAX_LINE_CHARS) {
      emit(rest.slice(0, MAX_LINE_CHARS));
      rest = rest.slice(MAX_LINE_CHARS);
    }
  });
  stream.on('end', () => {
    if (rest !== '') emit(rest);
    rest = '';
  });
}

export const spawnEnvoy = (binary: string, args: string[], opts: SpawnOptions): RealEnvoyProcess => {
  // stdout is inherited, not piped: Node's pipes are sockets, and Envoy cannot open /dev/stdout on a socket
  // (ENXIO), which is where access logs usually go. stderr (Envoy's own log) is read line by line, passed
  // through unchanged, and its tail kept to explain a failure.
  // With credentials, libuv sets the group, drops supplementary groups, then sets the user, before exec.
  const ids = opts.credentials
    ? { gid: opts.credentials.gid, ...(opts.credentials.uid !== undefined ? { uid: opts.credentials.uid } : {}) }
    : {};
  const child = nodeSpawn(binary, args, {
    detached: true,
    stdio: ['ignore', 'inherit', 'pipe'],
    env: opts.env ?? process.env,
    ...ids,
  });
  const output = new OutputTail();
  let done = false;
  const exited = new Promise<ExitStatus>((resolve) => {
    child.once('error', (err) => {
      output.push(`spawn failed: ${err.message}`);
      if (!done) {
        done = true;
        resolve({ code: 127, signal: null });
      }
    });
    child.once('exit', (code, signal) => {
      done = true;
      resolve({ code, signal });
    });
  });
  eachLine(child.stderr!, (line) => {
    output.push(line);
    opts.passThrough(line);
  });
  const pid = child.pid ?? -1;
  return {
    pid,
    exited,
    output,
    kill(signal) {
      if (done || pid <= 0) return;
      try {
        process.kill(-pid, signal);
      } catch {
        try {
          child.kill(signal);
        } catch {
          /* already gone */
        }
      }
    },
  };
};

/** Runs a short Envoy command (validate, --hot-restart-version) and returns its exit code and output. */
export function runEnvoyCommand(
  binary: string,
  args: string[],
  timeoutMs = 30_000,
): Promise<{ code: number; output: string }> {
  return new Promise((resolve) => {
    execFile(binary, args, { timeout: timeoutMs, maxBuffer: 4 * 1024 * 1024 }, (err, stdout, stderr) => {
      // A numeric code is the program's exit status; a string (ENOENT, EACCES) means it could not be run: 127.
      const raw = err ? (err as unknown as { code?: unknown }).code : 0;
      const code = typeof raw === 'number' ? raw : err ? (typeof raw === 'string' ? 127 : 1) : 0;
      resolve({ code, output: `${stdout}${stderr}`.trim() || (err ? err.message : '') });
    });
  });
}
