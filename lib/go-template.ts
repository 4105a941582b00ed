// A renderer for the part of Go's text/template that Envoy bootstrap templates use: Istio's stock template
// (tools/packaging/common/envoy_bootstrap.json) and the customisations its docs show. Pure: text and data in,
// text out. Semantics follow text/template (and, for the functions Istio adds, sprig):
//   - actions `{{ }}` with trim markers `{{- ` / ` -}}`, comments `{{/* */}}`;
//   - if / else if / else / end, range (with `$i, $v :=`, else, break, continue), with / else with / else;
//   - pipelines `a | b`, parenthesised pipelines, variables (`$x := `, `$x = `, `$`), fields `.a.b`, `$x.a`;
//   - literals: "strings" with Go escapes, `raw strings`, numbers, 'c' chars, true, false, nil;
//   - functions: and or not eq ne lt le gt ge len index slice print printf println js urlquery html, Istio's
//     toJSON, and sprig's toJson toPrettyJson toRawJson fromJson default empty coalesce ternary quote squote
//     upper lower trim trimPrefix trimSuffix replace contains hasPrefix hasSuffix join split splitList list dict
//     hasKey keys get toString int float64 atoi indent nindent b64enc b64dec first last cat repeat add add1 sub
//     mul div mod max min.
// Missing map keys print "<no value>" and are false, as in Go; a missing field of a struct value (the
// ProxyConfig in `.config`, the metadata in `.metadata`) is an error. define/template/block are not supported
// and are reported as such.

export class TemplateError extends Error {
  constructor(
    message: string,
    readonly line: number,
  ) {
    super(`line ${line}: ${message}`);
  }
}

/** Marks an object as a Go struct: a missing field is an error instead of "<no value>". */
export const GO_STRUCT = Symbol('goStruct');

export function goStruct<T extends object>(typeName: string, fields: T): T {
  Object.defineProperty(fields, GO_STRUCT, { value: typeName, enumerable: false });
  return fields;
}

/** A Go nil map or slice held in a struct field: empty and false, but JSON `null` (not Istio's toJSON "{}"). */
export const GO_NIL: Readonly<Record<string, never>> = Object.freeze({});

// ---- lexing into text and actions ----

interface Text {
  kind: 'text';
  text: string;
}
interface Action {
  kind: 'action';
  src: string;
  line: number;
}
type Piece = Text | Action;

const SPACE = /[ \t\r\n]/;

function split(src: string): Piece[] {
  const out: Piece[] = [];
  let pos = 0;
  let trimNext = false;
  // Line numbers for errors, counted once over the text (positions only move forward).
  let counted = 0;
  let line = 1;
  // indexOf, not a loop over each character: this runs once per start-up, before the code is optimised.
  const lineAt = (i: number) => {
    for (let nl = src.indexOf('\n', counted); nl >= 0 && nl < i; nl = src.indexOf('\n', counted)) {
      line++;
      counted = nl + 1;
    }
    return line;
  };
  for (;;) {
    const open = src.indexOf('{{', pos);
    let text = src.slice(pos, open < 0 ? undefined : open);
    if (trimNext) text = text.replace(/^[ \t\r\n]+/, '');
    trimNext = false;
    if (open < 0) {
      out.push({ kind: 'text', text });
      return out;
    }
    let start = open + 2;
    if (src[start] === '-' && SPACE.test(src[start + 1] ?? '')) {
      text = trimTrailingSpace(text);
      start += 2;
    }
    out.push({ kind: 'text', text });
    const close = findClose(src, start);
    if (close < 0) throw new TemplateError('unclosed action', lineAt(open));
    let end = close;
    if (src[close - 1] === '-' && SPACE.test(src[close - 2] ?? '')) {
      end = close - 2;
      trimNext = true;
    }
    const body = src.slice(start, end).trim();
    if (!(body.startsWith('/*') && body.endsWith('*/'))) out.push({ kind: 'action', src: body, line: lineAt(open) });
    pos = close + 2;
  }
}

/**
 * The text without its trailing space, tab, CR and LF (`{{- `), as Go trims it. A loop from the end: the regular
 * expression /[ \t\r\n]+$/ tried a match at every run of indentation in the text.
 */
function trimTrailingSpace(text: string): string {
  let end = text.length;
  while (end > 0 && SPACE.test(text[end - 1]!)) end--;
  return end === text.length ? text : text.slice(0, end);
}

/** The `}}` closing an action, skipping quoted strings (which may contain `}}`). */
function findClose(src: string, from: number): number {
  for (let i = from; i < src.length; i++) {
    const c = src[i];
    if (c === '"' || c === '`' || c === "'") {
      const q = c;
      for (i++; i < src.length && src[i] !== q; i++) if (src[i] === '\\' && q !== '`') i++;
    } else if (c === '/' && src[i + 1] === '*') {
      const e = src.indexOf('*/', i + 2);
      if (e < 0) return -1;
      i = e + 1;
    } else if (c === '}' && src[i + 1] === '}') {
      return i;
    }
  }
  return -1;
}

// ---- tokens inside an action ----

type Tok =
  | { t: 'field'; path: string[] }
  | { t: 'var'; name: string; path: string[] }
  | { t: 'ident'; name: string }
  | { t: 'str'; value: string }
  | { t: 'num'; value: number }
  | { t: 'punct'; value: '|' | '(' | ')' | ':=' | '=' | ',' }
  | { t: 'dotpath'; path: string[] };

const IDENT = /[A-Za-z_][A-Za-z0-9_]*/y;

function unquoteGo(body: string, line: number): string {
  let out = '';
  for (let i = 0; i < body.length; i++) {
    const c = body[i]!;
    if (c !== '\\') {
      out += c;
      continue;
    }
    const n = body[++i];
    const simple: Record<string, string> = {
      n: '\n',
      t: '\t',
      r: '\r',
      '\\': '\\',
      '"': '"',
      "'": "'",
      a: '\x07',
      b: '\b',
      f: '\f',
      v: '\v',
    };
    if (n !== undefined && n in simple) out += simple[n];
    else if (n === 'x') ((out += String.fromCharCode(parseInt(body.slice(i + 1, i + 3), 16))), (i += 2));
    else if (n === 'u') ((out += String.fromCodePoint(parseInt(body.slice(i + 1, i + 5), 16))), (i += 4));
    else if (n === 'U') ((out += String.fromCodePoint(parseInt(body.slice(i + 1, i + 9), 16))), (i += 8));
    else if (n !== undefined && /[0-7]/.test(n))
      ((out += String.fromCharCode(parseInt(body.slice(i, i + 3), 8))), (i += 2));
    else throw new TemplateError(`unknown escape \\${n ?? ''} in string`, line);
  }
  return out;
}

function tokenize(src: string, line: number): Tok[] {
  const toks: Tok[] = [];
  let i = 0;
  const fieldChain = (): string[] => {
    const path: string[] = [];
    while (src[i] === '.' && /[A-Za-z_]/.test(src[i + 1] ?? '')) {
      IDENT.lastIndex = i + 1;
      const m = IDENT.exec(src)!;
      path.push(m[0]);
      i = IDENT.lastIndex;
    }
    return path;
  };
  while (i < src.length) {
    const c = src[i]!;
    if (SPACE.test(c)) {
      i++;
    } else if (c === '|' || c === '(' || c === ')' || c === ',') {
      toks.push({ t: 'punct', value: c });
      i++;
    } else if (c === ':' && src[i + 1] === '=') {
      toks.push({ t: 'punct', value: ':=' });
      i += 2;
    } else if (c === '=') {
      toks.push({ t: 'punct', value: '=' });
      i++;
    } else if (c === '"' || c === '`') {
      let j = i + 1;
      while (j < src.length && src[j] !== c) j += src[j] === '\\' && c === '"' ? 2 : 1;
      if (j >= src.length) throw new TemplateError('unterminated string', line);
      const body = src.slice(i + 1, j);
      toks.push({ t: 'str', value: c === '`' ? body : unquoteGo(body, line) });
      i = j + 1;
    } else if (c === "'") {
      const j = src.indexOf("'", i + 2);
      if (j < 0) throw new TemplateError('unterminated character constant', line);
      toks.push({ t: 'num', value: unquoteGo(src.slice(i + 1, j), line).codePointAt(0) ?? 0 });
      i = j + 1;
    } else if (c === '.') {
      if (/[A-Za-z_]/.test(src[i + 1] ?? '')) toks.push({ t: 'field', path: fieldChain() });
      else if (/[0-9]/.test(src[i + 1] ?? '')) i = number(i);
      else {
        toks.push({ t: 'field', path: [] });
        i++;
      }
    } else if (c === '$') {
      IDENT.lastIndex = i + 1;
      const m = IDENT.exec(src);
      i = m ? IDENT.lastIndex : i + 1;
      toks.push({ t: 'var', name: m ? m[0] : '', path: fieldChain() });
    } else if (/[0-9+-]/.test(c)) {
      i = number(i);
    } else if (/[A-Za-z_]/.test(c)) {
      IDENT.lastIndex = i;
      const m = IDENT.exec(src)!;
      i = IDENT.lastIndex;
      toks.push({ t: 'ident', name: m[0] });
    } else {
      throw new TemplateError(`unexpected "${c}" in action {{${src}}}`, line);
    }
    // A field chain right after ")" (`(pipeline).a.b`).
    if (
      src[i] === '.' &&
      toks.length &&
      toks[toks.length - 1]!.t === 'punct' &&
      (toks[toks.length - 1] as { value: string }).value === ')'
    ) {
      toks.push({ t: 'dotpath', path: fieldChain() });
    }
  }
  return toks;

  function number(from: number): number {
    const m = /[+-]?(0[xX][0-9a-fA-F_]+|0[oO]?[0-7_]+|0[bB][01_]+|(\d[\d_]*)?\.?\d*([eE][+-]?\d+)?)/y;
    m.lastIndex = from;
    const r = m.exec(src);
    if (!r || r[0] === '' || r[0] === '+' || r[0] === '-') throw new TemplateError(`bad number in {{${src}}}`, line);
    const text = r[0].replace(/_/g, '');
    const neg = text.startsWith('-');
    const body = text.replace(/^[+-]/, '');
    let v: number;
    if (/^0[xX]/.test(body)) v = parseInt(body.slice(2), 16);
    else if (/^0[bB]/.test(body)) v = parseInt(body.slice(2), 2);
    else if (/^0[oO]/.test(body)) v = parseInt(body.slice(2), 8);
    else if (/^0[0-7]+$/.test(body)) v = parseInt(body, 8);
    else v = Number(body);
    toks.push({ t: 'num', value: neg ? -v : v });
    return m.lastIndex;
  }
}

// ---- parse tree ----

type Operand =
  | { k: 'field'; path: string[] }
  | { k: 'var'; name: string; path: string[] }
  | { k: 'lit'; value: unknown }
  | { k: 'fn'; name: string }
  | { k: 'sub'; pipe: Pipeline; path: string[] };
type Command = Operand[];
interface Pipeline {
  decl?: { names: string[]; assign: boolean };
  cmds: Command[];
  line: number;
}

type Node =
  | { n: 'text'; text: string }
  | { n: 'out'; pipe: Pipeline }
  | { n: 'if' | 'with'; pipe: Pipeline; then: Node[]; else: Node[] }
  | { n: 'range'; pipe: Pipeline; body: Node[]; else: Node[] }
  | { n: 'break' | 'continue'; line: number };

function parsePipeline(toks: Tok[], line: number, allowDecl: boolean): Pipeline {
  let pos = 0;
  let decl: Pipeline['decl'];
  // `$a :=`, `$a, $b :=` or `$a =`
  if (allowDecl) {
    let j = 0;
    const names: string[] = [];
    while (toks[j]?.t === 'var' && (toks[j] as { path: string[] }).path.length === 0) {
      names.push((toks[j] as { name: string }).name);
      j++;
      if (toks[j]?.t === 'punct' && (toks[j] as { value: string }).value === ',') j++;
      else break;
    }
    const op = toks[j];
    if (names.length && op?.t === 'punct' && (op.value === ':=' || op.value === '=')) {
      decl = { names, assign: op.value === '=' };
      pos = j + 1;
    }
  }
  const cmds: Command[] = [];
  let cmd: Command = [];
  const stop = (t: Tok | undefined) => t === undefined || (t.t === 'punct' && t.value === ')');
  while (!stop(toks[pos])) {
    const t = toks[pos++]!;
    if (t.t === 'punct' && t.value === '|') {
      if (cmd.length === 0) throw new TemplateError('missing command before "|"', line);
      cmds.push(cmd);
      cmd = [];
      continue;
    }
    if (t.t === 'punct' && t.value === '(') {
      const inner: Tok[] = [];
      let depth = 1;
      while (pos < toks.length) {
        const x = toks[pos++]!;
        if (x.t === 'punct' && x.value === '(') depth++;
        if (x.t === 'punct' && x.value === ')' && --depth === 0) break;
        inner.push(x);
      }
      if (depth !== 0) throw new TemplateError('unclosed "("', line);
      const next = toks[pos];
      const path = next?.t === 'dotpath' ? (pos++, next.path) : [];
      cmd.push({ k: 'sub', pipe: parsePipeline(inner, line, false), path });
      continue;
    }
    if (t.t === 'field') cmd.push({ k: 'field', path: t.path });
    else if (t.t === 'var') cmd.push({ k: 'var', name: t.name, path: t.path });
    else if (t.t === 'str' || t.t === 'num') cmd.push({ k: 'lit', value: t.value });
    else if (t.t === 'ident') {
      if (t.name === 'true' || t.name === 'false') cmd.push({ k: 'lit', value: t.name === 'true' });
      else if (t.name === 'nil') cmd.push({ k: 'lit', value: null });
      else cmd.push({ k: 'fn', name: t.name });
    } else throw new TemplateError(`unexpected ${JSON.stringify((t as { value?: string }).value ?? t.t)}`, line);
  }
  if (cmd.length) cmds.push(cmd);
  if (cmds.length === 0) throw new TemplateError('missing value in action', line);
  return { decl, cmds, line };
}

const KEYWORDS = new Set(['if', 'else', 'end', 'range', 'with', 'break', 'continue', 'define', 'template', 'block']);

function parse(pieces: Piece[]): Node[] {
  let i = 0;
  // Parses nodes until one of the `until` keywords; returns the nodes and the action that stopped it.
  const list = (until: string[]): { nodes: Node[]; stop?: { word: string; rest: Tok[]; line: number } } => {
    const nodes: Node[] = [];
    while (i < pieces.length) {
      const p = pieces[i++]!;
      if (p.kind === 'text') {
        if (p.text) nodes.push({ n: 'text', text: p.text });
        continue;
      }
      const toks = tokenize(p.src, p.line);
      const head = toks[0];
      const word = head?.t === 'ident' && KEYWORDS.has(head.name) ? head.name : undefined;
      if (!word) {
        nodes.push({ n: 'out', pipe: parsePipeline(toks, p.line, true) });
        continue;
      }
      if (until.includes(word)) return { nodes, stop: { word, rest: toks.slice(1), line: p.line } };
      if (word === 'if' || word === 'with') nodes.push(conditional(word, toks.slice(1), p.line));
      else if (word === 'range') {
        const pipe = parsePipeline(toks.slice(1), p.line, true);
        const body = list(['else', 'end']);
        let elseNodes: Node[] = [];
        if (body.stop?.word === 'else') {
          const e = list(['end']);
          if (!e.stop) throw new TemplateError('range has no {{end}}', p.line);
          elseNodes = e.nodes;
        } else if (!body.stop) throw new TemplateError('range has no {{end}}', p.line);
        nodes.push({ n: 'range', pipe, body: body.nodes, else: elseNodes });
      } else if (word === 'break' || word === 'continue') nodes.push({ n: word, line: p.line });
      else if (word === 'define' || word === 'template' || word === 'block') {
        throw new TemplateError(`{{${word}}} is not supported by this agent's template renderer`, p.line);
      } else throw new TemplateError(`unexpected {{${word}}}`, p.line);
    }
    return { nodes };
  };
  const conditional = (word: 'if' | 'with', toks: Tok[], line: number): Node => {
    const pipe = parsePipeline(toks, line, word === 'with');
    const then = list(['else', 'end']);
    if (!then.stop) throw new TemplateError(`${word} has no {{end}}`, line);
    let elseNodes: Node[] = [];
    if (then.stop.word === 'else') {
      const rest = then.stop.rest;
      // `else if ...` / `else with ...` chain: a nested conditional that shares this one's {{end}}.
      if (rest[0]?.t === 'ident' && (rest[0].name === 'if' || rest[0].name === 'with')) {
        elseNodes = [conditional(rest[0].name, rest.slice(1), then.stop.line)];
      } else {
        const e = list(['end']);
        if (!e.stop) throw new TemplateError(`${word} has no {{end}}`, line);
        elseNodes = e.nodes;
      }
    }
    return { n: word, pipe, then: then.nodes, else: elseNodes };
  };
  const top = list([]);
  return top.nodes;
}

// ---- evaluation ----

/** Go's idea of an absent value (a missing map key): prints "<no value>", is false. */
const NO_VALUE = Symbol('noValue');

type Scope = Array<Map<string, unknown>>;

class Stop {
  constructor(readonly kind: 'break' | 'continue') {}
}

function truthy(v: unknown): boolean {
  if (v === NO_VALUE || v === null || v === undefined || v === false || v === 0 || v === '') return false;
  if (Array.isArray(v)) return v.length > 0;
  if (typeof v === 'object')
    return (v as object)[GO_STRUCT as keyof object] !== undefined || Object.keys(v as object).length > 0;
  return true;
}

function fieldOf(v: unknown, name: string, line: number): unknown {
  if (v === NO_VALUE || v === null || v === undefined) return NO_VALUE;
  if (typeof v !== 'object' || Array.isArray(v))
    throw new TemplateError(`can't evaluate field ${name} in type ${goType(v)}`, line);
  const struct = (v as Record<symbol, unknown>)[GO_STRUCT];
  if (Object.prototype.hasOwnProperty.call(v, name)) return (v as Record<string, unknown>)[name];
  if (struct !== undefined) throw new TemplateError(`can't evaluate field ${name} in type ${String(struct)}`, line);
  return NO_VALUE;
}

function goType(v: unknown): string {
  if (typeof v === 'string') return 'string';
  if (typeof v === 'number') return Number.isInteger(v) ? 'int' : 'float64';
  if (typeof v === 'boolean') return 'bool';
  if (Array.isArray(v)) return '[]interface {}';
  return 'map[string]interface {}';
}

/** fmt's %v. */
export function goString(v: unknown): string {
  if (v === NO_VALUE) return '<no value>';
  if (v === null || v === undefined) return '<nil>';
  if (typeof v === 'string') return v;
  if (typeof v === 'number') return goNumber(v);
  if (typeof v === 'boolean') return String(v);
  if (Array.isArray(v)) return `[${v.map(goString).join(' ')}]`;
  const o = v as Record<string, unknown>;
  if (o[GO_STRUCT as unknown as string] !== undefined) return `{${Object.values(o).map(goString).join(' ')}}`;
  return `map[${Object.keys(o)
    .sort()
    .map((k) => `${k}:${goString(o[k])}`)
    .join(' ')}]`;
}

function goNumber(n: number): string {
  if (Number.isInteger(n) && Math.abs(n) < 1e21) return String(n);
  const exp = n !== 0 && (Math.abs(n) < 1e-4 || Math.abs(n) >= 1e21);
  if (!exp) return String(n);
  return n.toExponential().replace(/e([+-])(\d)$/, 'e$10$2');
}

function num(v: unknown, fn: string, line: number): number {
  if (typeof v === 'number') return v;
  if (typeof v === 'boolean') return v ? 1 : 0;
  throw new TemplateError(`${fn}: want a number, got ${goType(v)}`, line);
}

function jsonOf(v: unknown, indent?: string): string {
  if (v === GO_NIL) return 'null';
  return JSON.stringify(v === NO_VALUE ? null : v, (_k, x) => (x === undefined ? null : x), indent) ?? 'null';
}

function jsEscape(s: string): string {
  let out = '';
  for (const ch of s) {
    const c = ch.codePointAt(0)!;
    if (ch === '\\') out += '\\\\';
    else if (ch === "'") out += "\\'";
    else if (ch === '"') out += '\\"';
    else if (ch === '<') out += '\\u003C';
    else if (ch === '>') out += '\\u003E';
    else if (ch === '&') out += '\\u0026';
    else if (ch === '=') out += '\\u003D';
    else if (c < 0x20) out += `\\u${c.toString(16).toUpperCase().padStart(4, '0')}`;
    else out += ch;
  }
  return out;
}

function sprintf(format: string, args: unknown[], line: number): string {
  let i = 0;
  return format.replace(
    /%([-+# 0]*)(\d+)?(?:\.(\d+))?([a-zA-Z%])/g,
    (_m, flags: string, width: string | undefined, prec: string | undefined, verb: string) => {
      if (verb === '%') return '%';
      if (i >= args.length) return `%!${verb}(MISSING)`;
      const a = args[i++];
      let s: string;
      switch (verb) {
        case 'v':
        case 's':
          s = goString(a);
          break;
        case 'q':
          s = typeof a === 'number' ? `'${String.fromCodePoint(a)}'` : JSON.stringify(goString(a));
          break;
        case 'd':
          s = String(Math.trunc(num(a, 'printf', line)));
          break;
        case 'f':
        case 'F':
          s = num(a, 'printf', line).toFixed(prec === undefined ? 6 : Number(prec));
          break;
        case 'g':
          s = goNumber(num(a, 'printf', line));
          break;
        case 't':
          s = String(Boolean(a));
          break;
        case 'x':
        case 'X':
          s = typeof a === 'number' ? a.toString(16) : Buffer.from(goString(a)).toString('hex');
          if (verb === 'X') s = s.toUpperCase();
          break;
        default:
          throw new TemplateError(`printf: verb %${verb} is not supported`, line);
      }
      if (width && s.length < Number(width))
        s = flags.includes('-') ? s.padEnd(Number(width)) : s.padStart(Number(width), flags.includes('0') ? '0' : ' ');
      return s;
    },
  );
}

type Fn = (args: unknown[], line: number) => unknown;

const eqOne = (a: unknown, b: unknown) => (a === NO_VALUE ? null : a) === (b === NO_VALUE ? null : b);
const compare =
  (name: string, test: (a: number | string, b: number | string) => boolean): Fn =>
  (args, line) => {
    const [a, b] = args;
    if (typeof a === 'string' && typeof b === 'string') return test(a, b);
    return test(num(a, name, line), num(b, name, line));
  };
const str = (v: unknown) =>
  v === NO_VALUE || v === null || v === undefined ? '' : typeof v === 'string' ? v : goString(v);
const list = (v: unknown): unknown[] =>
  Array.isArray(v) ? v : v === NO_VALUE || v === null || v === undefined ? [] : [v];

const FUNCS: Record<string, Fn> = {
  not: ([a]) => !truthy(a),
  eq: ([a, ...rest]) => rest.some((b) => eqOne(a, b)),
  ne: ([a, b]) => !eqOne(a, b),
  lt: compare('lt', (a, b) => a < b),
  le: compare('le', (a, b) => a <= b),
  gt: compare('gt', (a, b) => a > b),
  ge: compare('ge', (a, b) => a >= b),
  len: ([a], line) => {
    if (a === null) return 0;
    if (typeof a === 'string' || Array.isArray(a)) return a.length;
    if (a && typeof a === 'object') return Object.keys(a).length;
    throw new TemplateError(`len of ${goType(a)}`, line);
  },
  index: ([v, ...keys], line) => {
    let cur = v;
    for (const k of keys) {
      if (Array.isArray(cur) || typeof cur === 'string') {
        const n = num(k, 'index', line);
        if (n < 0 || n >= cur.length) throw new TemplateError(`index out of range: ${n}`, line);
        cur = cur[n];
      } else if (cur && typeof cur === 'object') {
        cur = Object.prototype.hasOwnProperty.call(cur, String(k))
          ? (cur as Record<string, unknown>)[String(k)]
          : NO_VALUE;
      } else if (cur === NO_VALUE || cur === null) {
        cur = NO_VALUE;
      } else throw new TemplateError(`can't index item of type ${goType(cur)}`, line);
    }
    return cur;
  },
  slice: ([v, ...idx], line) => {
    const [a, b] = idx.map((x) => num(x, 'slice', line));
    if (typeof v === 'string' || Array.isArray(v)) return v.slice(a ?? 0, b);
    throw new TemplateError(`can't slice item of type ${goType(v)}`, line);
  },
  print: (args) =>
    args
      .map((a, i) => (i > 0 && typeof a !== 'string' && typeof args[i - 1] !== 'string' ? ' ' : '') + goString(a))
      .join(''),
  println: (args) => args.map(goString).join(' ') + '\n',
  printf: ([f, ...args], line) => sprintf(str(f), args, line),
  js: (args) => jsEscape(args.map(str).join('')),
  html: (args) =>
    args
      .map(str)
      .join('')
      .replace(
        /[&'<>"\0]/g,
        (c) => ({ '&': '&amp;', "'": '&#39;', '<': '&lt;', '>': '&gt;', '"': '&#34;', '\0': '\uFFFD' })[c]!,
      ),
  urlquery: (args) => encodeURIComponent(args.map(str).join('')).replace(/%20/g, '+'),
  // Istio's own: JSON, "{}" for nil.
  toJSON: ([v]) => (v === GO_NIL ? 'null' : v === null || v === undefined || v === NO_VALUE ? '{}' : jsonOf(v)),
  toJson: ([v]) => jsonOf(v),
  toRawJson: ([v]) => jsonOf(v),
  toPrettyJson: ([v]) => jsonOf(v, '  '),
  fromJson: ([v]) => {
    try {
      return JSON.parse(str(v));
    } catch {
      return {};
    }
  },
  default: ([d, v]) => (truthy(v) ? v : d),
  empty: ([v]) => !truthy(v),
  coalesce: (args) => args.find(truthy) ?? null,
  ternary: ([a, b, c]) => (truthy(c) ? a : b),
  quote: (args) =>
    args
      .filter((a) => a !== null && a !== NO_VALUE)
      .map((a) => JSON.stringify(str(a)))
      .join(' '),
  squote: (args) =>
    args
      .filter((a) => a !== null && a !== NO_VALUE)
      .map((a) => `'${str(a)}'`)
      .join(' '),
  upper: ([s]) => str(s).toUpperCase(),
  lower: ([s]) => str(s).toLowerCase(),
  trim: ([s]) => str(s).trim(),
  trimPrefix: ([p, s]) => (str(s).startsWith(str(p)) ? str(s).slice(str(p).length) : str(s)),
  trimSuffix: ([p, s]) => (str(p) && str(s).endsWith(str(p)) ? str(s).slice(0, -str(p).length) : str(s)),
  replace: ([a, b, s]) => str(s).split(str(a)).join(str(b)),
  contains: ([sub, s]) => str(s).includes(str(sub)),
  hasPrefix: ([p, s]) => str(s).startsWith(str(p)),
  hasSuffix: ([p, s]) => str(s).endsWith(str(p)),
  join: ([sep, l]) => list(l).map(str).join(str(sep)),
  splitList: ([sep, s]) => str(s).split(str(sep)),
  split: ([sep, s]) =>
    Object.fromEntries(
      str(s)
        .split(str(sep))
        .map((x, i) => [`_${i}`, x]),
    ),
  list: (args) => args,
  dict: (args) => {
    const o: Record<string, unknown> = {};
    for (let i = 0; i < args.length; i += 2) o[str(args[i])] = i + 1 < args.length ? args[i + 1] : '';
    return o;
  },
  hasKey: ([m, k]) => !!m && typeof m === 'object' && Object.prototype.hasOwnProperty.call(m, str(k)),
  keys: (args) => args.flatMap((m) => (m && typeof m === 'object' ? Object.keys(m) : [])),
  get: ([m, k]) =>
    m && typeof m === 'object' && Object.prototype.hasOwnProperty.call(m, str(k))
      ? (m as Record<string, unknown>)[str(k)]
      : '',
  toString: ([v]: unknown[]) => str(v),
  int: ([v]) => (typeof v === 'number' ? Math.trunc(v) : Number.parseInt(str(v), 10) || 0),
  atoi: ([v]) => Number.parseInt(str(v), 10) || 0,
  float64: ([v]) => (typeof v === 'number' ? v : Number.parseFloat(str(v)) || 0),
  indent: ([n, s]) =>
    str(s)
      .split('\n')
      .map((l) => ' '.repeat(Number(n)) + l)
      .join('\n'),
  nindent: ([n, s]) =>
    '\n' +
    str(s)
      .split('\n')
      .map((l) => ' '.repeat(Number(n)) + l)
      .join('\n'),
  b64enc: ([s]) => Buffer.from(str(s)).toString('base64'),
  b64dec: ([s]) => Buffer.from(str(s), 'base64').toString(),
  first: ([l]) => list(l)[0] ?? null,
  last: ([l]) => list(l)[list(l).length - 1] ?? null,
  cat: (args) =>
    args
      .filter((a) => a !== null && a !== NO_VALUE)
      .map(goString)
      .join(' '),
  repeat: ([n, s]) => str(s).repeat(Number(n)),
  add: (args, line) => args.reduce<number>((a, b) => a + Math.trunc(num(b, 'add', line)), 0),
  add1: ([a], line) => Math.trunc(num(a, 'add1', line)) + 1,
  sub: ([a, b], line) => Math.trunc(num(a, 'sub', line)) - Math.trunc(num(b, 'sub', line)),
  mul: (args, line) => args.reduce<number>((a, b) => a * Math.trunc(num(b, 'mul', line)), 1),
  div: ([a, b], line) => Math.trunc(Math.trunc(num(a, 'div', line)) / Math.trunc(num(b, 'div', line))),
  mod: ([a, b], line) => Math.trunc(num(a, 'mod', line)) % Math.trunc(num(b, 'mod', line)),
  max: (args, line) => Math.max(...args.map((a) => Math.trunc(num(a, 'max', line)))),
  min: (args, line) => Math.min(...args.map((a) => Math.trunc(num(a, 'min', line)))),
};

/** Renders a Go text/template over `data` (the root `.`). Throws TemplateError naming the line. */
export function renderGoTemplate(src: string, data: unknown): string {
  const tree = parse(split(src));
  const out: string[] = [];
  const scope: Scope = [new Map([['', data]])];
  const lookupVar = (name: string, line: number): unknown => {
    for (let s = scope.length - 1; s >= 0; s--) if (scope[s]!.has(name)) return scope[s]!.get(name);
    throw new TemplateError(`undefined variable "$${name}"`, line);
  };
  const setVar = (name: string, value: unknown, line: number) => {
    for (let s = scope.length - 1; s >= 0; s--) {
      if (scope[s]!.has(name)) {
        scope[s]!.set(name, value);
        return;
      }
    }
    throw new TemplateError(`undefined variable "$${name}"`, line);
  };

  const operand = (o: Operand, dot: unknown, line: number, args?: unknown[]): unknown => {
    switch (o.k) {
      case 'lit':
        return o.value;
      case 'field':
        return o.path.reduce((v, f) => fieldOf(v, f, line), dot);
      case 'var':
        return o.path.reduce((v, f) => fieldOf(v, f, line), lookupVar(o.name, line));
      case 'sub':
        return o.path.reduce((v, f) => fieldOf(v, f, line), pipeline(o.pipe, dot));
      case 'fn': {
        if (o.name === 'and' || o.name === 'or') return args === undefined ? undefined : args;
        const fn = FUNCS[o.name];
        if (!fn) throw new TemplateError(`function "${o.name}" not defined`, line);
        return fn(args ?? [], line);
      }
    }
  };

  const command = (cmd: Command, dot: unknown, line: number, piped: unknown[]): unknown => {
    const head = cmd[0]!;
    if (head.k === 'fn') {
      // and/or short-circuit: they return the first deciding argument without evaluating the rest.
      if (head.name === 'and' || head.name === 'or') {
        const argOps = cmd.slice(1);
        const values = [...argOps.map((a) => () => operand(a, dot, line)), ...piped.map((p) => () => p)];
        if (values.length === 0) throw new TemplateError(`wrong number of args for ${head.name}`, line);
        let v: unknown;
        for (const get of values) {
          v = get();
          if (head.name === 'and' ? !truthy(v) : truthy(v)) return v;
        }
        return v;
      }
      const args = [...cmd.slice(1).map((a) => operand(a, dot, line)), ...piped];
      return operand(head, dot, line, args);
    }
    if (cmd.length > 1 || piped.length)
      throw new TemplateError(`can't give argument to non-function ${describe(head)}`, line);
    return operand(head, dot, line);
  };

  const pipeline = (p: Pipeline, dot: unknown): unknown => {
    let piped: unknown[] = [];
    let v: unknown;
    for (const cmd of p.cmds) {
      v = command(cmd, dot, p.line, piped);
      piped = [v];
    }
    if (p.decl && p.decl.names.length === 1) {
      if (p.decl.assign) setVar(p.decl.names[0]!, v, p.line);
      else scope[scope.length - 1]!.set(p.decl.names[0]!, v);
    }
    return v;
  };

  const run = (nodes: Node[], dot: unknown): void => {
    for (const node of nodes) {
      switch (node.n) {
        case 'text':
          out.push(node.text);
          break;
        case 'out': {
          const v = pipeline(node.pipe, dot);
          if (!node.pipe.decl) out.push(goString(v));
          break;
        }
        case 'if':
        case 'with': {
          scope.push(new Map());
          try {
            const v = pipeline(node.pipe, dot);
            if (truthy(v)) run(node.then, node.n === 'with' ? v : dot);
            else run(node.else, dot);
          } finally {
            scope.pop();
          }
          break;
        }
        case 'range': {
          scope.push(new Map());
          try {
            const decl = node.pipe.decl;
            const v = pipeline({ ...node.pipe, decl: undefined }, dot);
            const entries: Array<[unknown, unknown]> = Array.isArray(v)
              ? v.map((x, i) => [i, x])
              : typeof v === 'number'
                ? Array.from({ length: Math.max(0, v) }, (_x, i) => [i, i])
                : v && typeof v === 'object'
                  ? Object.keys(v)
                      .sort()
                      .map((k) => [k, (v as Record<string, unknown>)[k]])
                  : [];
            if (v !== null && v !== undefined && v !== NO_VALUE && typeof v !== 'object' && typeof v !== 'number') {
              throw new TemplateError(`range can't iterate over ${goString(v)}`, node.pipe.line);
            }
            if (entries.length === 0) run(node.else, dot);
            for (const [k, x] of entries) {
              const iter = new Map<string, unknown>();
              if (decl?.names.length === 1) iter.set(decl.names[0]!, x);
              if (decl && decl.names.length >= 2) {
                iter.set(decl.names[0]!, k);
                iter.set(decl.names[1]!, x);
              }
              scope.push(iter);
              try {
                run(node.body, x);
              } catch (e) {
                if (!(e instanceof Stop)) throw e;
                if (e.kind === 'break') break;
              } finally {
                scope.pop();
              }
            }
          } finally {
            scope.pop();
          }
          break;
        }
        case 'break':
        case 'continue':
          throw new Stop(node.n);
      }
    }
  };
  try {
    run(tree, data);
  } catch (e) {
    if (e instanceof Stop) throw new TemplateError(`{{${e.kind}}} outside {{range}}`, 0);
    throw e;
  }
  return out.join('');
}

function describe(o: Operand): string {
  if (o.k === 'field') return `.${o.path.join('.')}`;
  if (o.k === 'var') return `$${o.name}`;
  if (o.k === 'lit') return JSON.stringify(o.value);
  return 'pipeline';
}
