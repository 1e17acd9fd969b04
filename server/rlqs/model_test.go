package rlqs

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
)

// The division's model test: random streams report random demand on a few
// ids of two keys, end, come back, and the weight moves; after every tick,
// for every share, the live parts and RLS's lease fit in the share less what
// ended streams may still enforce, and what each stream was last sent never
// lets its Envoy admit more than its part.
func TestDivisionNeverExceedsTheShare(t *testing.T) {
	t.Parallel()
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			runModel(t, rand.New(rand.NewPCG(seed, 7)))
		})
	}
}

func runModel(t *testing.T, rng *rand.Rand) {
	eng := newFakeEngine()
	clock := &fakeClock{}
	clock.ns.Store(int64(time.Hour))
	eng.limit("edge", "tenant=a", 1, 100, 50, 0.5)
	eng.limit("edge", "tenant=b", 1, 100, 50, 0.5) // same key as a: one share
	eng.limit("edge", "tenant=c", 2, 7, 3, 0.5)
	hold := []time.Duration{0, 2 * time.Second}[rng.IntN(2)]
	svc, err := New(Options{Engine: eng, Clock: clock.now, Hold: hold, AbandonAfter: 30 * time.Second, Queue: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ids := []map[string]string{{"tenant": "a"}, {"tenant": "b"}, {"tenant": "c"}}
	var live []*stream
	for step := range 400 {
		switch op := rng.IntN(10); {
		case op < 5 || len(live) == 0:
			if len(live) < 5 && (len(live) == 0 || rng.IntN(4) == 0) {
				live = append(live, svc.open(func(error) {}, "model"))
			}
			st := live[rng.IntN(len(live))]
			var us []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
			for _, id := range ids {
				if rng.IntN(2) == 0 {
					n := uint64(rng.ExpFloat64() * 200)
					us = append(us, usage(id, n/2, n-n/2, time.Duration(rng.IntN(6))*time.Second))
				}
			}
			svc.report(st, report("edge", us...))
		case op < 6:
			i := rng.IntN(len(live))
			svc.close(live[i])
			live = append(live[:i], live[i+1:]...)
		case op < 8:
			eng.weight(rng.Float64())
			svc.Reshare()
		default:
			l := eng.lease(1)
			if l != nil {
				l.offered.Add(uint64(rng.IntN(500)))
			}
		}
		clock.advance(time.Duration(rng.IntN(2000)) * time.Millisecond)
		svc.Tick()
		checkModel(t, svc, step)
		for _, st := range live {
			for len(st.queue) > 0 {
				<-st.queue
			}
		}
	}
}

func checkModel(t *testing.T, svc *Service, step int) {
	t.Helper()
	svc.mu.Lock()
	defer svc.mu.Unlock()
	now := svc.opt.Clock()
	for _, sh := range svc.shares {
		tg := sh.target
		budget := Part{tg.Rate * tg.Weight, tg.Burst * tg.Weight}
		var reserved, used Part
		for e := range sh.entries {
			for _, r := range e.reserved {
				if r.until > now {
					reserved = addPart(reserved, r.part)
				}
			}
			for _, c := range e.consumers {
				used = addPart(used, c.part.cur)
				if c.hasSent {
					if sent := c.sentPart(sh); sent.Rate > c.part.cur.Rate+1e-9 || sent.Burst > c.part.cur.Burst+1e-9 {
						t.Fatalf("step %d: sent %+v, more than the part %+v", step, sent, c.part.cur)
					}
				}
			}
		}
		used = addPart(used, sh.rls.cur)
		avail := Part{max(0, budget.Rate-reserved.Rate), max(0, budget.Burst-reserved.Burst)}
		if used.Rate > avail.Rate*(1+1e-9)+1e-9 || used.Burst > avail.Burst*(1+1e-9)+1e-9 {
			t.Fatalf("step %d: key %d: parts %+v over the share %+v less reserved %+v", step, sh.key.key, used, budget, reserved)
		}
		if l := sh.lease.(*fakeLease); l.weight()*tg.Rate > sh.rls.cur.Rate+1e-9 {
			t.Fatalf("step %d: lease weight %.6f over RLS's part %+v", step, l.weight(), sh.rls.cur)
		}
	}
	if len(svc.ids) > svc.opt.MaxBuckets {
		t.Fatalf("step %d: %d ids", step, len(svc.ids))
	}
}
