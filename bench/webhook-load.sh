#!/usr/bin/env bash
# Load benchmark of the webhook (`just bench-webhook`).
#
# Starts `sidecar-injector serve` (release build) on 127.0.0.1 with the realistic templates of
# bench/fixtures/templates, drives POST /mutate over TLS keep-alive with oha (installed from
# crates.io when missing) using a typical 8 KB Pod, at fixed rates and at saturation, and
# reports requests/s, latency percentiles and the server's RSS; then restarts it with 1,000
# templates and reports its RSS again. Everything listens on 127.0.0.1 and is stopped at exit.
#
# Environment: DURATION (per run, default 10s), LOG (the server's log filter, default info:
# one line per admission, as in production; written to a file).
set -euo pipefail
cd "$(dirname "$0")/.."

duration=${DURATION:-10s}
log_filter=${LOG:-info}
work=$(mktemp -d)
server_pid=""
cleanup() {
    if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

if ! command -v oha >/dev/null 2>&1; then
    echo "--- installing oha (load generator) from crates.io"
    cargo install oha --locked --version 1.16.0
fi
echo "--- building the release binary"
cargo build --quiet --release -p injector-cli
binary=./target/release/sidecar-injector

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -keyout "$work/tls.key" -out "$work/tls.crt" -subj "/CN=127.0.0.1" \
    -addext "subjectAltName=IP:127.0.0.1" 2>/dev/null

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
rss_mib() { awk '/VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }

start_server() {
    port=$(free_port)
    admin=$(free_port)
    "$binary" serve --templates "$1" --tls-cert "$work/tls.crt" --tls-key "$work/tls.key" \
        --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" --log "$log_filter" --drain-period 0s \
        2>"$work/server.log" &
    server_pid=$!
    for _ in $(seq 1 100); do
        if curl -fsS "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1; then return; fi
        sleep 0.1
    done
    echo "the server did not become ready:" >&2
    cat "$work/server.log" >&2
    exit 1
}

stop_server() {
    kill "$server_pid"
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
}

# load NAME CONNECTIONS [RATE]
load() {
    local name=$1 connections=$2 rate=${3:-}
    local args=(-z "$duration" -c "$connections" --no-tui --output-format json --insecure
        -m POST -H "Content-Type: application/json" -D bench/fixtures/typical-pod-review.json)
    if [ -n "$rate" ]; then args+=(-q "$rate"); fi
    local out="$work/run-$RANDOM.json"
    oha "${args[@]}" "https://127.0.0.1:$port/mutate" >"$out"
    python3 - "$out" "$name" "$connections" "${rate:-max}" <<'EOF'
import json, sys
result = json.load(open(sys.argv[1]))
summary = result["summary"]
percentiles = result["latencyPercentiles"]
codes = result.get("statusCodeDistribution", {})
errors = result.get("errorDistribution", {})
ms = lambda seconds: f"{seconds * 1000:.2f} ms" if seconds is not None else "-"
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {summary['requestsPerSec']:,.0f} | "
      f"{ms(percentiles.get('p50'))} | {ms(percentiles.get('p99'))} | {ms(percentiles.get('p99.9'))} | "
      f"{summary['successRate'] * 100:.2f}% | {codes} {errors if errors else ''} |")
EOF
}

echo "--- realistic templates: $(ls bench/fixtures/templates | wc -l) files"
start_server bench/fixtures/templates
sleep 1
idle=$(rss_mib "$server_pid")
echo
echo "| run | connections | target rate | requests/s | p50 | p99 | p99.9 | success | status codes |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---|"
load warmup 8 >/dev/null
load "fixed 1,000/s" 16 1000
load "fixed 5,000/s" 32 5000
load saturation 64
loaded=$(rss_mib "$server_pid")
stop_server
echo
echo "RSS idle (3 templates): ${idle} MiB; after the runs: ${loaded} MiB"

python3 - "$work/many" <<'EOF'
import os, sys
out = sys.argv[1]
os.makedirs(out)
for i in range(1000):
    with open(os.path.join(out, f"t{i:04}.yaml"), "w") as f:
        f.write(f"""apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {{name: template-{i:04}}}
spec:
  priority: {i % 50}
  failurePolicy: {"Fail" if i % 2 else "Ignore"}
  namespaceSelector: {{matchLabels: {{team: team-{i % 40}}}}}
  podSelector: {{matchLabels: {{app: app-{i}}}}}
  containers:
  - name: sidecar-{i}
    image: registry.example.com/sidecars/agent:{i}.0
    args: ["--pod={{{{ pod.name }}}}", "--namespace={{{{ pod.namespace }}}}"]
    env: [{{name: AGENT_ID, value: "{i}"}}, {{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}]
    resources: {{requests: {{cpu: 10m, memory: 16Mi}}, limits: {{memory: 64Mi}}}}
    volumeMounts: [{{name: agent-{i}, mountPath: /var/run/agent}}]
  volumes:
  - name: agent-{i}
    emptyDir: {{}}
""")
EOF
start_server "$work/many"
sleep 1
many_idle=$(rss_mib "$server_pid")
load "1,000 templates, fixed 1,000/s" 16 1000 >/dev/null
many_loaded=$(rss_mib "$server_pid")
stop_server
echo "RSS with 1,000 templates: idle ${many_idle} MiB; after 1,000/s for ${duration}: ${many_loaded} MiB"
