package envoymodel

import (
	"fmt"
	"math"
	"testing"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestFillRateIsTokensPerFillOverWholeSeconds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		b    *typev3.TokenBucket
		want float64
	}{
		{"per second", tb(10, 10, time.Second).GetTokenBucket(), 10},
		{"over 4 s", tb(10, 10, 4*time.Second).GetTokenBucket(), 2.5},
		{"2.9 s truncates to 2 s", tb(10, 10, 2900*time.Millisecond).GetTokenBucket(), 5},
		{"under 1 s divides by zero: unlimited", tb(10, 10, 500*time.Millisecond).GetTokenBucket(), math.Inf(1)},
		{"0 over 0 s is unlimited too", tb(10, 0, 0).GetTokenBucket(), math.Inf(1)},
		{"unset tokens_per_fill is raised to one a year", &typev3.TokenBucket{MaxTokens: 3, FillInterval: durationpb.New(time.Second)}, minFillRate},
		{"negative interval gives a positive rate", &typev3.TokenBucket{MaxTokens: 3, TokensPerFill: tb(0, 6, 0).GetTokenBucket().TokensPerFill, FillInterval: &durationpb.Duration{Seconds: -2}}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := fillRate(tc.b); got != tc.want {
				t.Errorf("fillRate = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestWholeSecondsTruncatesTowardZero(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d    *durationpb.Duration
		want int64
	}{
		{nil, 0}, {&durationpb.Duration{Nanos: 999_999_999}, 0}, {&durationpb.Duration{Seconds: 3, Nanos: 5}, 3},
		{&durationpb.Duration{Seconds: 1, Nanos: -1}, 0}, {&durationpb.Duration{Seconds: -1, Nanos: 1}, 0},
		{&durationpb.Duration{Seconds: -2}, -2},
	} {
		if got := wholeSeconds(tc.d); got != tc.want {
			t.Errorf("wholeSeconds(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
}

func TestLimiter(t *testing.T) {
	t.Parallel()
	const s = int64(time.Second)
	for _, tc := range []struct {
		name string
		b    *typev3.RateLimitStrategy
		// at each step: advance by dt, then count what n requests admit.
		steps []struct {
			dt   time.Duration
			n    int
			want int
		}
	}{
		{"starts full, refills continuously, capped at max", tb(5, 10, time.Second), []struct {
			dt   time.Duration
			n    int
			want int
		}{{0, 8, 5}, {300 * time.Millisecond, 8, 3}, {time.Hour, 8, 5}}},
		{"max_tokens 0 denies everything", tb(0, 10, time.Second), []struct {
			dt   time.Duration
			n    int
			want int
		}{{0, 3, 0}, {time.Hour, 3, 0}}},
		{"fill under 1 s is unlimited", tb(2, 1, 999*time.Millisecond), []struct {
			dt   time.Duration
			n    int
			want int
		}{{0, 1000, 1000}}},
		{"a token is taken whole", tb(1, 1, 10*time.Second), []struct {
			dt   time.Duration
			n    int
			want int
		}{{0, 2, 1}, {9 * time.Second, 1, 0}, {time.Second, 1, 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			now := 7 * s
			l := newLimiter(tc.b.GetTokenBucket(), nil, now)
			for i, st := range tc.steps {
				now += int64(st.dt)
				got := 0
				for range st.n {
					if decide(tc.b, l, now) {
						got++
					}
				}
				if got != st.want {
					t.Errorf("step %d: admitted %d of %d, want %d", i, got, st.n, st.want)
				}
			}
		})
	}
}

func TestNewLimiterKeepsTheFillFraction(t *testing.T) {
	t.Parallel()
	old := newLimiter(tb(10, 1, time.Second).GetTokenBucket(), nil, 0)
	for range 6 {
		old.take(0)
	}
	for _, tc := range []struct {
		name string
		old  *limiter
		max  uint32
		want float64
	}{
		{"first limiter starts full", nil, 20, 20},
		{"40% left of 10 is 40% of 20", old, 20, 8},
		{"40% left of 10 is 40% of 5", old, 5, 2},
		{"old max 0 (NaN in Envoy) starts empty", newLimiter(tb(0, 1, time.Second).GetTokenBucket(), nil, 0), 20, 0},
	} {
		if got := newLimiter(tb(tc.max, 1, time.Second).GetTokenBucket(), tc.old, 0).remaining(0); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: starts with %v tokens, want %v", tc.name, got, tc.want)
		}
	}
}

func TestDecideStrategies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		s    *typev3.RateLimitStrategy
		want bool
	}{
		{"allow all", allowAll, true},
		{"deny all", denyAll, false},
		{"requests_per_time_unit allows everything", perUnit, true},
		{"unset strategy fails open", &typev3.RateLimitStrategy{}, true},
		{"nil strategy fails open", nil, true},
		{"unknown blanket value allows", blanket(7), true},
		{"token bucket without a limiter denies", tb(5, 5, time.Second), false},
	} {
		if got := decide(tc.s, nil, 0); got != tc.want {
			t.Errorf("%s: decide = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestSameTokenBucketIgnoresFillSeconds(t *testing.T) {
	t.Parallel()
	base := tb(5, 5, time.Second).GetTokenBucket()
	for _, tc := range []struct {
		name string
		b    *typev3.TokenBucket
		want bool
	}{
		{"identical", tb(5, 5, time.Second).GetTokenBucket(), true},
		{"seconds differ only", tb(5, 5, 9*time.Second).GetTokenBucket(), true},
		{"nanos differ", tb(5, 5, time.Second+1).GetTokenBucket(), false},
		{"max differs", tb(6, 5, time.Second).GetTokenBucket(), false},
		{"tokens_per_fill differs", tb(5, 4, time.Second).GetTokenBucket(), false},
	} {
		if got := sameTokenBucket(base, tc.b); got != tc.want {
			t.Errorf("%s: same = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestSlots(t *testing.T) {
	t.Parallel()
	var c slotCounter
	w := int64(SlotWidth)
	for _, at := range []int64{10*w + 1, 10*w + 5, 12 * w, 25*w - 1} {
		c.add(at)
	}
	a := c.snapshot()
	if a.First != 10 || len(a.Counts) != 15 || a.Counts[0] != 2 || a.Counts[2] != 1 || a.Counts[14] != 1 {
		t.Fatalf("slots = %+v", a)
	}
	if most, at := a.MaxWindow(10); most != 3 || at != 10 {
		t.Errorf("MaxWindow(10) = %d at %d, want 3 at 10", most, at)
	}
	b := Slots{First: 8, Counts: []uint64{1, 0, 4}}
	sum := a.Add(b)
	if sum.First != 8 || len(sum.Counts) != 17 || sum.Counts[0] != 1 || sum.Counts[2] != 6 {
		t.Errorf("Add = %+v", sum)
	}
	if most, _ := sum.MaxWindow(10); most != 8 {
		t.Errorf("MaxWindow of the sum = %d, want 8", most)
	}
	if got := (Slots{}).Add(b); got.First != 8 || len(got.Counts) != 3 {
		t.Errorf("empty.Add = %+v", got)
	}
	// Window: slots before and after the run count 0.
	if w := b.Window(7, 12); w.First != 7 || fmt.Sprint(w.Counts) != "[0 1 0 4 0]" {
		t.Errorf("Window(7, 12) = %+v, want [0 1 0 4 0] from 7", w)
	}
	if w := b.Window(9, 9); len(w.Counts) != 0 {
		t.Errorf("empty Window = %+v", w)
	}
}

func TestSlotsKeepAtMostAnHour(t *testing.T) {
	t.Parallel()
	var c slotCounter
	w := int64(SlotWidth)
	c.add(0)
	c.add(5 * w)
	c.add(int64(maxSlots)*w + 3*w)
	if len(c.counts) != maxSlots || c.first != 4 || c.counts[1] != 1 || c.counts[maxSlots-1] != 1 {
		t.Errorf("after an hour: first %d, %d slots, last %d", c.first, len(c.counts), c.counts[len(c.counts)-1])
	}
	c.add(int64(10*maxSlots) * w)
	if len(c.counts) != 1 || c.first != int64(10*maxSlots) {
		t.Errorf("after a long idle: first %d, %d slots", c.first, len(c.counts))
	}
}

func TestSlotsMean(t *testing.T) {
	for _, tc := range []struct {
		s    Slots
		want float64
	}{
		{Slots{}, 0},
		{Slots{First: 7, Counts: []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}}, 55}, // one second
		{Slots{Counts: make([]uint64, 20)}, 0},
		{Slots{Counts: []uint64{30, 0, 0, 0, 0}}, 60}, // half a second
	} {
		if got := tc.s.Mean(); got != tc.want {
			t.Errorf("%v: mean %v, want %v", tc.s, got, tc.want)
		}
	}
}
