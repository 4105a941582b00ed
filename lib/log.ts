// Istio's log format: `<RFC3339 micros>Z\t<level>\t<scope>\t<message>`, or one JSON object a line.
// Per-scope levels come from --log_output_level=scope:level,... (a bare level sets the default).
// Under systemd with stderr connected to the journal (JOURNAL_STREAM names stderr's device:inode), a text line has
// no timestamp (the journal adds its own) and starts with a syslog priority `<N>`, so `journalctl -p warning`
// filters; Envoy's lines passed through get the same treatment (journalLine).
// Istio's other logging flags: --log_target (stdout, stderr or a file; repeatable), --log_caller (scopes whose
// lines carry the caller's file:line, `all` for every scope) and --log_stacktrace_level (scope:level at and above
// which a line carries a stack trace), in zap's places: the caller after the scope, the stack on following lines
// (JSON: `caller`, `stack`).

import * as fs from 'node:fs';
import { JOURNAL_STREAM } from './env';

export type Level = 'debug' | 'info' | 'warn' | 'error' | 'none';
const ORDER: Record<Level, number> = { debug: 0, info: 1, warn: 2, error: 3, none: 4 };
const ALIASES: Record<string, Level> = {
  debug: 'debug',
  info: 'info',
  warn: 'warn',
  warning: 'warn',
  error: 'error',
  none: 'none',
  fatal: 'error',
};

export interface Logger {
  readonly name: string;
  debug(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
  enabled(level: Level): boolean;
}

interface LogState {
  defaultLevel: Level;
  levels: Map<string, Level>;
  json: boolean;
  /** stderr is the journal: a priority prefix and no timestamp. */
  journal: boolean;
  write: (line: string) => void;
  /** Scopes whose lines carry the caller; `all` in the set means every scope. */
  callers: Set<string>;
  stackDefault: Level;
  stackLevels: Map<string, Level>;
  /** Files opened for --log_target, closed by the next configureLogging that sets targets. */
  fds: number[];
}

const state: LogState = {
  defaultLevel: 'info',
  levels: new Map(),
  json: false,
  journal: stderrIsJournal(process.env.JOURNAL_STREAM),
  write: (line) => writeStream(process.stderr, line + '\n'),
  callers: new Set(),
  stackDefault: 'none',
  stackLevels: new Map(),
  fds: [],
};

/**
 * True when JOURNAL_STREAM (`<device>:<inode>`, set by systemd) names this process's stderr. A child whose
 * stderr was redirected elsewhere inherits the variable, hence the check against fstat(2), as systemd advises.
 */
export function stderrIsJournal(journalStream: string | undefined, fd = 2): boolean {
  const want = JOURNAL_STREAM.get({ JOURNAL_STREAM: journalStream });
  if (!want) return false;
  try {
    const st = fs.fstatSync(fd);
    return want === `${st.dev}:${st.ino}`;
  } catch {
    return false;
  }
}

/** Syslog priorities (sd-daemon.h): the agent's levels and Envoy's (trace..critical). */
const PRIORITY: Record<string, number> = { critical: 2, error: 3, warn: 4, warning: 4, info: 6, debug: 7, trace: 7 };

/** `<3>` etc. when stderr is the journal, else nothing: for lines written to stderr directly (`error: ...`). */
export function journalPrefix(level: Exclude<Level, 'none'>): string {
  return state.journal ? `<${PRIORITY[level]}>` : '';
}

/**
 * Envoy's own stderr line as the journal should get it: its leading timestamp dropped and the priority of its
 * level (the second tab-separated field in Istio's text format, `"level"` in JSON) in front. Unchanged otherwise.
 */
export function journalLine(line: string, journal = state.journal): string {
  if (!journal) return line;
  const text = /^\d{4}-\d\d-\d\dT[\d:.]+Z\t([a-z]+)\t/.exec(line);
  if (text) return `<${PRIORITY[text[1]!] ?? 6}>${line.slice(line.indexOf('\t') + 1)}`;
  const json = /"level":"([a-z]+)"/.exec(line);
  return `<${(json && PRIORITY[json[1]!]) ?? 6}>${line}`;
}

export function parseLevel(text: string): Level | undefined {
  return ALIASES[text.trim().toLowerCase()];
}

/** Parses `info` or `default:info,xdsproxy:debug`; throws on an unknown level. */
export function parseOutputLevels(spec: string): { defaultLevel?: Level; levels: Map<string, Level> } {
  const levels = new Map<string, Level>();
  let defaultLevel: Level | undefined;
  for (const part of spec
    .split(',')
    .map((p) => p.trim())
    .filter(Boolean)) {
    const idx = part.lastIndexOf(':');
    const name = idx < 0 ? 'default' : part.slice(0, idx);
    const level = parseLevel(idx < 0 ? part : part.slice(idx + 1));
    if (!level) throw new Error(`unknown log level in "${part}" (want debug, info, warn, error or none)`);
    if (name === 'default' || name === 'all') defaultLevel = level;
    else levels.set(name, level);
  }
  return { defaultLevel, levels };
}

/**
 * A line for a stream whose reader went away (a closed pipe, a journal that stopped) is dropped: a serving agent
 * keeps serving when its log output closes (agent.ts decides which commands stop instead).
 */
function writeStream(stream: NodeJS.WriteStream, line: string): void {
  if (stream.writable && !stream.destroyed) stream.write(line);
}

export interface LoggingOptions {
  outputLevel?: string;
  json?: boolean;
  journal?: boolean;
  write?: (line: string) => void;
  /** --log_target: `stdout`, `stderr` or file paths (appended to, created 0600); the default is stderr. */
  targets?: readonly string[];
  /** --log_caller: comma-separated scopes, or `all`. */
  callers?: string;
  /** --log_stacktrace_level: as --log_output_level (`default:none` is the default). */
  stacktraceLevel?: string;
}

export function configureLogging(opts: LoggingOptions): void {
  if (opts.outputLevel !== undefined) {
    const parsed = parseOutputLevels(opts.outputLevel);
    if (parsed.defaultLevel) state.defaultLevel = parsed.defaultLevel;
    for (const [k, v] of parsed.levels) state.levels.set(k, v);
  }
  if (opts.stacktraceLevel !== undefined) {
    const parsed = parseOutputLevels(opts.stacktraceLevel);
    if (parsed.defaultLevel) state.stackDefault = parsed.defaultLevel;
    for (const [k, v] of parsed.levels) state.stackLevels.set(k, v);
  }
  if (opts.callers !== undefined) {
    for (const name of opts.callers
      .split(',')
      .map((c) => c.trim())
      .filter(Boolean))
      state.callers.add(name);
  }
  if (opts.json !== undefined) state.json = opts.json;
  if (opts.journal !== undefined) state.journal = opts.journal;
  if (opts.targets?.length) setTargets(opts.targets);
  if (opts.write) state.write = opts.write;
}

/** Opens every target before changing anything, so a target that cannot be opened leaves logging as it was. */
function setTargets(targets: readonly string[]): void {
  const fds: number[] = [];
  const writers = targets.map((t): ((line: string) => void) => {
    if (t === 'stdout') return (line) => writeStream(process.stdout, line);
    if (t === 'stderr') return (line) => writeStream(process.stderr, line);
    let fd: number;
    try {
      fd = fs.openSync(t, 'a', 0o600);
    } catch (e) {
      for (const f of fds) fs.closeSync(f);
      throw new Error(`--log_target ${t}: ${(e as Error).message}`);
    }
    fds.push(fd);
    return (line) => {
      try {
        fs.writeSync(fd, line);
      } catch {
        // A full disk or a removed mount loses log lines, never the caller's work.
      }
    };
  });
  for (const f of state.fds) fs.closeSync(f);
  state.fds = fds;
  // The journal's priority prefix belongs on stderr only.
  if (targets.some((t) => t !== 'stderr')) state.journal = false;
  state.write =
    writers.length === 1
      ? (line) => writers[0]!(line + '\n')
      : (line) => {
          for (const w of writers) w(line + '\n');
        };
}

/** Restores defaults; for tests. */
export function resetLogging(): void {
  state.defaultLevel = 'info';
  state.levels.clear();
  state.json = false;
  state.journal = stderrIsJournal(process.env.JOURNAL_STREAM);
  state.write = (line) => writeStream(process.stderr, line + '\n');
  state.callers.clear();
  state.stackDefault = 'none';
  state.stackLevels.clear();
  for (const f of state.fds) fs.closeSync(f);
  state.fds = [];
}

/**
 * RFC3339 with microseconds, as Istio's zap encoder prints. Without an argument the time is the wall clock's, and
 * the microseconds within its millisecond come from the high-resolution clock while the two agree (they part when
 * the wall clock is set; the wall clock wins then, with 000), so lines a few hundred microseconds apart are
 * told apart.
 */
export function timestamp(now?: Date): string {
  const wall = now ?? new Date();
  // The high-resolution clock's offset into the wall clock's millisecond; within a millisecond of it either way is
  // the two clocks agreeing at a millisecond's edge, kept inside the wall clock's millisecond (so lines stay in order).
  const within = performance.timeOrigin + performance.now() - wall.getTime();
  const agree = !now && within > -1 && within < 2;
  const us = agree ? String(Math.min(999, Math.max(0, Math.floor(within * 1000)))).padStart(3, '0') : '000';
  return wall.toISOString().replace(/\.(\d{3})Z$/, `.$1${us}Z`);
}

/**
 * The frames above the logging call: `new Error()` made in emit(), under the scope's method. Short caller form
 * as zap's (file base name:line); in the bundled executable the file is the bundle.
 */
function callSite(): { caller: string; stack: string } {
  const frames = (new Error().stack ?? '').split('\n').slice(4);
  const m = /\(?([^()\s]+):(\d+):\d+\)?$/.exec(frames[0] ?? '');
  return { caller: m ? `${m[1]!.split('/').pop()}:${m[2]}` : 'unknown', stack: frames.map((f) => f.trim()).join('\n') };
}

function emit(name: string, level: Exclude<Level, 'none'>, msg: string, fields?: Record<string, unknown>): void {
  const min = state.levels.get(name) ?? state.defaultLevel;
  if (ORDER[level] < ORDER[min]) return;
  const time = timestamp();
  const prefix = state.journal ? `<${PRIORITY[level]}>` : '';
  const withCaller = state.callers.size > 0 && (state.callers.has(name) || state.callers.has('all'));
  const stackMin = state.stackLevels.get(name) ?? state.stackDefault;
  const withStack = stackMin !== 'none' && ORDER[level] >= ORDER[stackMin];
  const site = withCaller || withStack ? callSite() : undefined;
  if (state.json) {
    const extra = { ...(withCaller && { caller: site!.caller }), ...(withStack && { stack: site!.stack }) };
    state.write(prefix + JSON.stringify({ time, level, scope: name, ...extra, msg, ...fields }));
    return;
  }
  const head = state.journal ? `${prefix}${level}\t${name}` : `${time}\t${level}\t${name}`;
  let line = `${head}\t${withCaller ? `${site!.caller}\t` : ''}${msg}`;
  if (fields) {
    for (const [k, v] of Object.entries(fields)) line += `\t${k}=${typeof v === 'string' ? v : JSON.stringify(v)}`;
  }
  if (withStack) line += `\n${site!.stack}`;
  state.write(line);
}

export function scope(name: string): Logger {
  return {
    name,
    debug: (m, f) => emit(name, 'debug', m, f),
    info: (m, f) => emit(name, 'info', m, f),
    warn: (m, f) => emit(name, 'warn', m, f),
    error: (m, f) => emit(name, 'error', m, f),
    enabled: (level) => ORDER[level] >= ORDER[state.levels.get(name) ?? state.defaultLevel],
  };
}
