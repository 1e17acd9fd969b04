package rlqs

import (
	"fmt"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
)

// modelLimiter is Envoy's limiter for one bucket as the research notes give
// it: a first token bucket (or one after a blanket rule) starts full; a
// different one replaces it at the old fill fraction; the same one
// (max_tokens, tokens_per_fill, fill_interval.nanos) is kept.
type modelLimiter struct {
	has                bool
	allow              bool
	max, rate, tokens  float64
	at                 int64
	maxT, perFill, nan uint32
}

func (l *modelLimiter) remaining(now int64) float64 {
	return min(l.max, l.tokens+float64(now-l.at)/1e9*l.rate)
}

func (l *modelLimiter) apply(a *rlqsv3.RateLimitQuotaResponse_BucketAction, now int64) {
	tb := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if tb == nil {
		l.has = false
		l.allow = a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule() == 2 // ALLOW_ALL
		return
	}
	if l.has && l.maxT == tb.GetMaxTokens() && l.perFill == tb.GetTokensPerFill().GetValue() && l.nan == uint32(tb.GetFillInterval().GetNanos()) {
		return
	}
	newMax := float64(tb.GetMaxTokens())
	tokens := newMax
	if l.has {
		frac := 0.0
		if l.max > 0 {
			frac = l.remaining(now) / l.max
		}
		tokens = newMax * frac
	}
	l.has, l.max, l.tokens, l.at = true, newMax, tokens, now
	l.rate = float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().GetSeconds())
	l.maxT, l.perFill, l.nan = tb.GetMaxTokens(), tb.GetTokensPerFill().GetValue(), uint32(tb.GetFillInterval().GetNanos())
}

// drain takes every whole token the limiter holds at now.
func (l *modelLimiter) drain(now int64) int {
	if !l.has {
		return 0
	}
	n := int(l.remaining(now))
	l.tokens, l.at = l.remaining(now)-float64(n), now
	return n
}

// pump applies every queued response of st to l.
func pumpInto(st *stream, l *modelLimiter, now int64) {
	for len(st.queue) > 0 {
		a := <-st.queue
		for _, m := range a.msgs {
			for _, x := range m.GetBucketAction() {
				l.apply(x, now)
			}
		}
	}
}

// Envoys share one key (rate 40/s or 10/s, burst 100). A's reports say it wants most
// of it, the others' little; all limiters settle at their full parts. A
// spends its whole burst; then the others report high demand. A's part
// shrinks at once (its limiter keeps fraction 0), theirs grow after the
// hold, and their limiters, full, scale to the whole new bursts at once.
// The key's token bucket admits at most 100 + rate·t in t seconds.
func TestBurstMovedToAFullLimiterStaysInTheKey(t *testing.T) {
	for _, rate := range []float64{40, 10} {
		for _, others := range []int{1, 4} {
			t.Run(fmt.Sprintf("%.0fps/%d", rate, others), func(t *testing.T) { burstMoves(t, rate, others) })
		}
	}
}

func burstMoves(t *testing.T, rate float64, others int) {
	eng := newFakeEngine()
	clock := &fakeClock{}
	clock.ns.Store(int64(time.Hour))
	eng.limit("edge", "tenant=a", 1, rate, 100, 1)
	svc, err := New(Options{Engine: eng, Clock: clock.now, Hold: 200 * time.Millisecond, AbandonAfter: time.Minute, Queue: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	id := map[string]string{"tenant": "a"}
	sa := svc.open(func(error) {}, "a")
	var la modelLimiter
	sb := make([]*stream, others)
	lb := make([]modelLimiter, others)
	for i := range sb {
		sb[i] = svc.open(func(error) {}, "b")
	}
	pumpAll := func() {
		pumpInto(sa, &la, clock.now())
		for i := range sb {
			pumpInto(sb[i], &lb[i], clock.now())
		}
	}
	step := func(d time.Duration) {
		clock.advance(d)
		svc.Tick()
		pumpAll()
	}
	// Demand: A 50/s, the others 0.2/s each, reported over 5 s.
	svc.report(sa, report("edge", usage(id, 100, 150, 5*time.Second)))
	for i := range sb {
		svc.report(sb[i], report("edge", usage(id, 1, 0, 5*time.Second)))
	}
	for range 3000 { // 300 s: every burst grown to its part, every limiter full
		step(100 * time.Millisecond)
		if s := clock.now() % int64(5*time.Second); s < int64(100*time.Millisecond) {
			// the periodic reports, idle
			svc.report(sa, report("edge", usage(id, 100, 150, 5*time.Second)))
			for i := range sb {
				svc.report(sb[i], report("edge", usage(id, 1, 0, 5*time.Second)))
			}
			pumpAll()
		}
	}
	t.Logf("before: A max %.0f, B0 max %.0f", la.max, lb[0].max)
	// The others' flood comes at the start of their report period: it takes
	// their tokens (outside the window measured below), and their limiters
	// refill for 4.9 s before they report it.
	for i := range lb {
		lb[i].drain(clock.now())
	}
	for range 49 {
		step(100 * time.Millisecond)
	}
	t.Logf("at A's drain: B0 holds %.1f of %.0f", lb[0].remaining(clock.now()), lb[0].max)
	b0 := lb[0].max
	start := clock.now()
	admitted := la.drain(clock.now())
	// The others' periodic reports: the flood, mostly denied. A's report
	// is not due yet.
	for i := range sb {
		svc.report(sb[i], report("edge", usage(id, 10, 50000, 5*time.Second)))
	}
	pumpAll()
	for range 12 {
		step(100 * time.Millisecond)
		admitted += la.drain(clock.now())
		if lb[0].max > b0 {
			break // the grow has landed
		}
	}
	for i := range lb {
		admitted += lb[i].drain(clock.now())
	}
	el := float64(clock.now()-start) / 1e9
	limit := 100 + rate*el
	t.Logf("after: A max %.0f, B0 max %.0f", la.max, lb[0].max)
	t.Logf("admitted %d in %.1f s; the key's bucket admits at most %.0f", admitted, el, limit)
	if float64(admitted) > limit {
		t.Fatalf("admitted %d in %.1f s, over the key's %.0f (100 + %.0f·t)", admitted, el, limit, rate)
	}
}
