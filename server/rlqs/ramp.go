package rlqs

import (
	"math"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// What Envoy's limiter does with a new max_tokens (the research notes,
// GC:246-273): a token bucket that follows no token bucket (a bucket's
// first assignment, or one after a blanket rule, an expiry, or on a new
// stream) builds a new limiter, full; a changed one keeps the old limiter's
// fill fraction. Either way, tokens can appear that no refill made: a new
// limiter's whole max_tokens, and, when max_tokens grows on a limiter that is
// not empty (an idle one is full), the grow times its fill fraction. A burst
// that moves from a drained limiter to an idle one would be admitted twice.
//
// So a new limiter starts with rampStart tokens of burst (but for the first
// limiter of a key that no other limiter, reservation or RLS draw shares, in
// an Envoy that has just made the bucket: it starts full, as RLS's bucket
// for a new key does, and nothing was drained to refill), and max_tokens
// grows by one step at a time, burstStep apart at the least: burstGrowth of
// its part's rate over burstStep, and at least one token (the time since the
// last step gives no credit: credit kept while idle would be a full bucket
// again). Tokens then appear from grows at most burstGrowth as fast as the
// rate refills them, or a token a step for a part under 20 a second: over a
// window of the rule, that much on top of its cap. Shrinks are at once; the
// rate is the part's from the first assignment.
const (
	rampStart   = 1
	burstGrowth = 0.05
	burstStep   = time.Second
)

// holdsBucket reports whether c's Envoy holds the token bucket it was last
// sent, which a new one replaces rather than starting a new, full limiter:
// not once ttl has passed since it was sent (its Envoy may have let it
// expire).
func (c *consumer) holdsBucket(now, ttl int64) bool {
	return c.hasSent && c.sent.blanket == 0 && now-c.sentAt < ttl
}

// paced is strat with its max_tokens held to what may be sent at now: at
// most rampStart for a new limiter, the last sent plus one step for a grow,
// at once for a shrink.
func (c *consumer) paced(strat *typev3.RateLimitStrategy, now, ttl int64) *typev3.RateLimitStrategy {
	tb := strat.GetTokenBucket()
	if tb == nil {
		return strat
	}
	full, sent := tb.GetMaxTokens(), c.sent.maxTokens
	switch {
	case !c.hasSent && c.firstFull:
		// The first limiter of a key nothing else holds or draws on, in
		// an Envoy that has just made the bucket: full, as RLS's bucket
		// for a new key is.
	case !c.holdsBucket(now, ttl):
		tb.MaxTokens = min(full, rampStart)
	case full <= sent:
	case now-c.maxAt < int64(burstStep):
		tb.MaxTokens = sent
	default:
		rate := float64(tb.GetTokensPerFill().GetValue()) / float64(max(tb.GetFillInterval().GetSeconds(), 1))
		// One step's growth, however long since the last: credit kept
		// while idle would be a full bucket again.
		grown := float64(sent) + math.Max(1, math.Floor(burstGrowth*rate*burstStep.Seconds()))
		tb.MaxTokens = uint32(min(float64(full), grown))
	}
	return strat
}

// noteSent records strat as sent to c at now, and when its max_tokens last
// changed.
func (c *consumer) noteSent(strat *typev3.RateLimitStrategy, now, ttl int64) {
	if tb := strat.GetTokenBucket(); tb != nil && (!c.holdsBucket(now, ttl) || tb.GetMaxTokens() != c.sent.maxTokens) {
		c.maxAt = now
	}
	c.sent, c.hasSent, c.sentAt = encode(strat), true, now
}

// pacing reports whether c's burst has yet to grow to full, its part's:
// its share is divided again at the next tick.
func (c *consumer) pacing(full uint32, now, ttl int64) bool {
	return c.holdsBucket(now, ttl) && full > c.sent.maxTokens
}

// startCap is p while StartHold runs, after a start: the node's Envoys may
// still enforce the previous process's assignments, unknown here, until each
// has reported. A bucket its Envoy had before (c.inherited) gets at most the
// rate it reported admitting, less the most burst it could have spent in the
// period (the share's, shareBurst), its burst in proportion; a new bucket
// gets nothing yet, since the Envoys yet to report may hold all of the share.
func startCap(p Part, c *consumer, shareBurst float64) Part {
	if !c.inherited || !(c.period > 0) || !(p.Rate > 0) {
		return Part{}
	}
	admits := max(0, c.admits-shareBurst/c.period)
	if admits >= p.Rate {
		return p
	}
	return Part{admits, p.Burst * admits / p.Rate}
}
