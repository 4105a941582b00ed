'use strict';
// The executable's main script (scripts/build.sh puts it, the bundle and the bundle's code cache into the SEA blob).
// Node's own SEA code cache is made before the bundle has run, so it holds only the bundle's top level: every module
// body and every function the agent calls at start-up was compiled again at each start. Here the bundle (asset
// pilot-agent.cjs) is compiled with a V8 code cache made after a build-time run that loaded the modules a sidecar
// loads (asset pilot-agent.cache, scripts/code-cache.js), so their compiled code comes from the executable.
// V8 rejects a cache made by another V8 or under other code-generation flags; the bundle then compiles from source,
// as before, and `pilot-agent version -o json` says `codeCache: rejected`.

const vm = require('node:vm');

/**
 * The bundle, which esbuild wrote as one CommonJS function expression `(function (exports, require, module,
 * __filename, __dirname) {...})`, compiled the same way here and at build time (V8 checks the source).
 */
function compileBundle(source, cachedData) {
  return new vm.Script(source, {
    filename: 'pilot-agent.cjs',
    cachedData: cachedData && cachedData.length ? cachedData : undefined,
  });
}

module.exports = { compileBundle };

const sea = require('node:sea');
if (sea.isSea()) {
  // Both read in place from the executable's mapping: the cache is not copied, and the source is decoded once,
  // into the one string V8 compiles (as scripts/code-cache.js reads it: UTF-8).
  const script = compileBundle(
    Buffer.from(sea.getRawAsset('pilot-agent.cjs')).toString('utf8'),
    Buffer.from(sea.getRawAsset('pilot-agent.cache')),
  );
  globalThis.__pilotAgentCodeCache = script.cachedDataRejected === false ? 'accepted' : 'rejected';
  script.runInThisContext()(module.exports, require, module, __filename, __dirname);
}
