#!/usr/bin/env bash
# The agent's main job on a fresh machine: installs what it needs, builds dist/pilot-agent, starts the example's
# two backends, and runs a sidecar in standalone mode (embedded discovery server, real Envoy) until Ctrl-C.
# Then: curl 127.0.0.1:8080/  (v1 about 80%, v2 about 20%),  curl -H 'x-version: v2' 127.0.0.1:8080/
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ -d node_modules ] || npm ci --no-audit --no-fund
envoy="$(bash scripts/install-envoy.sh)"
[ -x dist/pilot-agent ] || bash scripts/build.sh
node examples/standalone/backends.js &
backends=$!
trap 'kill $backends 2>/dev/null || true' EXIT
workdir="${DEMO_DIR:-$(mktemp -d /tmp/pilot-agent-demo.XXXXXX)}"
echo "demo: agent working directory $workdir; Ctrl-C to stop" >&2
cd "$workdir"
PROXY_CONFIG="{\"binaryPath\":\"$envoy\",\"configPath\":\"$workdir/proxy\"}" \
POD_NAME="${POD_NAME:-demo}" POD_NAMESPACE="${POD_NAMESPACE:-demo}" INSTANCE_IP="${INSTANCE_IP:-127.0.0.1}" \
  "$root/dist/pilot-agent" proxy sidecar --standalone "$root/examples/standalone/config" "$@"
