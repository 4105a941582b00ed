// The agent's text inputs (ProxyConfig, mesh config, bootstrap templates and overrides) are JSON or YAML. JSON,
// what the injector and Istio's templates produce, is read by JSON.parse; only other text loads the YAML parser,
// whose module set-up is a large share of the agent's start-up before Envoy's spawn. YAML also reports the errors,
// with their line and column, so invalid JSON is explained the same way as before, and so is a key given twice
// (JSON.parse would keep the last one silently).

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
  return YAML.parse(text, { uniqueKeys: true });
}

/** Does an object in this text (valid JSON) name a key twice? One pass over the text. */
function hasDuplicateKey(text: string): boolean {
  // One entry per open object (its keys so far) or array (null).
  const open: Array<Set<string> | null> = [];
  let keyNext = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22 /* " */) {
      let j = i + 1;
      let escaped = false;
      for (; text.charCodeAt(j) !== 0x22; j++) {
        if (text.charCodeAt(j) === 0x5c /* \ */) {
          escaped = true;
          j++;
        }
      }
      if (keyNext) {
        const key = escaped ? (JSON.parse(text.slice(i, j + 1)) as string) : text.slice(i + 1, j);
        const keys = open[open.length - 1]!;
        if (keys.has(key)) return true;
        keys.add(key);
        keyNext = false;
      }
      i = j;
    } else if (c === 0x7b /* { */) {
      open.push(new Set());
      keyNext = true;
    } else if (c === 0x5b /* [ */) {
      open.push(null);
      keyNext = false;
    } else if (c === 0x7d /* } */ || c === 0x5d /* ] */) {
      open.pop();
      keyNext = false;
    } else if (c === 0x2c /* , */) {
      keyNext = open[open.length - 1] instanceof Set;
    }
  }
  return false;
}
