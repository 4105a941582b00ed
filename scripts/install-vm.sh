#!/usr/bin/env bash
# Installs pilot-agent on a VM (or any systemd host) as the pilot-agent.service unit; run as root. Idempotent: run
# it again to upgrade the binaries and the unit; configuration you edited is kept unless --force-config.
#
#   install-vm.sh --standalone DIR [options]                       # no istiod: Istio YAML in DIR
#   install-vm.sh --istiod HOST:PORT --root-cert FILE --token FILE [options]
#   install-vm.sh --istio-vm DIR [options]                         # Istio's VM onboarding (istioctl's output)
#   install-vm.sh --uninstall [--purge]                            # --purge: config, state and the user too
# Options: --binary FILE (default dist/pilot-agent), --envoy FILE (default: scripts/install-envoy.sh),
#   --type sidecar|router|ingress|waypoint (default sidecar), --namespace NS (default vm),
#   --service-account SA (default default), --no-start, --force-config (rewrite /etc/pilot-agent/pilot-agent.env
#   and mesh.yaml), --bind-low-ports / --no-bind-low-ports (CAP_NET_BIND_SERVICE for the agent and Envoy: the DNS
#   proxy on :53, listeners below 1024; kept on later runs until --no-bind-low-ports).
#
# Installs: /usr/local/bin/pilot-agent, /usr/local/bin/envoy, /usr/local/lib/pilot-agent/pilot-agent-systemd (readiness, reload),
# /etc/systemd/system/pilot-agent.service, /etc/pilot-agent/{pilot-agent.env,mesh.yaml}, /etc/pilot-agent/standalone/
# (standalone) or /etc/pilot-agent/root-cert.pem and the token at
# /var/lib/pilot-agent/var/run/secrets/tokens/istio-token (istiod); user and group istio-proxy (1337).
# Standalone with DIR/ca/identities/<namespace>/<sa> (the embedded CA): the CA lives in the state directory,
# /var/lib/pilot-agent/ca (the unit may write there: the root is created on first start; /etc stays read-only),
# linked from /etc/pilot-agent/standalone/ca; identities are replaced as a set, tokens 0600 istio-proxy; a root
# in DIR/ca (root-cert.pem + root-key.pem, to share one between hosts) replaces the installed one, else the
# installed or first-start root is kept. This host's own token is DIR/ca/identities/NS/SA.
# --istio-vm DIR: the directory `istioctl x workload entry configure -o DIR` wrote (cluster.env, mesh.yaml,
# root-cert.pem, istio-token, hosts; a sidecar.env beside them is installed too). cluster.env and sidecar.env go
# where Istio's VM start reads them, /var/lib/istio/envoy/, and are read as it reads them (pilot-agent-vm-env:
# capture from their ISTIO_* variables, POD_NAMESPACE, INSTANCE_IP, CA_ADDR...); root-cert.pem goes to
# /var/lib/pilot-agent/etc/certs (the agent's ./etc/certs), the token to the agent's token path, hosts' lines are
# added to /etc/hosts when missing, and mesh.yaml becomes /etc/pilot-agent/mesh.yaml with this host's binaryPath,
# configPath and terminationDrainDuration added unless it sets them (rewritten at each --istio-vm install).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
UNIT=pilot-agent.service
ETC=/etc/pilot-agent
STATE=/var/lib/pilot-agent
UNIT_FILE=/etc/systemd/system/$UNIT
HELPER=/usr/local/lib/pilot-agent/pilot-agent-systemd
binary="$root/dist/pilot-agent" envoy="" standalone="" istiod="" root_cert="" token="" type=sidecar ns=vm
start=1 force=0 uninstall=0 purge=0 sa=default low_ports="" istio_vm=""
VM_ENV=/usr/local/lib/pilot-agent/pilot-agent-vm-env
ISTIO_ENV_DIR=/var/lib/istio/envoy
DROPIN_DIR=/etc/systemd/system/$UNIT.d
LOW_PORTS_DROPIN=$DROPIN_DIR/bind-low-ports.conf

say() { echo "install-vm: $*"; }
die() { echo "install-vm: $*" >&2; exit 1; }
need_arg() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) need_arg "$@"; binary="$2"; shift 2 ;;
    --envoy) need_arg "$@"; envoy="$2"; shift 2 ;;
    --standalone) need_arg "$@"; standalone="$2"; shift 2 ;;
    --istiod) need_arg "$@"; istiod="$2"; shift 2 ;;
    --istio-vm) need_arg "$@"; istio_vm="$2"; shift 2 ;;
    --root-cert) need_arg "$@"; root_cert="$2"; shift 2 ;;
    --token) need_arg "$@"; token="$2"; shift 2 ;;
    --type) need_arg "$@"; type="$2"; shift 2 ;;
    --namespace) need_arg "$@"; ns="$2"; shift 2 ;;
    --service-account) need_arg "$@"; sa="$2"; shift 2 ;;
    --bind-low-ports) low_ports=1; shift ;;
    --no-bind-low-ports) low_ports=0; shift ;;
    --no-start) start=0; shift ;;
    --force-config) force=1; shift ;;
    --uninstall) uninstall=1; shift ;;
    --purge) purge=1; shift ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "install-vm: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || die "run as root"
systemd_running() { [ -d /run/systemd/system ] && command -v systemctl >/dev/null; }

if [ "$uninstall" = 1 ]; then
  if systemd_running; then
    systemctl disable --now "$UNIT" 2>/dev/null || true
  fi
  rm -f "$UNIT_FILE" /usr/local/bin/pilot-agent /usr/local/bin/envoy "$HELPER" "$VM_ENV" "$LOW_PORTS_DROPIN"
  rmdir /usr/local/lib/pilot-agent "$DROPIN_DIR" 2>/dev/null || true
  if systemd_running; then systemctl daemon-reload; systemctl reset-failed "$UNIT" 2>/dev/null || true; fi
  if [ "$purge" = 1 ]; then
    rm -rf "$ETC" "$STATE"
    rm -f "$ISTIO_ENV_DIR/cluster.env" "$ISTIO_ENV_DIR/sidecar.env"
    rmdir "$ISTIO_ENV_DIR" /var/lib/istio 2>/dev/null || true
    if id istio-proxy >/dev/null 2>&1; then userdel istio-proxy 2>/dev/null || true; fi
    if getent group istio-proxy >/dev/null; then groupdel istio-proxy 2>/dev/null || true; fi
    say "removed pilot-agent, its configuration, state and the istio-proxy user"
  else
    say "removed pilot-agent ($ETC and $STATE kept; --purge removes them)"
  fi
  exit 0
fi

case "$type" in sidecar|router|ingress|waypoint) ;; *) die "--type: want sidecar, router, ingress or waypoint, got $type" ;; esac
modes=0; for m in "$standalone" "$istiod" "$istio_vm"; do [ -n "$m" ] && modes=$((modes + 1)); done
[ "$modes" -le 1 ] || die "give one of --standalone DIR, --istiod HOST:PORT or --istio-vm DIR"
if [ "$modes" = 0 ] && [ ! -f "$ETC/mesh.yaml" ]; then die "first install: give --standalone DIR, --istiod HOST:PORT or --istio-vm DIR"; fi
if [ -n "$istio_vm" ]; then
  [ -d "$istio_vm" ] || die "--istio-vm: $istio_vm is not a directory"
  for f in cluster.env mesh.yaml root-cert.pem istio-token; do
    [ -f "$istio_vm/$f" ] || die "--istio-vm: $istio_vm has no $f (istioctl x workload entry configure -o DIR writes it)"
  done
  [ -s "$istio_vm/istio-token" ] || die "--istio-vm: $istio_vm/istio-token is empty"
  grep -q '^defaultConfig:[[:space:]]*$' "$istio_vm/mesh.yaml" || die "--istio-vm: $istio_vm/mesh.yaml has no defaultConfig: block (istioctl's mesh.yaml has one)"
  bash -n "$istio_vm/cluster.env" 2>/dev/null || die "--istio-vm: $istio_vm/cluster.env is not valid shell (it is sourced as Istio's istio-start.sh sources it)"
  if [ -f "$istio_vm/sidecar.env" ]; then bash -n "$istio_vm/sidecar.env" 2>/dev/null || die "--istio-vm: $istio_vm/sidecar.env is not valid shell"; fi
fi
if [ -n "$standalone" ] && [ ! -d "$standalone" ]; then die "--standalone: $standalone is not a directory"; fi
# The embedded CA's rule for a namespace or service account name (a DNS label).
label='^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'
printf '%s' "$ns" | grep -Eq "$label" || die "--namespace: $ns is not a DNS label (lower-case letters, digits, '-')"
printf '%s' "$sa" | grep -Eq "$label" || die "--service-account: $sa is not a DNS label (lower-case letters, digits, '-')"
ca_src=""
if [ -n "$standalone" ] && [ -e "$standalone/ca" ]; then
  ca_src="$standalone/ca"
  [ -d "$ca_src/identities" ] || die "--standalone: $ca_src has no identities/ directory (the embedded CA needs identities/<namespace>/<sa> token files)"
  # Everything in it is installed or refused here, never dropped: a CA that silently lost identities fails later.
  for f in "$ca_src"/* "$ca_src"/.[!.]*; do
    [ -e "$f" ] || continue
    case "$(basename "$f")" in identities|root-cert.pem|root-key.pem) ;; *) die "--standalone: $f: only identities/, root-cert.pem and root-key.pem belong in ca/" ;; esac
  done
  if { [ -e "$ca_src/root-cert.pem" ] && [ ! -e "$ca_src/root-key.pem" ]; } || { [ ! -e "$ca_src/root-cert.pem" ] && [ -e "$ca_src/root-key.pem" ]; }; then
    die "--standalone: $ca_src needs both root-cert.pem and root-key.pem, or neither (then the CA makes a root on first start)"
  fi
  for d in "$ca_src/identities"/* "$ca_src/identities"/.[!.]*; do
    [ -e "$d" ] || continue
    n="$(basename "$d")"
    [ -d "$d" ] && printf '%s' "$n" | grep -Eq "$label" || die "--standalone: $d: identities/ holds one directory per namespace, named as a DNS label"
    for t in "$d"/* "$d"/.[!.]*; do
      [ -e "$t" ] || continue
      [ -f "$t" ] && printf '%s' "$(basename "$t")" | grep -Eq "$label" || die "--standalone: $t: a namespace directory holds one token file per service account, named as a DNS label"
      [ -s "$t" ] || die "--standalone: $t is empty (a token file holds that identity's token)"
    done
  done
fi
if [ -n "$istiod" ]; then
  [ -n "$root_cert" ] && [ -f "$root_cert" ] || die "--istiod needs --root-cert FILE (istiod's root certificate)"
  [ -n "$token" ] && [ -f "$token" ] || die "--istiod needs --token FILE (a service account token for istiod)"
fi
[ -x "$binary" ] || die "--binary: $binary is not an executable (build it with npm run build, or pass --binary)"
if [ -z "$envoy" ]; then envoy="$(bash "$root/scripts/install-envoy.sh")" || die "no Envoy binary (pass --envoy FILE)"; fi
[ -x "$envoy" ] || die "--envoy: $envoy is not an executable"
"$binary" version -s >/dev/null || die "--binary: $binary does not run here (glibc >= 2.28 and libstdc++6 are needed)"
"$envoy" --version >/dev/null || die "--envoy: $envoy does not run here (glibc >= 2.30 is needed)"

# Istio's user: uid and gid 1337 (the capture rules exclude it, so Envoy's own traffic is not captured).
if ! getent group istio-proxy >/dev/null; then
  getent group 1337 >/dev/null && die "gid 1337 is taken by group $(getent group 1337 | cut -d: -f1); istio-proxy needs it"
  groupadd --gid 1337 istio-proxy
fi
if ! id istio-proxy >/dev/null 2>&1; then
  getent passwd 1337 >/dev/null && die "uid 1337 is taken by user $(getent passwd 1337 | cut -d: -f1); istio-proxy needs it"
  useradd --uid 1337 --gid istio-proxy --no-create-home --home-dir "$STATE" --shell /usr/sbin/nologin istio-proxy
fi
[ "$(id -u istio-proxy)" = 1337 ] || die "user istio-proxy exists with uid $(id -u istio-proxy), not 1337"

# Binaries: written beside the old ones and renamed over them, so a running agent keeps its file.
put() { local src="$1" dst="$2" mode="$3"; install -D -m "$mode" "$src" "$dst.new" && mv -f "$dst.new" "$dst"; }
put "$binary" /usr/local/bin/pilot-agent 0755
put "$envoy" /usr/local/bin/envoy 0755
put "$root/packaging/systemd/pilot-agent-systemd" "$HELPER" 0755
put "$root/packaging/systemd/pilot-agent-vm-env" "$VM_ENV" 0755
put "$root/packaging/systemd/pilot-agent.service" "$UNIT_FILE" 0644
if [ "$low_ports" = 1 ]; then
  install -d -m 0755 "$DROPIN_DIR"
  put "$root/packaging/systemd/bind-low-ports.conf" "$LOW_PORTS_DROPIN" 0644
elif [ "$low_ports" = 0 ]; then
  rm -f "$LOW_PORTS_DROPIN"; rmdir "$DROPIN_DIR" 2>/dev/null || true
elif [ -f "$LOW_PORTS_DROPIN" ]; then
  put "$root/packaging/systemd/bind-low-ports.conf" "$LOW_PORTS_DROPIN" 0644
fi

install -d -m 0750 -g istio-proxy "$ETC"
install -d -m 0750 -o istio-proxy -g istio-proxy "$STATE"

# The token the agent reads (./var/run/secrets/tokens/istio-token), 0600; the directories on the way are the
# agent's too, since it creates its sockets beside them (./var/run/secrets/workload-spiffe-uds).
install_token() {
  local d="$STATE"
  for part in var run secrets tokens; do d="$d/$part"; install -d -m 0750 -o istio-proxy -g istio-proxy "$d"; done
  install -m 0600 -o istio-proxy -g istio-proxy "$1" "$d/istio-token.new" && mv -f "$d/istio-token.new" "$d/istio-token"
}

# The embedded CA's directory, owned by the agent's user, nobody else may read it: the tokens and the root key are
# owner-only (the agent refuses token files others can read). Identities are swapped in as a whole.
CA=$STATE/ca
install_ca() {
  local src="$1" d t
  install -d -m 0700 -o istio-proxy -g istio-proxy "$CA"
  rm -rf "$CA/identities.new" "$CA/identities.old"
  install -d -m 0700 -o istio-proxy -g istio-proxy "$CA/identities.new"
  for d in "$src/identities"/*/; do
    [ -d "$d" ] || continue
    install -d -m 0700 -o istio-proxy -g istio-proxy "$CA/identities.new/$(basename "$d")"
    for t in "$d"*; do
      [ -f "$t" ] && install -m 0600 -o istio-proxy -g istio-proxy "$t" "$CA/identities.new/$(basename "$d")/"
    done
  done
  if [ -d "$CA/identities" ]; then mv "$CA/identities" "$CA/identities.old"; fi
  mv "$CA/identities.new" "$CA/identities" && rm -rf "$CA/identities.old"
  if [ -f "$src/root-key.pem" ]; then
    if ! cmp -s "$src/root-key.pem" "$CA/root-key.pem" || ! cmp -s "$src/root-cert.pem" "$CA/root-cert.pem"; then
      # The key first, as the CA writes it: a certificate without its key is never taken as complete.
      install -m 0600 -o istio-proxy -g istio-proxy "$src/root-key.pem" "$CA/root-key.pem.new" && mv -f "$CA/root-key.pem.new" "$CA/root-key.pem"
      install -m 0644 -o istio-proxy -g istio-proxy "$src/root-cert.pem" "$CA/root-cert.pem.new" && mv -f "$CA/root-cert.pem.new" "$CA/root-cert.pem"
      say "installed the embedded CA root from $src"
    fi
  elif [ -f "$CA/root-cert.pem" ]; then
    say "kept the embedded CA root in $CA"
  fi
  say "embedded CA: $(find "$CA/identities" -type f | wc -l) identities in $CA/identities"
  # This host's own identity: its token, where the agent reads it (./var/run/secrets/tokens/istio-token).
  if [ -f "$CA/identities/$ns/$sa" ]; then
    install_token "$CA/identities/$ns/$sa"
  else
    say "WARNING: no identity $ns/$sa in $src/identities: this host's sidecar gets no certificate from the embedded CA (--namespace, --service-account)"
  fi
}
args=""
if [ -n "$standalone" ]; then
  # The directory is replaced as a whole; the agent watches it and applies edits while running.
  rm -rf "$ETC/standalone.new"
  install -d -m 0750 -g istio-proxy "$ETC/standalone.new"
  find "$standalone" -maxdepth 1 -type f \( -name '*.yaml' -o -name '*.yml' -o -name '*.json' \) -exec install -m 0640 -g istio-proxy {} "$ETC/standalone.new/" \;
  if [ -n "$ca_src" ]; then
    install_ca "$ca_src"
    ln -s "$CA" "$ETC/standalone.new/ca"
  elif [ -d "$CA/identities" ]; then
    # No CA any more: its tokens are secrets, so they go; the root stays for a later CA.
    rm -rf "$CA/identities"
    say "removed the embedded CA's identities ($standalone has no ca/); kept its root in $CA"
  fi
  rm -rf "$ETC/standalone" && mv "$ETC/standalone.new" "$ETC/standalone"
  args="--standalone $ETC/standalone"
fi
if [ -n "$istiod" ]; then
  install -m 0640 -g istio-proxy "$root_cert" "$ETC/root-cert.pem"
  install_token "$token"
fi
if [ -n "$istio_vm" ]; then
  install -d -m 0755 /var/lib/istio "$ISTIO_ENV_DIR"
  for f in cluster.env sidecar.env; do
    if [ -f "$istio_vm/$f" ]; then put "$istio_vm/$f" "$ISTIO_ENV_DIR/$f" 0640; chgrp istio-proxy "$ISTIO_ENV_DIR/$f"; say "installed $ISTIO_ENV_DIR/$f"; fi
  done
  # The agent's ./etc/certs: the root verifies istiod (xDS and CA), and OUTPUT_CERTS writes the issued files beside it.
  install -d -m 0750 -o istio-proxy -g istio-proxy "$STATE/etc" "$STATE/etc/certs"
  install -m 0644 -o istio-proxy -g istio-proxy "$istio_vm/root-cert.pem" "$STATE/etc/certs/root-cert.pem.new"
  mv -f "$STATE/etc/certs/root-cert.pem.new" "$STATE/etc/certs/root-cert.pem"
  install_token "$istio_vm/istio-token"
  if [ -f "$istio_vm/hosts" ]; then
    while IFS= read -r line || [ -n "$line" ]; do
      case "$line" in ''|'#'*) continue ;; esac
      grep -qxF -- "$line" /etc/hosts || { printf '%s\n' "$line" >> /etc/hosts; say "added to /etc/hosts: $line"; }
    done < "$istio_vm/hosts"
  fi
fi

write_config() { # file, then content on stdin: written when absent or with --force-config
  local file="$1" tmp
  if [ -f "$file" ] && [ "$force" = 0 ]; then cat >/dev/null; say "kept $file (--force-config rewrites it)"; return; fi
  tmp="$(mktemp "$file.XXXXXX")"; cat >"$tmp"; chmod 0640 "$tmp"; chgrp istio-proxy "$tmp"; mv -f "$tmp" "$file"
  say "wrote $file"
}
{
  cat <<EOT
# Environment of pilot-agent.service: KEY=value, one a line. A value is taken literally; wrap it in single quotes
# only when it has blanks at its ends. JSON needs no escaping: PROXY_CONFIG='{"concurrency": 2}'.
# ProxyConfig is best set in $ETC/mesh.yaml (defaultConfig). After an edit: systemctl restart pilot-agent.
PROXY_TYPE=$type
# Extra arguments of \`pilot-agent proxy\` (split at blanks).
PILOT_AGENT_ARGS=$args
# Ports the readiness and reload helper asks: Envoy's readiness listener and the agent's status port (statusPort).
PILOT_AGENT_READY_PORT=15021
PILOT_AGENT_STATUS_PORT=15020
POD_NAME=$(hostname)
EOT
  if [ -n "$istio_vm" ]; then
    echo "# POD_NAMESPACE, SERVICE_ACCOUNT, ISTIO_* and the rest: $ISTIO_ENV_DIR/cluster.env (and sidecar.env), read after this file."
  else
    printf 'POD_NAMESPACE=%s\nSERVICE_ACCOUNT=%s\n' "$ns" "$sa"
  fi
  if [ -n "$istiod" ]; then
    cat <<EOT
# istiod: its root certificate, for both xDS and the CA. The token is read from
# $STATE/var/run/secrets/tokens/istio-token at each connect (replace the file to rotate it).
XDS_ROOT_CA=$ETC/root-cert.pem
CA_ROOT_CA=$ETC/root-cert.pem
EOT
  fi
} | write_config "$ETC/pilot-agent.env"
{
  cat <<EOT
# Mesh config of pilot-agent.service; defaultConfig is the ProxyConfig (Istio's field names and defaults).
defaultConfig:
  binaryPath: /usr/local/bin/envoy
  configPath: $STATE/proxy
  # systemctl stop drains this long (TimeoutStopSec=60 must stay above it).
  terminationDrainDuration: 5s
EOT
  if [ -n "$istiod" ]; then echo "  discoveryAddress: $istiod"; fi
} | if [ -n "$istio_vm" ]; then
  # istioctl's mesh.yaml, with what this host needs inserted under defaultConfig: unless it sets it already.
  cat >/dev/null
  m="$istio_vm/mesh.yaml" extra="  # Added by install-vm.sh (this host's Envoy and its writable config directory):\n"
  grep -q '^  binaryPath:' "$m" || extra="$extra  binaryPath: /usr/local/bin/envoy\n"
  grep -q '^  configPath:' "$m" || extra="$extra  configPath: $STATE/proxy\n"
  grep -q '^  terminationDrainDuration:' "$m" || extra="$extra  terminationDrainDuration: 5s\n"
  force=1 write_config "$ETC/mesh.yaml" < <(awk -v extra="$extra" '{ print } /^defaultConfig:[[:space:]]*$/ && !done { printf "%s", extra; done = 1 }' "$m")
else
  write_config "$ETC/mesh.yaml"
fi

if systemd_running; then
  systemctl daemon-reload
  systemctl enable "$UNIT" >/dev/null 2>&1
  if [ "$start" = 1 ]; then
    if systemctl is-active --quiet "$UNIT"; then
      say "restarting $UNIT (it was running)"; systemctl restart "$UNIT"
    else
      say "starting $UNIT (returns once Envoy is ready)"; systemctl start "$UNIT"
    fi
  fi
else
  systemctl enable "$UNIT" >/dev/null 2>&1 || say "systemd is not running: enable $UNIT once it is"
fi
say "installed: /usr/local/bin/pilot-agent $(/usr/local/bin/pilot-agent version -s), Envoy $(/usr/local/bin/envoy --version | sed -n 's/.*version: \([^/]*\/[^/]*\).*/\1/p'), $UNIT_FILE"
