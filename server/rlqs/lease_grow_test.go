package rlqs

import (
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/descriptors/engine"
)

// A lease's weight grows at once, but keeps the leased bucket's tokens, not
// its fill ratio: otherwise an idle, full lease gains (w'−w)·B tokens at
// once, after Hold (200 ms). Envoy A spends its burst (half the share's);
// then RLS offers a draw it cannot have (hits_addend 1000, denied, no token
// taken, but 1000 offered): RLS's measured demand jumps, A's part shrinks at
// once (its limiter, drained, stays empty) and the lease grows to most of
// the share. Together they must stay within the share's bucket, B + R·t.
func TestLeaseGrowKeepsTokens(t *testing.T) {
	r := newLeaseRig(t, "unit: second, requests_per_unit: 10, burst: 100")
	e, svc, clock, id := r.e, r.svc, r.clock, r.id
	rls := r.rls
	a := svc.open(func(error) {}, "a")
	var la modelLimiter
	svc.report(a, report("edge", usage(id, 1, 0, 0)))
	pumpInto(a, &la, clock.now())
	// 200 s: A reports 9/s of demand, RLS draws 0.2/s; A's burst grows,
	// paced, to its part; both end idle and full.
	for s := range 4000 {
		clock.advance(50 * time.Millisecond)
		if s%100 == 0 && s < 3000 {
			rls(1)
		}
		svc.Tick()
		pumpInto(a, &la, clock.now())
		if s%100 == 99 {
			svc.report(a, report("edge", usage(id, 45, 0, 5*time.Second)))
			pumpInto(a, &la, clock.now())
		}
	}
	lw := e.BucketShare("edge", id).Lease.Weight()
	t.Logf("settled: A max_tokens %.0f (holds %.0f), %.2f/s; lease weight %.3f", la.max, la.remaining(clock.now()), la.rate, lw)
	start := clock.now()
	admitted := la.drain(clock.now()) // A spends its burst
	fromA := admitted
	o0, _ := e.BucketShare("edge", id).Lease.Counts()
	ok := rls(1000) // denied: offered 1000, no token taken
	o1, _ := e.BucketShare("edge", id).Lease.Counts()
	t.Logf("hits 1000: ok %v, offered %d -> %d", ok, o0, o1)
	for range 50 { // 2.5 s
		clock.advance(50 * time.Millisecond)
		rls(1000) // RLS's demand stays high, and takes no token
		svc.Tick()
		pumpInto(a, &la, clock.now())
		admitted += la.drain(clock.now())
	}
	for rls(1) {
		admitted++
	}
	el := float64(clock.now()-start) / 1e9
	limit := 100 + 10*el
	t.Logf("A admitted %d, RLS %d, lease weight now %.3f: %d in %.2f s; the share's bucket admits %.0f", fromA, admitted-fromA, e.BucketShare("edge", id).Lease.Weight(), admitted, el, limit)
	if float64(admitted) > limit {
		t.Fatalf("admitted %d in %.2f s, over the share's %.0f (100 + 10·t)", admitted, el, limit)
	}
}

// leaseRig is a service on the real engine with one rule, tenant (limit as
// YAML flow fields, e.g. "unit: minute, requests_per_unit: 600"), and RLS
// draws on tenant=a through the engine, on the rig's fake clock.
type leaseRig struct {
	e     *engine.Engine
	svc   *Service
	clock *fakeClock
	id    map[string]string
	dec   engine.Decision
	t     *testing.T
}

func newLeaseRig(t *testing.T, limit string) *leaseRig {
	t.Helper()
	set, err := descriptors.Parse("rules.yaml", strings.NewReader("domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {"+limit+"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(set, bucket.NewStore(0), engine.Options{Weight: 1})
	if err != nil {
		t.Fatal(err)
	}
	r := &leaseRig{e: e, clock: &fakeClock{}, id: map[string]string{"tenant": "a"}, t: t}
	r.clock.ns.Store(int64(time.Hour))
	r.svc, err = New(Options{Engine: FromEngine(e), Clock: r.clock.now, Hold: 200 * time.Millisecond, AbandonAfter: time.Hour, Queue: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// rls is one RLS request for tenant=a of hits tokens, now: whether it was
// admitted.
func (r *leaseRig) rls(hits uint32) bool {
	descs := []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "a"}}}}
	if err := r.e.Decide(&r.dec, "edge", descs, hits, r.clock.now()); err != nil {
		r.t.Fatal(err)
	}
	return r.dec.Code == engine.OK
}
