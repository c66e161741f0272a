#!/usr/bin/env bash
# Load benchmark of the webhook (`just bench-webhook`).
#
# Starts `sidecar-injector serve` (the release binary that ships: static, by
# build/release.sh) on 127.0.0.1 with the realistic templates of bench/fixtures/templates, and
# next to it the transport-only server (crates/cli/examples/transport_only.rs, built the same
# way: the same TLS, HTTP/1.1 and body reading, answering the
# webhook's own answer, nothing else) with the same certificate. Drives POST /mutate over
# TLS keep-alive with oha (installed from crates.io when missing) using a typical 8 KB Pod, at
# fixed rates and at saturation, alternating between the two servers run by run for ROUNDS
# rounds; reports each run, the medians, the webhook's saturation throughput as a share of the
# transport's, and the webhook's RSS; then restarts it with 1,000 templates and reports its RSS
# again. Everything listens on 127.0.0.1 and is stopped at exit.
#
# Environment: DURATION (per run, default 10s), ROUNDS (default 3), LOG (the webhook's log
# filter, default info: one line per admission, as in production; written to a file), BIN
# (another build of sidecar-injector to measure, say the previous commit's, made by
# build/release.sh too, as the transport-only server always is; default the one just built),
# BASELINE (other builds of sidecar-injector, space-separated, each NAME=PATH or PATH (named
# baseline): served beside the first with the same templates and loaded in turn with it and the
# transport-only server, run by run: what a change moves, side by side in one run).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/local.sh
source bench/local.sh

duration=${DURATION:-10s}
rounds=${ROUNDS:-3}
log_filter=${LOG:-info}
work=$(mktemp -d)
server_pid=""
transport_pid=""
declare -A baseline_pids=() baseline_ports=() baseline_paths=()
stop_pid() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }
cleanup() {
    if [ -n "$server_pid" ]; then stop_pid "$server_pid"; fi
    if [ -n "$transport_pid" ]; then stop_pid "$transport_pid"; fi
    for pid in "${baseline_pids[@]}"; do stop_pid "$pid"; done
    rm -rf "$work"
}
trap cleanup EXIT

if ! command -v oha >/dev/null 2>&1; then
    echo "--- installing oha (load generator) from crates.io"
    cargo install oha --locked --version 1.16.0
fi
echo "--- building the release binary and the transport-only server (build/release.sh: static)"
bash build/release.sh
release=${CARGO_TARGET_DIR:-./target}/$(uname -m)-unknown-linux-gnu/release
binary=${BIN:-$release/sidecar-injector}
transport=$release/examples/transport_only
baselines=()
for entry in ${BASELINE:-}; do
    name=baseline path=$entry
    if [[ $entry == *=* ]]; then name=${entry%%=*} path=${entry#*=}; fi
    baselines+=("$name")
    baseline_paths[$name]=$path
done
servers=(webhook "${baselines[@]}" transport)

self_signed "$work"

# "USER SYSTEM PREEMPTED" of process $1: its CPU in clock ticks (fields 14 and 15 of its stat,
# threads that ended included) and the involuntary context switches of the threads it has now
# (both servers keep theirs for the whole run).
cpu_account() {
    local times
    times=$(awk '{print $14, $15}' "/proc/$1/stat")
    echo "$times $(cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^nonvoluntary_ctxt_switches/ {n += $2} END {print n + 0}')"
}
rss_mib() { awk '/VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }
post() { # PORT OUTPUT: posts the typical review once
    curl -fsSk -X POST -H "Content-Type: application/json" \
        --data-binary @bench/fixtures/typical-pod-review.json -o "$2" "https://127.0.0.1:$1/mutate"
}

start_server() { # TEMPLATES [BINARY]
    port=$(free_port)
    admin=$(free_port)
    # MIMALLOC_PURGE_DELAY as the chart sets it.
    MIMALLOC_PURGE_DELAY=0 "${2:-$binary}" serve --templates "$1" --tls-cert "$work/tls.crt" --tls-key "$work/tls.key" \
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
    stop_pid "$server_pid"
    server_pid=""
}

# The transport-only server, answering what the webhook answered to the typical review.
start_transport() {
    transport_port=$(free_port)
    post "$port" "$work/answer.json"
    "$transport" --tls-cert "$work/tls.crt" --tls-key "$work/tls.key" \
        --listen "127.0.0.1:$transport_port" --answer "$work/answer.json" 2>"$work/transport.log" &
    transport_pid=$!
    for _ in $(seq 1 100); do
        if post "$transport_port" /dev/null 2>/dev/null; then return; fi
        sleep 0.1
    done
    echo "the transport-only server did not start:" >&2
    cat "$work/transport.log" >&2
    exit 1
}

# start_baseline NAME TEMPLATES: a BASELINE build, served like the webhook beside it.
start_baseline() {
    local saved_port=$port saved_pid=$server_pid
    start_server "$2" "${baseline_paths[$1]}"
    baseline_ports[$1]=$port baseline_pids[$1]=$server_pid
    port=$saved_port server_pid=$saved_pid
}

# load SERVER NAME CONNECTIONS [RATE]: SERVER is webhook, a baseline's name or transport; one row, also kept in
# results.jsonl for the medians.
load() {
    local server=$1 name=$2 connections=$3 rate=${4:-}
    local target_port=$port pid=$server_pid
    if [ "$server" = transport ]; then target_port=$transport_port pid=$transport_pid; fi
    if [ -n "${baseline_pids[$server]:-}" ]; then
        target_port=${baseline_ports[$server]} pid=${baseline_pids[$server]}
    fi
    local args=(-z "$duration" -c "$connections" --no-tui --output-format json --insecure
        -m POST -H "Content-Type: application/json" -D bench/fixtures/typical-pod-review.json)
    if [ -n "$rate" ]; then args+=(-q "$rate"); fi
    local out="$work/run-$RANDOM.json"
    local before after
    before=$(cpu_account "$pid")
    oha "${args[@]}" "https://127.0.0.1:$target_port/mutate" >"$out"
    after=$(cpu_account "$pid")
    python3 - "$out" "$server" "$name" "$connections" "${rate:-max}" "$work/results.jsonl" \
        "$before" "$after" "$(getconf CLK_TCK)" <<'EOF'
import json, sys
out, server, name, connections, rate, results, before, after, ticks = sys.argv[1:]
result = json.load(open(out))
summary = result["summary"]
percentiles = result["latencyPercentiles"]
codes = result.get("statusCodeDistribution", {})
errors = result.get("errorDistribution", {})
ms = lambda seconds: f"{seconds * 1000:.2f} ms" if seconds is not None else "-"
# The server's own CPU (user and system, all its threads) and the times the kernel took a CPU
# from one of its threads, per request answered during the run.
requests = sum(int(n) for n in codes.values()) or 1
(user0, system0, taken0), (user1, system1, taken1) = (map(int, a.split()) for a in (before, after))
cpu_us = ((user1 - user0) + (system1 - system0)) / int(ticks) / requests * 1e6
preempted = (taken1 - taken0) / requests
print(f"| {server} | {name} | {connections} | {rate} | {summary['requestsPerSec']:,.0f} | "
      f"{ms(percentiles.get('p50'))} | {ms(percentiles.get('p99'))} | {ms(percentiles.get('p99.9'))} | "
      f"{cpu_us:.1f} µs | {preempted:.2f} | "
      f"{summary['successRate'] * 100:.2f}% | {codes} {errors if errors else ''} |")
with open(results, "a") as f:
    f.write(json.dumps({"server": server, "run": name, "rps": summary["requestsPerSec"],
                        "p50": percentiles.get("p50"), "p99": percentiles.get("p99"),
                        "p99.9": percentiles.get("p99.9"), "cpu_us": cpu_us,
                        "preempted": preempted}) + "\n")
EOF
}

echo "--- realistic templates: $(ls bench/fixtures/templates | wc -l) files; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
start_server bench/fixtures/templates
sleep 1
idle=$(rss_mib "$server_pid")
start_transport
for name in "${baselines[@]}"; do start_baseline "$name" bench/fixtures/templates; done
echo
echo "| server | run | connections | target rate | requests/s | p50 | p99 | p99.9 | server CPU / request | preempted / request | success | status codes |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
for server in "${servers[@]}"; do load "$server" warmup 8 >/dev/null; done
rm -f "$work/results.jsonl"
for _ in $(seq 1 "$rounds"); do
    for server in "${servers[@]}"; do load "$server" "fixed 1,000/s" 16 1000; done
    for server in "${servers[@]}"; do load "$server" "fixed 5,000/s" 32 5000; done
    for server in "${servers[@]}"; do load "$server" saturation 64; done
done
loaded=$(rss_mib "$server_pid")
transport_rss=$(rss_mib "$transport_pid")
stop_pid "$transport_pid"
transport_pid=""
for name in "${baselines[@]}"; do
    echo "($name after its runs: $(rss_mib "${baseline_pids[$name]}") MiB)"
    stop_pid "${baseline_pids[$name]}"
    unset "baseline_pids[$name]"
done
stop_server
echo
echo "Medians of $rounds rounds (load average after the runs: $(cut -d' ' -f1-3 /proc/loadavg)):"
echo
python3 - "$work/results.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
runs = list(dict.fromkeys(r["run"] for r in rows))
def median(server, run, key):
    return statistics.median(r[key] for r in rows
                             if r["server"] == server and r["run"] == run and r[key] is not None)
print("| server | run | requests/s | p50 | p99 | p99.9 | server CPU / request | preempted / request |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
servers = list(dict.fromkeys(r["server"] for r in rows))
for run in runs:
    for server in servers:
        ms = lambda key: f"{median(server, run, key) * 1000:.2f} ms"
        print(f"| {server} | {run} | {median(server, run, 'rps'):,.0f} | {ms('p50')} | {ms('p99')} | {ms('p99.9')} | "
              f"{median(server, run, 'cpu_us'):.1f} µs | {median(server, run, 'preempted'):.2f} |")
ours = [r["rps"] for r in rows if r["server"] == "webhook" and r["run"] == "saturation"]
theirs = [r["rps"] for r in rows if r["server"] == "transport" and r["run"] == "saturation"]
ratio = statistics.median(ours) / statistics.median(theirs)
each = ", ".join(f"{a / b:.2f}" for a, b in zip(ours, theirs))
print(f"\nSaturation, webhook / transport-only: **{ratio:.2f}** (of the medians; round by round: {each})")
cost = lambda server: [r["cpu_us"] for r in rows if r["server"] == server and r["run"] == "saturation"]
print("Server CPU per request at saturation: "
      + ", ".join(f"{server} {statistics.median(cost(server)):.1f} µs" for server in servers)
      + " (medians; the load generator shares the machine's CPUs, and takes them from a server it wakes)")
for server in servers:
    if server in ("webhook", "transport"):
        continue
    base = [r["rps"] for r in rows if r["server"] == server and r["run"] == "saturation"]
    print(f"Saturation, webhook / {server}: **{statistics.median(ours) / statistics.median(base):.2f}**")
EOF
echo
echo "RSS idle (3 templates): ${idle} MiB; after the runs: ${loaded} MiB (the transport-only server after its runs: ${transport_rss} MiB)"

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
load webhook "1,000 templates, fixed 1,000/s" 16 1000 >/dev/null
many_loaded=$(rss_mib "$server_pid")
stop_server
echo "RSS with 1,000 templates: idle ${many_idle} MiB; after 1,000/s for ${duration}: ${many_loaded} MiB"
