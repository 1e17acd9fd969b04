package rlqs

import (
	"testing"
	"time"
)

// After a restart, the node's Envoys still enforce the assignments of the
// previous process, which this one does not know, until each has reported
// here. For StartHold after the service starts, a stream's part is at most
// the rate its Envoy reported admitting; then the parts grow as usual.
func TestStartHoldCapsPartsAtReportedAdmits(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.Hold = 0; o.StartHold = 6 * time.Second })
	f.eng.limit("edge", "tenant=a", 1, 100, 100, 1)
	a, _ := f.stream()
	// A admitted 30/s under its old assignment (and was denied more).
	got := envoyRate(assignment(f.exchange(a, report("edge", usage(tenantA, 150, 350, 5*time.Second))), tenantA))
	if got > 30+1e-9 {
		t.Fatalf("A's part just after the start: %.2f/s, more than the 30/s it reported admitting", got)
	}
	f.clock.advance(2 * time.Second)
	b, _ := f.stream()
	got = envoyRate(assignment(f.exchange(b, report("edge", usage(tenantA, 100, 0, 5*time.Second))), tenantA))
	if got > 20+1e-9 {
		t.Fatalf("B's part 2 s after the start: %.2f/s, more than the 20/s it reported admitting", got)
	}
	checkSums(t, f.svc.Snapshot())
	// Once the hold is over, A's part grows to its demand's share.
	f.clock.advance(5 * time.Second)
	f.svc.Tick()
	eventually(t, "A's part to grow past 30/s", func() bool {
		f.clock.advance(sweepEvery)
		f.svc.Tick()
		for _, bk := range f.svc.Snapshot().Buckets {
			for _, p := range bk.Parts {
				if p.Stream == 1 && p.Rate > 31 {
					return true
				}
			}
		}
		return false
	})
}

// A new bucket's first report (time_elapsed 0) comes from an Envoy with no
// assignment for it: StartHold does not cut its part.
func TestStartHoldLeavesNewBucketsAlone(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.Hold = 0; o.StartHold = 6 * time.Second })
	f.eng.limit("edge", "tenant=a", 1, 100, 100, 1)
	a, _ := f.stream()
	if got := envoyRate(assignment(f.exchange(a, report("edge", usage(tenantA, 1, 0, 0))), tenantA)); got < 99 {
		t.Fatalf("a new bucket just after the start: %.2f/s, want the share", got)
	}
}
