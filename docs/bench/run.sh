#!/usr/bin/env bash
# run.sh reproduces the tables of docs/BENCHMARKS.md: it builds sharelimit, starts
# the no-op RLS server (the gRPC floor) and sharelimit on docs/bench/bench.yaml,
# and runs `sharelimit bench` against both, alternating A B A B in each run.
# Usage: docs/bench/run.sh [ROUNDS] [DURATION]
set -euo pipefail
cd "$(dirname "$0")/../.."
export GOTOOLCHAIN=local
ROUNDS="${1:-4}"
DUR="${2:-5s}"
BIN="$(mktemp -d)/sharelimit"
go build -o "$BIN" ./cmd/sharelimit
"$BIN" bench --serve-noop 127.0.0.1:19091 >/dev/null 2>&1 &
NOOP=$!
"$BIN" serve --config-dir docs/bench --grpc-addr 127.0.0.1:19092 --http-addr 127.0.0.1:19093 --log-level warn &
SL=$!
trap 'kill $NOOP $SL 2>/dev/null; wait 2>/dev/null' EXIT
sleep 1
cmp() { "$BIN" bench --target-a 127.0.0.1:19091 --pid-a "$NOOP" --label-a noop \
	--target-b 127.0.0.1:19092 --pid-b "$SL" --label-b sharelimit \
	--rounds "$ROUNDS" --duration "$DUR" --warmup 1s --domain bench --progress=false "$@"; }

echo "## 1 descriptor, closed loop, c=16"
cmp --concurrency 16 | tee /tmp/sharelimit-bench-closed.txt
NOOP_RPS=$(awk '/^median +noop/ {print $3}' /tmp/sharelimit-bench-closed.txt)
HALF=$((NOOP_RPS / 2))
echo
echo "## 1 descriptor, open loop at 50% of the no-op server's closed-loop throughput ($HALF/s)"
cmp --rate "$HALF"
echo
one() { "$BIN" bench --target 127.0.0.1:19092 --server-pid "$SL" --concurrency 16 --duration "$DUR" --warmup 1s \
	--domain bench --progress=false "$@" | grep -A1 '^req/s'; }
echo "## 10 descriptors per request vs 1 (sharelimit, per-IP keys, closed loop, c=16; alternating)"
for r in $(seq "$ROUNDS"); do
	for n in 1 10; do echo "descriptors=$n"; one --descriptors "$n" --shape remote_address --cardinality 1000; done
done
echo
echo "## key cardinality 1 vs 1M per-IP keys (sharelimit, closed loop, c=16; alternating)"
for r in $(seq "$ROUNDS"); do
	for card in 1 1000000; do echo "cardinality=$card"; one --shape remote_address --cardinality "$card"; done
done
echo
echo "## RSS with 1M live per-IP buckets (domain bench-hold: 100 a day, so nothing is swept)"
curl -s 127.0.0.1:19093/metrics | grep -E '^sharelimit_buckets |^process_resident_memory_bytes'
"$BIN" bench --target 127.0.0.1:19092 --concurrency 16 --shape remote_address --cardinality 1000000 \
	--requests 1000000 --domain bench-hold --progress=false >/dev/null
curl -s 127.0.0.1:19093/metrics | grep -E '^sharelimit_buckets |^process_resident_memory_bytes'
