// Package loadgen is `sharelimit bench`: a load generator that speaks Envoy's
// RateLimitService v3 the way Envoy does, and the no-op server that is its floor.
//
// Why a package of its own: it is a client of the daemon, not a part of it,
// and `sharelimit bench`, docs/bench/run.sh and tools/soak all measure with
// it, so their figures come from one generator. It must never be imported
// by the daemon, never run unbounded (MaxDuration caps every run), and never
// time a call from when it was sent when it was due earlier (open loop).
//
// # Load
//
// Run sends ShouldRateLimit calls over one or more long-lived HTTP/2 connections
// per target from a fixed set of workers, each reusing one request message. A run
// is always bounded: by a duration, a request count, or both (whichever comes
// first), and never longer than MaxDuration.
//
//   - Closed loop (Rate 0): each worker sends its next request as soon as the last
//     is answered. Latency is the call's own.
//   - Open loop (Rate > 0): requests are due on a fixed schedule at the total rate,
//     and any free worker takes the next due slot. Latency is corrected for
//     coordinated omission: a request that could not be sent on time because
//     every worker was busy is timed from when it was due. A worker that is early
//     sleeps and is timed from when it wakes, since Go's timers may wake it up to
//     a millisecond late and that delay is the generator's, not the server's.
//     Requests still due when the window closes are reported as missed.
//
// # Keys
//
// Descriptor j of request s carries key index (s·descriptors + j) mod
// cardinality: requests walk the key space round-robin, so a run of at least
// cardinality/descriptors requests touches every value, and the descriptors of a
// request differ when cardinality ≥ descriptors. The walk continues from the
// warmup into the measured window. See Shape for what the values look like.
//
// # Measures
//
// Latencies go into a log-linear histogram (Histogram) with a relative error of at
// most HistogramRelativeError. Latency covers answered calls; failed calls are
// counted by gRPC code. With a server PID, the server's user+system CPU time is
// read from /proc/PID/stat before and after the measured window and divided by
// the calls made in it: CPU per decision. The generator's own CPU is reported the
// same way, since on a shared machine it is CPU the server did not get.
//
// # Comparing
//
// Absolute figures drift between runs on shared machines, so Compare alternates
// two targets, A (the baseline, usually ServeNoop) and B, with identical load
// for a number of rounds and reports per-run figures, per-side medians and B/A
// ratios of the medians.
//
// # Progress
//
// With Config.Progress set, a line per second reports the rate of the last second
// and the counts so far. Main turns it on by default when a run may last more
// than 5 seconds (or has no time bound), off otherwise; --progress overrides.
package loadgen
