#!/usr/bin/env bash
# run.sh reproduces the daemon's table in docs/BENCHMARKS.md with one command and
# prints which targets were met. It builds sharelimit and starts, side by side:
#   - the plain floor: `bench --serve-noop --noop-server plain`, a no-op RLS on
#     grpc.NewServer() defaults at Go's default GC, answering with the fields a
#     real answer carries;
#   - the tuned floor: the same no-op on serve's own gRPC options and GC pacing;
#   - sharelimit on docs/bench/*.yaml.
# Every comparison alternates A B A B in one run, with the same client. The
# plain floor and sharelimit are also compared with a second client written
# elsewhere, nghttp2's h2load, with the same request. The
# latency comparison pins the servers to CPU 0 and the load generator to CPU 1
# (taskset); the others leave all three on every core, as a node would.
# The answer encoder's A/B against vtprotobuf (encode.sh) and the engine's Go
# benchmarks run last.
#
# Usage: docs/bench/run.sh [ROUNDS] [DURATION]     (defaults: 4 5s)
# Needs: go, curl, python3, taskset (util-linux), h2load (nghttp2-client),
# at least 2 CPUs.
set -euo pipefail
cd "$(dirname "$0")/../.."
export GOTOOLCHAIN=local
ROUNDS="${1:-4}"
DUR="${2:-5s}"
OUT="$(mktemp -d)"
BIN="$OUT/sharelimit"
go build -o "$BIN" ./cmd/sharelimit
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(go version); results in $OUT"
echo "load before: $(uptime)"

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

echo "## throughput and CPU per decision: 1 descriptor, closed loop, 16 workers over 2 connections (domain bench: the limit never binds, every answer OK)"
cmp plain "$PLAIN" "$PLAIN_PID" plain --concurrency 16 --conns 2 --domain bench
cmp tuned "$TUNED" "$TUNED_PID" tuned --concurrency 16 --conns 2 --domain bench

echo "## the same with h2load (nghttp2) as the client: plain floor (A) against sharelimit (B), alternating"
# h2load posts one hand-built request, gRPC-framed: domain bench, one
# descriptor {generic_key=key-0}, the load generator's 1-descriptor call, on 16
# streams over 2 connections (-c 2 -m 8), as the load generator. Domain bench
# allows 1e9 a second: the limit never binds, and both servers answer OK.
# h2load counts an HTTP 200 as a success and cannot read grpc-status, so the
# request is first sent once with curl to both servers, which must answer
# grpc-status 0 and overall_code OK, and every sharelimit run is checked by the
# daemon's own counters: at least one OK decision per call h2load counted as a
# success and at most one per call it started (a call still in flight when
# h2load stops may or may not have been decided), no OVER_LIMIT, no invalid
# request. Each measured run follows a 1 s run that is not measured; the
# server's CPU is utime+stime from /proc/PID/stat over the measured run.
H2_BODY="$OUT/h2load-request.bin"
python3 - "$H2_BODY" <<'EOF'
import sys
def field(n, b): return bytes([n << 3 | 2, len(b)]) + b
entry = field(1, b"generic_key") + field(2, b"key-0")
msg = field(1, b"bench") + field(2, field(1, entry))
open(sys.argv[1], "wb").write(b"\0" + len(msg).to_bytes(4, "big") + msg)
EOF
h2() {
	h2load -c 2 -m 8 -t 1 -D "$2" -d "$H2_BODY" -H 'content-type: application/grpc' -H 'te: trailers' \
		"http://$1/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
}
# h2check ADDR: the request, once, with curl; grpc-status 0 and overall_code OK (field 1 = 1).
h2check() {
	curl -s --http2-prior-knowledge -X POST -H 'content-type: application/grpc' -H 'te: trailers' \
		--data-binary @"$H2_BODY" -D "$OUT/h2check.hdr" -o "$OUT/h2check.bin" \
		"http://$1/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	if ! grep -q '^grpc-status: 0' "$OUT/h2check.hdr" || [ "$(od -An -tx1 -j5 -N2 "$OUT/h2check.bin" | tr -d ' ')" != 0801 ]; then
		echo "the h2load request is not answered OK by $1:" >&2
		cat "$OUT/h2check.hdr" >&2
		od -An -tx1 "$OUT/h2check.bin" >&2
		exit 1
	fi
}
h2check "$PLAIN"
h2check "$SL"
cputicks() { awk '{sub(/.*\) /, ""); print $12 + $13}' "/proc/$1/stat"; }
# counted KIND: the daemon's OK or OVER_LIMIT decisions in domain bench, or its invalid requests.
counted() {
	curl -s "$ADMIN/metrics" | awk -v k="$1" '
		k == "invalid" && /^sharelimit_invalid_requests_total / {n += $2}
		index($1, "sharelimit_decisions_total{code=\"" k "\",domain=\"bench\",") == 1 {n += $2}
		END {printf "%d", n}'
}
# h2run LABEL ADDR PID ROUND: one measured h2load run; appends
# "LABEL ROUND CPU_TICKS OK OVER_LIMIT INVALID" (counts - for the floor) to
# h2load.txt. The daemon's counts take in the unmeasured run before, whose
# output is kept too.
h2run() {
	local label=$1 addr=$2 pid=$3 round=$4 c0 c1 k0=() k1=() k
	if [ "$label" = sharelimit ]; then for k in OK OVER_LIMIT invalid; do k0+=("$(counted $k)"); done; fi
	h2 "$addr" 1s >"$OUT/h2load-$label-$round-warm.txt"
	c0=$(cputicks "$pid")
	h2 "$addr" "$DUR" >"$OUT/h2load-$label-$round.txt"
	c1=$(cputicks "$pid")
	if [ "$label" = sharelimit ]; then
		for k in OK OVER_LIMIT invalid; do k1+=("$(counted $k)"); done
		echo "$label $round $((c1 - c0)) $((k1[0] - k0[0])) $((k1[1] - k0[1])) $((k1[2] - k0[2]))" >>"$OUT/h2load.txt"
	else
		echo "$label $round $((c1 - c0)) - - -" >>"$OUT/h2load.txt"
	fi
}
for r in $(seq "$ROUNDS"); do
	h2run plain "$PLAIN" "$PLAIN_PID" "$r"
	h2run sharelimit "$SL" "$SL_PID" "$r"
done
echo "h2load: done"

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

echo "## the answer encoder against vtprotobuf's (one core, 12 alternating rounds; docs/bench/encode.sh)"
docs/bench/encode.sh 12 1s | tee "$OUT/encode.txt"

echo "## engine benchmarks (one core, 3 runs)"
go test ./descriptors/ -run '^$' -bench 'DecideFixedRule/serial|DecidePerValue100k$' -benchmem -cpu 1 -count 3 | tee "$OUT/engine.txt"
echo "load after: $(uptime)"

python3 - "$OUT" "$LIVE" "$(getconf CLK_TCK)" <<'EOF'
import json, statistics, sys, re
out, live, tick = sys.argv[1], int(float(sys.argv[2])), int(sys.argv[3])
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
# The targets that matter are against the plain floor: the direct transport
# must stay at >= 1.5x its throughput and <= 0.4x its CPU per decision. The
# tuned floor, on sharelimit's own gRPC options, isolates the cost of deciding,
# and keeps the earlier targets (>= 0.90x throughput, <= 1.15x CPU).
for name, label, tt, ct in (("plain", "plain grpc-go no-op", 1.5, 0.4), ("tuned", "tuned no-op", 0.90, 1.15)):
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
# h2load: per side, the medians over the rounds of req/s (succeeded calls over
# the measured time) and of the server's CPU per call.
h2 = {"plain": [], "sharelimit": []}
h2bad, h2calls, h2checks = 0, 0, []
for l in open(f"{out}/h2load.txt"):
    label, rnd, ticks, ok, over, inv = l.split()
    def parse(name):
        t = open(f"{out}/{name}.txt").read()
        secs = float(re.search(r"finished in ([\d.]+)s", t).group(1))
        total, started, done, succ, failed, errd, tmo = map(int, re.search(
            r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout", t).groups())
        # A call still in flight at the end may have its status counted
        # and not be done: 2xx may exceed the successes, never fall short.
        s2, s3, s4, s5 = map(int, re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", t).groups())
        return secs, started, succ, (total - succ) + failed + errd + tmo + max(0, succ - s2) + s3 + s4 + s5
    secs, started, succ, bad = parse(f"h2load-{label}-{rnd}")
    _, wstarted, wsucc, wbad = parse(f"h2load-{label}-{rnd}-warm")
    h2bad += bad + wbad
    h2calls += succ + wsucc
    if label == "sharelimit":
        # both runs: every success an OK decision, no more decisions than
        # calls started; none over the limit, none invalid
        h2checks.append(succ + wsucc <= int(ok) <= started + wstarted and int(over) == 0 and int(inv) == 0)
        if not h2checks[-1]:
            print(f"h2load round {rnd}: {started + wstarted} started, {succ + wsucc} succeeded, but the daemon counted {ok} OK, {over} OVER_LIMIT, {inv} invalid")
    h2[label].append((succ / secs, int(ticks) * 1e9 / tick / max(1, succ)))
errors += h2bad
hm = {k: (statistics.median(x for x, _ in v), statistics.median(y for _, y in v)) for k, v in h2.items()}
d = f'{hm["sharelimit"][0]:.0f} vs {hm["plain"][0]:.0f} req/s; {us(hm["sharelimit"][1])} vs {us(hm["plain"][1])} CPU; medians of {len(h2["plain"])} rounds, 16 streams over 2 connections'
row("h2load: throughput vs plain grpc-go no-op", f'{hm["sharelimit"][0] / hm["plain"][0]:.3f}x', "", None, d)
row("h2load: CPU per decision vs plain grpc-go no-op", f'{hm["sharelimit"][1] / hm["plain"][1]:.3f}x', "", None, d)
row("h2load: every call answered OK", f"{h2bad} failed", "0, and the daemon's counts agree", h2bad == 0 and all(h2checks),
    f"{h2calls} calls, each HTTP 200; the daemon's counts agree in {sum(h2checks)} of {len(h2checks)} rounds (an OK decision per success, none over the limit, none invalid): the limit (1e9/s) never binds")
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
for l in open(f"{out}/encode.txt"):
    m = re.match(r"(\S+): vtprotobuf / hand-written, medians ([\d.]+)x, minimums ([\d.]+)x; proto.Marshal / hand-written, medians ([\d.]+)x", l)
    if m:
        row(f"answer encoder, {m.group(1)}: vtprotobuf / hand-written", f"{m.group(2)}x", "", None,
            f"medians (minimums {m.group(3)}x) of 12 alternating rounds; proto.Marshal {m.group(4)}x; vtprotobuf needs -tags vtprotobuf")
row("failed calls in every run", str(errors), "0", errors == 0, "errors and unknown codes, all runs")
print()
print("| measure | reached | target | | detail |")
print("|---|---|---|---|---|")
for r in rows: print("| " + " | ".join(r) + " |")
EOF
