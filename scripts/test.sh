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
# curl and setpriv (util-linux) drive the capture-mode and two-namespace tests.
if ! command -v curl >/dev/null 2>&1 || ! command -v setpriv >/dev/null 2>&1; then
  echo "test: installing curl and util-linux" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends curl util-linux; } >&2 \
    || echo "test: could not install curl" >&2
fi
# The Wasm OCI tests run Debian's docker-registry and push images with skopeo (test/helpers/oci-registry.ts).
if ! command -v docker-registry >/dev/null 2>&1 || ! command -v skopeo >/dev/null 2>&1; then
  echo "test: installing docker-registry and skopeo" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-registry skopeo; } >&2 \
    || echo "test: could not install docker-registry and skopeo" >&2
fi
# The WasmPlugin tests assemble a proxy-wasm module with wabt's wat2wasm (test/helpers/wasm-module.ts also installs it).
if ! command -v wat2wasm >/dev/null 2>&1; then
  echo "test: installing wabt" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wabt; } >&2 \
    || echo "test: could not install wabt" >&2
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
# lib/ and the entry points are kept as prettier formats them (.prettierrc.json: 120 columns); `npm run format` fixes.
echo "test: prettier --check"
if ! npx prettier --check 'lib/**/*.ts' agent.ts agent-snapshot.ts >/dev/null; then
  npx prettier --list-different 'lib/**/*.ts' agent.ts agent-snapshot.ts | sed 's/^/test: not formatted: /'
  failed=1
fi

pattern="${1:-\.test\.ts$}"
# One uvu process a file: an unhandled rejection in one file ends that file's run (counted as a failure), not the
# whole suite's.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
total=0; passed=0; skipped=0; fails=0; files=0
deadline=$(( SECONDS + 3600 ))
for f in $(ls test | grep -E '\.test\.ts$' | grep -E "$pattern"); do
  files=$(( files + 1 ))
  # One file gets at most 15 minutes (the slowest, the packaging tests, take about 5): a file that hangs fails alone
  # instead of using up the whole suite's hour.
  left=$(( deadline - SECONDS )); [ "$left" -lt 60 ] && left=60; [ "$left" -gt 900 ] && left=900
  timeout --signal=KILL "$left" npx uvu -r tsx test "^${f//./\\.}$" > "$log" 2>&1
  rc=$?
  cat "$log"
  t=$(sed -n 's/^ *Total: *\([0-9]*\).*/\1/p' "$log" | tail -1)
  p=$(sed -n 's/^ *Passed: *\([0-9]*\).*/\1/p' "$log" | tail -1)
  k=$(sed -n 's/^ *Skipped: *\([0-9]*\).*/\1/p' "$log" | tail -1)
  t=${t:-0}; p=${p:-0}; k=${k:-0}
  f_fails=$(( t - p - k )); [ "$f_fails" -lt 0 ] && f_fails=0
  if [ "$rc" -ne 0 ] && [ "$f_fails" -eq 0 ]; then
    echo "test: $f ended with exit code $rc before its tests finished"
    f_fails=1
  fi
  total=$(( total + t )); passed=$(( passed + p )); skipped=$(( skipped + k )); fails=$(( fails + f_fails ))
done
[ "$failed" -ne 0 ] && fails=$(( fails + 1 ))
if [ "$total" -eq 0 ]; then echo "test: no test ran"; fails=$(( fails + 1 )); fi
echo "test: $files files, $total tests"
echo "$passed passed, $fails failed"
[ "$fails" -eq 0 ] && [ "$skipped" -eq 0 ]
