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
trap 'kill $PLAIN_PID $TUNED_PID $SL_PID 2>/dev/null; wait 2>/dev/null' EXIT
sleep 1

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

echo "## realistic mix (3-4 descriptors, wildcard, 100k per-IP keys, ~10% OVER_LIMIT) against the plain floor"
cmp mix "$PLAIN" "$PLAIN_PID" plain --concurrency 16 --conns 2 --shape mix --cardinality 100000 --domain bench-mix

echo "## servers on CPU 0, load generator on CPU 1: closed-loop throughput, then p99 at half the plain floor's"
for p in $PLAIN_PID $SL_PID; do taskset -a -cp 0 "$p" >/dev/null; done
pinned() {
	local name=$1
	shift
	taskset -c 1 "$BIN" bench --target-a "$PLAIN" --pid-a "$PLAIN_PID" --label-a plain --target-b "$SL" --pid-b "$SL_PID" \
		--label-b sharelimit --rounds "$ROUNDS" --duration "$DUR" --warmup 1s --progress=false --conns 2 \
		--domain bench --json "$@" >"$OUT/$name.json"
	echo "$name: done"
}
pinned pinned --concurrency 16
HALF=$(python3 -c "import json; print(int(json.load(open('$OUT/pinned.json'))['a']['median']['requests_per_second'] / 2))")
pinned latency --rate "$HALF"
for p in $PLAIN_PID $SL_PID; do taskset -a -cp "0-$(($(nproc) - 1))" "$p" >/dev/null; done

echo "## 10 descriptors vs 1 (per-IP keys, cardinality 1000), alternating"
for _ in $(seq "$ROUNDS"); do
	one desc1 --descriptors 1 --shape remote_address --cardinality 1000 --domain bench
	one desc10 --descriptors 10 --shape remote_address --cardinality 1000 --domain bench
done

echo "## 1M live buckets vs 1 key"
# Domain bench-hold refills 100 a day: every key drawn from keeps a live,
# non-full bucket, never swept. The warm-up creates all 1M.
"$BIN" bench --target "$SL" --concurrency 16 --conns 2 --shape remote_address --cardinality 1000000 \
	--requests 1000000 --warmup 0 --domain bench-hold --progress=false >/dev/null
LIVE=$(curl -s "$ADMIN/metrics" | awk '/^sharelimit_buckets / {printf "%d", $2}')
for _ in $(seq "$ROUNDS"); do
	one key1 --shape generic_key --cardinality 1 --domain bench
	one live1m --shape remote_address --cardinality 1000000 --domain bench-hold
done
LIVE_AFTER=$(curl -s "$ADMIN/metrics" | awk '/^sharelimit_buckets / {printf "%d", $2}')
RSS=$(curl -s "$ADMIN/metrics" | awk '/^process_resident_memory_bytes / {printf "%d", $2 / 1048576}')
echo "live buckets: $LIVE after the warm-up, $LIVE_AFTER after the runs; RSS $RSS MiB"

echo "## heap allocations per request, whole daemon (go_memstats_mallocs_total over 200k requests)"
mallocs() { curl -s "$ADMIN/metrics" | awk '/^go_memstats_mallocs_total / {printf "%d", $2}'; }
for d in 1 10; do
	m0=$(mallocs)
	"$BIN" bench --target "$SL" --concurrency 16 --requests 200000 --warmup 0 --descriptors "$d" \
		--shape remote_address --cardinality 1000 --domain bench --progress=false >/dev/null
	m1=$(mallocs)
	echo "allocs$d $(((m1 - m0) / 200000))" | tee -a "$OUT/allocs.txt"
done

echo "## engine benchmarks (one core, 3 runs)"
go test ./descriptors/ -run '^$' -bench 'DecideFixedRule/serial|DecidePerValue100k$' -benchmem -cpu 1 -count 3 | tee "$OUT/engine.txt"

python3 - "$OUT" "$LIVE" <<'EOF'
import json, statistics, sys, re
out, live = sys.argv[1], int(float(sys.argv[2]))
def load(n): return json.load(open(f"{out}/{n}.json"))
def med(n, key="requests_per_second"):
    return statistics.median(json.loads(l)[key] for l in open(f"{out}/{n}.jsonl") if l.strip())
rows = []
def row(what, got, target, ok, detail):
    rows.append((what, got, target, "met" if ok else "MISSED", detail))
def side(c, s, k): return c[s]["median"][k]
for name, label in (("plain", "plain grpc-go no-op"), ("tuned", "tuned no-op")):
    c = load(name)
    r = c["ratio_b_over_a"]
    tp = r["requests_per_second"]; cpu = r.get("server_cpu_per_decision", float("nan"))
    d = f'{side(c,"b","requests_per_second"):.0f} vs {side(c,"a","requests_per_second"):.0f} req/s; {side(c,"b","server_cpu_per_decision_ns")/1e3:.1f} vs {side(c,"a","server_cpu_per_decision_ns")/1e3:.1f} us CPU'
    if name == "plain":
        row(f"throughput vs {label}", f"{tp:.3f}x", ">= 1.25x", tp >= 1.25, d)
        row(f"CPU per decision vs {label}", f"{cpu:.3f}x", "<= 0.75x", cpu <= 0.75, d)
    else:
        row(f"throughput vs {label}", f"{tp:.3f}x", "(reported)", True, d)
        row(f"CPU per decision vs {label}", f"{cpu:.3f}x", "(reported)", True, d)
c = load("mix")
runs = c["b"]["runs"]; over = sum(r["over_limit"] for r in runs) / max(1, sum(r["requests"] for r in runs))
row("realistic mix vs plain no-op: throughput", f'{c["ratio_b_over_a"]["requests_per_second"]:.3f}x', "(reported)", True,
    f'{side(c,"b","requests_per_second"):.0f} req/s, {over:.1%} OVER_LIMIT; CPU {c["ratio_b_over_a"].get("server_cpu_per_decision", float("nan")):.3f}x')
c = load("pinned")
row("throughput vs plain no-op, pinned apart", f'{c["ratio_b_over_a"]["requests_per_second"]:.3f}x', "(reported)", True,
    f'{side(c,"b","requests_per_second"):.0f} vs {side(c,"a","requests_per_second"):.0f} req/s; CPU {c["ratio_b_over_a"].get("server_cpu_per_decision", float("nan")):.3f}x')
c = load("latency")
p = c["ratio_b_over_a"]["p99"]
row("p99 at half load vs plain no-op (pinned apart)", f"{p:.3f}x", "<= 1.2x", p <= 1.2,
    f'{side(c,"b","p99_ns")/1e3:.0f} vs {side(c,"a","p99_ns")/1e3:.0f} us at {c["a"]["runs"][0]["rate"]:.0f}/s')
r10 = med("desc10") / med("desc1")
row("10 descriptors vs 1", f"{r10:.3f}x", ">= 0.75x", r10 >= 0.75, f'{med("desc10"):.0f} vs {med("desc1"):.0f} req/s (medians)')
rl = med("live1m") / med("key1")
row("1M live buckets vs 1 key", f"{rl:.3f}x", ">= 0.85x", rl >= 0.85 and live >= 1_000_000,
    f'{med("live1m"):.0f} vs {med("key1"):.0f} req/s; {live} live buckets')
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
print()
print("| measure | reached | target | | detail |")
print("|---|---|---|---|---|")
for r in rows: print("| " + " | ".join(r) + " |")
EOF
