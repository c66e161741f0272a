#!/usr/bin/env bash
# Writes the chart's README (charts/sidecar-injector/README.md) from its README.md.gotmpl and
# the `# --` comments of its values.yaml, with helm-docs (HELM_DOCS_VERSION of
# e2e/control-plane/versions.env, built from its Go module into the cache when missing, as helm
# is). Every value must have a description: a row without one fails.
#
# Usage: chart-docs.sh           write the README
#        chart-docs.sh --check   exit 1 when the README differs from what would be written
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
chart="$root/charts/sidecar-injector"
readme="$chart/README.md"

log() { printf '[chart-docs] %s\n' "$*" >&2; }

helm_docs=$(bash "$root/e2e/control-plane/build.sh" helm-docs)
generated=$(mktemp)
trap 'rm -f "$generated"' EXIT
# In file order, so that the table keeps values.yaml's grouping; --dry-run prints the README.
(cd "$chart" && "$helm_docs" --log-level warning --chart-search-root . --sort-values-order file \
  --template-files README.md.gotmpl --dry-run) >"$generated"

# A value without a `# --` comment is a row with an empty description.
if undocumented=$(grep -E '^\| [^|]+ \| [^|]+ \| .* \|  \|$' "$generated"); then
  log "values without a description (add a '# --' comment above each in values.yaml):"
  printf '%s\n' "$undocumented" >&2
  exit 1
fi

if [[ "${1:-}" == "--check" ]]; then
  if ! diff -u "$readme" "$generated"; then
    log "${readme#"$root"/} is stale: run 'just chart-docs' (or 'just generate') and commit"
    exit 1
  fi
  exit 0
fi
cp "$generated" "$readme"
log "wrote ${readme#"$root"/}"
