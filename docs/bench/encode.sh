#!/usr/bin/env bash
# encode.sh measures the answer encoder, server/wire's AppendResponse, against
# the vtprotobuf marshaller go-control-plane generates for the same messages
# (compiled only with -tags vtprotobuf), on the same answers (1 and 10
# descriptors), as an interleaved A/B: one test binary, ROUNDS rounds, each
# running both benchmarks, in the order A B, then B A, then A B, ... on one
# core (-test.cpu 1). proto.Marshal, what an untagged build would fall back
# to, runs in every round too, as a reference. It prints every run, then each
# benchmark's minimum and median, and the ratios of the medians.
#
# Usage: docs/bench/encode.sh [ROUNDS] [BENCHTIME]     (defaults: 12 1s)
# run.sh calls it; it also runs alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
export GOTOOLCHAIN=local
ROUNDS="${1:-12}"
BT="${2:-1s}"
OUT="$(mktemp -d)"
go test -c -tags vtprotobuf -o "$OUT/wire.test" ./server/wire/
# The binary checks first that both encoders write the same bytes.
"$OUT/wire.test" -test.run 'VTProtoMatchesWire|EncodeMatchesProto' -test.count 1 >/dev/null
A='^BenchmarkEncode$/./wire$'
B='^BenchmarkEncodeVTProto$'
REF='^BenchmarkEncode$/./proto$'
run() {
	"$OUT/wire.test" -test.run '^$' -test.bench "$1" -test.benchtime "$BT" -test.cpu 1 -test.benchmem |
		grep '^Benchmark' | tee -a "$OUT/encode.txt"
}
echo "encoder A/B: $ROUNDS rounds, benchtime $BT, one core; $(go version); load before: $(uptime)"
for r in $(seq "$ROUNDS"); do
	if [ $((r % 2)) = 1 ]; then run "$A"; run "$B"; else run "$B"; run "$A"; fi
	run "$REF"
done
echo "load after: $(uptime)"
python3 - "$OUT/encode.txt" <<'EOF'
import re, statistics, sys
runs = {}
for l in open(sys.argv[1]):
    m = re.match(r"Benchmark(\S+)\s+\d+\s+([\d.]+) ns/op\s+(\d+) B/op\s+(\d+) allocs/op", l)
    if m:
        runs.setdefault(m.group(1), []).append((float(m.group(2)), int(m.group(4))))
print()
print("| benchmark | runs | min ns/op | median ns/op | allocs/op |")
print("|---|---|---|---|---|")
for name, v in sorted(runs.items()):
    ns = [x for x, _ in v]
    print(f"| {name} | {len(v)} | {min(ns):.1f} | {statistics.median(ns):.1f} | {max(a for _, a in v)} |")
print()
for n in ("1-descriptor", "10-descriptors"):
    a = [x for x, _ in runs.get(f"Encode/{n}/wire", [])]
    b = [x for x, _ in runs.get(f"EncodeVTProto/{n}", [])]
    p = [x for x, _ in runs.get(f"Encode/{n}/proto", [])]
    if not a or not b or not p:
        sys.exit(f"{n}: a benchmark did not run")
    print(f"{n}: vtprotobuf / hand-written, medians {statistics.median(b) / statistics.median(a):.3f}x, minimums {min(b) / min(a):.3f}x;"
          f" proto.Marshal / hand-written, medians {statistics.median(p) / statistics.median(a):.3f}x")
EOF
