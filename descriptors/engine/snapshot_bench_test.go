package engine

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/internal/monotime"
)

// snapBenchConfig is a per-IP limit that binds: every bucket it makes stays
// live (spent, refilling over an hour).
const snapBenchConfig = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 10}\n"

// liveEngine is an engine holding n live, non-full buckets.
func liveEngine(b *testing.B, n int) *Engine {
	b.Helper()
	e := newEngine(b, mustParse(b, snapBenchConfig), bucket.NewStore(n+n/50), Options{})
	d := desc("remote_address=")
	var dec Decision
	for i := range n {
		d.Entries[0].Value = fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
		if err := e.Decide(&dec, "edge", []*commonv3.RateLimitDescriptor{d}, 1, 0); err != nil {
			b.Fatal(err)
		}
	}
	if e.Store().Live() != n {
		b.Fatalf("%d live buckets, want %d", e.Store().Live(), n)
	}
	return e
}

// BenchmarkSnapshot1M: exporting a million live buckets, and restoring them
// into a new engine (what a restarted daemon does before it listens).
func BenchmarkSnapshot1M(b *testing.B) {
	const n = 1_000_000
	e := liveEngine(b, n)
	var saved []bucket.Saved
	b.Run("export", func(b *testing.B) {
		for b.Loop() {
			saved = saved[:0]
			e.Export(0, func(batch []bucket.Saved) { saved = append(saved, batch...) })
		}
		if len(saved) != n {
			b.Fatalf("%d exported", len(saved))
		}
	})
	b.Run("restore", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			r := newEngine(b, mustParse(b, snapBenchConfig), bucket.NewStore(n+n/50), Options{Seed: e.Seed()})
			b.StartTimer()
			if res := r.Restore(saved, e.Weights(), time.Second, noOverrides, 0); res.Kept != n {
				b.Fatalf("%+v", res)
			}
		}
	})
}

// BenchmarkDecideDuringCheckpoint: decisions on one goroutine over 100k live
// per-IP buckets, alone and while a checkpoint exports every bucket over and
// over on another goroutine (the other core of two): what a checkpoint costs
// the hot path while it runs, shard locks and caches, not CPU time taken
// from it. Compare the two in one run.
func BenchmarkDecideDuringCheckpoint(b *testing.B) {
	const n = 100_000
	ips := ipValues(n)
	for _, busy := range []bool{false, true} {
		b.Run(fmt.Sprintf("checkpointing=%v", busy), func(b *testing.B) {
			e := liveEngine(b, n)
			clock := monotime.New()
			stop := make(chan struct{})
			done := make(chan struct{})
			var exports atomic.Int64
			go func() {
				defer close(done)
				for busy {
					select {
					case <-stop:
						return
					default:
					}
					e.Export(clock(), func([]bucket.Saved) {})
					exports.Add(1)
				}
			}()
			dec := Decision{Statuses: make([]Status, 0, 1)}
			d := desc("remote_address=")
			descs := []*commonv3.RateLimitDescriptor{d}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				d.Entries[0].Value = ips[i%n]
				e.Decide(&dec, "edge", descs, 1, clock())
			}
			close(stop)
			<-done
			if busy {
				b.ReportMetric(float64(exports.Load()), "exports")
			}
		})
	}
}
