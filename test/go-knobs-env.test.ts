// Every variable registered in lib/env.ts is read somewhere: a registered variable nobody reads is one a user sets
// and that silently does nothing (issue 23: CA_PROVIDER, PILOT_CERT_PROVIDER and ECC_CURVE were such).

import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { registeredVars } from '../lib/env';

const ROOT = path.join(__dirname, '..');

// Nothing is exempt: proxyless gRPC (issue 24) reads DISABLE_ENVOY and GRPC_XDS_BOOTSTRAP.
const EXEMPT = new Set<string>();

// Read by their names rather than through the registry: where, as a pattern that file must still contain.
const READ_BY_NAME: Record<string, [file: string, pattern: RegExp]> = {
  // The node metadata takes the environment's ISTIO_VERSION as Istio does (lib/node-identity.ts).
  ISTIO_VERSION: ['lib/node-identity.ts', /sources\.ISTIO_VERSION/],
  // Every ISTIO_META_* variable becomes node metadata; the discovery server reads it from there.
  ISTIO_META_STANDALONE_CAPTURE: ['lib/discovery/proxy.ts', /\.STANDALONE_CAPTURE\b/],
};

function sources(dir: string): string[] {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) return sources(p);
    return e.name.endsWith('.ts') && p !== path.join(ROOT, 'lib', 'env.ts') ? [p] : [];
  });
}

test('every variable registered in lib/env.ts is read through the registry by the agent', () => {
  const code = [...sources(path.join(ROOT, 'lib')), path.join(ROOT, 'agent.ts')].map((f) => fs.readFileSync(f, 'utf8')).join('\n');
  // The istio-iptables flag table names its variables as strings; lib/iptables-flags.ts reads them by those names.
  const flagTable = fs.readFileSync(path.join(ROOT, 'lib', 'iptables-flags.ts'), 'utf8');
  const unread: string[] = [];
  for (const { name } of registeredVars()) {
    if (EXEMPT.has(name)) continue;
    const byName = READ_BY_NAME[name];
    if (byName) {
      assert.match(fs.readFileSync(path.join(ROOT, byName[0]), 'utf8'), byName[1], `${name} is no longer read in ${byName[0]}`);
      continue;
    }
    // NAME.get(env) through a named import, or the registry object handed to a reader (`envs.NAME`, `E.NAME`).
    const viaRegistry = new RegExp(`\\b${name}\\.(get|isSet)\\(|\\b(envs|E|IPTABLES_ENV)\\.${name}\\b`).test(code);
    const viaFlagTable = new RegExp(`env: \\[[^\\]]*'${name}'`).test(flagTable);
    if (!viaRegistry && !viaFlagTable) unread.push(name);
  }
  assert.equal(unread, [], `registered in lib/env.ts and read nowhere: ${unread.join(', ')}`);
});

test.run();
