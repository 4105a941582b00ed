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

/**
 * A sidecar's workload key, in the default case only (Istio's RSA key, 2048 bits unless WORKLOAD_RSA_KEY_SIZE says
 * otherwise; 60-90 ms of the thread pool here), is started before the bundle is even compiled: until Envoy's spawn
 * the machine's second core is idle, and the CSR otherwise waited for the key. lib/csr.ts pregenerateKey() takes it
 * when the settings ask for that key, and makes its own otherwise; anything unusual (ECDSA, mounted certificates,
 * standalone, a size it would refuse) is left to it.
 */
function startEarlyKey() {
  const args = process.argv.slice(2);
  if (args[0] !== 'proxy' || args.some((a) => a.startsWith('--standalone'))) return;
  const env = process.env;
  if ((env.ECC_SIGNATURE_ALGORITHM || '').trim() !== '' || (env.FILE_MOUNTED_CERTS || '') !== '') return;
  const size = env.WORKLOAD_RSA_KEY_SIZE || '';
  const bits = size === '' ? 2048 : Number(size);
  if (!['', '2048', '3072', '4096'].includes(size)) return;
  const { generateKeyPair } = require('node:crypto');
  const pair = new Promise((resolve, reject) =>
    generateKeyPair('rsa', { modulusLength: bits, publicExponent: 0x10001 }, (err, publicKey, privateKey) =>
      err ? reject(err) : resolve({ publicKey, privateKey }),
    ),
  );
  pair.catch(() => undefined);
  globalThis.__pilotAgentEarlyKey = { algorithm: JSON.stringify({ kind: 'RSA', bits }), pair };
}

const sea = require('node:sea');
if (sea.isSea()) {
  startEarlyKey();
  // Both read in place from the executable's mapping: the cache is not copied, and the source is decoded once,
  // into the one string V8 compiles (as scripts/code-cache.js reads it). The bundle is ASCII (scripts/build.sh
  // checks), so latin1 is the same text as UTF-8 and decodes as a plain copy: ~1 ms less than UTF-8 for 1.9 MB.
  const script = compileBundle(
    Buffer.from(sea.getRawAsset('pilot-agent.cjs')).toString('latin1'),
    Buffer.from(sea.getRawAsset('pilot-agent.cache')),
  );
  globalThis.__pilotAgentCodeCache = script.cachedDataRejected === false ? 'accepted' : 'rejected';
  script.runInThisContext()(module.exports, require, module, __filename, __dirname);
}
