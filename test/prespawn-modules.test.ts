// What `proxy` loads before Envoy's spawn is on the path to ready (issue 23): every module there is compiled and run
// while Envoy waits to be started. node:http (with its client, server and agent modules, ~3 ms there) is needed only
// after the spawn (Envoy's admin, the app probes and scrapes, the status server), so the modules agent.ts loads before
// it must not load it at their top level.

import { spawnSync } from 'node:child_process';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { REPO } from './helpers/harness';

// agent.ts proxyCommand up to `envoy.start()` (its static imports come with agent.ts itself).
const BEFORE_SPAWN = [
  'csr',
  'resolve',
  'config-path-lock',
  'sds-sockets',
  'app-probe',
  'health-checker',
  'app-metrics',
  'cert-provider',
  'envoy-component',
  'unix-socket',
  'prebind',
];

test('the modules loaded before Envoy is spawned do not load node:http, https, http2 or tls', () => {
  const files = BEFORE_SPAWN.map((m) => path.join(REPO, 'lib', `${m}.ts`));
  const code = `
    Promise.all([import(${JSON.stringify(path.join(REPO, 'agent.ts'))}), ...${JSON.stringify(files)}.map((f) => import(f))])
      .then(() => {
        const loaded = process.moduleLoadList.filter((m) => /^NativeModule (https?|http2|tls|_http_\\w+)$/.test(m));
        console.log(JSON.stringify(loaded));
      });`;
  const r = spawnSync(process.execPath, ['--import', 'tsx', '-e', code], { cwd: REPO, encoding: 'utf8' });
  assert.is(r.status, 0, r.stderr);
  assert.equal(JSON.parse(r.stdout.trim()), []);
});

test.run();
