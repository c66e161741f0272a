#!/usr/bin/env bash
# The release build of sidecar-injector that ships (`just release`, `just image`, `just dist`)
# and that the load benchmark measures, with the benchmark's transport-only server built the
# same way: static (crt-static with an explicit --target: the binary needs no libc in the image,
# while build scripts and proc macros stay dynamic).
#
# Not profile-guided: a profile moved the server's CPU a request, not a figure a user feels, and
# the server holds its targets without one (docs/architecture.md, decision 25).
#
# Outputs: target/<arch>-unknown-linux-gnu/release/{sidecar-injector,examples/transport_only}
# (in CARGO_TARGET_DIR when set), <arch> the machine's (`uname -m`: x86_64 here; aarch64 on an
# arm64 builder, which is how the Dockerfile builds other platforms: natively, never across).
# The binary carries the source revision (build/revision.sh) in its `sidecar_injector_build_info`
# metric (SIDECAR_INJECTOR_REVISION, read at compile time).
set -euo pipefail
cd "$(dirname "$0")/.."

target=$(uname -m)-unknown-linux-gnu
# Cargo's encoded form: an inherited CARGO_ENCODED_RUSTFLAGS cannot silently replace the flag.
SIDECAR_INJECTOR_REVISION=$(bash build/revision.sh) \
    CARGO_ENCODED_RUSTFLAGS="-Ctarget-feature=+crt-static" RUSTFLAGS="" \
    cargo build --release --locked --target "$target" \
    -p injector-cli --bin sidecar-injector --example transport_only
