#!/usr/bin/env bash
# Prints a directory holding Python's prometheus_client (the reference Prometheus and OpenMetrics parsers the
# metrics tests check the merged exposition with): the repo's cache .cache/python-prom (ignored by git), installed
# there from PyPI with pip --target when missing. Pinned, so every run parses with the same rules.
set -euo pipefail
VERSION="${PROMETHEUS_CLIENT_VERSION:-0.26.0}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$root/.cache/python-prom-$VERSION"
py="$(command -v python3 || command -v python || true)"
if [ -z "$py" ]; then echo "install-prom-parser: python3 is needed for the metrics parser tests" >&2; exit 1; fi
if PYTHONPATH="$dir" "$py" -c 'import prometheus_client.openmetrics.parser' >/dev/null 2>&1; then echo "$dir"; exit 0; fi
echo "install-prom-parser: installing prometheus-client==$VERSION from PyPI into $dir" >&2
rm -rf "$dir.tmp"
if ! "$py" -m pip install --quiet --disable-pip-version-check --no-deps --target "$dir.tmp" "prometheus-client==$VERSION" >&2; then
  echo "install-prom-parser: pip could not install prometheus-client==$VERSION" >&2
  rm -rf "$dir.tmp"; exit 1
fi
rm -rf "$dir" && mv "$dir.tmp" "$dir"
echo "$dir"
