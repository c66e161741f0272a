#!/usr/bin/env bash
# Prints the path of the llvm-profdata of the LLVM rustc was built with: Debian's llvm-<major>
# or rustup's llvm-tools. Exits 1, printing nothing, when there is none.
set -euo pipefail
major=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
host=$(rustc -vV | sed -n 's/^host: //p')
for candidate in "llvm-profdata-$major" "/usr/lib/llvm-$major/bin/llvm-profdata" \
    "$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata"; do
    if command -v "$candidate" >/dev/null 2>&1; then
        command -v "$candidate"
        exit 0
    fi
done
exit 1
