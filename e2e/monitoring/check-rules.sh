#!/usr/bin/env bash
# Checks the alerts of the chart's PrometheusRule with promtool, from what the chart renders:
# `helm template --set prometheusRule.enabled=true`, the PrometheusRule's spec (its `groups`)
# written out as a Prometheus rules file, then `promtool check rules` on it and `promtool test
# rules` with the unit tests of alerts.test.yaml (copied beside it, since promtool reads the
# rule files a test names from the test file's directory). helm and promtool are the pinned
# ones of e2e/control-plane/versions.env, built into the cache when missing.
#
# Usage: check-rules.sh [DIR]   write sidecar-injector.rules.yaml (and the test file) into DIR,
#                               kept (e2e/tests/monitoring.rs loads that file into Prometheus);
#                               without DIR, a temporary directory removed at the end
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="$root/e2e/control-plane/build.sh"

log() { printf '[check-rules] %s\n' "$*" >&2; }

dir="${1:-}"
if [[ -z "$dir" ]]; then
  dir="$(mktemp -d)"
  trap 'rm -rf "$dir"' EXIT
fi
mkdir -p "$dir"

helm="$(bash "$build" helm)"
promtool="$(bash "$build" promtool)"

rendered="$dir/prometheusrule.yaml"
rules="$dir/sidecar-injector.rules.yaml"
"$helm" template sidecar-injector "$root/charts/sidecar-injector" --namespace sidecar-injector \
  --set prometheusRule.enabled=true --show-only templates/prometheusrule.yaml >"$rendered"
grep -q '^kind: PrometheusRule$' "$rendered" || { log "no PrometheusRule rendered"; exit 1; }
# The spec is the manifest's last key (templates/prometheusrule.yaml): its lines, less their
# two spaces of indentation, are the rules file. promtool refuses anything else.
awk 'found { sub(/^  /, ""); print } /^spec:$/ { found = 1 }' "$rendered" >"$rules"
[[ -s "$rules" ]] || { log "the PrometheusRule has no spec"; exit 1; }
cp "$here/alerts.test.yaml" "$dir/alerts.test.yaml"

# docs/operations.md, "Alerts", shows every alert's expression: it must say what the rules say.
while IFS= read -r expr; do
  grep -qF -- "$expr" "$root/docs/operations.md" \
    || { log "docs/operations.md's table of alerts lacks: $expr"; exit 1; }
done < <(sed -n 's/^ *expr: //p' "$root/charts/sidecar-injector/rules/sidecar-injector.rules.yaml")

"$promtool" check rules "$rules"
"$promtool" test rules "$dir/alerts.test.yaml"
log "the chart's alerts pass promtool check rules and test rules ($rules)"
