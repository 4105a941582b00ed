#!/usr/bin/env bash
# Parity with the Go pilot-agent: runs both agents with a fake Envoy on every input set of
# test/helpers/parity.ts, regenerates the Go goldens in test/golden/parity/, and prints a semantic diff per set.
# Exits non-zero when a difference is not in test/golden/parity/allow.json. Needs root (network namespaces).
#   bash scripts/parity.sh [set-name-filter]
# The Go agent is the version pinned below, built once from the Go module proxy into $GOBIN (default
# /root/go/bin) and reused; GO_PILOT_AGENT=/path/to/pilot-agent uses another build.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
ISTIO_MODULE_VERSION="v0.0.0-20260827124520-eed52ebb66ad"
[ -d node_modules ] || npm ci --no-audit --no-fund
go_agent="${GO_PILOT_AGENT:-${GOBIN:-/root/go/bin}/pilot-agent}"
if [ ! -x "$go_agent" ]; then
  echo "building the Go pilot-agent (istio.io/istio@$ISTIO_MODULE_VERSION, a few minutes)" >&2
  GOBIN="$(dirname "$go_agent")" GOFLAGS=-mod=mod go install "istio.io/istio/pilot/cmd/pilot-agent@$ISTIO_MODULE_VERSION"
fi
# The stock template the Go agent renders must be the one in test/fixtures (the test checks ours against it).
stock="$(go env GOMODCACHE 2>/dev/null || echo /root/go/pkg/mod)/istio.io/istio@$ISTIO_MODULE_VERSION/tools/packaging/common/envoy_bootstrap.json"
if [ -f "$stock" ] && ! cmp -s "$stock" test/fixtures/istio/envoy_bootstrap.json; then
  echo "test/fixtures/istio/envoy_bootstrap.json differs from $stock; copy it over" >&2
  exit 2
fi
exec npx tsx scripts/parity.ts "$go_agent" "${1:-}"
