package rlqs

import (
	"math"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// FuzzReport feeds any bytes that decode as a report to a stream: nothing
// panics, the stream gets an answer or a clear error, the ids held stay
// within the cap, the parts within the share, and what the reports add to
// demand sharing's meters stays within what maxReportedRate allows, however
// large their counts or short their periods.
func FuzzReport(f *testing.F) {
	huge := usage(tenantA, math.MaxUint64, math.MaxUint64, 0)
	huge.TimeElapsed = &durationpb.Duration{Nanos: 1}
	for _, r := range []*rlqsv3.RateLimitQuotaUsageReports{
		report("edge", usage(tenantA, 1, 0, 0)),
		report("edge", usage(map[string]string{"tenant": "b", "x": ""}, 3, 9, 5*time.Second)),
		report(""),
		report("nowhere", usage(map[string]string{"": "v"}, 0, 0, -time.Second)),
		report("edge", huge, usage(map[string]string{"tenant": "b", "x": ""}, math.MaxUint64, 0, time.Second)),
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, b)
	}
	f.Fuzz(func(t *testing.T, first, second []byte) {
		eng := newFakeEngine()
		eng.limit("edge", "tenant=a", 1, 100, 100, 0.5)
		eng.limit("edge", "tenant=b,x=", 1, 100, 100, 0.5)
		clock := &fakeClock{}
		svc, err := New(Options{Engine: eng, Clock: clock.now, MaxBuckets: 4, Queue: 64})
		if err != nil {
			t.Fatal(err)
		}
		st := svc.open(func(error) {}, "fuzz")
		for _, b := range [][]byte{first, second} {
			var r rlqsv3.RateLimitQuotaUsageReports
			if proto.Unmarshal(b, &r) != nil {
				continue
			}
			if validate(&r, st) != nil {
				continue
			}
			svc.report(st, &r)
			clock.advance(time.Second)
			svc.Tick()
			checkModel(t, svc, 0)
		}
		if n := svc.Snapshot().IDs; n > 4 {
			t.Fatalf("%d ids held, cap 4", n)
		}
		// Two ticks of at most a second each, at most 4 stream and id pairs.
		if off, adm := eng.reportedTotals(); eng.wrapped || off > 2*4*maxReportedRate || adm > off {
			t.Fatalf("the reports added %d offered, %d admitted to the meters (wrapped: %t)", off, adm, eng.wrapped)
		}
		svc.close(st)
	})
}
