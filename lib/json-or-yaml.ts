// The agent's text inputs (ProxyConfig, mesh config, bootstrap templates and overrides) are JSON or YAML. JSON,
// what the injector and Istio's templates produce, is read by JSON.parse; only other text loads the YAML parser,
// whose module set-up is a large share of the agent's start-up before Envoy's spawn. YAML also reports the errors,
// with their line and column, so invalid JSON is explained the same way as before, and so is a key given twice
// (JSON.parse would keep the last one silently). Its errors never quote the text: a file may be a key symlinked in
// by mistake (or by someone who cannot read it), and the error goes to a log others read.

import type * as Yaml from 'yaml';

export function parseJsonOrYaml(text: string): unknown {
  const head = text.trimStart()[0];
  if (head === '{' || head === '[') {
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch {
      // Not JSON (a YAML flow mapping, or invalid): the YAML parser decides and says where.
    }
    if (value !== undefined && !hasDuplicateKey(text)) return value;
  }
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const YAML = require('yaml') as typeof Yaml;
  try {
    // Not prettyErrors: those append the offending lines of the text to the message. No warnings on stderr either
    // (an unresolved tag is quoted there).
    return YAML.parse(text, { uniqueKeys: true, prettyErrors: false, logLevel: 'error' });
  } catch (e) {
    throw yamlError(e, text);
  }
}

/**
 * What a YAML parser message says, without the text it quotes: some end in the offending source (`Block scalar
 * header includes extra characters: <text>`, `Unresolved tag: <tag>`), the lexer's quote it in JSON.
 */
export function yamlErrorText(message: string): string {
  const line = message.split('\n', 1)[0]!.replace(/ at line \d+, column \d+:?$/, '');
  const said = line
    .replace(/"(?:[^"\\]|\\.)*"/g, '')
    // Any ': ' but the parser's own `Missing space after : in flow map` is followed by the text.
    .replace(/: (?!in ).*$/, '')
    .replace(/\S{32,}/g, '...')
    .trim();
  return said.length > 200 ? `${said.slice(0, 200)}...` : said || 'invalid YAML';
}

function yamlError(e: unknown, text: string): Error {
  // Every error of the parser, not only YAMLParseError: resolving an alias throws a ReferenceError naming it.
  const err = e as { name?: string; message?: string; code?: string; pos?: [number, number] };
  if (typeof err?.message !== 'string') return e as Error;
  let where = '';
  const at = err.pos?.[0];
  if (typeof at === 'number' && at >= 0) {
    const before = text.slice(0, at);
    const line = before.split('\n').length;
    where = ` at line ${line}, column ${at - before.lastIndexOf('\n')}`;
  }
  // No cause: the parser's own error is the one that quotes the text.
  const out = new Error(`${yamlErrorText(err.message)}${where}`);
  out.name = err.name!;
  Object.assign(out, { code: err.code });
  return out;
}

/** The characters that open or close a value, separate members, or start a string, in JSON text. */
const STRUCTURE = /["{}[\],]/g;

/**
 * Does an object in this text (valid JSON) name a key twice? One pass over the text, which jumps from one
 * structural character to the next (a regular expression and indexOf do the scanning, not a loop over every
 * character: the text is a rendered bootstrap of some 30 KB, read once before Envoy's spawn, interpreted).
 */
function hasDuplicateKey(text: string): boolean {
  // One entry per open object (its keys so far) or array (null).
  const open: Array<Set<string> | null> = [];
  let keyNext = false;
  STRUCTURE.lastIndex = 0;
  for (let m = STRUCTURE.exec(text); m; m = STRUCTURE.exec(text)) {
    const i = m.index;
    const c = text.charCodeAt(i);
    if (c === 0x22 /* " */) {
      // Valid JSON: the closing quote is the next one not escaped (an odd run of backslashes before it escapes it).
      let j = i;
      for (;;) {
        j = text.indexOf('"', j + 1);
        let k = j - 1;
        while (text.charCodeAt(k) === 0x5c /* \ */) k--;
        if ((j - 1 - k) % 2 === 0) break;
      }
      if (keyNext) {
        const raw = text.slice(i + 1, j);
        const key = raw.includes('\\') ? (JSON.parse(text.slice(i, j + 1)) as string) : raw;
        const keys = open[open.length - 1]!;
        if (keys.has(key)) return true;
        keys.add(key);
        keyNext = false;
      }
      STRUCTURE.lastIndex = j + 1;
    } else if (c === 0x7b /* { */) {
      open.push(new Set());
      keyNext = true;
    } else if (c === 0x5b /* [ */) {
      open.push(null);
      keyNext = false;
    } else if (c === 0x7d /* } */ || c === 0x5d /* ] */) {
      open.pop();
      keyNext = false;
    } else {
      // ,
      keyNext = open[open.length - 1] instanceof Set;
    }
  }
  return false;
}
