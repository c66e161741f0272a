#!/usr/bin/env bash
# The release build of sidecar-injector that ships (`just image`) and that the load benchmark
# measures, with the benchmark's transport-only server built the same way: static
# (crt-static, explicit --target), and profile-guided.
#
# Profile-guided: an instrumented build first serves a training load (build/pgo-train.py: the
# typical review of the benchmark and two others, over TLS keep-alive), and the final build is
# optimised with the profile it recorded. On the webhook's path this cut the CPU a request by
# a fifth to a quarter (BENCHMARKS.md, docs/architecture.md decision 25). It needs the
# llvm-profdata of the LLVM rustc was built with (build/llvm-profdata.sh finds it; Debian:
# llvm-<major>; rustup: llvm-tools); SIDECAR_INJECTOR_PGO=0 builds without a profile.
#
# Outputs: target/<arch>-unknown-linux-gnu/release/{sidecar-injector,examples/transport_only}
# (in CARGO_TARGET_DIR when set), <arch> the machine's (`uname -m`: x86_64 here; aarch64 on an
# arm64 builder, which is how the Dockerfile builds other platforms: natively, never across).
# The instrumented build and the profile are kept in target/pgo/: the profile is recorded again
# only when the instrumented binaries or the training (this script, the trainer, its fixtures)
# changed, so it always describes the code being built.
#
# The final build carries the source revision (build/revision.sh) in its
# `sidecar_injector_build_info` metric (SIDECAR_INJECTOR_REVISION, read at compile time); the
# instrumented build does not, so that its binaries, hence the profile, stay the same from one
# commit to the next when the code does.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/local.sh
source bench/local.sh

target=$(uname -m)-unknown-linux-gnu
revision=$(bash build/revision.sh)
# Cargo's encoded form (flags separated by 0x1f): a path with a space stays one flag, and an
# inherited CARGO_ENCODED_RUSTFLAGS cannot silently replace these.
build() { # RUSTFLAGS..., as separate arguments: the final build, with the revision
    SIDECAR_INJECTOR_REVISION="$revision" build_as_is "$@"
}
build_as_is() { # RUSTFLAGS..., as separate arguments
    local IFS=$'\x1f'
    CARGO_ENCODED_RUSTFLAGS="-Ctarget-feature=+crt-static${*:+$IFS$*}" RUSTFLAGS="" \
        cargo build --release --locked --target "$target" \
        -p injector-cli --bin sidecar-injector --example transport_only
}

if [[ "${SIDECAR_INJECTOR_PGO:-1}" == 0 ]]; then
    echo "release: SIDECAR_INJECTOR_PGO=0, building without a profile" >&2
    build
    exit 0
fi

if ! profdata=$(bash build/llvm-profdata.sh); then
    echo "release: no llvm-profdata of rustc's LLVM: run 'just build-packages' (Debian's" \
        "llvm-<major>, as root) or 'rustup component add llvm-tools', or build without a" \
        "profile with SIDECAR_INJECTOR_PGO=0" >&2
    exit 1
fi

pgo=$PWD/target/pgo
mkdir -p "$pgo"
# One release build at a time: two would share the profile's directory.
exec 9>"$pgo/lock"
flock 9
work=$(mktemp -d)
pids=()
failed_logs() { # shown when the training fails
    for log in "$work"/*.log; do
        if [[ -s "$log" ]]; then
            echo "--- $(basename "$log"):" >&2
            tail -n 20 "$log" >&2
        fi
    done
}
cleanup() {
    local status=$?
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [[ $status != 0 ]]; then failed_logs; fi
    rm -rf "$work"
}
trap cleanup EXIT

echo "--- release: the instrumented build" >&2
(
    unset SIDECAR_INJECTOR_REVISION
    CARGO_TARGET_DIR="$pgo/instrumented" build_as_is "-Cprofile-generate=$pgo/profiles"
)
instrumented=$pgo/instrumented/$target/release

# A profile is an input of every crate of the final build: a new one rebuilds them all. When
# the instrumented binaries and the training are those the profile was recorded with, the
# profile is kept.
fingerprint=$(sha256sum "$instrumented/sidecar-injector" "$instrumented/examples/transport_only" \
    build/release.sh build/pgo-train.py bench/fixtures/typical-pod-review.json \
    bench/fixtures/templates/* | cut -d' ' -f1 | tr '\n' ' ')
if [[ -f "$pgo/merged.profdata" && "$(cat "$pgo/merged.source" 2>/dev/null)" == "$fingerprint" ]]; then
    echo "--- release: the profile of these instrumented binaries is kept" >&2
    build "-Cprofile-use=$pgo/merged.profdata"
    exit 0
fi
rm -f "$pgo/merged.profdata" "$pgo/merged.source"

echo "--- release: training" >&2
rm -rf "$pgo/profiles"
mkdir -p "$pgo/profiles"
self_signed "$work"
post() { # PORT OUTPUT: the typical review, once
    curl -fsS --cacert "$work/tls.crt" -X POST -H "Content-Type: application/json" \
        --data-binary @bench/fixtures/typical-pod-review.json -o "$2" "https://127.0.0.1:$1/mutate"
}
# up PID NAME CHECK...: waits until CHECK succeeds; fails when the process has ended.
up() {
    local pid=$1 name=$2
    shift 2
    for _ in $(seq 1 100); do
        if "$@" >/dev/null 2>&1; then return; fi
        if ! kill -0 "$pid" 2>/dev/null; then break; fi
        sleep 0.1
    done
    echo "release: the instrumented $name did not start" >&2
    exit 1
}
# stop PID: SIGTERM, and the wait that lets it write its profile as it exits (and says how).
stop() {
    kill "$1"
    wait "$1"
    pids=()
}
# The line per admission in both formats (json as the chart sets it, text as the benchmark
# and `serve` by default), whatever this shell's environment says.
for format in json text; do
    port=$(free_port)
    admin=$(free_port)
    "$instrumented/sidecar-injector" serve --templates bench/fixtures/templates \
        --tls-cert "$work/tls.crt" --tls-key "$work/tls.key" --listen "127.0.0.1:$port" \
        --admin-listen "127.0.0.1:$admin" --drain-period 0s --log info --log-format "$format" \
        2>"$work/webhook-$format.log" &
    pids=("$!")
    up "${pids[0]}" webhook curl -fsS "http://127.0.0.1:$admin/readyz"
    python3 build/pgo-train.py "$port" "$work/tls.crt" 10000
    # The transport-only server answers what the webhook answered.
    post "$port" "$work/answer.json"
    stop "${pids[0]}"
done
transport_port=$(free_port)
"$instrumented/examples/transport_only" --tls-cert "$work/tls.crt" --tls-key "$work/tls.key" \
    --listen "127.0.0.1:$transport_port" --answer "$work/answer.json" 2>"$work/transport.log" &
pids=("$!")
up "${pids[0]}" "transport-only server" post "$transport_port" /dev/null
python3 build/pgo-train.py "$transport_port" "$work/tls.crt" 20000 --typical-only
stop "${pids[0]}"
"$profdata" merge -o "$pgo/merged.profdata" "$pgo/profiles"
echo "$fingerprint" >"$pgo/merged.source"

echo "--- release: the profile-guided build" >&2
build "-Cprofile-use=$pgo/merged.profdata"
