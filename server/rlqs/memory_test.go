package rlqs

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
)

// One local client reports distinct bucket ids of MaxIDBytes each, 100 to a
// report (under the daemon's 1 MiB message limit), far fewer than
// --max-buckets: the ids held are bounded by their bytes too. Past
// MaxIDBytes of them, a new id is denied and not stored; the heap they hold
// stays within a little over twice the bound. (Before the bound, ids of
// MaxIDBytes up to the default --max-buckets took about 16 GiB.)
func TestIDBytesBounded(t *testing.T) {
	const budget = 16 << 20
	eng := newFakeEngine()
	eng.wildcard("edge", "k", 1, 1000, 1000, 1) // one rule, any value
	clock := &fakeClock{}
	clock.ns.Store(int64(time.Hour))
	svc, err := New(Options{Engine: eng, Clock: clock.now, AbandonAfter: time.Minute, MaxBuckets: 1_000_000, MaxIDBytes: budget, Queue: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	st := svc.open(func(error) {}, "x")
	pad := strings.Repeat("v", MaxIDBytes-64)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const n = 2 * budget / MaxIDBytes // twice what fits
	for i := 0; i < n; i += 100 {
		var us []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
		for j := i; j < i+100; j++ {
			us = append(us, usage(map[string]string{"k": fmt.Sprintf("%08d", j) + pad}, 1, 0, 0))
		}
		svc.report(st, report("edge", us...))
		for len(st.queue) > 0 {
			a := <-st.queue // as the sender does: the bytes are sent
			st.unsent.Add(-a.bytes)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	svc.mu.Lock()
	ids, held := len(svc.ids), svc.idBytes
	svc.mu.Unlock()
	if held > budget || ids > budget/(MaxIDBytes-56) {
		t.Fatalf("%d ids, %d bytes held, over the bound of %d", ids, held, budget)
	}
	if ids < budget/MaxIDBytes-1 {
		t.Fatalf("only %d ids held within a bound of %d bytes", ids, budget)
	}
	grown := float64(after.HeapAlloc) - float64(before.HeapAlloc)
	t.Logf("%d ids, %d bytes of them, %.1f MiB of heap", ids, held, grown/(1<<20))
	if grown > 3*budget {
		t.Fatalf("the heap grew %.1f MiB for a bound of %d MiB of ids", grown/(1<<20), budget>>20)
	}
	if svc.Snapshot().Refusals["overflow"] == 0 {
		t.Fatal("no id past the bound was refused")
	}
}
