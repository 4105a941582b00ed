#!/usr/bin/env bash
# Runs every benchmark in bench/ (or those matching $1) against the real Envoy and the built executable.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ -d node_modules ] || npm ci --no-audit --no-fund
ENVOY_BIN="$(bash scripts/install-envoy.sh)"; export ENVOY_BIN
bash scripts/build.sh
for b in bench/*.bench.ts; do
  case "$b" in *"${1:-}"*) ;; *) continue ;; esac
  echo "== $b"
  npx tsx "$b"
done
