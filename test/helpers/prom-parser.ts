// The reference parsers for the merged metrics: Python prometheus_client's Prometheus text parser and its
// OpenMetrics parser (strict: one # EOF, no metadata after samples, counter naming, no clashing names). Installed
// into the repo's cache by scripts/install-prom-parser.sh when missing; a test that needs it fails if it cannot be had.

import { execFileSync } from 'node:child_process';
import * as path from 'node:path';
import { REPO } from './harness';

let dir: string | undefined;
function parserDir(): string {
  if (dir) return dir;
  try {
    dir = execFileSync('bash', [path.join(REPO, 'scripts/install-prom-parser.sh')], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] }).trim();
  } catch (e) {
    throw new Error(`this test needs Python's prometheus_client and it could not be installed: ${(e as Error).message}`);
  }
  return dir;
}

export interface ParsedFamily {
  name: string;
  type: string;
  help: string;
  samples: Array<{ name: string; labels: Record<string, string>; value: number | null }>;
}

const SCRIPT = `
import sys, json, math
fmt = sys.argv[1]
if fmt == 'openmetrics':
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
else:
    from prometheus_client.parser import text_string_to_metric_families
try:
    out = [{'name': f.name, 'type': f.type, 'help': f.documentation,
            'samples': [{'name': s.name, 'labels': s.labels, 'value': None if math.isnan(s.value) or math.isinf(s.value) else s.value} for s in f.samples]}
           for f in text_string_to_metric_families(sys.stdin.read())]
    print(json.dumps({'families': out}))
except Exception as e:
    print(json.dumps({'error': type(e).__name__ + ': ' + str(e)}))
`;

/** Parses with the reference parser; throws with the parser's own message when it rejects the text. */
export function parseExposition(text: string, format: 'text' | 'openmetrics'): ParsedFamily[] {
  const out = execFileSync('python3', ['-c', SCRIPT, format], { input: text, encoding: 'utf8', env: { ...process.env, PYTHONPATH: parserDir() }, maxBuffer: 256 * 1024 * 1024 });
  const r = JSON.parse(out) as { families?: ParsedFamily[]; error?: string };
  if (r.error) throw new Error(`the ${format} parser rejects the exposition: ${r.error}`);
  return r.families!;
}
