#!/usr/bin/env bash
# Installs, from Debian packages, the llvm-profdata the profile-guided release build
# (build/release.sh) merges its profile with: that of the LLVM rustc was built with
# (llvm-<major>), unless one is there already (build/llvm-profdata.sh finds it, rustup's
# llvm-tools too). Nothing is installed when it is already there, or when the build is asked to
# go without a profile (SIDECAR_INJECTOR_PGO=0).
#
# Usage: packages.sh         install it when missing (needs root and apt-get; not through sudo
#                            when rustc is on your own PATH only: run its apt-get instead)
#        packages.sh --check exit 1 when it is missing, instead of installing
set -euo pipefail

log() { printf '[build-packages] %s\n' "$*" >&2; }

if [[ "${SIDECAR_INJECTOR_PGO:-1}" == 0 ]]; then
  exit 0
fi
if bash "$(dirname "$0")/llvm-profdata.sh" >/dev/null; then
  exit 0
fi
llvm_major=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
package="llvm-$llvm_major"
if [[ "${1:-}" == "--check" ]]; then
  log "missing: llvm-profdata for LLVM $llvm_major (as root: apt-get install $package; or: rustup component add llvm-tools)"
  exit 1
fi
if [[ "$(id -u)" != 0 ]]; then
  log "error: the release build needs the llvm-profdata of LLVM $llvm_major (rustc's)"
  log "run as root: apt-get install -y --no-install-recommends $package"
  log "or, without root: rustup component add llvm-tools; or build without a profile: SIDECAR_INJECTOR_PGO=0"
  exit 1
fi
command -v apt-get >/dev/null || { log "error: no apt-get here; install $package by hand"; exit 1; }

install() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$package" >&2
}
started=$SECONDS
log "installing $package"
if ! install; then
  # A fresh machine often has no package lists yet.
  log "install failed; running apt-get update and trying again"
  apt-get update -q >&2 || { log "error: apt-get update failed"; exit 1; }
  install || { log "error: cannot install $package (see apt-get's output above); rustup component add llvm-tools serves too"; exit 1; }
fi
log "installed in $((SECONDS - started)) s"
