package rlqs

import (
	"math"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// Envoy builds a new limiter, full, for a token bucket that follows no token
// bucket: a bucket's first assignment, or one after a blanket rule, after an
// expiry, or on a new stream (GC:267-270 in the research notes). Its
// max_tokens is admitted at once on top of the rate, each time. A
// replacement of a limiter keeps its fill fraction instead, and under load
// that fraction is low. So an assignment that may build a new limiter
// carries rampStart tokens of burst, and the burst doubles every rampStep,
// each time as a replacement, until it is the part's: a fresh limiter adds
// at most rampStart tokens, and each doubling at most what the load left in
// the smaller bucket. (One step from one token to the whole burst would not
// do: a one-token bucket refills between requests, and its full fraction
// would give the whole new burst at once.)
const (
	rampStart = 1
	rampStep  = 250 * time.Millisecond
)

// holdsBucket reports whether c's Envoy was last sent a token bucket, which
// a new one replaces rather than starting a new, full limiter.
func (c *consumer) holdsBucket() bool { return c.hasSent && c.sent.blanket == 0 }

// ramped is strat with c's ramp applied to its burst.
func (c *consumer) ramped(strat *typev3.RateLimitStrategy) *typev3.RateLimitStrategy {
	tb := strat.GetTokenBucket()
	switch {
	case tb == nil:
	case !c.holdsBucket():
		tb.MaxTokens = min(tb.MaxTokens, rampStart)
	case c.ramp > 0:
		tb.MaxTokens = min(tb.MaxTokens, c.ramp)
	}
	return strat
}

// noteSent records strat as sent to c; a token bucket after none starts a
// ramp.
func (c *consumer) noteSent(strat *typev3.RateLimitStrategy, now int64) {
	if strat.GetTokenBucket() != nil && !c.holdsBucket() {
		c.ramp, c.rampAt = rampStart, now
	}
	c.sent, c.hasSent = encode(strat), true
}

// stepRamp doubles c's burst cap once a step has passed since the last, and
// ends the ramp once the cap reaches full, the part's own burst. It reports
// whether c is still ramping.
func (c *consumer) stepRamp(full uint32, now int64) bool {
	if c.ramp == 0 {
		return false
	}
	if now-c.rampAt >= int64(rampStep) {
		c.ramp = uint32(min(2*uint64(c.ramp), math.MaxUint32))
		c.rampAt = now
	}
	if c.ramp >= full {
		c.ramp = 0
	}
	return c.ramp > 0
}

// admitsCap is p cut to the rate an Envoy reported admitting, its burst in
// proportion: while StartHold runs, the Envoy may still enforce an
// assignment of a previous process, and this one gives it no more than it
// was admitting until every Envoy has reported.
func admitsCap(p Part, admits float64) Part {
	if !(admits < p.Rate) {
		return p
	}
	admits = max(admits, 0)
	return Part{admits, p.Burst * admits / p.Rate}
}
