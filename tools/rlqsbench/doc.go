// Command rlqsbench measures what RLQS costs the daemon against RLS, and how
// closely each holds a limit, for docs/BENCHMARKS.md ("RLQS against RLS").
//
// It starts two daemons from the built binary, with the same rules and flags
// (static membership, --replicas 1, --rlqs): one takes RLS calls from package
// loadgen, the other usage reports from model Envoys (internal/envoymodel),
// each Envoy on its own gRPC connection and enforcing its assignments in this
// process. Two daemons, not one, because an RLQS assignment keeps its part of
// the share for its time to live after its stream ends, which would shrink
// what RLS may admit right after an RLQS phase. The CPU phases alternate
// protocols (RLS, RLQS, RLS, RLQS, ...) so that the machine's noise falls on
// both, and read each daemon's utime+stime from /proc/PID/stat over a fixed
// window after a warm-up. The accuracy phase offers the same skewed load to
// both daemons at once, over RLS and over RLQS, and counts what was admitted
// in 100 ms slots on one clock.
//
// Why a command of its own: the figures need real processes whose CPU is
// read from /proc, two kinds of client at once and minutes of load; no test
// should run that long or depend on the machine's speed, and the daemon must
// not carry a benchmark. It must never leave a daemon it started running,
// never run unbounded (every phase has a fixed length, and an interrupt ends
// the run), and never print a figure it did not measure in this run: a phase
// that fails ends the run with an error.
//
//	docs/bench/rlqs.sh
package main
