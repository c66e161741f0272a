#!/usr/bin/env bash
# The release build of sidecar-injector that ships (`just image`) and that the load benchmark
# measures, with the benchmark's transport-only server built the same way: static
# (crt-static, explicit --target), and profile-guided.
#
# Profile-guided: an instrumented build first serves a training load (build/pgo-train.py: the
# typical review of the benchmark and two others, over TLS keep-alive), and the final build is
# optimised with the profile it recorded. On the webhook's path (JSON, TLS, HTTP) this cut
# the CPU a request by about a fifth (BENCHMARKS.md). The profile is made afresh on every run, from
# the code being built, so it never describes other code. It needs the llvm-profdata of the
# LLVM rustc was built with (Debian: llvm-<major>; rustup: llvm-tools); SIDECAR_INJECTOR_PGO=0
# builds without a profile.
#
# Outputs: target/x86_64-unknown-linux-gnu/release/{sidecar-injector,examples/transport_only}.
# The instrumented build and the profile are kept in target/pgo/: the profile is recorded again
# only when the instrumented binaries changed.
set -euo pipefail
cd "$(dirname "$0")/.."

target=x86_64-unknown-linux-gnu
static="-C target-feature=+crt-static"
build() { # RUSTFLAGS, then cargo arguments
    local flags=$1
    shift
    RUSTFLAGS="$flags" cargo build --release --locked --target "$target" \
        -p injector-cli --bin sidecar-injector --example transport_only "$@"
}

if [[ "${SIDECAR_INJECTOR_PGO:-1}" == 0 ]]; then
    echo "release: SIDECAR_INJECTOR_PGO=0, building without a profile" >&2
    build "$static"
    exit 0
fi

llvm_major=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
profdata=""
for candidate in "llvm-profdata-$llvm_major" "/usr/lib/llvm-$llvm_major/bin/llvm-profdata" \
    "$(rustc --print sysroot)/lib/rustlib/$target/bin/llvm-profdata"; do
    if command -v "$candidate" >/dev/null 2>&1; then
        profdata=$candidate
        break
    fi
done
if [[ -z "$profdata" ]]; then
    echo "release: no llvm-profdata for LLVM $llvm_major (rustc's): install the Debian package" \
        "llvm-$llvm_major or the rustup component llvm-tools, or build without a profile with" \
        "SIDECAR_INJECTOR_PGO=0" >&2
    exit 1
fi

pgo=$PWD/target/pgo
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

echo "--- release: the instrumented build" >&2
mkdir -p "$pgo"
CARGO_TARGET_DIR="$pgo/instrumented" build "$static -C profile-generate=$pgo/profiles"
instrumented=$pgo/instrumented/$target/release

# A profile is an input of every crate of the final build: a new one rebuilds them all. When
# the instrumented binaries are the ones the profile was recorded with, the code is the same,
# and so is the profile kept.
fingerprint=$(sha256sum "$instrumented/sidecar-injector" "$instrumented/examples/transport_only" | cut -d' ' -f1 | tr '\n' ' ')
if [[ -f "$pgo/merged.profdata" && "$(cat "$pgo/merged.source" 2>/dev/null)" == "$fingerprint" ]]; then
    echo "--- release: the profile of these instrumented binaries is kept" >&2
    build "$static -C profile-use=$pgo/merged.profdata"
    exit 0
fi
rm -f "$pgo/merged.profdata" "$pgo/merged.source"

echo "--- release: training" >&2
rm -rf "$pgo/profiles"
mkdir -p "$pgo/profiles"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -keyout "$work/tls.key" -out "$work/tls.crt" -subj "/CN=127.0.0.1" \
    -addext "subjectAltName=IP:127.0.0.1" 2>/dev/null
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# stop PID: SIGTERM, and the wait that lets it write its profile as it exits.
stop() {
    kill "$1"
    wait "$1"
}
port=$(free_port)
admin=$(free_port)
"$instrumented/sidecar-injector" serve --templates bench/fixtures/templates \
    --tls-cert "$work/tls.crt" --tls-key "$work/tls.key" --listen "127.0.0.1:$port" \
    --admin-listen "127.0.0.1:$admin" --drain-period 0s 2>"$work/webhook.log" &
webhook=$!
pids+=("$webhook")
for _ in $(seq 1 100); do
    if curl -fsS "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1; then break; fi
    sleep 0.1
done
python3 build/pgo-train.py "$port" "$work/tls.crt" 20000
# The transport-only server answers what the webhook answered.
curl -fsS --cacert "$work/tls.crt" -X POST -H "Content-Type: application/json" \
    --data-binary @bench/fixtures/typical-pod-review.json -o "$work/answer.json" \
    "https://127.0.0.1:$port/mutate"
stop "$webhook"
transport_port=$(free_port)
"$instrumented/examples/transport_only" --tls-cert "$work/tls.crt" --tls-key "$work/tls.key" \
    --listen "127.0.0.1:$transport_port" --answer "$work/answer.json" 2>"$work/transport.log" &
transport=$!
pids+=("$transport")
for _ in $(seq 1 100); do
    if curl -fsS --cacert "$work/tls.crt" -X POST -H "Content-Type: application/json" \
        --data-binary @bench/fixtures/typical-pod-review.json -o /dev/null \
        "https://127.0.0.1:$transport_port/mutate" 2>/dev/null; then break; fi
    sleep 0.1
done
python3 build/pgo-train.py "$transport_port" "$work/tls.crt" 20000 --typical-only
stop "$transport"
pids=()
"$profdata" merge -o "$pgo/merged.profdata" "$pgo/profiles"
echo "$fingerprint" >"$pgo/merged.source"

echo "--- release: the profile-guided build" >&2
build "$static -C profile-use=$pgo/merged.profdata"
