package rlqs

import (
	"testing"
	"time"
)

// An Envoy held the whole share of a per-minute key over RLQS, RLS drew
// nothing (its lease at the least weight). The Envoy's traffic stops (it
// still reports the bucket, idle). RLS now offers 20/s on a key of 10/s:
// it should get about 10/s once the hold is over.
func TestLeaseRegrowsAfterRLQSLeaves(t *testing.T) {
	r := newLeaseRig(t, "unit: minute, requests_per_unit: 600")
	e, svc, clock, id := r.e, r.svc, r.clock, r.id
	rls := func() bool { return r.rls(1) }
	a := svc.open(func(error) {}, "a")
	var la modelLimiter
	svc.report(a, report("edge", usage(id, 1, 0, 0)))
	pumpInto(a, &la, clock.now())
	for s := range 1200 { // 60 s of A at 50/s, RLS idle
		clock.advance(50 * time.Millisecond)
		svc.Tick()
		pumpInto(a, &la, clock.now())
		if s%100 == 99 {
			svc.report(a, report("edge", usage(id, 50, 200, 5*time.Second)))
			pumpInto(a, &la, clock.now())
		}
	}
	bs := e.BucketShare("edge", id)
	t.Logf("key R %.1f/s B %.0f; A's part %.2f/s; lease weight %.6f", bs.Rate, bs.Burst, la.rate, bs.Lease.Weight())
	// A's traffic stops (its Envoy still reports the bucket, idle).
	// RLS: 20 requests a second, for 10 minutes.
	perMin := map[int]int{}
	for s := range 12000 {
		clock.advance(50 * time.Millisecond)
		if rls() {
			perMin[s/1200]++
		}
		svc.Tick()
		pumpInto(a, &la, clock.now())
		if s%100 == 99 {
			svc.report(a, report("edge", usage(id, 0, 0, 5*time.Second)))
			pumpInto(a, &la, clock.now())
		}
		if s%1200 == 1199 {
			t.Logf("minute %d: RLS admitted %d (%.2f/s), lease weight %.3f", s/1200, perMin[s/1200], float64(perMin[s/1200])/60, e.BucketShare("edge", id).Lease.Weight())
		}
	}
	// Minute 1 on is well past the hold and a report or two: RLS should get
	// the key's 600 a minute, give or take.
	if perMin[1] < 500 {
		t.Fatalf("RLS admitted %d in its second minute alone on the key, of 600 a minute: its lease grows back too slowly", perMin[1])
	}
}

// The same key, but RLS's requests come in bursts (4 every 500 ms, 8/s
// offered of a 10/s key) while the divider ticks every 100 ms: a division
// that saw no draw measures RLS's demand as 0, its part shrinks at once,
// and the lease with it.
func TestLeaseGrowsWithBurstyRLS(t *testing.T) {
	r := newLeaseRig(t, "unit: minute, requests_per_unit: 600")
	e, svc, clock, id := r.e, r.svc, r.clock, r.id
	rls := func() bool { return r.rls(1) }
	a := svc.open(func(error) {}, "a")
	var la modelLimiter
	svc.report(a, report("edge", usage(id, 0, 0, 0)))
	pumpInto(a, &la, clock.now())
	perMin := map[int]int{}
	offered := map[int]int{}
	for s := range 6000 { // 10 minutes, 100 ms ticks
		clock.advance(100 * time.Millisecond)
		if s%5 == 0 {
			for range 4 {
				offered[s/600]++
				if rls() {
					perMin[s/600]++
				}
			}
		}
		svc.Tick()
		pumpInto(a, &la, clock.now())
		if s%50 == 49 {
			svc.report(a, report("edge", usage(id, 0, 0, 5*time.Second)))
			pumpInto(a, &la, clock.now())
		}
		if s%600 == 599 {
			t.Logf("minute %d: RLS admitted %d of %d offered, lease weight %.3f; A's part %.2f/s", s/600, perMin[s/600], offered[s/600], e.BucketShare("edge", id).Lease.Weight(), la.rate)
		}
	}
	if perMin[5] < 400 {
		t.Fatalf("RLS admitted %d of %d in minute 5, on a key of 600 a minute with the Envoy idle", perMin[5], offered[5])
	}
}

// The page's part for RLS (ID "rls") and the assigned sum should be what
// RLS can draw: the lease's weight in force, times R.
func TestPageShowsLeaseInForce(t *testing.T) {
	r := newLeaseRig(t, "unit: minute, requests_per_unit: 600")
	e, svc, clock, id := r.e, r.svc, r.clock, r.id
	a := svc.open(func(error) {}, "a")
	var la modelLimiter
	svc.report(a, report("edge", usage(id, 0, 0, 0)))
	pumpInto(a, &la, clock.now())
	for s := range 600 { // 60 s: RLS 10/s, A idle
		clock.advance(100 * time.Millisecond)
		r.rls(1)
		svc.Tick()
		pumpInto(a, &la, clock.now())
		if s%50 == 49 {
			svc.report(a, report("edge", usage(id, 0, 0, 5*time.Second)))
			pumpInto(a, &la, clock.now())
		}
	}
	snap := svc.Snapshot()
	b := snap.Buckets[0]
	inForce := e.BucketShare("edge", id).Lease.Weight() * 10
	for _, p := range b.Parts {
		if p.ID == "rls" {
			t.Logf("page: rls %.2f/s, assigned %.2f/s of %.2f/s; the lease in force draws %.2f/s", p.Rate, b.AssignedRate, b.ShareRate, inForce)
			if p.Rate > inForce*1.05+0.01 {
				t.Fatalf("the page shows RLS at %.2f/s, its lease draws %.2f/s", p.Rate, inForce)
			}
		}
	}
}
