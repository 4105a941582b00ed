// Durations in the protobuf/Go forms Istio accepts: `45s`, `1m30s`, `500ms`, `1.5s`, `2h`, `0`.

const UNITS: Record<string, number> = { ns: 1e-6, us: 1e-3, 'µs': 1e-3, ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

/** Returns milliseconds, or throws an Error describing what is wrong with the text. */
export function parseDuration(text: string): number {
  const s = text.trim();
  if (s === '0') return 0;
  if (s === '') throw new Error('empty duration');
  const re = /(\d+(?:\.\d+)?|\.\d+)(ns|us|µs|ms|s|m|h)/y;
  let total = 0;
  let pos = 0;
  while (pos < s.length) {
    re.lastIndex = pos;
    const m = re.exec(s);
    if (!m) throw new Error(`"${text}" is not a duration (examples: 45s, 1m30s, 500ms)`);
    total += parseFloat(m[1]!) * UNITS[m[2]!]!;
    pos = re.lastIndex;
  }
  return total;
}

/** Protobuf JSON form (`45s`, `0.250s`) used in Envoy's bootstrap. */
export function formatProtoDuration(ms: number): string {
  const secs = ms / 1000;
  return Number.isInteger(secs) ? `${secs}s` : `${secs.toFixed(3).replace(/0+$/, '')}s`;
}
