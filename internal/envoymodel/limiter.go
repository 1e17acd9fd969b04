package envoymodel

import (
	"math"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// minFillRate is Envoy's kMinFillRate, one token a year (TB:11): a rate of
// zero, such as an unset tokens_per_fill, is raised to it (TB:69).
const minFillRate = 1.0 / (365 * 24 * 60 * 60)

// limiter is the token bucket Envoy builds for a token_bucket strategy, an
// AtomicTokenBucketImpl (GC:253-273, TB:67-76): refill is continuous at rate
// tokens a second, capped at max, and a request takes one whole token or is
// denied (F:312, no partial consumption). tokens is the content at time at
// (nanoseconds on the model's clock). It is not safe for concurrent use; the
// model holds its lock around every call.
type limiter struct {
	max    float64
	rate   float64 // +Inf when the fill interval truncates to 0 s
	tokens float64
	at     int64
}

// newLimiter builds the limiter for tb at now. With no previous limiter it
// starts full; replacing one, it starts at the old one's fill fraction
// (GC:265-270). Envoy computes that fraction as remaining/max, which is 0/0
// (NaN) when the old max_tokens was 0; the model starts such a limiter empty.
func newLimiter(tb *typev3.TokenBucket, old *limiter, now int64) *limiter {
	l := &limiter{max: float64(tb.GetMaxTokens()), rate: fillRate(tb), at: now}
	l.tokens = l.max
	if old != nil {
		fraction := 0.0
		if old.max > 0 {
			fraction = old.remaining(now) / old.max
		}
		l.tokens = l.max * fraction
	}
	return l
}

// fillRate is tokens_per_fill over the fill interval truncated to whole
// seconds (GC:259-262). Envoy divides by zero when the interval is under a
// second: the rate is +Inf, or NaN when tokens_per_fill is 0 too, and either
// way its limiter always holds max_tokens (TB's std::min returns max_tokens
// for a NaN), so both are modelled as +Inf. A negative rate is made positive
// and a tiny one raised to minFillRate, as TB:69 does.
func fillRate(tb *typev3.TokenBucket) float64 {
	secs := wholeSeconds(tb.GetFillInterval())
	if secs == 0 {
		return math.Inf(1)
	}
	rate := math.Abs(float64(tb.GetTokensPerFill().GetValue()) / float64(secs))
	return max(rate, minFillRate)
}

// wholeSeconds is absl::ToInt64Seconds(Seconds(s) + Nanoseconds(n)): the
// duration truncated toward zero to whole seconds.
func wholeSeconds(d *durationpb.Duration) int64 {
	s, n := d.GetSeconds(), d.GetNanos()
	switch {
	case s > 0 && n < 0:
		s--
	case s < 0 && n > 0:
		s++
	}
	return s
}

// remaining is the content at now, refilled since at and capped at max.
func (l *limiter) remaining(now int64) float64 {
	if math.IsInf(l.rate, 1) {
		return l.max
	}
	dt := float64(max(now-l.at, 0)) / 1e9
	return min(l.max, l.tokens+dt*l.rate)
}

// take consumes one token at now if a whole one is there.
func (l *limiter) take(now int64) bool {
	tokens := l.remaining(now)
	l.at = max(now, l.at)
	if tokens < 1 {
		l.tokens = tokens
		return false
	}
	l.tokens = tokens - 1
	return true
}

// sameTokenBucket is Envoy's protoTokenBucketsEq (GC:246-251): it compares
// max_tokens, tokens_per_fill and fill_interval.nanos, and not
// fill_interval.seconds, so a change of seconds alone keeps the old limiter
// and its old rate.
func sameTokenBucket(a, b *typev3.TokenBucket) bool {
	return a.GetMaxTokens() == b.GetMaxTokens() &&
		a.GetTokensPerFill().GetValue() == b.GetTokensPerFill().GetValue() &&
		a.GetFillInterval().GetNanos() == b.GetFillInterval().GetNanos()
}

// decide applies one strategy to one request as F's shouldAllowRequest does:
// a blanket rule is enforced; a token bucket consumes from l;
// requests_per_time_unit, an unset strategy and an unknown blanket value let
// the request through (F:313-321). l is never nil for a token bucket in the
// model (Envoy would crash reading it, see New); should it be, the request is
// denied rather than admitted.
func decide(s *typev3.RateLimitStrategy, l *limiter, now int64) bool {
	switch s.GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		return s.GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL
	case *typev3.RateLimitStrategy_TokenBucket:
		return l != nil && l.take(now)
	default:
		return true
	}
}
