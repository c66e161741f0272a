#!/usr/bin/env bash
# Installs Debian packages for the scripts that need some on the host (e2e/node/host-packages.sh): as root, retrying once after `apt-get update`, as a fresh machine often has
# no package lists yet. The caller decides what is missing; its environment reaches apt-get.
#
# Usage: apt-install.sh TAG PACKAGE...   (TAG names the caller in the log: [TAG] ...)
set -euo pipefail

tag=$1
shift
log() { printf '[%s] %s\n' "$tag" "$*" >&2; }

if [[ "$(id -u)" != 0 ]]; then
  log "error: these Debian packages are needed: $*"
  log "run as root: apt-get install -y --no-install-recommends $*"
  exit 1
fi
command -v apt-get >/dev/null || { log "error: no apt-get here; install $* by hand"; exit 1; }

install() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >&2
}
started=$SECONDS
log "installing $*"
if ! install "$@"; then
  log "install failed; running apt-get update and trying again"
  apt-get update -q >&2 || { log "error: apt-get update failed"; exit 1; }
  install "$@" || { log "error: cannot install $* (see apt-get's output above)"; exit 1; }
fi
log "installed in $((SECONDS - started)) s"
