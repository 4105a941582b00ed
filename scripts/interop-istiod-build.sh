#!/usr/bin/env bash
# Builds a real istiod (pilot-discovery) and the Go pilot-agent from the Go module proxy into a cache directory,
# for scripts/interop-istiod.sh. Without Kubernetes istiod needs one change (see the patch below); everything else
# is upstream. Reused when the binaries are already there. Prints the cache directory on its last line.
#
#   ISTIO_VERSION_PIN  the istio.io/istio module version (default: the one the Go agent anchor was built from)
#   ISTIOD_CACHE       where to build (default: .cache/istiod-<version>/ in the repo)
set -euo pipefail
cd "$(dirname "$0")/.."

version="${ISTIO_VERSION_PIN:-v0.0.0-20260827124520-eed52ebb66ad}"
cache="${ISTIOD_CACHE:-$PWD/.cache/istiod-$version}"
if [[ -x "$cache/bin/pilot-discovery" && -x "$cache/bin/pilot-agent" && -f "$cache/envoy_bootstrap_tmpl.json" ]]; then
  echo "$cache"
  exit 0
fi
command -v go >/dev/null || { echo "interop-istiod-build: 'go' is not on PATH" >&2; exit 1; }
mkdir -p "$cache/bin"
work="$cache/build"
rm -rf "$work" && mkdir -p "$work/mod"

# 1. A throwaway module that depends on istio at the pinned version (fetched from the module proxy unless cached).
cd "$work/mod"
go mod init interop-istiod-build >/dev/null 2>&1
go get "istio.io/istio/pilot/cmd/pilot-discovery@$version" "istio.io/istio/pilot/cmd/pilot-agent@$version" >&2

# 2. A writable copy of the istio module (go build -overlay refuses files under GOMODCACHE), used via replace.
src="$(go list -m -f '{{.Dir}}' istio.io/istio)"
cp -r "$src" "$work/istio" && chmod -R u+w "$work/istio"
go mod edit -replace "istio.io/istio=$work/istio"

# 3. The one patch: with no Kubernetes there is no multicluster controller (or no config cluster), and the
#    ServiceEntry registry dereferences it for its Namespaces input. Give it an empty static collection instead.
f="$work/istio/pilot/pkg/serviceregistry/serviceentry/controller.go"
old=$'\t\ts.inputs.Namespaces = multiclusterController.ConfigCluster().Namespaces()'
grep -qxF "$old" "$f" || { echo "interop-istiod-build: no line to patch in $f (other version?)" >&2; exit 1; }
python3 - "$f" "$old" <<'PY'
import sys
path, old = sys.argv[1], sys.argv[2]
new = """\t\tif multiclusterController == nil || multiclusterController.ConfigCluster() == nil {
\t\t\ts.inputs.Namespaces = krt.NewStaticCollection[*v1.Namespace](nil, nil, s.opts.WithName("inputs/Namespaces")...)
\t\t} else {
\t\t\ts.inputs.Namespaces = multiclusterController.ConfigCluster().Namespaces()
\t\t}"""
text = open(path).read()
open(path, "w").write(text.replace(old, new, 1))
PY

# 4. Build both (the Go agent afterwards takes seconds: shared build cache).
go build -o "$cache/bin/pilot-discovery" istio.io/istio/pilot/cmd/pilot-discovery >&2
go build -o "$cache/bin/pilot-agent" istio.io/istio/pilot/cmd/pilot-agent >&2
cp "$work/istio/tools/packaging/common/envoy_bootstrap.json" "$cache/envoy_bootstrap_tmpl.json"
rm -rf "$work"
echo "$cache"
