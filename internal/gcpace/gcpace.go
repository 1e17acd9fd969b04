// Package gcpace sets the garbage collector's pace from the live heap. It is a
// process setting of the daemon (and of the load generator's no-op server, so
// that the two compare like with like), not part of any adapter.
//
// Why a package of its own: the daemon and package loadgen must pace the
// collector by one rule, and neither should import the other. It must never
// override an operator's GOGC (Tuner.Run returns at once when it is set),
// and never pace below Go's default of 100 or above 400.
package gcpace

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// GC pacing. The daemon's live heap is small (a few MB) unless it holds many
// buckets, while gRPC allocates on every request. At Go's default GOGC of 100
// the collector then runs every few hundred requests; at 400 it costs about a
// sixth less CPU per decision (docs/BENCHMARKS.md). But 400 also lets a large
// heap grow to five times its live size: a million buckets would take ~500 MB
// instead of ~220. So the GC percentage follows the live heap: 400 while the
// live heap is small, falling towards 100 as it grows, so the headroom stays
// near gcHeadroom, never more than 4x and never less than Go's default.
const (
	maxGCPercent = 400
	minGCPercent = 100
	gcHeadroom   = 64 << 20
)

// gcPercentFor is the GOGC for a live heap of live bytes.
func gcPercentFor(live uint64) int {
	if live == 0 {
		return maxGCPercent
	}
	p := int(uint64(100*gcHeadroom) / live)
	return min(max(p, minGCPercent), maxGCPercent)
}

// Tuner adjusts GOGC to the live heap, unless the operator set GOGC. The zero
// value is ready; Run owns its goroutine's lifetime.
type Tuner struct {
	// Getenv reads the environment; nil means os.Getenv.
	Getenv func(string) string
}

// Run retunes every interval until ctx ends. It returns nil at once when GOGC is
// set: then the operator's choice stands.
func (g Tuner) Run(ctx context.Context) error {
	getenv := g.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if getenv("GOGC") != "" {
		return nil
	}
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	tune := func() {
		metrics.Read(sample)
		if sample[0].Value.Kind() == metrics.KindUint64 {
			debug.SetGCPercent(gcPercentFor(sample[0].Value.Uint64()))
		}
	}
	tune()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			tune()
		}
	}
}
