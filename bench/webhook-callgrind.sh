#!/usr/bin/env bash
# Instructions per admission of the whole webhook server, its transport and log line included
# (`just bench-webhook-instructions`).
#
# Runs `sidecar-injector serve` (the plain release build, without the profile of
# build/release.sh: its counts compare code, not profiles; the templates of bench/fixtures/templates, log
# level info as in production, LOG_FORMAT text or json) under callgrind on 127.0.0.1, posts the typical review N times
# (default 600) over 8 TLS keep-alive connections with oha, stops the server and prints the
# instructions of its user space per request and of the parts that matter. Unlike times on a
# shared VM, instruction counts move only with the code: compare two builds with BIN. The
# kernel's share (TCP, syscalls) is not counted. Everything is stopped at exit.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/local.sh
source bench/local.sh

requests=${N:-600}
work=$(mktemp -d)
server_pid=""
cleanup() {
    if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

for tool in valgrind callgrind_annotate; do
    command -v "$tool" >/dev/null || { echo "$tool is needed (apt-get install valgrind)" >&2; exit 1; }
done
if ! command -v oha >/dev/null 2>&1; then
    cargo install oha --locked --version 1.16.0
fi
if [ -z "${BIN:-}" ]; then
    cargo build --quiet --release -p injector-cli --bin sidecar-injector
fi
binary=${BIN:-./target/release/sidecar-injector}

self_signed "$work"
port=$(free_port)
admin=$(free_port)

MIMALLOC_PURGE_DELAY=0 valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out" \
    "$binary" serve --templates bench/fixtures/templates --tls-cert "$work/tls.crt" \
    --tls-key "$work/tls.key" --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" \
    --log info --log-format "${LOG_FORMAT:-text}" --drain-period 0s 2>"$work/server.log" &
server_pid=$!
for _ in $(seq 1 200); do
    if curl -fsS "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1; then break; fi
    sleep 0.2
done
oha -n "$requests" -c 8 --no-tui --output-format json --insecure -m POST \
    -H "Content-Type: application/json" -D bench/fixtures/typical-pod-review.json \
    "https://127.0.0.1:$port/mutate" >"$work/oha.json"
kill -INT "$server_pid"
wait "$server_pid" 2>/dev/null || true
server_pid=""

python3 - "$work/oha.json" "$requests" <<'EOF'
import json, sys
codes = json.load(open(sys.argv[1])).get("statusCodeDistribution", {})
if codes.get("200") != int(sys.argv[2]):
    sys.exit(f"not every request was answered 200: {codes}")
EOF
callgrind_annotate --inclusive=yes "$work/callgrind.out" 2>/dev/null | python3 -c '
import re, sys
requests = int(sys.argv[1])
parts = [
    ("the server, in all (TLS handshakes of 8 connections included)", "PROGRAM TOTALS"),
    ("TLS handshakes", "rustls::server::hs::ExpectClientHello::with_certified_key"),
    ("answering a request (respond)", "injector_webhook::server::respond"),
    ("- decide", "injector_webhook::review::decide "),
    ("- the log line", "tracing_core::event::Event::dispatch"),
    ("reading the request head", "hyper::proto::h1::conn::Conn<I,B,T>::poll_read_head"),
    ("writing the answer", "hyper::proto::h1::io::Buffered<T,B>::poll_flush"),
]
found = {}
for line in sys.stdin:
    match = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(.*)", line)
    if not match:
        continue
    count, name = int(match.group(1).replace(",", "")), match.group(2)
    for label, needle in parts:
        if needle in name + " " and label not in found:
            found[label] = count
print(f"{requests} requests, instructions of the server (user space) per request:")
if "TLS handshakes" in found:
    rest = found["the server, in all (TLS handshakes of 8 connections included)"] - found["TLS handshakes"]
    print(f"  the server, but for the TLS handshakes: {rest / requests / 1000:.1f}k")
for label, _ in parts:
    if label in found:
        print(f"  {label}: {found[label] / requests / 1000:.1f}k")
' "$requests"
