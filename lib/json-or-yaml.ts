// The agent's text inputs (ProxyConfig, mesh config, bootstrap templates and overrides) are JSON or YAML. JSON,
// what the injector and Istio's templates produce, is read by JSON.parse; only other text loads the YAML parser,
// whose module set-up is a large share of the agent's start-up before Envoy's spawn. YAML also reports the errors,
// with their line and column, so invalid JSON is explained the same way as before.

import type * as Yaml from 'yaml';

export function parseJsonOrYaml(text: string): unknown {
  const head = text.trimStart()[0];
  if (head === '{' || head === '[') {
    try {
      return JSON.parse(text);
    } catch {
      // Not JSON (a YAML flow mapping, or invalid): the YAML parser decides and says where.
    }
  }
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const YAML = require('yaml') as typeof Yaml;
  return YAML.parse(text, { uniqueKeys: true });
}
