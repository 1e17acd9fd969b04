package engine

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/internal/monotime"
)

const benchConfig = `
domain: edge
descriptors:
  - key: generic_key
    value: checkout
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: header_match
    value: api
    descriptors:
      - key: remote_address
        rate_limit: {unit: minute, requests_per_unit: 1000000000}
`

// ipValues returns n distinct IPv4-looking strings.
func ipValues(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
	}
	return out
}

func benchEngine(b *testing.B) *Engine { return benchEngineWith(b, Options{Weight: 0.25}) }

// benchEngineWith is benchEngine built with opts.
func benchEngineWith(b *testing.B, opts Options) *Engine {
	set := mustParse(b, benchConfig)
	if set.Len() != 4 {
		b.Fatalf("fixture has %d rules", set.Len())
	}
	return newEngine(b, set, bucket.NewStore(0), opts)
}

// mustMatch guards the benchmark against a fixture that matches nothing: a
// decision without a limit is cheap and would make the numbers meaningless.
func mustMatch(b *testing.B, e *Engine, descs []*commonv3.RateLimitDescriptor) {
	out, _, err := decide(e, "edge", descs, 1, 0, nil)
	if err != nil {
		b.Fatal(err)
	}
	for i, st := range out {
		if st.Limit == nil {
			b.Fatalf("descriptor %d matched no limit", i)
		}
	}
}

// BenchmarkDecideFixedRule decides one descriptor on a fixed (exact) rule. The
// serial figure is the cost of a decision; the parallel one adds two cores
// contending for the one bucket, which a single token bucket must serialise.
func BenchmarkDecideFixedRule(b *testing.B) {
	e := benchEngine(b)
	clock := monotime.New()
	descs := []*commonv3.RateLimitDescriptor{desc("generic_key=checkout")}
	mustMatch(b, e, descs)
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		dec := Decision{Statuses: make([]Status, 0, 1)}
		for i := 0; i < b.N; i++ {
			e.Decide(&dec, "edge", descs, 1, clock())
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			dec := Decision{Statuses: make([]Status, 0, 1)}
			for pb.Next() {
				e.Decide(&dec, "edge", descs, 1, clock())
			}
		})
	})
}

// BenchmarkDecidePerValue100k decides over 100k existing per-IP buckets. Each
// goroutine reuses one request and changes its value, as a freshly decoded
// request sits in cache in the server.
func BenchmarkDecidePerValue100k(b *testing.B) { benchPerValue(b, false) }

// BenchmarkDecidePerValueDemand100k is BenchmarkDecidePerValue100k with the
// rule shared by demand and 64 of its values hot: every decision also
// hashes the value's cross-replica ID and looks it up among the hot ones,
// and one in 16 on a value that is not hot is counted as a candidate.
func BenchmarkDecidePerValueDemand100k(b *testing.B) { benchPerValue(b, true) }

func benchPerValue(b *testing.B, demand bool) {
	e := benchEngineWith(b, Options{Weight: 0.25, DemandAll: demand})
	clock := monotime.New()
	ips := ipValues(100_000)
	if demand {
		var d *DemandRule
		for _, x := range e.DemandRules() {
			if x.Rule.Path() == "edge.remote_address" {
				d = x.State
			}
		}
		var ids []uint64
		for _, ip := range ips[:DefaultTopKeys] {
			ds := desc("remote_address=" + ip)
			ids = append(ids, ValueID(d.RuleID(), e.Set().Match("edge", ds.Entries), ds.Entries))
		}
		if n := len(e.SetHot(d, ids, 0)); n != DefaultTopKeys {
			b.Fatalf("%d hot values", n)
		}
	}
	for _, ip := range ips {
		decide(e, "edge", []*commonv3.RateLimitDescriptor{desc("remote_address=" + ip)}, 1, 0, nil)
	}
	if e.Store().Live() != len(ips) {
		b.Fatalf("%d live buckets, want %d", e.Store().Live(), len(ips))
	}
	var next atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		dec := Decision{Statuses: make([]Status, 0, 1)}
		d := desc("remote_address=")
		descs := []*commonv3.RateLimitDescriptor{d}
		mustMatch(b, e, descs)
		i := next.Add(50_000)
		for pb.Next() {
			i++
			d.Entries[0].Value = ips[i%uint64(len(ips))]
			e.Decide(&dec, "edge", descs, 1, clock())
		}
	})
}

func BenchmarkDecide10Descriptors(b *testing.B) {
	e := benchEngine(b)
	clock := monotime.New()
	descs := make([]*commonv3.RateLimitDescriptor, 10)
	for i := range descs {
		switch i % 3 {
		case 0:
			descs[i] = desc("generic_key=checkout")
		case 1:
			descs[i] = desc(fmt.Sprintf("remote_address=10.0.0.%d", i))
		default:
			descs[i] = desc("header_match=api", fmt.Sprintf("remote_address=10.1.0.%d", i))
		}
	}
	mustMatch(b, e, descs)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		dec := Decision{Statuses: make([]Status, 0, 10)}
		for pb.Next() {
			e.Decide(&dec, "edge", descs, 1, clock())
		}
	})
}

// BenchmarkDistinctKeys compares one goroutine with one per core on distinct
// existing per-IP buckets: the ratio of their ns/op is the parallel speed-up.
func BenchmarkDistinctKeys(b *testing.B) {
	for _, par := range []bool{false, true} {
		name := "serial"
		if par {
			name = "parallel"
		}
		b.Run(name, func(b *testing.B) {
			e := benchEngine(b)
			clock := monotime.New()
			ips := ipValues(1 << 16)
			for _, ip := range ips {
				decide(e, "edge", []*commonv3.RateLimitDescriptor{desc("remote_address=" + ip)}, 1, 0, nil)
			}
			var next atomic.Uint64
			work := func(pb func() bool) {
				dec := Decision{Statuses: make([]Status, 0, 1)}
				d := desc("remote_address=")
				descs := []*commonv3.RateLimitDescriptor{d}
				mustMatch(b, e, descs)
				i := next.Add(1 << 14)
				for pb() {
					i++
					d.Entries[0].Value = ips[i&(1<<16-1)]
					e.Decide(&dec, "edge", descs, 1, clock())
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			if !par {
				n := 0
				work(func() bool { n++; return n <= b.N })
				return
			}
			b.RunParallel(func(pb *testing.PB) { work(pb.Next) })
		})
	}
}

// BenchmarkBucketMemory reports the heap held per live bucket with 1M buckets.
func BenchmarkBucketMemory(b *testing.B) {
	const n = 1_000_000
	b.ReportAllocs()
	for it := 0; it < b.N; it++ {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		store := bucket.NewStore(2 * n) // room for all n below the overflow reserve
		wt := bucket.InitialWeight(1)
		p := &bucket.Params{Rate: 1, Size: 10}
		for k := uint64(0); k < n; k++ {
			store.Do(bucket.Request{Key: k * 0x9E3779B97F4A7C15, Params: p, Op: bucket.Draw, N: 1}, wt, 0)
		}
		if store.Live() != n {
			b.Fatalf("%d live buckets", store.Live())
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/bucket")
		runtime.KeepAlive(store)
	}
}

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
