#!/usr/bin/env bash
# Prints the source revision a release build is made from, which `sidecar_injector_build_info`
# and the image's org.opencontainers.image.revision label carry: SIDECAR_INJECTOR_REVISION when
# it is set (a build outside a checkout, such as `docker build --build-arg`), else the commit
# of this checkout, with `-dirty` when tracked files differ from it, else `unknown` (not a git
# checkout: the Dockerfile's context leaves .git out).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -n "${SIDECAR_INJECTOR_REVISION:-}" ]]; then
    echo "$SIDECAR_INJECTOR_REVISION"
elif commit=$(git rev-parse --verify --quiet HEAD 2>/dev/null); then
    if [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
        echo "$commit-dirty"
    else
        echo "$commit"
    fi
else
    echo unknown
fi
