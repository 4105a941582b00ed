#!/usr/bin/env bash
# The agent's main job on a fresh machine: installs what it needs, builds dist/pilot-agent, starts the example's
# two backends, and runs a sidecar in standalone mode (embedded discovery server, real Envoy) until Ctrl-C.
# Then: curl 127.0.0.1:8080/  (v1 about 80%, v2 about 20%),  curl -H 'x-version: v2' 127.0.0.1:8080/
#
# Every port can be moved when another program holds it (defaults in brackets):
#   DEMO_PORT [8080]  the service port the app calls       DEMO_V1_PORT [9081], DEMO_V2_PORT [9082]  the backends
#   DEMO_GATEWAY_PORT [8088]  the Gateway (router demo)    DEMO_ADMIN_PORT [15000]  Envoy's admin
#   DEMO_STATUS_PORT [15020]  the agent's status port      DEMO_ENVOY_STATUS_PORT [15021], DEMO_PROMETHEUS_PORT [15090]
# DEMO_DIR: the agent's working directory (bootstrap, sockets); kept. Unset: a temporary one, removed at exit.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
port="${DEMO_PORT:-8080}" v1="${DEMO_V1_PORT:-9081}" v2="${DEMO_V2_PORT:-9082}" gw="${DEMO_GATEWAY_PORT:-8088}"
admin="${DEMO_ADMIN_PORT:-15000}" status="${DEMO_STATUS_PORT:-15020}"
envoy_status="${DEMO_ENVOY_STATUS_PORT:-15021}" prometheus="${DEMO_PROMETHEUS_PORT:-15090}"
for p in "$port" "$v1" "$v2" "$gw" "$admin" "$status" "$envoy_status" "$prometheus"; do
  [[ "$p" =~ ^[0-9]+$ ]] && (( p >= 1 && p <= 65535 )) || { echo "demo: port \"$p\" is not a number in 1-65535" >&2; exit 2; }
done
[ -d node_modules ] || npm ci --no-audit --no-fund
envoy="$(bash scripts/install-envoy.sh)"
[ -x dist/pilot-agent ] || bash scripts/build.sh

if [ -n "${DEMO_DIR:-}" ]; then
  workdir="$DEMO_DIR"
  mkdir -p "$workdir"
  made_workdir=""
else
  workdir="$(mktemp -d "${TMPDIR:-/tmp}/pilot-agent-demo.XXXXXX")"
  made_workdir="$workdir"
fi
backends=""
cleanup() {
  if [ -n "$backends" ]; then kill "$backends" 2>/dev/null || true; wait "$backends" 2>/dev/null || true; fi
  if [ -n "$made_workdir" ]; then rm -rf "$made_workdir"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The example's own files when every port is the default (edit them and Envoy follows); otherwise a copy with the
# ports moved, in the working directory.
config="$root/examples/standalone/config"
if [ "$port:$v1:$v2:$gw" != "8080:9081:9082:8088" ]; then
  mkdir -p "$workdir/config"
  for f in "$config"/*.yaml; do
    sed -e "s/number: 8080\b/number: $port/; s/number: 8088\b/number: $gw/; s/http: 9081\b/http: $v1/; s/http: 9082\b/http: $v2/" \
      -e "s/127\.0\.0\.1:8080\b/127.0.0.1:$port/g; s/127\.0\.0\.1:8088\b/127.0.0.1:$gw/g" "$f" > "$workdir/config/$(basename "$f")"
  done
  config="$workdir/config"
fi

BACKEND_V1_PORT="$v1" BACKEND_V2_PORT="$v2" node examples/standalone/backends.js &
backends=$!
echo "demo: agent working directory $workdir; service on 127.0.0.1:$port; Ctrl-C to stop" >&2
cd "$workdir"
# Not exec: the EXIT trap stops the backends and removes a temporary working directory after the agent ends.
PROXY_CONFIG="{\"binaryPath\":\"$envoy\",\"configPath\":\"$workdir/proxy\",\"proxyAdminPort\":$admin,\"statusPort\":$status}" \
ENVOY_STATUS_PORT="$envoy_status" ENVOY_PROMETHEUS_PORT="$prometheus" \
POD_NAME="${POD_NAME:-demo}" POD_NAMESPACE="${POD_NAMESPACE:-demo}" INSTANCE_IP="${INSTANCE_IP:-127.0.0.1}" \
  "$root/dist/pilot-agent" proxy sidecar --standalone "$config" "$@"
