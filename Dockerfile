# syntax=docker/dockerfile:1
# The sidecar-injector image: one static-ish Rust binary on a minimal, non-root runtime.
#   docker build -t sidecar-injector:0.1.0 .

FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p injector-cli \
 && install -D -m 0755 target/release/sidecar-injector /out/sidecar-injector

FROM debian:bookworm-slim
RUN groupadd --system --gid 65532 nonroot \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin nonroot
COPY --from=builder /out/sidecar-injector /usr/local/bin/sidecar-injector
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/sidecar-injector"]
CMD ["run"]
