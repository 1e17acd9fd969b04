package engine

import (
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/internal/monotime"
)

// Benchmarks whose limits bind: the OVER_LIMIT path, the wait path and the walk
// through weight epochs. Each counts its outcomes and fails when the path it
// names was not taken, so it cannot quietly measure the OK path instead.

const bindConfig = `
domain: edge
descriptors:
  - key: tight
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: queue
    rate_limit: {unit: second, requests_per_unit: 1000, burst: 1, policy: wait, max_wait: 15ms}
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 100}
`

func bindEngine(b *testing.B) *Engine {
	set := mustParse(b, bindConfig)
	if set.Len() != 3 {
		b.Fatalf("fixture has %d rules", set.Len())
	}
	return newEngine(b, set, bucket.NewStore(0), Options{Weight: 0.25})
}

// outcomes tallies codes and waits across goroutines.
type outcomes struct{ ok, over, waited atomic.Int64 }

func (o *outcomes) add(out []Status, code Code) {
	if code == OverLimit {
		o.over.Add(1)
	} else {
		o.ok.Add(1)
	}
	if len(out) > 0 && out[0].Wait > 0 {
		o.waited.Add(1)
	}
}

func (o *outcomes) report(b *testing.B) {
	n := float64(o.ok.Load() + o.over.Load())
	if n > 0 {
		b.ReportMetric(float64(o.over.Load())/n, "over/op")
		b.ReportMetric(float64(o.waited.Load())/n, "waited/op")
	}
}

// BenchmarkDecideOverLimit draws from one exhausted 10/s bucket on the real
// clock: almost every decision is OVER_LIMIT.
func BenchmarkDecideOverLimit(b *testing.B) {
	e := bindEngine(b)
	clock := monotime.New()
	descs := []*commonv3.RateLimitDescriptor{desc("tight=x")}
	mustMatch(b, e, descs)
	var o outcomes
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		dec := Decision{Statuses: make([]Status, 0, 1)}
		for pb.Next() {
			e.Decide(&dec, "edge", descs, 1, clock())
			o.add(dec.Statuses, dec.Code)
		}
	})
	b.StopTimer()
	if b.N > 100 && o.over.Load() < int64(b.N)/2 {
		b.Fatalf("only %d of %d decisions were OVER_LIMIT: the limit does not bind", o.over.Load(), b.N)
	}
	o.report(b)
}

// BenchmarkDecideWait offers a wait-policy rule twice its rate on a clock that
// moves 0.5 ms per decision: reservations queue up to max_wait, then the
// overflow is refused, so both the wait and the OVER_LIMIT paths run.
func BenchmarkDecideWait(b *testing.B) {
	e := bindEngine(b)
	var now atomic.Int64
	descs := []*commonv3.RateLimitDescriptor{desc("queue=x")}
	mustMatch(b, e, descs)
	var o outcomes
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		dec := Decision{Statuses: make([]Status, 0, 1)}
		for pb.Next() {
			e.Decide(&dec, "edge", descs, 1, now.Add(int64(500*time.Microsecond)))
			o.add(dec.Statuses, dec.Code)
		}
	})
	b.StopTimer()
	if b.N > 100 && (o.waited.Load() == 0 || o.over.Load() == 0) {
		b.Fatalf("%d waited, %d over of %d: the wait path does not bind", o.waited.Load(), o.over.Load(), b.N)
	}
	o.report(b)
}

// BenchmarkDecideWeightEpochs changes the weight every 64 decisions over 4096
// per-IP buckets drawn faster than they refill, so most draws first bring their
// bucket through the epochs it missed.
func BenchmarkDecideWeightEpochs(b *testing.B) {
	e := bindEngine(b)
	var now atomic.Int64
	ips := ipValues(4096)
	weights := []float64{0.25, 0.2, 1.0 / 6, 0.125}
	var next, decisions atomic.Uint64
	var o outcomes
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		dec := Decision{Statuses: make([]Status, 0, 1)}
		d := desc("remote_address=")
		descs := []*commonv3.RateLimitDescriptor{d}
		i := next.Add(1 << 10)
		for pb.Next() {
			i++
			if n := decisions.Add(1); n%64 == 0 {
				e.SetWeight(weights[(n/64)%uint64(len(weights))], now.Load())
			}
			d.Entries[0].Value = ips[i%uint64(len(ips))]
			e.Decide(&dec, "edge", descs, 1, now.Add(int64(time.Microsecond)))
			o.add(dec.Statuses, dec.Code)
		}
	})
	b.StopTimer()
	if b.N > 100_000 && o.over.Load() == 0 {
		b.Fatalf("no decision of %d was OVER_LIMIT: the limit does not bind", b.N)
	}
	if e.Weight().Epoch == 0 && b.N > 64 {
		b.Fatal("the weight never changed")
	}
	o.report(b)
}
