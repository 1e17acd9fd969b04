package rlqs

import (
	"testing"
	"time"
)

// maxTokens is the max_tokens of r's assignment for tenant a, 0 for none.
func maxTokensOf(t *testing.T, f *fixture, st *client) uint32 {
	t.Helper()
	r, err := recvWithin(t, st, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return assignment(r, tenantA).GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket().GetMaxTokens()
}

// Envoy builds a new limiter, full, for a token bucket that follows no
// token bucket, so such an assignment carries rampStart tokens of burst,
// and the burst doubles every rampStep, as replacements, up to the part's.
// A DENY_ALL in between starts the ramp again.
func TestFreshLimiterBurstRamps(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.Hold = 0 })
	f.eng.limit("edge", "tenant=a", 1, 100, 100, 1)
	st, _ := f.stream()
	first := assignment(f.exchange(st, report("edge", usage(tenantA, 1, 0, 0))), tenantA)
	tb := first.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if tb == nil || tb.GetMaxTokens() != rampStart || envoyRate(first) < 99 {
		t.Fatalf("first assignment %v, want max_tokens %d at the full rate", first, rampStart)
	}
	// Before a step has passed, nothing is pushed.
	f.clock.advance(rampStep / 2)
	f.svc.Tick()
	if r, err := recvWithin(t, st, 200*time.Millisecond); err == nil {
		t.Fatalf("pushed before a ramp step: %v", r)
	}
	want := uint32(rampStart)
	for want < 99 {
		want = min(2*want, 99)
		f.clock.advance(rampStep)
		f.svc.Tick() // divides, and marks the share for the next tick
		f.svc.Tick()
		if got := maxTokensOf(t, f, st); got != want {
			t.Fatalf("ramp: max_tokens %d, want %d", got, want)
		}
	}
	f.clock.advance(10 * rampStep)
	f.svc.Tick()
	f.svc.Tick()
	if r, err := recvWithin(t, st, 200*time.Millisecond); err == nil {
		t.Fatalf("pushed after the ramp ended: %v", r)
	}

	// A DENY_ALL in between: the next token bucket is a new limiter again.
	f.eng.weight(0)
	f.svc.Reshare()
	f.svc.Tick()
	if got := maxTokensOf(t, f, st); got != 0 {
		t.Fatalf("share 0: max_tokens %d, want DENY_ALL", got)
	}
	f.eng.weight(1)
	f.svc.Reshare()
	f.svc.Tick()
	if got := maxTokensOf(t, f, st); got != rampStart {
		t.Fatalf("token bucket after DENY_ALL: max_tokens %d, want %d", got, rampStart)
	}
}
