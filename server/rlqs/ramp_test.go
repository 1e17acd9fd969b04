package rlqs

import (
	"testing"
	"time"
)

// maxTokensOf is the max_tokens of the next assignment for tenant a on st,
// 0 for a blanket rule.
func maxTokensOf(t *testing.T, st *client) uint32 {
	t.Helper()
	r, err := recvWithin(t, st, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return assignment(r, tenantA).GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket().GetMaxTokens()
}

// Envoy builds a new limiter, full, for a token bucket that follows no
// token bucket, so such an assignment carries rampStart tokens of burst; a
// grow of max_tokens adds at most burstGrowth of the rate a second since it
// last changed, in steps at least burstStep apart; a shrink is at once. A
// DENY_ALL in between starts again from rampStart.
func TestBurstGrowsPaced(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.Hold = 0 })
	f.eng.limit("edge", "tenant=a", 1, 100, 100, 1)
	st, _ := f.stream()
	// A bucket its Envoy had before this stream (a reconnect): its limiter
	// may have been drained, and whatever it holds, the new one is full.
	first := assignment(f.exchange(st, report("edge", usage(tenantA, 1, 0, 5*time.Second))), tenantA)
	tb := first.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if tb == nil || tb.GetMaxTokens() != rampStart || envoyRate(first) < 99 {
		t.Fatalf("first assignment %v, want max_tokens %d at the full rate", first, rampStart)
	}
	// 99/s, 5% of it a second: 4.95 tokens a second, a step a second.
	f.clock.advance(burstStep / 2)
	f.svc.Tick()
	f.svc.Tick()
	if r, err := recvWithin(t, st, 200*time.Millisecond); err == nil {
		t.Fatalf("pushed before a step: %v", r)
	}
	want := uint32(rampStart)
	f.clock.advance(burstStep / 2)
	for want < 99 {
		f.svc.Tick() // divides, and marks the share for the next tick
		f.svc.Tick()
		want = min(want+4, 99) // ⌊4.95 × 1 s⌋
		if got := maxTokensOf(t, st); got != want {
			t.Fatalf("max_tokens %d, want %d", got, want)
		}
		f.clock.advance(burstStep)
	}
	f.svc.Tick()
	f.svc.Tick()
	if r, err := recvWithin(t, st, 200*time.Millisecond); err == nil {
		t.Fatalf("pushed once the burst was the part's: %v", r)
	}

	// A shrink is at once.
	f.eng.weight(0.5)
	f.svc.Reshare()
	f.svc.Tick()
	if got := maxTokensOf(t, st); got != 49 {
		t.Fatalf("the share halved: max_tokens %d, want 49 at once", got)
	}
	// A DENY_ALL in between: the next token bucket is a new limiter again.
	f.eng.weight(0)
	f.svc.Reshare()
	f.svc.Tick()
	if got := maxTokensOf(t, st); got != 0 {
		t.Fatalf("share 0: max_tokens %d, want DENY_ALL", got)
	}
	f.eng.weight(1)
	f.svc.Reshare()
	f.svc.Tick()
	if got := maxTokensOf(t, st); got != rampStart {
		t.Fatalf("token bucket after DENY_ALL: max_tokens %d, want %d", got, rampStart)
	}
}

// The first limiter of a key that nothing else holds, reserves or draws on,
// in an Envoy that has just made the bucket (time_elapsed 0), starts full,
// as RLS's bucket for a new key does. A second Envoy's limiter on the same
// key ramps: the burst it gets was the first one's, which may be drained.
func TestFirstLimiterOfAnUnusedKeyStartsFull(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.Hold = 0 })
	f.eng.limit("edge", "tenant=a", 1, 100, 100, 1)
	a, _ := f.stream()
	if got := assignment(f.exchange(a, report("edge", usage(tenantA, 1, 0, 0))), tenantA).GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket().GetMaxTokens(); got != 99 {
		t.Fatalf("the first limiter of an unused key: max_tokens %d, want the share's 99", got)
	}
	b, _ := f.stream()
	if got := assignment(f.exchange(b, report("edge", usage(tenantA, 1, 0, 0))), tenantA).GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket().GetMaxTokens(); got != rampStart {
		t.Fatalf("a second Envoy's limiter on the key: max_tokens %d, want %d", got, rampStart)
	}
}
