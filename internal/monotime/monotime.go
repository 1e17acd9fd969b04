// Package monotime is the daemon's one clock. The engine and its buckets take
// the time as an argument (descriptors reads no clock); this is where the
// daemon, and the benchmarks that stand in for it, read it from.
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
