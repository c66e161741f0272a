#!/usr/bin/env bash
# Installs, from Debian packages, the llvm-profdata the profile-guided release build
# (build/release.sh) merges its profile with: that of the LLVM rustc was built with
# (llvm-<major>), unless one is there already (build/llvm-profdata.sh finds it, rustup's
# llvm-tools too). Nothing is installed when it is already there, or when the build is asked to
# go without a profile (SIDECAR_INJECTOR_PGO=0).
#
# Usage: packages.sh         install it when missing (build/apt-install.sh: needs root and
#                            apt-get; not through sudo when rustc is on your own PATH only)
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
bash "$(dirname "$0")/apt-install.sh" build-packages "$package" || {
  log "or, without root: rustup component add llvm-tools; or build without a profile: SIDECAR_INJECTOR_PGO=0"
  exit 1
}
