package rlqs

import (
	"math"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Part is a consumer's part of a share: tokens per second and at once.
type Part struct {
	Rate, Burst float64
}

// fillSeconds is the whole-second fill interval of a rule with cluster rate
// rate and the given window: the window, reduced so that a fill of the whole
// rate still fits Envoy's uint32 tokens_per_fill, and at least 1 s (Envoy
// truncates the interval to whole seconds, so under 1 s would be unlimited).
// A part is at most the rate, so its fill fits too.
func fillSeconds(rate float64, window int64) int64 {
	f := max(window, 1)
	if rate > 0 && rate*float64(f) > math.MaxUint32 {
		f = max(1, int64(math.MaxUint32/rate))
	}
	return f
}

// maxFill is the longest fill interval a part gets: a year, the slowest
// rate Envoy's limiter has (kMinFillRate).
const maxFill = 365 * 24 * 3600

// Strategy encodes p as Envoy enforces it (Envoy's limiter refills
// tokens_per_fill ÷ whole seconds of fill_interval per second, up to
// max_tokens), rounding down so Envoy never admits more than p:
//   - tokens_per_fill = ⌊rate × fill⌋, always set (unset reads as 0);
//   - a part under one token a fill gets the shortest whole-second fill
//     that holds one, up to a year (rate 1/3 per second: one token every
//     3 s), where ⌊rate × fill⌋ would be 0;
//   - max_tokens = ⌊burst⌋; under one token the part is DENY_ALL;
//   - fill_interval.nanos = fill seconds: Envoy ignores nanos for the rate
//     but compares only nanos to see that a bucket changed, so a change of
//     interval must show there.
func Strategy(p Part, fill int64) *typev3.RateLimitStrategy {
	burst := clampUint32(p.Burst)
	if burst < 1 {
		return Blanket(false)
	}
	fill = max(fill, 1)
	if p.Rate > 0 && p.Rate*float64(fill) < 1 {
		f := math.Ceil(1 / p.Rate)
		if p.Rate*f < 1 { // 1/rate rounded down
			f++
		}
		if f <= maxFill {
			fill = int64(f)
		}
	}
	tb := &typev3.TokenBucket{
		MaxTokens:     burst,
		TokensPerFill: wrapperspb.UInt32(clampUint32(p.Rate * float64(fill))),
		FillInterval:  &durationpb.Duration{Seconds: fill, Nanos: int32(fill % 1_000_000_000)},
	}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: tb}}
}

// Blanket is ALLOW_ALL when allow, else DENY_ALL.
func Blanket(allow bool) *typev3.RateLimitStrategy {
	rule := typev3.RateLimitStrategy_DENY_ALL
	if allow {
		rule = typev3.RateLimitStrategy_ALLOW_ALL
	}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}}
}

// clampUint32 is ⌊x⌋ in [0, MaxUint32]; NaN is 0.
func clampUint32(x float64) uint32 {
	switch {
	case !(x >= 1):
		return 0
	case x >= math.MaxUint32:
		return math.MaxUint32
	}
	return uint32(x)
}

// encoded is the comparable form of an assignment: whether it changed is
// what decides a push.
type encoded struct {
	blanket   int8 // 0: token bucket; 1: ALLOW_ALL; -1: DENY_ALL
	maxTokens uint32
	perFill   uint32
	fill      int64
}

// encode is s's comparable form.
func encode(s *typev3.RateLimitStrategy) encoded {
	if tb := s.GetTokenBucket(); tb != nil {
		return encoded{maxTokens: tb.GetMaxTokens(), perFill: tb.GetTokensPerFill().GetValue(), fill: tb.GetFillInterval().GetSeconds()}
	}
	if s.GetBlanketRule() == typev3.RateLimitStrategy_ALLOW_ALL {
		return encoded{blanket: 1}
	}
	return encoded{blanket: -1}
}

// strategy is e as a message.
func (e encoded) strategy() *typev3.RateLimitStrategy {
	if e.blanket != 0 {
		return Blanket(e.blanket > 0)
	}
	tb := &typev3.TokenBucket{MaxTokens: e.maxTokens, TokensPerFill: wrapperspb.UInt32(e.perFill),
		FillInterval: &durationpb.Duration{Seconds: e.fill, Nanos: int32(e.fill % 1_000_000_000)}}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: tb}}
}
