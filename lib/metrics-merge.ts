// Merges Prometheus expositions from several sources (the agent, Envoy, the app) into one valid exposition, in the
// Prometheus text format (0.0.4) or OpenMetrics 1.0, whichever the scraper asked for. Pure: text in, text out.
//
// Concatenating the sources, as Istio's agent does, breaks the format in ways parsers reject: a family declared by
// two sources gets a second `# TYPE`, an OpenMetrics app's `# EOF` ends the exposition before what follows, and
// text-format counters are not valid OpenMetrics. Here every source is parsed into metric families; families of
// the same name are merged (first HELP and TYPE kept, samples concatenated, a series seen twice kept once); each
// family is written out contiguously in the asked format (counters get OpenMetrics' `_total` naming or text's
// name-as-declared; untyped <-> unknown; timestamps ms <-> s; exemplars only in OpenMetrics); `# EOF` ends an
// OpenMetrics exposition exactly once. A source with a line that is not Prometheus text is left out whole, and
// a family that clashes with an earlier one (another type, or a sample name already taken) is left out of the
// later source: each such problem is returned, so the caller can log and count it.
//
// The app must not speak for Envoy or the agent: a family a trusted source gives (or any envoy_* / istio_agent_*
// family) takes no samples from an untrusted source, whatever their labels or spelling; those are left out and
// reported. Series are compared parsed (name and sorted, unescaped labels), so `x{} 1` and `x 0` are one series.

export type MetricsFormat = 'text' | 'openmetrics';

export const CONTENT_TYPE: Record<MetricsFormat, string> = {
  text: 'text/plain; version=0.0.4; charset=utf-8',
  openmetrics: 'application/openmetrics-text; version=1.0.0; charset=utf-8',
};

export interface MetricsSource {
  /** Names the source in problems (`agent`, `envoy`, `app`). */
  name: string;
  text: string;
  /** How the source is written; detected from a `# EOF` line when not given. */
  format?: MetricsFormat;
  /** The app's exposition: it cannot add to a trusted source's family, nor to an envoy_* or istio_agent_* one. */
  untrusted?: boolean;
}

export interface MergeProblem {
  source: string;
  problem: string;
  /** Set when an untrusted source gave samples of a family it does not own (they were left out). */
  ownedFamily?: string;
}

// Envoy's and the agent's names: reserved even when their own scrape failed and cannot claim them by example.
const RESERVED_PREFIX = /^(envoy_|istio_agent_)/;

export interface MergeResult {
  body: string;
  contentType: string;
  problems: MergeProblem[];
}

type FamilyType = 'counter' | 'gauge' | 'histogram' | 'gaugehistogram' | 'summary' | 'info' | 'stateset' | 'unknown';

interface Sample {
  name: string;
  /** Fast path: the line as written (`name{labels} value`, nothing else to convert); the fields below unset. */
  raw?: string;
  /** The label block as written (`{a="b"}`, or empty): with the name, the series key. */
  labels: string;
  value: string;
  /** Seconds. */
  ts?: number;
  /** OpenMetrics exemplar as written (`# {...} v [ts]`). */
  exemplar?: string;
}

interface Family {
  /** The family's name as OpenMetrics sees it (counters without `_total`). */
  name: string;
  type: FamilyType;
  help?: string;
  unit?: string;
  samples: Sample[];
  /** Declared by a TYPE line (else an untyped family made up from a sample's name). */
  declared: boolean;
  /** The name its TYPE line gave. */
  declaredName?: string;
}

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const SUFFIXES: Record<FamilyType, string[]> = {
  counter: ['_total', '_created', ''],
  gauge: [''],
  histogram: ['_bucket', '_sum', '_count', '_created'],
  gaugehistogram: ['_bucket', '_gcount', '_gsum'],
  summary: ['', '_sum', '_count', '_created'],
  info: ['_info'],
  stateset: [''],
  unknown: [''],
};
const TEXT_TYPES = new Set(['counter', 'gauge', 'histogram', 'summary', 'untyped']);
const OM_TYPES = new Set(['counter', 'gauge', 'histogram', 'gaugehistogram', 'summary', 'info', 'stateset', 'unknown']);

class LineError extends Error {}

function unescapeHelp(s: string): string {
  return s.replace(/\\(.)/g, (_m, c: string) => (c === 'n' ? '\n' : c));
}

function escapeHelp(s: string, format: MetricsFormat): string {
  const e = s.replace(/\\/g, '\\\\').replace(/\n/g, '\\n');
  return format === 'openmetrics' ? e.replace(/"/g, '\\"') : e;
}

function parseValue(raw: string): string {
  const l = raw.toLowerCase();
  if (l === 'nan') return 'NaN';
  if (l === '+inf' || l === 'inf') return '+Inf';
  if (l === '-inf') return '-Inf';
  if (!/^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/.test(raw)) throw new LineError(`"${raw}" is not a number`);
  return raw;
}

// name, {labels} (values with \\ \" \n escapes), value, timestamp, exemplar. One compiled regex per line is
// what keeps a 20 MB Envoy exposition within a fraction of a second.
const SAMPLE =
  /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[ \t]*[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"(?:[^"\\]|\\.)*"[ \t]*,)*(?:[ \t]*[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"(?:[^"\\]|\\.)*"[ \t]*)?\})?[ \t]+([^ \t#]+)(?:[ \t]+([^ \t#]+))?(?:[ \t]+(# .*))?[ \t]*$/;
const PLAIN_NUMBER = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;
// The common line (Envoy's every line): one space, a plain number, no timestamp. Matched without captures, kept
// as written, so a big exposition costs a regex test per line and little garbage.
const PLAIN_SAMPLE =
  /^[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{(?:[ \t]*[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"(?:[^"\\]|\\.)*"[ \t]*,)*(?:[ \t]*[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"(?:[^"\\]|\\.)*"[ \t]*)?\})? [+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$/;
const NAME_END = /[{ ]/;

function parseSample(line: string, format: MetricsFormat): Sample {
  if (PLAIN_SAMPLE.test(line)) return { name: line.slice(0, line.search(NAME_END)), raw: line, labels: '', value: '' };
  const m = SAMPLE.exec(line);
  if (!m)
    throw new LineError(
      NAME.test(line.split(/[{ \t]/, 1)[0]!) ? 'not a sample (name{labels} value [timestamp])' : 'not a metric name',
    );
  const s: Sample = { name: m[1]!, labels: m[2] ?? '', value: PLAIN_NUMBER.test(m[3]!) ? m[3]! : parseValue(m[3]!) };
  if (m[4] !== undefined) {
    const t = Number(m[4]);
    if (!Number.isFinite(t)) throw new LineError(`"${m[4]}" is not a timestamp`);
    s.ts = format === 'text' ? t / 1000 : t;
  }
  if (m[5] !== undefined) s.exemplar = m[5];
  return s;
}

function familyName(declared: string, type: FamilyType, format: MetricsFormat): string {
  // A text counter is declared by its sample name (`x_total`); OpenMetrics names the family `x`.
  if (type === 'counter' && format === 'text' && declared.endsWith('_total')) return declared.slice(0, -6);
  return declared;
}

/** One source's families, in order; throws LineError naming the line for anything that is not an exposition. */
function parseSource(text: string, format: MetricsFormat): Family[] {
  const fams = new Map<string, Family>();
  const declaredAs = new Map<string, Family>(); // name in a TYPE/HELP line -> family
  const owners = new Map<string, Family>(); // sample name -> the declared family it belongs to
  let current: Family | undefined;
  const lines = text.split('\n');
  for (let n = 0; n < lines.length; n++) {
    const line = lines[n]!.replace(/\r$/, '');
    try {
      if (line.trim() === '') continue;
      if (line.startsWith('#')) {
        const m = /^#\s+(HELP|TYPE|UNIT|EOF)(?:\s+(\S+)(?:\s(.*))?)?$/.exec(line);
        if (!m) continue; // a plain comment (text format)
        const [, kw, name, arg] = m as unknown as [string, string, string | undefined, string | undefined];
        if (kw === 'EOF') {
          if (lines.slice(n + 1).some((l) => l.trim() !== '')) throw new LineError('lines after # EOF');
          break;
        }
        if (!name || !NAME.test(name)) throw new LineError(`# ${kw} without a valid metric name`);
        if (kw === 'TYPE') {
          const t = (arg ?? '').trim();
          if (!(format === 'text' ? TEXT_TYPES : OM_TYPES).has(t)) throw new LineError(`unknown type "${t}"`);
          const type: FamilyType = t === 'untyped' ? 'unknown' : (t as FamilyType);
          let fname = familyName(name, type, format);
          // Text format: `x` and `x_total` may both be declared counters (Envoy does this); they stay two families.
          const taken = fams.get(fname);
          if (!declaredAs.get(name) && taken?.declaredName !== undefined && taken.declaredName !== name) fname = name;
          let f = declaredAs.get(name) ?? fams.get(fname);
          if (f && f.samples.length) throw new LineError(`# TYPE ${name} after its samples`);
          if (!f) {
            f = { name: fname, type, samples: [], declared: true };
            fams.set(fname, f);
          } else {
            if (f.name !== fname) {
              fams.delete(f.name);
              f.name = fname;
              fams.set(fname, f);
            }
            f.type = type;
            f.declared = true;
          }
          declaredAs.set(name, f);
          f.declaredName = name;
          for (const sfx of SUFFIXES[type]) owners.set(fname + sfx, f);
          current = f;
        } else {
          let f = declaredAs.get(name);
          if (!f) {
            f = { name, type: 'unknown', samples: [], declared: true };
            fams.set(name, f);
            declaredAs.set(name, f);
          }
          if (kw === 'HELP') f.help = unescapeHelp(arg ?? '');
          else f.unit = (arg ?? '').trim();
          current = f;
        }
        continue;
      }
      const s = parseSample(line, format);
      let f =
        current && SUFFIXES[current.type].some((sfx) => current!.name + sfx === s.name) ? current : owners.get(s.name);
      if (!f) {
        f = fams.get(s.name);
        if (!f) {
          f = { name: s.name, type: 'unknown', samples: [], declared: false };
          fams.set(s.name, f);
        }
      }
      f.samples.push(s);
      current = f;
    } catch (e) {
      if (e instanceof LineError)
        throw new LineError(
          `line ${n + 1}: ${e.message}: ${JSON.stringify(line.length > 80 ? line.slice(0, 80) + '...' : line)}`,
        );
      throw e;
    }
  }
  return [...fams.values()];
}

/** The sample names a family writes in the given format (for clash detection). */
function writtenName(f: Family, s: Sample, format: MetricsFormat, textCounterName: string): string | undefined {
  // The text format has no _created series.
  if (format === 'text' && s.name === f.name + '_created' && ['counter', 'histogram', 'summary'].includes(f.type))
    return undefined;
  if (f.type !== 'counter') return s.name;
  if (format === 'openmetrics') return s.name === f.name ? f.name + '_total' : s.name;
  return textCounterName;
}

function textCounterName(f: Family): string {
  return f.samples.some((s) => s.name === f.name + '_total') || !f.samples.some((s) => s.name === f.name)
    ? f.name + '_total'
    : f.name;
}

function writeFamily(f: Family, format: MetricsFormat, out: string[]): void {
  const om = format === 'openmetrics';
  let declared = f.name;
  let type: string = f.type;
  const ctr = f.type === 'counter' ? textCounterName(f) : '';
  if (!om) {
    if (f.type === 'counter') declared = ctr;
    else if (f.type === 'info') {
      declared = f.name + '_info';
      type = 'gauge';
    } else if (f.type === 'stateset') type = 'gauge';
    else if (f.type === 'unknown') type = 'untyped';
    else if (f.type === 'gaugehistogram') {
      // No text equivalent: its samples go out untyped, one family per sample name.
      const byName = new Map<string, Sample[]>();
      for (const s of f.samples) byName.set(s.name, [...(byName.get(s.name) ?? []), s]);
      for (const [n, ss] of byName) {
        out.push(`# TYPE ${n} untyped`);
        for (const s of ss) out.push(sampleLine(n, s, format));
      }
      return;
    }
  }
  if (f.help !== undefined) out.push(`# HELP ${declared} ${escapeHelp(f.help, format)}`);
  if (f.declared || om) out.push(`# TYPE ${declared} ${type}`);
  if (om && f.unit) out.push(`# UNIT ${declared} ${f.unit}`);
  for (const s of f.samples) {
    const n = writtenName(f, s, format, ctr);
    if (n !== undefined) out.push(sampleLine(n, s, format));
  }
}

function sampleLine(name: string, s: Sample, format: MetricsFormat): string {
  if (s.raw !== undefined) return name === s.name ? s.raw : name + s.raw.slice(s.name.length);
  let line = `${name}${s.labels === '{}' ? '' : s.labels} ${s.value}`;
  if (s.ts !== undefined) line += ` ${format === 'text' ? Math.round(s.ts * 1000) : s.ts}`;
  if (format === 'openmetrics' && s.exemplar) line += ` ${s.exemplar}`;
  return line;
}

const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"/g;

/** A series as parsed: its name and its labels, sorted and unescaped (`x{}`, `x` and `x{b="",a="1"}` spellings). */
function seriesKey(s: Sample): string {
  const block = s.raw !== undefined ? s.raw.slice(s.name.length, s.raw.lastIndexOf(' ')) : s.labels;
  const pairs: string[] = [];
  for (const m of block.matchAll(LABEL)) {
    const v = m[2]!.replace(/\\(.)/g, (_x, c: string) => (c === 'n' ? '\n' : c));
    // An empty label is no label, as Prometheus reads it.
    if (v !== '') pairs.push(`${m[1]}\u0000${v}`);
  }
  return `${s.name}\u0001${pairs.sort().join('\u0001')}`;
}

export function detectFormat(text: string): MetricsFormat {
  return /(^|\n)# EOF\s*$/.test(text) ? 'openmetrics' : 'text';
}

/** Merges the sources, in order, into one exposition in `format`. */
export function mergeExpositions(sources: readonly MetricsSource[], format: MetricsFormat): MergeResult {
  const problems: MergeProblem[] = [];
  const merged = new Map<string, Family>();
  const sampleOwner = new Map<string, Family>(); // written sample name -> the family writing it
  const parsed: Array<{ src: MetricsSource; fams: Family[] }> = [];
  for (const src of sources) {
    try {
      parsed.push({ src, fams: parseSource(src.text, src.format ?? detectFormat(src.text)) });
    } catch (e) {
      problems.push({ source: src.name, problem: `not a Prometheus exposition, left out: ${(e as Error).message}` });
    }
  }
  // Families the trusted sources give, whichever order the sources come in.
  const owned = new Set<string>();
  for (const { src, fams } of parsed) if (!src.untrusted) for (const f of fams) owned.add(f.name);
  for (const { src, fams: all } of parsed) {
    let fams = all;
    if (src.untrusted) {
      fams = [];
      for (const f of all) {
        if (!owned.has(f.name) && !RESERVED_PREFIX.test(f.name)) fams.push(f);
        else {
          const problem = `${f.name} is a family of Envoy or the agent; the ${f.samples.length} sample(s) given for it left out`;
          problems.push({ source: src.name, ownedFamily: f.name, problem });
        }
      }
    }
    let dupSeries = 0;
    for (const f of fams) {
      const prev = merged.get(f.name);
      if (prev && prev.type !== f.type && (prev.declared || f.declared)) {
        problems.push({
          source: src.name,
          problem: `${f.name} is a ${f.type} here but a ${prev.type} in an earlier source; left out`,
        });
        continue;
      }
      const target = prev ?? f;
      // A sample name another family already writes would make the exposition ambiguous.
      const ctr =
        f.type === 'counter' ? textCounterName(prev ? { ...prev, samples: [...prev.samples, ...f.samples] } : f) : '';
      const names = new Set<string>();
      let last = '';
      for (const s of f.samples) {
        if (s.name === last) continue;
        last = s.name;
        const n = writtenName(f, s, format, ctr);
        if (n !== undefined) names.add(n);
      }
      // OpenMetrics names the family itself in its TYPE line: that name may not be another family's sample.
      if (!f.samples.length || format === 'openmetrics') names.add(f.name);
      const clash = [...names].find((n) => sampleOwner.has(n) && sampleOwner.get(n) !== target);
      if (clash) {
        problems.push({
          source: src.name,
          problem: `${clash} is already written by family ${sampleOwner.get(clash)!.name}; ${f.name} left out`,
        });
        continue;
      }
      if (!prev) merged.set(f.name, target);
      if (target.help === undefined && f.help !== undefined) target.help = f.help;
      if (target.unit === undefined && f.unit !== undefined) target.unit = f.unit;
      target.declared ||= f.declared;
      if (target === f) {
        // the family's first source: its samples are already in place
      } else if (!target.samples.length) {
        for (const s of f.samples) target.samples.push(s);
      } else {
        // Series are compared parsed (name and labels); a source repeating its own is not checked.
        const seen = new Set(target.samples.map(seriesKey));
        for (const s of f.samples) {
          if (seen.has(seriesKey(s))) dupSeries++;
          else target.samples.push(s);
        }
      }
      for (const n of names) sampleOwner.set(n, target);
    }
    if (dupSeries)
      problems.push({ source: src.name, problem: `${dupSeries} series already given by an earlier source; left out` });
  }
  const out: string[] = [];
  for (const f of merged.values()) writeFamily(f, format, out);
  if (format === 'openmetrics') out.push('# EOF');
  return { body: out.length ? out.join('\n') + '\n' : '', contentType: CONTENT_TYPE[format], problems };
}

/** The format a scraper's Accept header prefers: OpenMetrics only when it ranks it above the text format. */
export function negotiateFormat(accept: string | undefined): MetricsFormat {
  if (!accept) return 'text';
  let om = -1;
  let text = -1;
  for (const part of accept.split(',')) {
    const [type, ...params] = part.split(';').map((p) => p.trim().toLowerCase());
    const qp = params.find((p) => p.startsWith('q='));
    const q = qp ? Number(qp.slice(2)) : 1;
    if (!Number.isFinite(q) || q <= 0) continue;
    if (type === 'application/openmetrics-text') om = Math.max(om, q);
    else if (type === 'text/plain' || type === '*/*' || type === 'text/*') text = Math.max(text, q);
  }
  return om > text ? 'openmetrics' : 'text';
}
