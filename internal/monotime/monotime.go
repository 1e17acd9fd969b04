// Package monotime is the daemon's one clock. The engine and its buckets take
// the time as an argument (descriptors/engine and descriptors/bucket read no
// clock); this is where the daemon reads it from, and the clock it hands the
// demand controller, as do the benchmarks that stand in for the daemon.
//
// Why a package of its own: every reading the engine compares must come from
// one monotonic scale, and one constructor (New) makes that scale. It must
// never read the wall clock for a reading: a Clock never steps backwards,
// whatever the wall clock does.
package monotime

import "time"

// Clock is a source of nanoseconds on a monotonic scale.
type Clock func() int64

// New returns a clock reading nanoseconds since the call, from Go's monotonic
// clock: it never steps backwards, whatever the wall clock does.
func New() Clock {
	start := time.Now()
	return func() int64 { return int64(time.Since(start)) }
}
