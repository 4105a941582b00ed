// Istio's log format: `<RFC3339 micros>Z\t<level>\t<scope>\t<message>`, or one JSON object a line.
// Per-scope levels come from --log_output_level=scope:level,... (a bare level sets the default).
// Under systemd with stderr connected to the journal (JOURNAL_STREAM names stderr's device:inode), a text line has
// no timestamp (the journal adds its own) and starts with a syslog priority `<N>`, so `journalctl -p warning`
// filters; Envoy's lines passed through get the same treatment (journalLine).

import * as fs from 'node:fs';
import { JOURNAL_STREAM } from './env';

export type Level = 'debug' | 'info' | 'warn' | 'error' | 'none';
const ORDER: Record<Level, number> = { debug: 0, info: 1, warn: 2, error: 3, none: 4 };
const ALIASES: Record<string, Level> = {
  debug: 'debug', info: 'info', warn: 'warn', warning: 'warn', error: 'error', none: 'none', fatal: 'error',
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
}

const state: LogState = {
  defaultLevel: 'info',
  levels: new Map(),
  json: false,
  journal: stderrIsJournal(process.env.JOURNAL_STREAM),
  write: (line) => process.stderr.write(line + '\n'),
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
  for (const part of spec.split(',').map((p) => p.trim()).filter(Boolean)) {
    const idx = part.lastIndexOf(':');
    const name = idx < 0 ? 'default' : part.slice(0, idx);
    const level = parseLevel(idx < 0 ? part : part.slice(idx + 1));
    if (!level) throw new Error(`unknown log level in "${part}" (want debug, info, warn, error or none)`);
    if (name === 'default' || name === 'all') defaultLevel = level;
    else levels.set(name, level);
  }
  return { defaultLevel, levels };
}

export function configureLogging(opts: { outputLevel?: string; json?: boolean; journal?: boolean; write?: (line: string) => void }): void {
  if (opts.outputLevel !== undefined) {
    const parsed = parseOutputLevels(opts.outputLevel);
    if (parsed.defaultLevel) state.defaultLevel = parsed.defaultLevel;
    for (const [k, v] of parsed.levels) state.levels.set(k, v);
  }
  if (opts.json !== undefined) state.json = opts.json;
  if (opts.journal !== undefined) state.journal = opts.journal;
  if (opts.write) state.write = opts.write;
}

/** Restores defaults; for tests. */
export function resetLogging(): void {
  state.defaultLevel = 'info';
  state.levels.clear();
  state.json = false;
  state.journal = stderrIsJournal(process.env.JOURNAL_STREAM);
  state.write = (line) => process.stderr.write(line + '\n');
}

export function timestamp(now: Date = new Date()): string {
  // RFC3339 with microseconds, as Istio's zap encoder prints.
  return now.toISOString().replace(/\.(\d{3})Z$/, '.$1000Z');
}

function emit(name: string, level: Exclude<Level, 'none'>, msg: string, fields?: Record<string, unknown>): void {
  const min = state.levels.get(name) ?? state.defaultLevel;
  if (ORDER[level] < ORDER[min]) return;
  const time = timestamp();
  const prefix = state.journal ? `<${PRIORITY[level]}>` : '';
  if (state.json) {
    state.write(prefix + JSON.stringify({ time, level, scope: name, msg, ...fields }));
    return;
  }
  let line = state.journal ? `${prefix}${level}\t${name}\t${msg}` : `${time}\t${level}\t${name}\t${msg}`;
  if (fields) {
    for (const [k, v] of Object.entries(fields)) line += `\t${k}=${typeof v === 'string' ? v : JSON.stringify(v)}`;
  }
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
