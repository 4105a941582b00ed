#!/usr/bin/env bash
# Regenerates test/golden/iptables from Istio's Go pilot-agent: for each case in cases.json, a fresh network
# namespace (lo, and eth0 with an IPv4 or IPv6 address, a veth so nothing leaves it), resolv.conf bind-mounted
# when the case has DNS servers, then `pilot-agent istio-iptables ARGS`, then iptables-save and ip6tables-save
# with comments and counters removed. The --dry-run input Istio would feed iptables-restore is kept too.
# Needs root, iptables and the Go binary: PILOT_AGENT=/root/go/bin/pilot-agent bash scripts/iptables-goldens.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$root/test/golden/iptables"
go_agent="${PILOT_AGENT:-/root/go/bin/pilot-agent}"
[ -x "$go_agent" ] || { echo "no Go pilot-agent at $go_agent (set PILOT_AGENT)" >&2; exit 1; }
command -v iptables-restore >/dev/null || { echo "iptables is not installed" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# name, net, env (K=V ...), resolv servers, args (shell-quoted), separated by \x1f (empty fields survive read)
node -e '
const q = (s) => /^[\w.,:/=@%+-]+$/.test(s) ? s : "\x27" + s.replace(/\x27/g, "\x27\\\x27\x27") + "\x27";
for (const c of require(process.argv[1])) {
  const env = Object.entries(c.env ?? {}).map(([k, v]) => `${k}=${q(v)}`).join(" ");
  console.log([c.name, c.net, env, (c.resolv ?? []).join(","), c.args.map(q).join(" ")].join("\x1f"));
}' "$dir/cases.json" > "$work/cases"

readme="$dir/README.md"
cat > "$readme" <<'HEAD'
# istio-iptables goldens

Made by `scripts/iptables-goldens.sh` with Istio's Go `pilot-agent` (built from the Go module proxy) on
iptables 1.8 (nf_tables backend). Each case ran in a fresh network namespace holding `lo` and `eth0` (one
end of a veth pair) with the address below; where the case lists DNS servers, `/etc/resolv.conf` was
bind-mounted to a file holding them. Files:

- `NAME.v4`, `NAME.v6`: `iptables-save` / `ip6tables-save` after the command, `#` lines dropped and counters
  zeroed. The empty IPv6 nat table in IPv4 cases comes from Istio's backend probe, which adds and removes a
  no-op rule in the nat table of both families.
- `NAME.dry-run`: what the command feeds `iptables-restore --noflush` (IPv4, then IPv6 when the pod has an
  IPv6 address), as recorded by the Go command's `--dry-run` with `DRY_RUN_FILE_PATH`.

The Go command's version: see `version` below. Cases (`cases.json` holds the same table for the tests):

HEAD
echo "version: \`$("$go_agent" version 2>/dev/null | tail -1)\`" >> "$readme"
echo >> "$readme"

normalise() { grep -v '^#' | sed -E 's/\[[0-9]+:[0-9]+\]/[0:0]/'; }

while IFS=$'\x1f' read -r name net env resolv args; do
  case "$net" in
    v4) cidr=10.1.0.5/24; addr="ip addr add $cidr dev eth0" ;;
    v6) cidr=fd00:1::5/64; addr="ip -6 addr add $cidr dev eth0 nodad" ;;
  esac
  mounts=""
  if [ -n "$resolv" ]; then
    tr ',' '\n' <<<"$resolv" | sed 's/^/nameserver /' > "$work/resolv.conf"
    mounts="mount --bind $work/resolv.conf /etc/resolv.conf"
  fi
  cmd="${env:+env $env }pilot-agent istio-iptables $args"
  setup="ip link set lo up; ip link add eth0 type veth peer name eth1; $addr; ip link set eth0 up; ip link set eth1 up; ${mounts:-true}"
  unshare -n -m bash -c "set -e; $setup
    ${env:+env $env} '$go_agent' istio-iptables $args >'$work/$name.log' 2>&1 || { cat '$work/$name.log' >&2; exit 1; }
    iptables-save > '$work/$name.v4'; ip6tables-save > '$work/$name.v6'
    rm -f '$work/$name.dry'
    ${env:+env $env} DRY_RUN_FILE_PATH='$work/$name.dry' '$go_agent' istio-iptables $args --dry-run >/dev/null 2>&1"
  normalise < "$work/$name.v4" > "$dir/$name.v4"
  normalise < "$work/$name.v6" > "$dir/$name.v6"
  # The dry-run file lists the commands run (iptables-save probes) and the restore input; keep the input.
  grep -Ev '^(ip6?tables)(-save|-restore)?( |$)' "$work/$name.dry" > "$dir/$name.dry-run" || true
  what="$(node -e 'const c=require(process.argv[1]).find((c)=>c.name===process.argv[2]); console.log(c.what)' "$dir/cases.json" "$name")"
  {
    echo "## $name"
    echo "$what; eth0 $cidr${resolv:+; resolv.conf nameservers $resolv}"
    echo '```'
    echo "$cmd"
    echo '```'
    echo
  } >> "$readme"
  echo "golden: $name"
done < "$work/cases"
