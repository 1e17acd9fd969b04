package rlqs

import (
	"fmt"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/descriptors/engine"
)

// benchRules give each tenant a bucket of its own, 1000 a second, which the
// reports below offer more than, so every assignment is a token bucket that
// binds.
const benchRules = `domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000}
`

// benchStreams is how many Envoys report the same buckets, each every
// 5 s, in turn.
const benchStreams = 4

// BenchmarkReport is the service's cost of one usage report of 1, 10 or 100
// buckets, on the daemon's engine (the adapter over a real engine, weight 1).
// Four streams report the same buckets in turn, each every 5 s as Envoy
// does, each offering 1.5× a quarter of the limit, unevenly; one operation
// is one report from one stream, answered with its assignments, then the
// divider's 100 ms ticks until the next stream's report (1.25 s: the
// division of the shares the report changed, the meters, a sweep and the
// responses they push). Answers are taken from the stream's queue, as its
// sender would, but not marshalled.
func BenchmarkReport(b *testing.B) {
	for _, n := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("buckets=%d", n), func(b *testing.B) { benchReport(b, n) })
	}
}

func benchReport(b *testing.B, buckets int) {
	set, err := descriptors.Parse("rules.yaml", strings.NewReader(benchRules))
	if err != nil {
		b.Fatal(err)
	}
	eng, err := engine.New(set, bucket.NewStore(0), engine.Options{Weight: 1})
	if err != nil {
		b.Fatal(err)
	}
	clock := &fakeClock{}
	clock.ns.Store(int64(time.Hour))
	svc, err := New(Options{Engine: FromEngine(eng), Clock: clock.now, Hold: 200 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	streams := make([]*stream, benchStreams)
	reports := make([]*rlqsv3.RateLimitQuotaUsageReports, benchStreams)
	for j := range streams {
		if streams[j] = svc.open(func(error) {}, "bench"); streams[j] == nil {
			b.Fatal("no stream opened")
		}
		// Stream j offers 150·(j+1) a second on every bucket: 150, 300,
		// 450, 600; 1500 in all, against 1000. A report covers 5 s.
		offered := uint64(5 * 150 * (j + 1))
		var us []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
		for i := range buckets {
			id := map[string]string{"tenant": fmt.Sprintf("t%03d", i)}
			us = append(us, usage(id, offered*2/3, offered/3, 5*time.Second))
		}
		reports[j] = report("edge", us...)
	}
	step := func(i int) (tokenBuckets int) {
		// 1.25 s from one report to the next: 50 ms, then 12 ticks.
		clock.advance(5*time.Second/benchStreams - 12*DefaultTick)
		svc.report(streams[i%benchStreams], reports[i%benchStreams])
		for range 12 {
			clock.advance(DefaultTick)
			svc.Tick()
		}
		for _, st := range streams {
			for len(st.queue) > 0 {
				ans := <-st.queue
				for _, m := range ans.msgs {
					for _, a := range m.GetBucketAction() {
						if a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() != nil {
							tokenBuckets++
						}
					}
				}
				st.unsent.Add(-ans.bytes)
			}
		}
		return tokenBuckets
	}
	// Two rounds of every stream: each id known and divided by demand.
	for i := range 2 * benchStreams {
		step(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	sent := 0
	for i := 0; b.Loop(); i++ {
		sent += step(i)
	}
	b.StopTimer()
	// Every report is answered with a token bucket for each of its ids: the
	// limits bind, nothing was denied or allowed outright.
	if sent < b.N*buckets {
		b.Fatalf("%d token-bucket assignments sent for %d reports of %d buckets", sent, b.N, buckets)
	}
	snap := svc.Snapshot()
	if len(snap.Buckets) == 0 || len(snap.Refusals) > 0 {
		b.Fatalf("shares %+v, refusals %v", snap.Buckets, snap.Refusals)
	}
	for _, bi := range snap.Buckets {
		if bi.AssignedRate > bi.ShareRate+1e-9 || bi.ShareRate != 1000 {
			b.Fatalf("bucket %+v: assigned over its budget, or not the rule's 1000/s", bi)
		}
	}
}
