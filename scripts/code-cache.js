'use strict';
// Build step (scripts/build.sh): node code-cache.js BUNDLE OUT, run by the executable's own node under the
// executable's V8 flags. Compiles the bundle as scripts/sea-main.js does, evaluates it without running a command,
// loads the modules a sidecar loads at start-up (agent.ts loadForCodeCache), and writes V8's code cache for the
// script as it is then: the compiled module bodies included.

const fs = require('node:fs');
const { compileBundle } = require('./sea-main.js');

async function main() {
  const [bundle, out] = process.argv.slice(2);
  const script = compileBundle(fs.readFileSync(bundle, 'utf8'));
  const mod = { exports: {} };
  // Not the main module: the bundle's entry runs no command.
  script.runInThisContext()(mod.exports, require, mod, bundle, __dirname);
  await mod.exports.loadForCodeCache();
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
