#!/usr/bin/env bash
# Builds the local control plane's binaries from their published Go modules at
# the versions pinned in versions.env, and caches them outside the repository:
#
#   ${SIDECAR_INJECTOR_CACHE:-$HOME/.cache/sidecar-injector}/bin/<name>-<version>
#
# for etcd, kube-apiserver, kube-controller-manager, kubectl, helm, kubeconform, krew,
# and the node's kubelet, kube-scheduler and kube-proxy; and helm-docs (which writes
# the chart's README), prometheus and promtool (the e2e suite's monitoring test), built
# only when named.
# A binary already in the cache is not rebuilt, so a second run is instant.
# Go's module and build caches also live under the cache directory (unless
# GOMODCACHE / GOCACHE are already set), so CI on the same machine reuses them.
#
# Usage:
#   build.sh [NAME...]   build the named binaries (default: all) and print the
#                        path of each, one per line, on stdout (progress goes
#                        to stderr)
#   build.sh --regen     regenerate the wrapper modules kubernetes/ and etcd/
#                        (go.mod + go.sum) from the versions in versions.env;
#                        commit the result
#
# SIDECAR_INJECTOR_KUBE_VERSION (one of KUBE_VERSIONS in versions.env; default
# KUBE_VERSION) picks the Kubernetes version of the Kubernetes binaries. A version
# other than KUBE_VERSION builds from its own wrapper module kubernetes-<version>/
# (--regen with the variable set writes it), and its binaries are cached side by
# side with the default's: <name>-<version>.
#
# Kubernetes and etcd cannot be built with a plain `go install cmd@version`:
# their go.mod files point their own sibling modules at local directories with
# replace lines, which are ignored when the module is a dependency. The wrapper
# modules here repeat those replaces with published versions. --regen reads
# the list from the pinned version's go.mod, so it is never typed by hand.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$here/versions.env"

: "${KUBE_VERSION:?} ${KUBE_VERSIONS:?} ${ETCD_VERSION:?} ${HELM_VERSION:?} ${KUBECONFORM_VERSION:?} ${KREW_VERSION:?}"
: "${HELM_DOCS_VERSION:?} ${PROMETHEUS_VERSION:?}"

log() { printf '[control-plane] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The Kubernetes version to build, and its wrapper module (kubernetes/ for the default).
kube_wrapper=kubernetes
if [[ -n "${SIDECAR_INJECTOR_KUBE_VERSION:-}" && "$SIDECAR_INJECTOR_KUBE_VERSION" != "$KUBE_VERSION" ]]; then
  [[ " $KUBE_VERSIONS " == *" $SIDECAR_INJECTOR_KUBE_VERSION "* ]] \
    || die "SIDECAR_INJECTOR_KUBE_VERSION=$SIDECAR_INJECTOR_KUBE_VERSION is not one of KUBE_VERSIONS ($KUBE_VERSIONS) in versions.env"
  KUBE_VERSION="$SIDECAR_INJECTOR_KUBE_VERSION"
  kube_wrapper="kubernetes-$KUBE_VERSION"
fi

cache="${SIDECAR_INJECTOR_CACHE:-$HOME/.cache/sidecar-injector}"
bindir="$cache/bin"
export GOMODCACHE="${GOMODCACHE:-$cache/gomod}"
export GOCACHE="${GOCACHE:-$cache/gocache}"
export CGO_ENABLED=0

command -v go >/dev/null || die "go is not on PATH"

# v1.34.4 -> major 1, minor 34, staging modules v0.34.4
if [[ ! "$KUBE_VERSION" =~ ^v([0-9]+)\.([0-9]+)\.([0-9]+)$ ]]; then
  die "KUBE_VERSION must look like v1.34.4, got $KUBE_VERSION"
fi
kube_major="${BASH_REMATCH[1]}"
kube_minor="${BASH_REMATCH[2]}"
kube_staging_version="v0.${kube_minor}.${BASH_REMATCH[3]}"

# Flags shared by every build: static, reproducible paths, stripped, and a
# writable module cache so that `rm -rf "$cache"` works.
go_build_flags=(-trimpath -modcacherw)

# ---------------------------------------------------------------------------
# --regen: the wrapper modules
# ---------------------------------------------------------------------------

# Prints the path of the go.mod file of module $1 at version $2 (downloading
# the module into GOMODCACHE).
module_gomod() {
  local json gomod
  json="$(cd / && go mod download -json "$1@$2")" || die "cannot download $1@$2"
  gomod="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")"
  [[ -f "$gomod" ]] || die "no go.mod for $1@$2 in: $json"
  printf '%s\n' "$gomod"
}

# Prints the left-hand module paths of the replace lines of go.mod $1 whose
# target starts with $2 (a local path such as ./staging/ or ../). Handles both
# the block form and single `replace a => b` lines.
local_replaces() {
  local prefix="${2//./\\.}"
  sed -nE "s#^[[:space:]]*(replace[[:space:]]+)?([^[:space:]]+)([[:space:]]+v[^[:space:]]+)?[[:space:]]+=>[[:space:]]+${prefix}.*#\\2#p" "$1" | sort -u
}

# Writes go.mod for wrapper module $1 (a directory under $here): module path,
# the go and godebug lines copied from the upstream go.mod $2, one require
# (module $3 at version $4), and `replace M => M $6` for each module in $5
# (newline separated). Then `go mod tidy` records go.sum.
write_wrapper() {
  local dir="$here/$1" upstream="$2" mod="$3" ver="$4" replaces="$5" rver="$6"
  local go_line godebug_lines m
  go_line="$(awk '$1 == "go" { print; exit }' "$upstream")"
  godebug_lines="$(grep -E '^godebug[[:space:]]' "$upstream" || true)"
  [[ -n "$go_line" ]] || die "no go directive in $upstream"
  [[ -n "$replaces" ]] || die "no local replace lines found in $upstream"
  {
    printf '// Code generated by build.sh --regen from the go.mod of %s %s. DO NOT EDIT.\n' "$mod" "$ver"
    # shellcheck disable=SC2016 # backquotes are meant literally
    printf '// Edit versions.env and run `bash e2e/control-plane/build.sh --regen` instead.\n\n'
    printf 'module sidecar-injector/e2e/control-plane/%s\n\n' "$1"
    printf '%s\n\n' "$go_line"
    if [[ -n "$godebug_lines" ]]; then printf '%s\n\n' "$godebug_lines"; fi
    printf 'require %s %s\n\n' "$mod" "$ver"
    printf '// Every module that %s %s replaces with a local directory,\n' "$mod" "$ver"
    printf '// pinned to its published version instead.\n'
    printf 'replace (\n'
    while IFS= read -r m; do
      printf '\t%s => %s %s\n' "$m" "$m" "$rver"
    done <<<"$replaces"
    printf ')\n'
  } >"$dir/go.mod"
  rm -f "$dir/go.sum"
  log "go mod tidy in $1/ ($(wc -l <<<"$replaces") replaced modules)"
  (cd "$dir" && GOFLAGS='' go mod tidy)
}

regen() {
  local gomod
  gomod="$(module_gomod k8s.io/kubernetes "$KUBE_VERSION")"
  if [[ "$kube_wrapper" != kubernetes ]]; then
    # Another version: its own wrapper, with the same tools.go; etcd stays as it is.
    mkdir -p "$here/$kube_wrapper"
    cp "$here/kubernetes/tools.go" "$here/$kube_wrapper/tools.go"
    write_wrapper "$kube_wrapper" "$gomod" k8s.io/kubernetes "$KUBE_VERSION" \
      "$(local_replaces "$gomod" ./staging/)" "$kube_staging_version"
    log "regenerated the $kube_wrapper/ wrapper module; commit go.mod and go.sum"
    return
  fi
  write_wrapper kubernetes "$gomod" k8s.io/kubernetes "$KUBE_VERSION" \
    "$(local_replaces "$gomod" ./staging/)" "$kube_staging_version"

  gomod="$(module_gomod go.etcd.io/etcd/server/v3 "$ETCD_VERSION")"
  write_wrapper etcd "$gomod" go.etcd.io/etcd/server/v3 "$ETCD_VERSION" \
    "$(local_replaces "$gomod" ../)" "$ETCD_VERSION"
  log "regenerated kubernetes/ and etcd/ wrapper modules; commit go.mod and go.sum"
}

# The wrapper must have been generated for the pinned version.
check_wrapper() {
  local dir="$here/$1" mod="$2" ver="$3"
  grep -Eq "^[[:space:]]*(require[[:space:]]+)?${mod//./\\.}[[:space:]]+${ver//./\\.}([[:space:]]|$)" "$dir/go.mod" \
    || die "$1/go.mod does not require $mod $ver (versions.env changed?): run build.sh --regen"
  [[ -f "$dir/go.sum" ]] || die "$1/go.sum is missing: run build.sh --regen"
}

# ---------------------------------------------------------------------------
# builds
# ---------------------------------------------------------------------------

kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X ${pkg}.gitVersion=${KUBE_VERSION}"
  kube_ldflags+=" -X ${pkg}.gitMajor=${kube_major}"
  kube_ldflags+=" -X ${pkg}.gitMinor=${kube_minor}"
  kube_ldflags+=" -X ${pkg}.gitTreeState=clean"
done
# The build tags of Kubernetes' own release builds (hack/lib/golang.sh).
kube_tags="selinux,notest,grpcnotrace"

build_kube() { # name out
  check_wrapper "$kube_wrapper" k8s.io/kubernetes "$KUBE_VERSION"
  (cd "$here/$kube_wrapper" && go build -mod=readonly "${go_build_flags[@]}" \
    -tags "$kube_tags" -ldflags "$kube_ldflags" -o "$2" "k8s.io/kubernetes/cmd/$1")
}

build_etcd() { # name out
  check_wrapper etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
  (cd "$here/etcd" && go build -mod=readonly "${go_build_flags[@]}" \
    -ldflags "-s -w" -o "$2" go.etcd.io/etcd/server/v3)
}

# go install module/cmd@version into a private GOBIN, then move the result.
go_install() { # out package version ldflags [tags]
  local gobin
  gobin="$(mktemp -d "$bindir/.gobin.XXXXXX")"
  (cd / && GOBIN="$gobin" go install "${go_build_flags[@]}" -tags "${5:-}" -ldflags "$4" "$2@$3") \
    || { rm -rf "$gobin"; return 1; }
  mv -f "$gobin/$(basename "$2")" "$1"
  rm -rf "$gobin"
}

build_helm() { # name out
  # Like helm's Makefile: stamp the version, and the Kubernetes version that
  # `helm template` / `helm lint` assume, from the client-go helm requires.
  local gomod cg k8s_major k8s_minor ld
  gomod="$(module_gomod helm.sh/helm/v3 "$HELM_VERSION")"
  cg="$(awk '$1 == "k8s.io/client-go" { print $2; exit }' "$gomod")"
  [[ "$cg" =~ ^v0\.([0-9]+)\. ]] || die "cannot find helm's k8s.io/client-go version in $gomod"
  k8s_major=1 k8s_minor="${BASH_REMATCH[1]}"
  ld="-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
  ld+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  ld+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=${k8s_major}"
  ld+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=${k8s_minor}"
  ld+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=${k8s_major}"
  ld+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=${k8s_minor}"
  go_install "$2" helm.sh/helm/v3/cmd/helm "$HELM_VERSION" "$ld"
}

build_kubeconform() { # name out
  go_install "$2" github.com/yannh/kubeconform/cmd/kubeconform "$KUBECONFORM_VERSION" \
    "-s -w -X main.version=${KUBECONFORM_VERSION}"
}

build_krew() { # name out
  go_install "$2" sigs.k8s.io/krew/cmd/krew "$KREW_VERSION" \
    "-s -w -X sigs.k8s.io/krew/internal/version.gitTag=${KREW_VERSION}"
}

# helm-docs writes the chart's README from values.yaml (`just chart-docs`); not part of the
# control plane, so not built by default (see all_names), only when named.
build_helm_docs() { # name out
  go_install "$2" github.com/norwoodj/helm-docs/cmd/helm-docs "$HELM_DOCS_VERSION" \
    "-s -w -X main.version=${HELM_DOCS_VERSION#v}"
}

# Prometheus and promtool, for the monitoring test only, so built only when named. Without
# Prometheus's tag builtinassets (the web UI's compiled assets, which the module does not ship:
# its release build makes them with npm), and with remove_all_sd (Prometheus's own tag): the
# test scrapes static targets, so every cloud's service discovery, and its SDK, is left out of
# the build. The version stamped
# is Prometheus's own (v0.316.0 -> 3.16.0), as its release build stamps it.
build_prometheus() { # name out
  local ver ld
  [[ "$PROMETHEUS_VERSION" =~ ^v0\.([0-9])([0-9]{2})\.([0-9]+)$ ]] \
    || die "PROMETHEUS_VERSION must look like v0.316.0, got $PROMETHEUS_VERSION"
  ver="${BASH_REMATCH[1]}.$((10#${BASH_REMATCH[2]})).${BASH_REMATCH[3]}"
  ld="-s -w -X github.com/prometheus/common/version.Version=${ver}"
  go_install "$2" "github.com/prometheus/prometheus/cmd/$1" "$PROMETHEUS_VERSION" "$ld" remove_all_sd
}

version_of() {
  case "$1" in
    etcd) echo "$ETCD_VERSION" ;;
    kube-apiserver | kube-controller-manager | kubectl | kubelet | kube-scheduler | kube-proxy) echo "$KUBE_VERSION" ;;
    helm) echo "$HELM_VERSION" ;;
    kubeconform) echo "$KUBECONFORM_VERSION" ;;
    krew) echo "$KREW_VERSION" ;;
    helm-docs) echo "$HELM_DOCS_VERSION" ;;
    prometheus | promtool) echo "$PROMETHEUS_VERSION" ;;
    *) die "unknown binary '$1' (known: ${all_names[*]} helm-docs prometheus promtool)" ;;
  esac
}

builder_of() {
  case "$1" in
    etcd) echo build_etcd ;;
    kube-apiserver | kube-controller-manager | kubectl | kubelet | kube-scheduler | kube-proxy) echo build_kube ;;
    helm) echo build_helm ;;
    kubeconform) echo build_kubeconform ;;
    krew) echo build_krew ;;
    helm-docs) echo build_helm_docs ;;
    prometheus | promtool) echo build_prometheus ;;
  esac
}

all_names=(etcd kube-apiserver kube-controller-manager kubectl kubelet kube-scheduler kube-proxy helm kubeconform krew)

tmp_out=""
cleanup() { if [[ -n "$tmp_out" ]]; then rm -f "$tmp_out"; fi; }
trap cleanup EXIT

build() { # name
  local name="$1" version out start
  version="$(version_of "$name")"
  out="$bindir/$name-$version"
  if [[ -x "$out" ]]; then
    log "cached   $name $version"
    return
  fi
  log "building $name $version (GOMODCACHE=$GOMODCACHE GOCACHE=$GOCACHE)"
  start=$SECONDS
  # Build to a temporary name and rename, so an interrupted build never
  # leaves a binary that a later run would take as cached.
  tmp_out="$(mktemp "$bindir/.$name.XXXXXX")"
  "$(builder_of "$name")" "$name" "$tmp_out"
  chmod 0755 "$tmp_out"
  mv -f "$tmp_out" "$out"
  tmp_out=""
  log "built    $name $version in $((SECONDS - start))s"
}

main() {
  if [[ "${1:-}" == "--regen" ]]; then
    [[ $# -eq 1 ]] || die "--regen takes no other argument"
    regen
    return
  fi
  local names=("$@") name
  if [[ ${#names[@]} -eq 0 ]]; then names=("${all_names[@]}"); fi
  for name in "${names[@]}"; do version_of "$name" >/dev/null; done
  mkdir -p "$bindir"
  for name in "${names[@]}"; do build "$name"; done
  for name in "${names[@]}"; do
    printf '%s\n' "$bindir/$name-$(version_of "$name")"
  done
}

main "$@"
