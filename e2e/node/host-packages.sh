#!/usr/bin/env bash
# Installs, from Debian packages, what the e2e node runs on the host: containerd (with ctr),
# runc, the CNI plugins, iptables (and nft, to remove the empty tables iptables-nft leaves),
# and busybox-static (the stand-in images are made of it).
# Nothing is installed when everything is already there, so a second run is instant.
#
# Usage: host-packages.sh         install what is missing (needs root and apt-get)
#        host-packages.sh --check exit 1, listing what is missing, instead of installing
set -euo pipefail

log() { printf '[node-packages] %s\n' "$*" >&2; }

# package, then the file it must provide; the CNI plugins are not on PATH.
wanted=(
  "containerd /usr/bin/containerd"
  "containerd /usr/bin/ctr"
  "runc /usr/sbin/runc"
  "containernetworking-plugins /usr/lib/cni/bridge"
  "containernetworking-plugins /usr/lib/cni/host-local"
  "containernetworking-plugins /usr/lib/cni/portmap"
  "containernetworking-plugins /usr/lib/cni/loopback"
  "iptables /usr/sbin/iptables"
  "nftables /usr/sbin/nft"
  "busybox-static /bin/busybox"
)

missing=()
for entry in "${wanted[@]}"; do
  read -r package file <<<"$entry"
  if [[ ! -x "$file" && ! " ${missing[*]} " =~ " $package " ]]; then missing+=("$package"); fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
if [[ "${1:-}" == "--check" ]]; then
  log "missing: ${missing[*]} (run: sudo bash e2e/node/host-packages.sh)"
  exit 1
fi
# The packages' maintainer scripts must not start a system containerd: the harness runs its own.
RUNLEVEL=1 bash "$(dirname "$0")/../../build/apt-install.sh" node-packages "${missing[@]}" \
  || { log "(or: sudo bash e2e/node/host-packages.sh)"; exit 1; }
