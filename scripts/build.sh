#!/usr/bin/env bash
# Builds dist/pilot-agent: one standalone Linux executable (Node single executable application), offline.
# esbuild CJS bundle (minified, names kept) -> SEA blob with V8's code cache (PILOT_AGENT_SNAPSHOT=1: a V8 startup
# snapshot instead; see README "The executable")
# -> copy of node, stripped BEFORE injection -> postject.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ -d node_modules ] || npm ci --no-audit --no-fund
mkdir -p dist
rm -f dist/pilot-agent dist/pilot-agent.cjs dist/sea-prep.blob
if [ "${PILOT_AGENT_SNAPSHOT:-0}" = 1 ]; then entry=agent-snapshot.ts; sea_opts='"useSnapshot": true'
else entry=agent.ts; sea_opts='"useCodeCache": true'; fi
# PILOT_AGENT_MINIFY=0: readable function names in CPU profiles (PILOT_AGENT_CPU_PROFILE).
minify=--minify; [ "${PILOT_AGENT_MINIFY:-1}" = 0 ] && minify=
npx esbuild "$entry" --bundle $minify --keep-names ${ESBUILD_EXTRA:-} --platform=node --target=node20 --format=cjs \
  --outfile=dist/pilot-agent.cjs --log-level=warning --legal-comments=none
cat > dist/sea-config.json <<JSON
{ "main": "dist/pilot-agent.cjs", "output": "dist/sea-prep.blob", "disableExperimentalSEAWarning": true, $sea_opts }
JSON
# The snapshot is built without NODE_OPTIONS/NODE_EXTRA_CA_CERTS: what the build's shell has must not end up in it.
env -u NODE_OPTIONS -u NODE_EXTRA_CA_CERTS node --experimental-sea-config dist/sea-config.json >dist/sea-build.log 2>&1 \
  || { cat dist/sea-build.log >&2; exit 1; }
cp "$(command -v node)" dist/pilot-agent.tmp
chmod u+w dist/pilot-agent.tmp
# Stripping after injection corrupts the binary; before is safe.
strip --strip-all dist/pilot-agent.tmp 2>/dev/null || echo "build: strip not available; binary left unstripped" >&2
npx postject dist/pilot-agent.tmp NODE_SEA_BLOB dist/sea-prep.blob \
  --sentinel-fuse NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2 >/dev/null 2>&1
mv dist/pilot-agent.tmp dist/pilot-agent
rm -f dist/sea-prep.blob dist/sea-config.json dist/sea-build.log
echo "build: dist/pilot-agent ($(du -h dist/pilot-agent | cut -f1))"
