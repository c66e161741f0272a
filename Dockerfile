# syntax=docker/dockerfile:1
# The sidecar-injector image: the one static Rust binary on an empty filesystem, non-root, with
# no shell and no package manager. `just image` builds the same image without an engine.
#   docker build -t <your-registry>/sidecar-injector:0.1.0 \
#       --build-arg SIDECAR_INJECTOR_REVISION="$(git rev-parse HEAD)" .
# The context leaves .git out: without the argument, the binary's build_info metric and the
# revision label say `unknown`. `just dist` writes the release's image, with every label.
#
# Other platforms: the builder stage runs on the target platform (no --platform=$BUILDPLATFORM),
# so it needs no cross toolchain, only a builder of that platform (a native node, or QEMU's
# binfmt emulation):
#   docker buildx build --platform linux/amd64,linux/arm64 \
#       -t <your-registry>/sidecar-injector:0.1.0 --push .

FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
# Read by build/release.sh (build/revision.sh) for the final build.
ARG SIDECAR_INJECTOR_REVISION
# Static (crt-static with an explicit --target: the binary needs no libc in the image, while
# build scripts and proc macros stay dynamic), as `just release` builds it.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    bash build/release.sh \
 && install -D -m 0755 "target/$(uname -m)-unknown-linux-gnu/release/sidecar-injector" /out/usr/local/bin/sidecar-injector \
 && mkdir -p /out/etc \
 && printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n' > /out/etc/passwd \
 && printf 'root:x:0:\nnogroup:x:65534:\nnonroot:x:65532:\n' > /out/etc/group

FROM scratch
ARG SIDECAR_INJECTOR_REVISION=unknown
LABEL org.opencontainers.image.title=sidecar-injector \
      org.opencontainers.image.revision=$SIDECAR_INJECTOR_REVISION \
      org.opencontainers.image.licenses=Apache-2.0
COPY --from=builder /out/ /
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/sidecar-injector"]
CMD ["run"]
