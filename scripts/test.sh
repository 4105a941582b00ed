#!/usr/bin/env bash
# The whole test suite: installs npm packages and the real Envoy, type-checks, runs every test against it.
# Last line: "N passed, N failed". Fails when any test fails or when no test ran.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export NO_COLOR=1 FORCE_COLOR=0

if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund >&2 || { echo "test: npm ci failed"; echo "0 passed, 1 failed"; exit 1; }
fi
# The istio-iptables tests program real iptables in network namespaces they create (CI runs as root).
if ! command -v iptables-restore >/dev/null 2>&1; then
  echo "test: installing iptables" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables; } >&2 || echo "test: could not install iptables" >&2
fi
# The DNS proxy tests use Debian's dnsmasq as the upstream resolver and dig as the client (test/helpers/dns.ts
# installs them too when a test runs alone). dnsmasq-base: the binary without the service that takes port 53.
if ! command -v dig >/dev/null 2>&1 || ! command -v dnsmasq >/dev/null 2>&1; then
  echo "test: installing dnsmasq-base and dnsutils" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends dnsmasq-base dnsutils; } >&2 \
    || echo "test: could not install dnsmasq-base and dnsutils" >&2
fi
if ! ENVOY_BIN="$(bash scripts/install-envoy.sh)"; then
  echo "test: no real Envoy could be found or installed; tests that need Envoy cannot run"
  echo "0 passed, 1 failed"; exit 1
fi
export ENVOY_BIN
# The reference Prometheus/OpenMetrics parsers the merged-metrics tests check against (Python prometheus_client).
if ! bash scripts/install-prom-parser.sh >/dev/null; then
  echo "test: Python's prometheus_client could not be installed; the metrics tests cannot run"
  echo "0 passed, 1 failed"; exit 1
fi
echo "test: using Envoy $ENVOY_BIN ($("$ENVOY_BIN" --version 2>/dev/null | sed -n 's/.*version: //p'))"

failed=0
echo "test: building dist/pilot-agent"
if ! bash scripts/build.sh; then echo "test: build failed"; echo "0 passed, 1 failed"; exit 1; fi
echo "test: tsc --noEmit"
if ! npx tsc --noEmit; then echo "test: type check failed"; failed=1; fi

pattern="${1:-\.test\.ts$}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
timeout --signal=KILL 3600 npx uvu -r tsx test "$pattern" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
total=$(sed -n 's/^ *Total: *\([0-9]*\).*/\1/p' "$log" | tail -1)
passed=$(sed -n 's/^ *Passed: *\([0-9]*\).*/\1/p' "$log" | tail -1)
skipped=$(sed -n 's/^ *Skipped: *\([0-9]*\).*/\1/p' "$log" | tail -1)
total=${total:-0}; passed=${passed:-0}; skipped=${skipped:-0}
fails=$(( total - passed - skipped ))
[ "$fails" -lt 0 ] && fails=0
if [ "$rc" -ne 0 ] && [ "$fails" -eq 0 ]; then fails=1; fi
[ "$failed" -ne 0 ] && fails=$(( fails + 1 ))
if [ "$total" -eq 0 ]; then echo "test: no test ran"; fails=$(( fails + 1 )); fi
echo "$passed passed, $fails failed"
[ "$fails" -eq 0 ] && [ "$skipped" -eq 0 ]
