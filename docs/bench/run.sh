#!/usr/bin/env bash
# run.sh reproduces the daemon's table in docs/BENCHMARKS.md with one command and
# prints which targets were met. It builds sharelimit and starts, side by side:
#   - the plain floor: `bench --serve-noop --noop-server plain`, a no-op RLS on
#     grpc.NewServer() defaults at Go's default GC, answering with the fields a
#     real answer carries;
#   - the tuned floor: the same no-op on serve's own gRPC options and GC pacing;
#   - sharelimit on docs/bench/*.yaml.
# Every comparison alternates A B A B in one run, with the same client. The
# latency comparison pins the servers to CPU 0 and the load generator to CPU 1
# (taskset); the others leave all three on every core, as a node would.
# The engine's Go benchmarks run last.
#
# Usage: docs/bench/run.sh [ROUNDS] [DURATION]     (defaults: 4 5s)
# Needs: go, curl, python3, taskset (util-linux), at least 2 CPUs.
set -euo pipefail
cd "$(dirname "$0")/../.."
export GOTOOLCHAIN=local
ROUNDS="${1:-4}"
DUR="${2:-5s}"
OUT="$(mktemp -d)"
BIN="$OUT/sharelimit"
go build -o "$BIN" ./cmd/sharelimit
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(go version); results in $OUT"

PLAIN=127.0.0.1:19091 TUNED=127.0.0.1:19094 SL=127.0.0.1:19092 ADMIN=127.0.0.1:19093
"$BIN" bench --serve-noop "$PLAIN" --noop-server plain >/dev/null 2>&1 &
PLAIN_PID=$!
"$BIN" bench --serve-noop "$TUNED" --noop-server tuned >/dev/null 2>&1 &
TUNED_PID=$!
"$BIN" serve --config-dir docs/bench --grpc-addr "$SL" --http-addr "$ADMIN" --log-level warn --max-buckets 2000000 &
SL_PID=$!
# The same daemon on grpc-go's transport (--grpc-transport grpc-go), for the
# before/after of the direct transport.
GG=127.0.0.1:19098
"$BIN" serve --config-dir docs/bench --grpc-addr "$GG" --http-addr 127.0.0.1:19099 --log-level warn --grpc-transport grpc-go &
GG_PID=$!
trap 'kill $PLAIN_PID $TUNED_PID $SL_PID $GG_PID 2>/dev/null; wait 2>/dev/null' EXIT
sleep 1
# Every server takes 10 s of load before anything is measured: the first
# seconds of a process (stacks, pools and the GC's pace growing) are not
# what a node's long-running daemon shows.
for t in "$PLAIN" "$TUNED" "$SL" "$GG"; do
	"$BIN" bench --target "$t" --concurrency 16 --conns 2 --duration 10s --warmup 0 --domain bench --progress=false >/dev/null
done

# cmp NAME A_ADDR A_PID A_LABEL [bench flags]: sharelimit (B) against A.
cmp() {
	local name=$1 a=$2 apid=$3 alabel=$4
	shift 4
	"$BIN" bench --target-a "$a" --pid-a "$apid" --label-a "$alabel" \
		--target-b "$SL" --pid-b "$SL_PID" --label-b sharelimit \
		--rounds "$ROUNDS" --duration "$DUR" --warmup 1s --progress=false "$@" --json >"$OUT/$name.json"
	echo "$name: done"
}
# one NAME [bench flags]: one sharelimit run, appended to NAME.jsonl.
one() {
	local name=$1
	shift
	"$BIN" bench --target "$SL" --server-pid "$SL_PID" --concurrency 16 --conns 2 --duration "$DUR" --warmup 1s \
		--progress=false --json "$@" | tr -d '\n' >>"$OUT/$name.jsonl"
	echo >>"$OUT/$name.jsonl"
}

echo "## throughput and CPU per decision: 1 descriptor, closed loop, 16 workers over 2 connections"
cmp plain "$PLAIN" "$PLAIN_PID" plain --concurrency 16 --conns 2 --domain bench
cmp tuned "$TUNED" "$TUNED_PID" tuned --concurrency 16 --conns 2 --domain bench

echo "## the direct transport against grpc-go's, same daemon: 1 descriptor, then 10"
cmp transport1 "$GG" "$GG_PID" grpc-go --concurrency 16 --conns 2 --domain bench
cmp transport10 "$GG" "$GG_PID" grpc-go --concurrency 16 --conns 2 --domain bench --descriptors 10 --shape remote_address --cardinality 1000
kill "$GG_PID"

echo "## realistic mix (3-4 descriptors, wildcard, 100k per-IP keys, ~10% OVER_LIMIT) against the plain floor"
cmp mix "$PLAIN" "$PLAIN_PID" plain --concurrency 16 --conns 2 --shape mix --cardinality 100000 --domain bench-mix

echo "## servers on CPU 0, load generator on CPU 1: closed-loop throughput, then p99 at half the plain floor's"
# Fresh servers started on CPU 0 (so Go sizes itself to one CPU, as a pinned
# deployment would), not the ones above re-pinned: those carried the earlier
# sections' state and measured a p99 1.7x the floor's that fresh ones do not
# show (docs/BENCHMARKS.md).
P_PLAIN=127.0.0.1:19095 P_SL=127.0.0.1:19096
taskset -c 0 "$BIN" bench --serve-noop "$P_PLAIN" --noop-server plain >/dev/null 2>&1 &
P_PLAIN_PID=$!
taskset -c 0 "$BIN" serve --config-dir docs/bench --grpc-addr "$P_SL" --http-addr 127.0.0.1:19097 --log-level warn &
P_SL_PID=$!
sleep 1
for t in "$P_PLAIN" "$P_SL"; do
	taskset -c 1 "$BIN" bench --target "$t" --concurrency 16 --conns 2 --duration 5s --warmup 0 --domain bench --progress=false >/dev/null
done
pinned() {
	local name=$1
	shift
	taskset -c 1 "$BIN" bench --target-a "$P_PLAIN" --pid-a "$P_PLAIN_PID" --label-a plain --target-b "$P_SL" --pid-b "$P_SL_PID" \
		--label-b sharelimit --rounds "$ROUNDS" --duration "$DUR" --warmup 1s --progress=false --conns 2 \
		--domain bench --json "$@" >"$OUT/$name.json"
	echo "$name: done"
}
pinned pinned --concurrency 16
HALF=$(python3 -c "import json; print(int(json.load(open('$OUT/pinned.json'))['a']['median']['requests_per_second'] / 2))")
pinned latency --rate "$HALF"
kill "$P_PLAIN_PID" "$P_SL_PID"

echo "## 10 descriptors vs 1 (per-IP keys, cardinality 1000), alternating"
for _ in $(seq "$ROUNDS"); do
	one desc1 --descriptors 1 --shape remote_address --cardinality 1000 --domain bench
	one desc10 --descriptors 10 --shape remote_address --cardinality 1000 --domain bench
done

echo "## 1M live buckets vs 1 key"
# Domain bench-hold refills 100 a day: every key drawn from keeps a live,
# non-full bucket, never swept. The warm-up creates all 1M; the count is the
# gauge's rise over it (other domains' buckets are live too), read after a
# sweep (every 10 s) has dropped the refilled buckets of the runs before, which
# would otherwise vanish during the warm-up and hide as many. Each measured run
# walks the keys from the first again, touching ~150k of the 1M; the store's
# tables hold all 1M either way, spread over memory by the key hash. The 1-key
# side is domain bench's generic_key rule (the bench-hold rule would refuse a
# single key after 100): both sides answer OK.
sleep 11
LIVE0=$(curl -s "$ADMIN/metrics" | awk '/^sharelimit_buckets / {printf "%d", $2}')
"$BIN" bench --target "$SL" --concurrency 16 --conns 2 --shape remote_address --cardinality 1000000 \
	--requests 1000000 --warmup 0 --domain bench-hold --progress=false >/dev/null
LIVE=$(($(curl -s "$ADMIN/metrics" | awk '/^sharelimit_buckets / {printf "%d", $2}') - LIVE0))
for _ in $(seq "$ROUNDS"); do
	one key1 --shape generic_key --cardinality 1 --domain bench
	one live1m --shape remote_address --cardinality 1000000 --domain bench-hold
done
LIVE_AFTER=$(($(curl -s "$ADMIN/metrics" | awk '/^sharelimit_buckets / {printf "%d", $2}') - LIVE0))
RSS=$(curl -s "$ADMIN/metrics" | awk '/^process_resident_memory_bytes / {printf "%d", $2 / 1048576}')
echo "bench-hold buckets: $LIVE after the warm-up, $LIVE_AFTER after the runs; RSS $RSS MiB"

echo "## heap allocations per request, whole daemon (go_memstats_mallocs_total over 200k requests)"
mallocs() { curl -s "$ADMIN/metrics" | awk '/^go_memstats_mallocs_total / {printf "%d", $2}'; }
for d in 1 10; do
	m0=$(mallocs)
	"$BIN" bench --target "$SL" --concurrency 16 --requests 200000 --warmup 0 --descriptors "$d" \
		--shape remote_address --cardinality 1000 --domain bench --progress=false >/dev/null
	m1=$(mallocs)
	echo "allocs$d $(awk -v a="$m0" -v b="$m1" 'BEGIN {printf "%.1f", (b - a) / 200000}')" | tee -a "$OUT/allocs.txt"
done

echo "## engine benchmarks (one core, 3 runs)"
go test ./descriptors/ -run '^$' -bench 'DecideFixedRule/serial|DecidePerValue100k$' -benchmem -cpu 1 -count 3 | tee "$OUT/engine.txt"

python3 - "$OUT" "$LIVE" <<'EOF'
import json, statistics, sys, re
out, live = sys.argv[1], int(float(sys.argv[2]))
def load(n): return json.load(open(f"{out}/{n}.json"))
def lines(n): return [json.loads(l) for l in open(f"{out}/{n}.jsonl") if l.strip()]
def med(n): return statistics.median(r["requests_per_second"] for r in lines(n))
rows, errors = [], 0
def row(what, got, target, ok, detail):
    rows.append((what, got, target, {True: "met", False: "MISSED", None: ""}[ok], detail))
def side(c, s, k): return c[s]["median"][k]
def runs(c): return c["a"]["runs"] + c["b"]["runs"]
def us(ns): return f"{ns / 1e3:.1f} us"
for name in ("plain", "tuned", "transport1", "transport10", "mix", "pinned", "latency"):
    errors += sum(r["errors"] + r["unknown"] for r in runs(load(name)))
for name in ("desc1", "desc10", "key1", "live1m"):
    errors += sum(r["errors"] + r["unknown"] for r in lines(name))
# The issue's targets are against the plain floor; the tuned floor, on
# sharelimit's own gRPC options, isolates the cost of deciding, and keeps the
# earlier targets (>= 0.90x throughput, <= 1.15x CPU).
for name, label, tt, ct in (("plain", "plain grpc-go no-op", 1.25, 0.75), ("tuned", "tuned no-op", 0.90, 1.15)):
    c = load(name)
    r = c["ratio_b_over_a"]
    tp, cpu = r["requests_per_second"], r.get("server_cpu_per_decision", float("nan"))
    d = f'{side(c,"b","requests_per_second"):.0f} vs {side(c,"a","requests_per_second"):.0f} req/s; {us(side(c,"b","server_cpu_per_decision_ns"))} vs {us(side(c,"a","server_cpu_per_decision_ns"))} CPU'
    row(f"throughput vs {label}", f"{tp:.3f}x", f">= {tt}x", tp >= tt, d)
    row(f"CPU per decision vs {label}", f"{cpu:.3f}x", f"<= {ct}x", cpu <= ct, d)
for name, what in (("transport1", "1 descriptor"), ("transport10", "10 descriptors")):
    c = load(name); r = c["ratio_b_over_a"]
    row(f"direct transport vs grpc-go's, {what}", f'{r["requests_per_second"]:.3f}x', "", None,
        f'throughput; CPU per decision {r.get("server_cpu_per_decision", float("nan")):.3f}x ({us(side(c,"b","server_cpu_per_decision_ns"))} vs {us(side(c,"a","server_cpu_per_decision_ns"))})')
c = load("mix")
rs = c["b"]["runs"]; over = sum(r["over_limit"] for r in rs) / max(1, sum(r["requests"] for r in rs))
row("realistic mix vs plain no-op: throughput", f'{c["ratio_b_over_a"]["requests_per_second"]:.3f}x', "", None,
    f'{side(c,"b","requests_per_second"):.0f} req/s, {over:.1%} OVER_LIMIT; CPU per decision {c["ratio_b_over_a"].get("server_cpu_per_decision", float("nan")):.3f}x')
c = load("pinned")
row("throughput vs plain no-op, pinned apart", f'{c["ratio_b_over_a"]["requests_per_second"]:.3f}x', "", None,
    f'{side(c,"b","requests_per_second"):.0f} vs {side(c,"a","requests_per_second"):.0f} req/s; CPU per decision {c["ratio_b_over_a"].get("server_cpu_per_decision", float("nan")):.3f}x')
c = load("latency")
p = c["ratio_b_over_a"]["p99"]
row("p99 at half load vs plain no-op (pinned apart)", f"{p:.3f}x", "<= 1.2x", p <= 1.2,
    f'{us(side(c,"b","p99_ns"))} vs {us(side(c,"a","p99_ns"))} at {c["a"]["runs"][0]["rate"]:.0f}/s')
r10 = med("desc10") / med("desc1")
def cpu(n): return statistics.median(r["server_cpu"]["per_decision_ns"] for r in lines(n))
row("10 descriptors vs 1", f"{r10:.3f}x", ">= 0.75x", r10 >= 0.75, f'{med("desc10"):.0f} vs {med("desc1"):.0f} req/s (medians); the daemon\'s CPU per call {us(cpu("desc10"))} vs {us(cpu("desc1"))}')
rl = med("live1m") / med("key1")
row("1M live buckets vs 1 key", f"{rl:.3f}x", ">= 0.85x", rl >= 0.85 and live >= 1_000_000,
    f'{med("live1m"):.0f} vs {med("key1"):.0f} req/s; {live} bench-hold buckets live')
eng = {}
for l in open(f"{out}/engine.txt"):
    m = re.match(r"Benchmark(\S+?)(-\d+)?\s+\d+\s+([\d.]+) ns/op.*?(\d+) allocs/op", l)
    if m: eng.setdefault(m.group(1), []).append((float(m.group(3)), int(m.group(4))))
for name, target in (("DecideFixedRule/serial", 150), ("DecidePerValue100k", 300)):
    v = eng.get(name, [])
    if not v:
        row(name, "-", f"<= {target} ns, 0 allocs", False, "did not run"); continue
    ns = statistics.median(x for x, _ in v); allocs = max(a for _, a in v)
    row(name, f"{ns:.1f} ns", f"<= {target} ns, 0 allocs", ns <= target and allocs == 0, f"median of {len(v)}; {allocs} allocs/op")
row("failed calls in every run", str(errors), "0", errors == 0, "errors and unknown codes, all runs")
print()
print("| measure | reached | target | | detail |")
print("|---|---|---|---|---|")
for r in rows: print("| " + " | ".join(r) + " |")
EOF
