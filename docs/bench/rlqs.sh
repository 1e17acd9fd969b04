#!/usr/bin/env bash
# rlqs.sh reproduces docs/BENCHMARKS.md's "RLQS against RLS (issue 33)" with
# one command. It builds sharelimit and tools/rlqsbench, which starts two
# daemons from the binary (same rules and flags, --replicas 1 --rlqs) and
# runs, in this order: both idle; rounds of RLS (package loadgen's open loop,
# 4 connections) then RLQS (4 model Envoys, internal/envoymodel), 115000/s
# offered against a limit of 100000/s, 30 s of warm-up then a 20 s window in
# which each daemon's utime+stime is read from /proc/PID/stat; then the
# accuracy phase, L = 300/s with 2L offered, 80% on one Envoy, over RLS and
# over RLQS at once. Last, the per-report Go benchmark of server/rlqs.
#
# Usage: docs/bench/rlqs.sh [ROUNDS]     (default 2; about 2 minutes plus 100 s a round)
# Needs: go, Linux (/proc), 2 CPUs or more.
set -euo pipefail
cd "$(dirname "$0")/../.."
export GOTOOLCHAIN=local
ROUNDS="${1:-2}"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
go build -o "$OUT/sharelimit" ./cmd/sharelimit
go build -o "$OUT/rlqsbench" ./tools/rlqsbench
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(go version)"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
"$OUT/rlqsbench" -bin "$OUT/sharelimit" -envoys 4 -limit 100000 -offered 115000 \
	-warmup 30s -window 20s -rounds "$ROUNDS" -acc-limit 300 -settle 30s -acc-window 25s
echo
echo "## per-report cost: go test -run '^\$' -bench Report -benchtime 2s -count 3 ./server/rlqs/"
go test -run '^$' -bench Report -benchtime 2s -count 3 ./server/rlqs/
