# Every task a person runs on sidecar-injector. `just --list` shows them.

set shell := ["bash", "-euo", "pipefail", "-c"]

crd_file := "crds/sidecartemplates.sidecar.dev.yaml"
# The chart's copy, which its templates/crd.yaml renders (so that `helm upgrade` upgrades it)
chart_crd_file := "charts/sidecar-injector/files/sidecartemplates.sidecar.dev.yaml"
cargo_deny_version := "0.20.2"
# The SBOM generator of `just dist`, by the CycloneDX project
cargo_cyclonedx_version := "0.5.9"

# List the recipes
default:
    @just --list

# Build every crate (debug)
build:
    cargo build --workspace --all-targets

# Format check, clippy, the CRD drift check, the dependency policy, every test, the fuzz target's build, then the end-to-end suite and the chart tests against a local control plane
test: fmt-check lint check-generated deny test-unit fuzz-check e2e

# The fast inner loop: format check, clippy, then the unit, property and snapshot tests with no control plane (the end-to-end and chart tests report skipped)
check: fmt-check lint
    SIDECAR_INJECTOR_E2E=0 cargo test --workspace --all-targets

# Run every test of the workspace
test-unit:
    cargo test --workspace --all-targets
    cargo test --workspace --doc

# Clippy on everything, warnings are errors
lint:
    cargo clippy --workspace --all-targets -- -D warnings

# Check formatting
fmt-check:
    cargo fmt --all -- --check

# Format the code
fmt:
    cargo fmt --all

# Regenerate crds/ (and the chart's copy, which its templates/crd.yaml renders) from the Rust types, and the chart's README from its values.yaml
generate:
    cargo run --quiet -p injector-cli -- crd > {{crd_file}}
    cp {{crd_file}} {{chart_crd_file}}
    bash build/chart-docs.sh

# Write charts/sidecar-injector/README.md from its README.md.gotmpl and the `# --` comments of values.yaml, with helm-docs (built from its Go module into the cache when missing, about 30 s once)
chart-docs:
    bash build/chart-docs.sh

# Fail when crds/ (or the chart's copy) differs from what the Rust types generate, or the chart's README from what its values.yaml gives
check-generated:
    #!/usr/bin/env bash
    set -euo pipefail
    generated=$(mktemp)
    trap 'rm -f "$generated"' EXIT
    cargo run --quiet -p injector-cli -- crd > "$generated"
    if ! diff -u {{crd_file}} "$generated"; then
        echo "crds/ has drifted from the Rust types: run 'just generate' and commit" >&2
        exit 1
    fi
    if ! cmp {{crd_file}} {{chart_crd_file}}; then
        echo "{{chart_crd_file}} differs from crds/: run 'just generate' and commit" >&2
        exit 1
    fi
    bash build/chart-docs.sh --check

# Dependency policy of deny.toml (cargo-deny), for the workspace and the fuzz harness: licences, bans and sources always; advisories only when a RustSec advisory database is on disk (this network cannot fetch it: see docs/development.md)
deny:
    #!/usr/bin/env bash
    set -euo pipefail
    deny=$({{just_executable()}} --quiet cargo-deny)
    db_root="${CARGO_HOME:-$HOME/.cargo}/advisory-dbs"
    checks=(licenses bans sources)
    if compgen -G "$db_root/advisory-db-*/crates" >/dev/null; then
        checks+=(advisories)
    fi
    # Everything cargo-deny reads (crate sources for the licences) is fetched by cargo; cargo-deny
    # itself runs offline, so it never tries to fetch the advisory database.
    cargo fetch --quiet --locked
    cargo fetch --quiet --locked --manifest-path crates/core/fuzz/Cargo.toml
    # The allow-list is the workspace's, so the fuzz harness's smaller graph leaves some unused.
    "$deny" --offline --locked check --hide-inclusion-graph -A license-exception-not-encountered "${checks[@]}"
    "$deny" --offline --locked --manifest-path crates/core/fuzz/Cargo.toml --config deny.toml \
        check --hide-inclusion-graph -A license-not-encountered "${checks[@]}"
    if [[ " ${checks[*]} " != *" advisories "* ]]; then
        echo "deny: advisories NOT checked: no RustSec advisory database in $db_root ('cargo deny fetch db' where GitHub is reachable puts it there)" >&2
    fi

# Print the path of cargo-deny (cargo_deny_version), building it from crates.io into the cache when missing (once: about 220 s of CPU, 10 minutes on 2 shared cores)
cargo-deny: (cargo-tool "cargo-deny" cargo_deny_version)

# Print the path of cargo-cyclonedx (cargo_cyclonedx_version), the SBOM generator of `just dist`, building it from the crate registry into the cache when missing (once: about 180 s of CPU, 2.5 minutes on 2 shared cores)
cargo-cyclonedx: (cargo-tool "cargo-cyclonedx" cargo_cyclonedx_version)

# Print the path of the cargo tool CRATE at VERSION, built with `cargo install --locked` into the cache (outside the repository) when missing
[private]
cargo-tool crate version:
    #!/usr/bin/env bash
    set -euo pipefail
    cache="${SIDECAR_INJECTOR_CACHE:-$HOME/.cache/sidecar-injector}"
    bin="$cache/bin/{{crate}}-{{version}}"
    if [[ ! -x "$bin" ]]; then
        echo "building {{crate}} {{version}} from the crate registry into $bin (once)" >&2
        mkdir -p "$cache/bin"
        root=$(mktemp -d "$cache/bin/.{{crate}}.XXXXXX")
        trap 'rm -rf "$root"' EXIT
        cargo install --quiet --locked {{crate}} --version {{version}} --root "$root"
        mv -f "$root/bin/{{crate}}" "$bin"
    fi
    echo "$bin"

# Criterion benchmarks of the engine (figures go in BENCHMARKS.md)
bench:
    cargo bench -p injector-core --bench plan

# Build the fuzz target on the stable toolchain (running it needs cargo-fuzz; see docs/development.md)
fuzz-check:
    cargo check --quiet --manifest-path crates/core/fuzz/Cargo.toml

# Fuzz compile + plan for SECONDS seconds (installs cargo-fuzz when missing)
fuzz seconds="60":
    command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
    mkdir -p crates/core/fuzz/corpus/plan
    cd crates/core && RUSTC_BOOTSTRAP=1 cargo fuzz run plan fuzz/corpus/plan fuzz/seeds/plan -- -max_total_time={{seconds}}

# Dry-run TEMPLATE against POD offline, explaining each decision
render template pod *args:
    cargo run --quiet -p injector-cli -- render --template {{template}} --pod {{pod}} --explain {{args}}

# Install the kubectl plugin: the binary (debug build) copied as DIR/kubectl-sidecar, which kubectl runs as `kubectl sidecar` when DIR is on PATH, and linked as DIR/kubectl_complete-sidecar, which kubectl 1.26+ runs to complete `kubectl sidecar <TAB>`
install-plugin dir=(env_var('HOME') / ".local/bin"):
    #!/usr/bin/env bash
    set -euo pipefail
    cargo build --quiet -p injector-cli --bin sidecar-injector
    target=$({{just_executable()}} target-dir)
    mkdir -p "{{dir}}"
    install -m 0755 "$target/debug/sidecar-injector" "{{dir}}/kubectl-sidecar"
    ln -sfn kubectl-sidecar "{{dir}}/kubectl_complete-sidecar"
    echo "installed {{dir}}/kubectl-sidecar: try 'kubectl sidecar status' ('kubectl plugin list' finds it when {{dir}} is on PATH)"
    echo "and {{dir}}/kubectl_complete-sidecar, for 'kubectl sidecar <TAB>' once kubectl's own completion is loaded"

# Print cargo's target directory, wherever CARGO_TARGET_DIR (or a cargo config) puts it
[private]
target-dir:
    @cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])'

# Cluster demo on a real node: a local control plane, a node and the operator, examples/nginx-sidecar's Deployment 2/2 Ready and its sidecar answering, and an unselected namespace; left running (stop it with `just down`; needs root)
demo: node-packages
    cargo run --quiet -p injector-e2e --bin demo

# Load benchmark of the webhook (the release binary of `just release`): serve + oha over TLS, fixed rates and saturation, alternating with a transport-only server built the same way (the ratio is the target; figures go in BENCHMARKS.md)
bench-webhook:
    bench/webhook-load.sh

# The size of every admission object the operator writes for N templates in G groups (default 200 64 and 500 64; figures go in BENCHMARKS.md)
bench-admission-sizes *args:
    cargo run --release --quiet -p injector-controller --example admission_sizes -- {{args}}

# Instructions per admission of the whole webhook server under callgrind (user space; steady where load-test times on a shared VM are not; BIN=... to compare a build)
bench-webhook-instructions:
    bench/webhook-callgrind.sh

# End-to-end figures against a local control plane: template apply to first injection, Pod CREATE latency by backend and where it goes (SIDECAR_INJECTOR_BENCH_PATHS=... for some paths, SIDECAR_INJECTOR_BENCH_ROUNDS=N for more rounds than 3), operator start to ready, the census (figures go in BENCHMARKS.md)
bench-e2e: release
    SIDECAR_INJECTOR_BIN="$PWD/target/x86_64-unknown-linux-gnu/release/sidecar-injector" cargo run --release --quiet -p injector-e2e --bin bench-e2e

# The operator at 500 templates in 64 groups on v1.37.2, under each backend (webhook, auto, policy): start to settled statuses, an edit to landing, Pod CREATE latency, admission objects' sizes (figures go in BENCHMARKS.md). SIDECAR_INJECTOR_BIN=... uses a release binary already built instead of `just release`
bench-scale:
    #!/usr/bin/env bash
    set -euo pipefail
    if [ -z "${SIDECAR_INJECTOR_BIN:-}" ]; then
        just release
        export SIDECAR_INJECTOR_BIN="$PWD/target/x86_64-unknown-linux-gnu/release/sidecar-injector"
    fi
    SIDECAR_INJECTOR_KUBE_VERSION="${SIDECAR_INJECTOR_KUBE_VERSION:-v1.37.2}" cargo run --release --quiet -p injector-e2e --bin bench-scale


# Mass creation on v1.37.2: a Deployment scaled from 0 to 1,000 replicas with no injection, then under the webhook, auto and policy backends with 3 and 50 templates, then with 3 and the leader of two replicas killed half-way: time to every Pod stored, admission p50/p99 from the API server's histogram, failed creations, rejections, Pods missing a template (figures go in BENCHMARKS.md). SIDECAR_INJECTOR_BIN=... uses a release binary already built
bench-mass:
    #!/usr/bin/env bash
    set -euo pipefail
    if [ -z "${SIDECAR_INJECTOR_BIN:-}" ]; then
        just release
        export SIDECAR_INJECTOR_BIN="$PWD/target/x86_64-unknown-linux-gnu/release/sidecar-injector"
    fi
    SIDECAR_INJECTOR_KUBE_VERSION="${SIDECAR_INJECTOR_KUBE_VERSION:-v1.37.2}" cargo run --release --quiet -p injector-e2e --bin bench-mass

# End-to-end scenarios and chart tests against a local control plane, and the scenarios that need running Pods on a local node with the chart installed from `just dist`'s packaged chart and image (the first build of the binaries takes ~7 minutes, of the release image a few more); SIDECAR_INJECTOR_E2E_SLOW=0 skips the 3-minute rotation scenario
e2e: node-packages dist
    SIDECAR_INJECTOR_E2E=1 SIDECAR_INJECTOR_E2E_SLOW=${SIDECAR_INJECTOR_E2E_SLOW:-1} cargo test -p injector-e2e --tests -- --nocapture
    {{just_executable()}} e2e-next

# The scenarios, the chart test, the policy backend differential test, the policy-only test and the one-verdict test again on every other Kubernetes version of e2e/control-plane/versions.env (KUBE_VERSIONS; the node and the 3-minute rotation run on the default version only)
e2e-next:
    #!/usr/bin/env bash
    set -euo pipefail
    source e2e/control-plane/versions.env
    for version in $KUBE_VERSIONS; do
        if [[ "$version" == "$KUBE_VERSION" ]]; then continue; fi
        echo "[e2e] ===== the scenarios and the chart test on Kubernetes $version" >&2
        SIDECAR_INJECTOR_E2E=1 SIDECAR_INJECTOR_E2E_SLOW=0 SIDECAR_INJECTOR_KUBE_VERSION="$version" \
            cargo test -p injector-e2e --test scenarios --test chart --test policy --test policy_only --test one_verdict -- --nocapture
    done

# Install the node's host packages (containerd, runc, CNI plugins, iptables, busybox-static) from Debian when missing (needs root)
node-packages:
    bash e2e/node/host-packages.sh

# Build (or find in the cache) the local control plane's binaries and print their paths
control-plane:
    bash e2e/control-plane/build.sh

# Offline demo: render every example workload with its template and show the containers each pod gets
demo-offline:
    #!/usr/bin/env bash
    set -euo pipefail
    cargo build --quiet -p injector-cli
    target=$({{just_executable()}} target-dir)
    for dir in examples/*/; do
        name=$(basename "$dir")
        echo "== $name: $(head -n 1 "$dir/sidecartemplate.yaml" | sed 's/^# //')"
        "$target/debug/sidecar-injector" render --template "$dir/sidecartemplate.yaml" --pod "$dir/workload.yaml" --explain 2>&1 >/dev/null | sed 's/^/   /'
        echo
    done

# Stop what `just demo` left running (the processes in its state file) and remove its directory
down:
    #!/usr/bin/env bash
    set -euo pipefail
    state=target/sidecar-injector-demo.state
    if [[ ! -f "$state" ]]; then echo "no demo running ($state not found)"; exit 0; fi
    dir=$(awk -F'\t' '$1 == "dir" {print $2}' "$state")
    # Newest first. The node's demo is one process, which stops everything it started and
    # puts the machine back on SIGTERM.
    grep -v '^dir' "$state" | tac | while IFS=$'\t' read -r pid name; do
        # Only a process still running the recorded program (a pid may have been reused).
        argv0=$(tr '\0' '\n' 2>/dev/null < "/proc/$pid/cmdline" | head -n 1 || true)
        if [[ "$(basename "${argv0:-none}")" != "$name"* ]]; then
            echo "$name (pid $pid): not running"
            continue
        fi
        kill -TERM "$pid"
        for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; echo "$name (pid $pid): killed"; else echo "$name (pid $pid): stopped"; fi
    done
    if [[ "$dir" == */sidecar-injector-e2e-* && -d "$dir" ]]; then rm -rf "$dir"; echo "removed $dir"; fi
    rm -f "$state"

# Quick chart check without a cluster: helm lint and template (defaults, then every optional object); `just e2e` runs the full chart tests
chart-lint:
    #!/usr/bin/env bash
    set -euo pipefail
    helm=$(bash e2e/control-plane/build.sh helm)
    "$helm" lint --strict charts/sidecar-injector
    optionals=(--set serviceMonitor.enabled=true --set prometheusRule.enabled=true --set grafanaDashboard.enabled=true
        --set "networkPolicy.webhook.from[0].ipBlock.cidr=10.0.0.0/24")
    "$helm" lint --strict charts/sidecar-injector "${optionals[@]}"
    "$helm" template t charts/sidecar-injector --namespace sidecar-injector >/dev/null
    "$helm" template t charts/sidecar-injector --namespace sidecar-injector "${optionals[@]}" >/dev/null
    # A managed cluster's values (docs/operations.md, "Managed clusters"), and the CRD left out
    managed=(--set hostNetwork=true --set webhookPort=9443 --set adminPort=9080 --set priorityClassName=system-cluster-critical)
    "$helm" lint --strict charts/sidecar-injector "${managed[@]}"
    "$helm" template t charts/sidecar-injector --namespace sidecar-injector "${managed[@]}" --set crds.install=false >/dev/null
    echo "chart OK"

# The alerts of the chart's PrometheusRule, as the chart renders them, through `promtool check rules` and `promtool test rules` (e2e/monitoring/alerts.test.yaml); Prometheus's promtool is built from its Go module into the cache when missing (a few minutes once)
chart-alerts:
    bash e2e/monitoring/check-rules.sh

# The release binary that ships, into target/<arch>-unknown-linux-gnu/release/ (in cargo's target directory): static (build/release.sh)
release:
    bash build/release.sh

# Build the operator's OCI image without a container engine, into OUT (default: sidecar-injector-image.tar in cargo's target directory; `ctr images import` it): the release binary of `just release`, alone and non-root, labelled with its version, revision, source and licence (the Dockerfile describes the same image)
image tag="sidecar-injector.invalid/sidecar-injector:dev" out="": release
    #!/usr/bin/env bash
    set -euo pipefail
    target=$({{just_executable()}} target-dir)
    out="{{out}}"
    read -r version source licenses < <({{just_executable()}} package-metadata)
    cargo run --quiet -p oci-image -- --out "${out:-$target/sidecar-injector-image.tar}" --name "{{tag}}" \
        --users --file "$target/x86_64-unknown-linux-gnu/release/sidecar-injector:/usr/local/bin/sidecar-injector" \
        --entrypoint /usr/local/bin/sidecar-injector --cmd run --user 65532:65532 \
        --expose 8443/tcp --expose 8080/tcp \
        --label org.opencontainers.image.title=sidecar-injector \
        --label "org.opencontainers.image.version=$version" \
        --label "org.opencontainers.image.revision=$(bash build/revision.sh)" \
        --label "org.opencontainers.image.source=$source" \
        --label "org.opencontainers.image.licenses=$licenses"

# Versioned release artifacts, afresh into dist/ of cargo's target directory: the image archive of `just image` and its SBOM (cargo-cyclonedx), the static binary and kubectl plugin archives with SHA256SUMS, krew's manifest sidecar.yaml (its archive under BASE_URL, `{version}` replaced) and the chart packaged by helm (build/dist.sh; publishing them: docs/operations.md)
dist base_url="https://example.invalid/releases/v{version}":
    JUST={{just_executable()}} bash build/dist.sh "{{base_url}}"

# Print the version, repository and licence of the binary's package (the workspace's: one version for the binary, the image, the chart and the plugin)
[private]
package-metadata:
    @cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; p=next(p for p in json.load(sys.stdin)["packages"] if p["name"] == "injector-cli"); print(p["version"], p["repository"], p["license"])'
