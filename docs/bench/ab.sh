#!/usr/bin/env bash
# ab.sh runs Go benchmarks of two commits as an interleaved A/B: one test
# binary per commit, run alternately (A B A B ...) so that the machine's drift
# falls on both sides alike, then prints each benchmark's minimum and median
# ns/op, the change, and the allocations of each side.
#
# Usage: docs/bench/ab.sh OLD NEW ROUNDS 'BENCH_REGEXP' PKG_AT_OLD [PKG_AT_NEW]
#   OLD, NEW     commits (anything git rev-parse takes)
#   PKG_AT_*     the package's directory at that commit (it may have moved)
# Environment: BENCHTIME (default 500ms), CPU (GOMAXPROCS, default 1).
# Example (issue 32's engine split):
#   docs/bench/ab.sh fef4bc4 main 10 'DecideFixedRule/serial|DecidePerValue100k$|Decide10Descriptors' \
#     ./descriptors ./descriptors/engine
set -euo pipefail
cd "$(dirname "$0")/../.."
export GOTOOLCHAIN=local
[[ $# -ge 5 ]] || { sed -n '2,14p' "$0"; exit 2; }
OLD=$1 NEW=$2 ROUNDS=$3 BENCH=$4 PKG_A=$5 PKG_B=${6:-$5}
BENCHTIME=${BENCHTIME:-500ms} CPU=${CPU:-1}
OUT=$(mktemp -d)
trap 'git worktree remove --force "$OUT/a" >/dev/null 2>&1 || true; git worktree remove --force "$OUT/b" >/dev/null 2>&1 || true' EXIT
build() { # side commit pkg
  git worktree add -q --detach "$OUT/$1" "$2"
  (cd "$OUT/$1" && go test -c -o "$OUT/$1.test" "$3")
}
build a "$OLD" "$PKG_A"
build b "$NEW" "$PKG_B"
echo "A = $(git rev-parse --short "$OLD") $PKG_A, B = $(git rev-parse --short "$NEW") $PKG_B"
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(go version); GOMAXPROCS $CPU; $ROUNDS rounds of $BENCHTIME"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((i = 1; i <= ROUNDS; i++)); do
  for side in a b; do
    "$OUT/$side.test" -test.run '^$' -test.bench "$BENCH" -test.benchtime "$BENCHTIME" \
      -test.cpu "$CPU" -test.benchmem | grep '^Benchmark' | sed "s/^/$side /" >>"$OUT/results"
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| benchmark | runs | A min | B min | A median | B median | Δ min | Δ median | paired B/A median | B/op, allocs/op A → B |"
echo "|---|---|---|---|---|---|---|---|---|---|"
# Columns: side name iterations ns "ns/op" bytes "B/op" allocs "allocs/op".
awk '
  { name = $2; sub(/-[0-9]+$/, "", name); v[$1, name] = v[$1, name] " " $4
    # Round i of A and round i of B ran next to each other: their ratio
    # is free of the drift between rounds.
    if ($1 == "a") a[name, ++na[name]] = $4; else r[name] = r[name] " " ($4 / a[name, ++nb[name]])
    alloc[$1, name] = $6 "/" $8; names[name] = 1 }
  function stats(s, out,   a, n, i, j, t) {
    n = split(substr(s, 2), a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    out["min"] = a[1]; out["med"] = (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2; out["n"] = n
  }
  END {
    for (name in names) {
      stats(v["a", name], A); stats(v["b", name], B); stats(r[name], P)
      printf "| `%s` | %d | %.1f | %.1f | %.1f | %.1f | %+.1f%% | %+.1f%% | %.3f | %s → %s |\n", substr(name, 10), A["n"],
        A["min"], B["min"], A["med"], B["med"], 100 * (B["min"] / A["min"] - 1), 100 * (B["med"] / A["med"] - 1),
        P["med"], alloc["a", name], alloc["b", name]
    }
  }' "$OUT/results" | sort
echo "raw results: $OUT/results"
