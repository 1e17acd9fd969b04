package rlqs

import (
	"fmt"
	"testing"
	"time"
)

// A stream that ends keeps its part reserved until its TTL, since its Envoy
// keeps admitting at it; its demand must keep counting in demand sharing's
// meters as long, or the leader moves this replica's share to the others
// while that Envoy still spends it (a cut stream of the busiest Envoy took
// the cluster to 1.2-1.4 × L for 10-14 s).
func TestEndedStreamKeepsItsDemandMeteredUntilTTL(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.Hold = 0 })
	f.eng.limit("edge", "tenant=a", 1, 100, 100, 1)
	a, cancelA := f.stream()
	f.exchange(a, report("edge", usage(tenantA, 1, 0, 0)))
	f.clock.advance(5 * time.Second)
	f.exchange(a, report("edge", usage(tenantA, 500, 0, 5*time.Second))) // 100/s
	f.svc.Tick()
	rate := func() float64 {
		b, _ := f.eng.reportedTotals()
		for range 10 {
			f.clock.advance(100 * time.Millisecond)
			f.svc.Tick()
		}
		e, _ := f.eng.reportedTotals()
		return float64(e - b)
	}
	if r := rate(); r < 95 {
		t.Fatalf("metered %.0f/s while streaming, want 100", r)
	}
	cancelA()
	eventually(t, "a to end", func() bool { return len(f.svc.Snapshot().Streams) == 0 })
	if r := rate(); r < 95 {
		t.Fatalf("metered %.0f/s after the stream ended, while its part is still reserved; want 100", r)
	}
	f.clock.advance(15 * time.Second) // the TTL has passed: its Envoy enforces nothing more
	f.svc.Tick()
	if r := rate(); r != 0 {
		t.Fatalf("metered %.0f/s once the ended stream's TTL had passed, want 0", r)
	}
}

// A reload that moves a bucket id to another rule keeps the reservations of
// streams that ended: their Envoys enforce their last assignment until its
// TTL, whatever the rules say now.
func TestReloadKeepsEndedStreamsReservations(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.Hold = 0 })
	f.eng.limit("edge", "tenant=a", 1, 100, 100, 1)
	a, cancelA := f.stream()
	b, _ := f.stream()
	f.exchange(a, report("edge", usage(tenantA, 1, 0, 0)))
	f.exchange(b, report("edge", usage(tenantA, 1, 0, 0)))
	f.clock.advance(5 * time.Second)
	ra := f.exchange(a, report("edge", usage(tenantA, 250, 0, 5*time.Second)))
	f.exchange(b, report("edge", usage(tenantA, 250, 0, 5*time.Second)))
	f.svc.Tick()
	aRate := envoyRate(assignment(ra, tenantA))
	cancelA()
	eventually(t, "a to end", func() bool { return len(f.svc.Snapshot().Streams) == 1 })
	f.svc.Tick()
	f.eng.limit("edge", "tenant=a", 2, 100, 100, 1) // the id now selects another rule
	f.svc.Reload()
	f.svc.Tick()
	bRate := 0.0
	for {
		r, err := recvWithin(t, b, 300*time.Millisecond)
		if err != nil {
			break
		}
		if x := assignment(r, tenantA); x != nil {
			bRate = envoyRate(x)
		}
	}
	if aRate+bRate > 100+1e-9 {
		t.Fatalf("the ended stream's Envoy still admits %.1f/s and the live one was given %.1f/s: %.1f/s against a share of 100/s", aRate, bRate, aRate+bRate)
	}
}

// A report naming many new ids of one share divides that share once, not
// once per id: the work grew with the square of the ids, with the lock held
// (8,000 ids took 7.8 s). Counted by divisions, not by the clock.
func TestReportDividesEachShareOnce(t *testing.T) {
	f := newFixture(t, nil)
	f.eng.wildcard("edge", "path", 1, 1000, 1000, 1)
	st, _ := f.stream()
	var us []*bucketUsage
	for i := range 500 {
		us = append(us, usage(map[string]string{"path": fmt.Sprint("/p", i)}, 1, 0, 0))
	}
	before := f.svc.divisions.Load()
	f.exchange(st, report("edge", us...))
	if n := f.svc.divisions.Load() - before; n > 2 {
		t.Fatalf("one report of 500 new ids of one share divided it %d times", n)
	}
}

// Stream and id pairs are bounded by --max-buckets as the ids are: each
// stream that reports an id holds state for it.
func TestMaxBucketsBoundsStreamIDPairs(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.MaxBuckets = 100 })
	f.eng.wildcard("edge", "path", 1, 1000, 1000, 1)
	var us []*bucketUsage
	for i := range 60 {
		us = append(us, usage(map[string]string{"path": fmt.Sprint("/p", i)}, 1, 0, 0))
	}
	for range 4 {
		st, _ := f.stream()
		f.exchange(st, report("edge", us...))
	}
	if n := f.svc.pairs(); n > 100 {
		t.Fatalf("%d stream and id pairs held, --max-buckets 100", n)
	}
}
