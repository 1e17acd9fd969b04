package rlqs

import (
	"math"
	"math/rand/v2"
	"testing"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// envoyLimiter models Envoy's RLQS token bucket as the filter builds it from
// an assignment (global_client_impl.cc, token_bucket_impl.cc): the rate is
// tokens_per_fill over the whole seconds of fill_interval, refill is
// continuous up to max_tokens, a new limiter starts full, a request takes one
// whole token. Blanket rules allow or deny all.
type envoyLimiter struct {
	allowAll, denyAll bool
	rate, max, tokens float64
	last              float64
}

const envoyMinFillRate = 1.0 / (365 * 24 * 3600) // kMinFillRate: one token a year

func newEnvoyLimiter(s *typev3.RateLimitStrategy) *envoyLimiter {
	if tb := s.GetTokenBucket(); tb != nil {
		secs := tb.GetFillInterval().GetSeconds() // nanos are truncated away
		rate := math.Inf(1)
		if secs > 0 {
			rate = float64(tb.GetTokensPerFill().GetValue()) / float64(secs)
		}
		rate = max(rate, envoyMinFillRate)
		m := float64(tb.GetMaxTokens())
		return &envoyLimiter{rate: rate, max: m, tokens: m}
	}
	if s.GetBlanketRule() == typev3.RateLimitStrategy_ALLOW_ALL {
		return &envoyLimiter{allowAll: true}
	}
	return &envoyLimiter{denyAll: true}
}

func (l *envoyLimiter) allow(t float64) bool {
	switch {
	case l.allowAll:
		return true
	case l.denyAll:
		return false
	}
	l.tokens = min(l.max, l.tokens+(t-l.last)*l.rate)
	l.last = t
	if l.tokens >= 1 {
		l.tokens--
		return true
	}
	return false
}

// sameBucket is Envoy's test for keeping a limiter: max_tokens,
// tokens_per_fill and fill_interval.nanos equal; seconds are not compared.
func sameBucket(a, b *typev3.TokenBucket) bool {
	return a.GetMaxTokens() == b.GetMaxTokens() && a.GetTokensPerFill().GetValue() == b.GetTokensPerFill().GetValue() &&
		a.GetFillInterval().GetNanos() == b.GetFillInterval().GetNanos()
}

// Over random parts, windows and traffic, Envoy enforcing the encoded
// assignment never admits more than the part allows: rate × t + burst.
func TestStrategyNeverAdmitsMoreThanThePart(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 1500 {
		scale := []float64{0.001, 0.3, 1, 10, 1000, 1e6, 1e10}[rng.IntN(7)]
		p := Part{Rate: scale * rng.Float64(), Burst: scale * rng.Float64() * 3}
		window := []int64{1, 60, 3600, 86400}[rng.IntN(4)]
		clusterRate := p.Rate * (1 + 3*rng.Float64())
		fill := fillSeconds(clusterRate, window)
		s := Strategy(p, fill)
		l := newEnvoyLimiter(s)
		if l.allowAll {
			t.Fatalf("case %d: part %+v encoded as ALLOW_ALL", i, p)
		}
		if tb := s.GetTokenBucket(); tb != nil {
			if tb.GetFillInterval().GetSeconds() < 1 || tb.TokensPerFill == nil || tb.GetMaxTokens() < 1 {
				t.Fatalf("case %d: bad token bucket %v", i, tb)
			}
		} else if p.Burst >= 1 {
			t.Fatalf("case %d: part %+v with a whole token denied", i, p)
		}
		// Bursty traffic well above the part, over up to 3 windows.
		horizon := float64(window) * 3 * rng.Float64()
		offered := max(p.Rate*4, 10/max(horizon, 1))
		n := min(int(offered*horizon)+int(p.Burst)+10, 200_000)
		admitted, now := 0.0, 0.0
		for range n {
			now += rng.ExpFloat64() * horizon / float64(n)
			if l.allow(now) {
				admitted++
			}
		}
		if bound := p.Rate*now + p.Burst; admitted > bound+1e-6 {
			t.Fatalf("case %d: part %+v fill %d: admitted %.0f over %.3fs, more than %.3f", i, p, fill, admitted, now, bound)
		}
	}
}

func TestStrategyEncoding(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name         string
		part         Part
		fill         int64
		deny         bool
		max, perFill uint32
		secs         int64
		nanos        int32
	}{
		{name: "whole tokens", part: Part{Rate: 10, Burst: 20}, fill: 1, max: 20, perFill: 10, secs: 1, nanos: 1},
		{name: "floor", part: Part{Rate: 2.9, Burst: 5.99}, fill: 60, max: 5, perFill: 174, secs: 60, nanos: 60},
		{name: "under one token of burst", part: Part{Rate: 100, Burst: 0.99}, fill: 1, deny: true},
		{name: "under one token a fill", part: Part{Rate: 0.001, Burst: 3}, fill: 1, max: 3, perFill: 1, secs: 1000, nanos: 1000},
		{name: "a third of a token a second", part: Part{Rate: 1.0 / 3, Burst: 1}, fill: 1, max: 1, perFill: 1, secs: 3, nanos: 3},
		{name: "under one token a year", part: Part{Rate: 1e-9, Burst: 3}, fill: 1, max: 3, perFill: 0, secs: 1, nanos: 1},
		{name: "huge", part: Part{Rate: 1e12, Burst: 1e12}, fill: 1, max: math.MaxUint32, perFill: math.MaxUint32, secs: 1, nanos: 1},
		{name: "NaN", part: Part{Rate: math.NaN(), Burst: math.NaN()}, fill: 1, deny: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := Strategy(tc.part, tc.fill)
			if tc.deny {
				if s.GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL || s.GetTokenBucket() != nil {
					t.Fatalf("got %v, want DENY_ALL", s)
				}
				return
			}
			tb := s.GetTokenBucket()
			if tb.GetMaxTokens() != tc.max || tb.GetTokensPerFill() == nil || tb.GetTokensPerFill().GetValue() != tc.perFill ||
				tb.GetFillInterval().GetSeconds() != tc.secs || tb.GetFillInterval().GetNanos() != tc.nanos {
				t.Fatalf("got %v", tb)
			}
			if s.GetRequestsPerTimeUnit() != nil {
				t.Fatal("requests_per_time_unit is never used")
			}
		})
	}
}

// A change of fill interval alone must look like a new bucket to Envoy,
// or it would keep the old rate.
func TestStrategyIntervalChangeIsSeen(t *testing.T) {
	t.Parallel()
	a := Strategy(Part{Rate: 1, Burst: 10}, 60).GetTokenBucket()
	b := Strategy(Part{Rate: 0.5, Burst: 10}, 120).GetTokenBucket() // 60 tokens per fill both
	if a.GetTokensPerFill().GetValue() != b.GetTokensPerFill().GetValue() {
		t.Fatalf("fixture: tokens per fill differ: %v %v", a, b)
	}
	if sameBucket(a, b) {
		t.Fatalf("Envoy would keep %v for %v", a, b)
	}
	if encode(Strategy(Part{Rate: 1, Burst: 10}, 60)) == encode(Strategy(Part{Rate: 0.5, Burst: 10}, 120)) {
		t.Fatal("encoded forms equal")
	}
}

func TestFillSeconds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rate   float64
		window int64
		want   int64
	}{
		{10, 1, 1}, {10, 0, 1}, {10, 3600, 3600}, {1e6, 86400, 4294}, {1e10, 60, 1}, {0, 60, 60},
	} {
		if got := fillSeconds(tc.rate, tc.window); got != tc.want {
			t.Errorf("fillSeconds(%g, %d) = %d, want %d", tc.rate, tc.window, got, tc.want)
		}
		if f := fillSeconds(tc.rate, tc.window); tc.rate*float64(f) > math.MaxUint32 && f > 1 {
			t.Errorf("fillSeconds(%g, %d) = %d overflows tokens_per_fill", tc.rate, tc.window, f)
		}
	}
	if e := encode(Strategy(Part{Rate: 3, Burst: 4}, 7)); e.strategy().String() != Strategy(Part{Rate: 3, Burst: 4}, 7).String() {
		t.Fatalf("encoded round trip differs: %v", e.strategy())
	}
}
