// Durations in the protobuf/Go forms Istio accepts: `45s`, `1m30s`, `500ms`, `1.5s`, `2h`, `0`.

import { quote } from './errors';

const UNITS: Record<string, number> = { ns: 1e-6, us: 1e-3, µs: 1e-3, ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

/**
 * The longest duration the agent accepts for anything it waits on: Node's timers hold a signed 32-bit count of
 * milliseconds and fire after 1 ms for anything longer (a `terminationDrainDuration: 1000h` would kill at once).
 */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/** google.protobuf.Duration's range (10,000 years), for durations that only Envoy acts on. */
export const MAX_PROTO_DURATION_MS = 315_576_000_000 * 1000;

export interface DurationLimits {
  /** Largest accepted value in milliseconds (default MAX_TIMER_MS). */
  maxMs?: number;
}

/** Returns milliseconds, or throws an Error describing what is wrong with the text. */
export function parseDuration(text: string, limits: DurationLimits = {}): number {
  const s = text.trim();
  if (s === '0') return 0;
  if (s === '') throw new Error('empty duration');
  const re = /(\d+(?:\.\d+)?|\.\d+)(ns|us|\u00b5s|ms|s|m|h)/y;
  let total = 0;
  let pos = 0;
  while (pos < s.length) {
    re.lastIndex = pos;
    const m = re.exec(s);
    if (!m) throw new Error(`${quote(text)} is not a duration (examples: 45s, 1m30s, 500ms)`);
    total += parseFloat(m[1]!) * UNITS[m[2]!]!;
    pos = re.lastIndex;
  }
  return checkDurationMs(total, quote(text), limits);
}

/** Checks milliseconds against the limits; `shown` is how the value appears in the message. */
export function checkDurationMs(ms: number, shown: string, limits: DurationLimits = {}): number {
  const max = limits.maxMs ?? MAX_TIMER_MS;
  if (!Number.isFinite(ms)) throw new Error(`${shown} is not a finite duration`);
  if (ms < 0) throw new Error(`${shown} is negative`);
  if (ms > max) throw new Error(`${shown} is longer than the longest supported duration, ${formatDuration(max)}`);
  return ms;
}

/** Go's form (`596h31m23.647s`, `1m30s`, `500ms`), for messages. */
export function formatDuration(ms: number): string {
  if (!Number.isFinite(ms)) return String(ms);
  if (ms === 0) return '0s';
  if (ms < 1000) return `${+ms.toFixed(6)}ms`;
  const h = Math.floor(ms / 3_600_000);
  const m = Math.floor((ms % 3_600_000) / 60_000);
  const s = +((ms % 60_000) / 1000).toFixed(3);
  return `${h ? `${h}h` : ''}${h || m ? `${m}m` : ''}${s}s`;
}

/** Protobuf JSON form (`45s`, `0.250s`) used in Envoy's bootstrap. */
export function formatProtoDuration(ms: number): string {
  const secs = ms / 1000;
  return Number.isInteger(secs) ? `${secs}s` : `${secs.toFixed(3).replace(/0+$/, '')}s`;
}
