'use strict';
// Build step (scripts/build.sh): node code-cache.js BUNDLE OUT [TEMPLATE], run by the executable's own node under the
// executable's V8 flags. Compiles the bundle as scripts/sea-main.js does, evaluates it without running a command,
// loads the modules a sidecar loads at start-up and runs the pure part of a start once over TEMPLATE (agent.ts
// loadForCodeCache), and writes V8's code cache for the script as it is then: the module bodies and the functions
// that ran, compiled.

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { compileBundle } = require('./sea-main.js');

async function main() {
  const [bundle, out, templateFile] = process.argv.slice(2);
  // As scripts/sea-main.js decodes it (the bundle is ASCII): V8 accepts a cache only for the same source.
  const script = compileBundle(fs.readFileSync(bundle, 'latin1'));
  const mod = { exports: {} };
  // Not the main module: the bundle's entry runs no command.
  script.runInThisContext()(mod.exports, require, mod, bundle, __dirname);
  // A scratch configPath for the exercise (TEMPLATE: Istio's bootstrap template), removed after.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pa-code-cache-'));
  try {
    await mod.exports.loadForCodeCache(templateFile ? { templateFile, dir } : undefined);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
  const cache = script.createCachedData();
  fs.writeFileSync(out, cache);
  process.stdout.write(`code-cache: ${(cache.length / 1024 / 1024).toFixed(1)} MiB for ${bundle}\n`);
}

main().then(
  () => process.exit(0),
  (err) => {
    process.stderr.write(`code-cache: ${err.stack || err}\n`);
    process.exit(1);
  },
);
