#!/usr/bin/env bash
# `just dist BASE_URL`: the release artifacts of this checkout's version (the workspace's, in
# Cargo.toml: one version for the binary, the image's labels, the chart and the plugin), written
# afresh into dist/ of cargo's target directory (CARGO_TARGET_DIR when set):
#
#   sidecar-injector-image-VERSION.tar        the operator's OCI image (`just image`), an OCI
#                                             layout in a tar, named IMAGE_NAME:VERSION
#   sidecar-injector-image-VERSION.cdx.json   its SBOM: the Rust crates of the binary it holds
#                                             (CycloneDX 1.5, by cargo-cyclonedx)
#   sidecar-injector-VERSION-linux-amd64.tar.gz   the static binary, with LICENSE and README.md
#   kubectl-sidecar-VERSION-linux-amd64.tar.gz    the same binary as the kubectl plugin
#                                                 (`kubectl sidecar`), with LICENSE
#   sidecar.yaml                              krew's manifest of the plugin: its archive under
#                                             BASE_URL, with its sha256 (checked here: krew
#                                             installs the plugin from the two)
#   sidecar-injector-VERSION.tgz              the chart, packaged by `helm package` (then
#                                             linted and rendered as packaged)
#   SHA256SUMS                                the sha256 of every file above
#
# BASE_URL is where the archives will be downloaded from; `{version}` in it is replaced by the
# version. The binary is the release build's (build/release.sh: static), with
# the revision (build/revision.sh) in its build_info metric and in the image's labels.
# Publishing them: docs/operations.md, "Publishing a release".
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $# != 1 ]]; then
    echo "usage: build/dist.sh BASE_URL (\`{version}\` in it is replaced by the version)" >&2
    exit 2
fi
just=${JUST:-just}
# The image's name in the archive (a registry of none: publishing names it again).
image_name=sidecar-injector.invalid/sidecar-injector
platform=linux-amd64

started=$SECONDS
if ! read -r version source licenses < <("$just" package-metadata); then
    echo "dist: cannot read the package's version, repository and licence (just package-metadata)" >&2
    exit 1
fi
base_url=${1//\{version\}/$version}
target=$("$just" target-dir)
dist=$target/dist
tools=$(bash e2e/control-plane/build.sh helm krew)
helm=$(grep '/helm-v' <<<"$tools")
krew=$(grep '/krew-v' <<<"$tools")
cyclonedx=$("$just" --quiet cargo-cyclonedx)

# One version everywhere: the chart's must be the workspace's (a unit test checks it too:
# crates/cli/tests/render.rs).
chart_yaml=$("$helm" show chart charts/sidecar-injector)
chart_version=$(awk '$1 == "version:" {print $2}' <<<"$chart_yaml")
app_version=$(awk '$1 == "appVersion:" {gsub(/"/, "", $2); print $2}' <<<"$chart_yaml")
if [[ "$chart_version" != "$version" || "$app_version" != "$version" ]]; then
    echo "dist: Chart.yaml has version $chart_version and appVersion $app_version, Cargo.toml" \
        "$version: change them together" >&2
    exit 1
fi

# The binary and the image's label carry the same revision.
SIDECAR_INJECTOR_REVISION=$(bash build/revision.sh)
export SIDECAR_INJECTOR_REVISION
# Archives' file times: the commit's (reproducible archives of one commit), or the epoch.
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || echo 0)
export SOURCE_DATE_EPOCH
echo "--- dist: sidecar-injector $version ($SIDECAR_INJECTOR_REVISION) into $dist" >&2

rm -rf "$dist"
mkdir -p "$dist"
work=$(mktemp -d "$target/.dist.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "--- dist: the image (just image)" >&2
image=sidecar-injector-image-$version.tar
"$just" image "$image_name:$version" "$dist/$image"
binary=$target/x86_64-unknown-linux-gnu/release/sidecar-injector

echo "--- dist: the SBOM (cargo-cyclonedx)" >&2
# cargo-cyclonedx writes a file beside each manifest of the workspace: it runs on a copy of the
# sources (the files git tracks or would), so nothing is written into the checkout.
mkdir -p "$work/src"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$work/src"
"$cyclonedx" cyclonedx --manifest-path "$work/src/crates/cli/Cargo.toml" --quiet \
    --format json --spec-version 1.5 --target x86_64-unknown-linux-gnu --no-build-deps \
    --describe binaries
mv "$work/src/crates/cli/sidecar-injector_bin.cdx.json" "$dist/sidecar-injector-image-$version.cdx.json"

echo "--- dist: the binary archives" >&2
# pack ARCHIVE FILE...: a reproducible .tar.gz of the files in $work/pack.
pack() {
    local archive=$1
    shift
    tar -C "$work/pack" --sort=name --owner=0 --group=0 --numeric-owner \
        --mtime="@$SOURCE_DATE_EPOCH" -cf - "$@" | gzip -9n >"$dist/$archive"
}
mkdir -p "$work/pack"
install -m 0755 "$binary" "$work/pack/sidecar-injector"
install -m 0755 "$binary" "$work/pack/kubectl-sidecar"
install -m 0644 LICENSE README.md "$work/pack/"
binary_archive=sidecar-injector-$version-$platform.tar.gz
plugin_archive=kubectl-sidecar-$version-$platform.tar.gz
pack "$binary_archive" sidecar-injector LICENSE README.md
pack "$plugin_archive" kubectl-sidecar LICENSE

echo "--- dist: the krew manifest" >&2
plugin_sha256=$(sha256sum "$dist/$plugin_archive" | cut -d' ' -f1)
cat >"$dist/sidecar.yaml" <<EOF
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: sidecar
spec:
  version: v$version
  homepage: $source
  shortDescription: Status, live explanations and plumbing checks of sidecar-injector
  description: |
    The kubectl plugin of sidecar-injector, the operator that injects sidecars into
    Pods from cluster-scoped SidecarTemplate resources. \`kubectl sidecar status\`
    shows where each template's running Pods stand (current, stale, missing) and
    the workloads behind the stale and missing ones; \`kubectl sidecar explain\`
    replays the injection decision for a live Pod or workload; \`kubectl sidecar
    check\` checks the live plumbing (operator, leader, webhook configuration,
    caBundle, endpoints, NetworkPolicy, policy backend) link by link and says which
    one is broken. It writes nothing.
  caveats: |
    It reads SidecarTemplates, which are cluster-scoped: the operator's chart
    aggregates reading them into the view, edit and admin ClusterRoles held
    cluster-wide, and binds more subjects with its viewerRbac.subjects value.
  platforms:
    - selector:
        matchLabels:
          os: linux
          arch: amd64
      uri: $base_url/$plugin_archive
      sha256: $plugin_sha256
      bin: kubectl-sidecar
      files:
        - from: kubectl-sidecar
          to: .
        - from: LICENSE
          to: .
EOF

echo "--- dist: the manifest checked by krew, which installs the plugin from its archive" >&2
# krew checks the manifest and the archive's sha256, and installs it as a user's krew would.
if ! KREW_ROOT="$work/krew" "$krew" install --manifest="$dist/sidecar.yaml" \
    --archive="$dist/$plugin_archive" </dev/null >"$work/krew.log" 2>&1; then
    cat "$work/krew.log" >&2
    exit 1
fi
installed=$("$work/krew/bin/kubectl-sidecar" --version)
if [[ "$installed" != "kubectl-sidecar $version" ]]; then
    echo "dist: the plugin krew installed says '$installed', not 'kubectl-sidecar $version'" >&2
    exit 1
fi

echo "--- dist: the chart (helm package), linted and rendered as packaged" >&2
chart=sidecar-injector-$version.tgz
"$helm" package charts/sidecar-injector --destination "$dist" >/dev/null
"$helm" lint --strict "$dist/$chart" >/dev/null
"$helm" template sidecar-injector "$dist/$chart" --namespace sidecar-injector \
    --set image.repository="$image_name" >/dev/null

(cd "$dist" && sha256sum -- "$image" "sidecar-injector-image-$version.cdx.json" "$binary_archive" \
    "$plugin_archive" sidecar.yaml "$chart" >SHA256SUMS)
echo "--- dist: done in $((SECONDS - started)) s, licence $licenses:" >&2
ls -l "$dist" >&2
