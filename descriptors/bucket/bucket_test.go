package bucket

import (
	"math"
	"testing"
	"time"
)

const sec = int64(time.Second)

// clock is a fake clock in nanoseconds; tests move it by hand, never sleep.
type clock struct{ t int64 }

func (c *clock) add(d time.Duration) int64 { c.t += int64(d); return c.t }

type step struct {
	at   time.Duration // advance the clock by this before the op
	op   Op
	n    float64
	ok   bool
	toks float64 // expected local tokens after the op (checked to 1e-6)
}

func run(t *testing.T, p Params, w float64, steps []step) {
	t.Helper()
	var c clock
	wt := InitialWeight(w)
	s := Full(c.t, wt)
	for i, st := range steps {
		now := c.add(st.at)
		s.advance(&p, wt, now)
		res := s.apply(&p, wt.W, st.op, st.n)
		if res.OK != st.ok || math.Abs(res.Tokens-st.toks) > 1e-6 {
			t.Fatalf("step %d (%+v): got ok=%v tokens=%.9f", i, st, res.OK, res.Tokens)
		}
	}
}

func TestBucketTable(t *testing.T) {
	cases := []struct {
		name  string
		p     Params
		w     float64
		steps []step
	}{
		{"starts full, drains, rejects, consumes nothing on failure", Params{Rate: 10, Size: 10}, 1, []step{
			{0, Draw, 4, true, 6}, {0, Draw, 6, true, 0}, {0, Draw, 1, false, 0}, {0, Draw, 1, false, 0},
		}},
		{"refills continuously and lazily", Params{Rate: 10, Size: 10}, 1, []step{
			{0, Draw, 10, true, 0}, {100 * time.Millisecond, Draw, 1, true, 0}, {50 * time.Millisecond, Draw, 1, false, 0.5},
			{50 * time.Millisecond, Draw, 1, true, 0},
		}},
		{"never refills past the size", Params{Rate: 10, Size: 5}, 1, []step{
			{0, Draw, 5, true, 0}, {time.Hour, Draw, 0.0, true, 5},
		}},
		{"burst larger than a second's rate", Params{Rate: 1, Size: 50}, 1, []step{
			{0, Draw, 50, true, 0}, {0, Draw, 1, false, 0}, {time.Second, Draw, 1, true, 0},
		}},
		{"hits larger than the size never pass, and cost nothing", Params{Rate: 10, Size: 10}, 1, []step{
			{0, Draw, 11, false, 10}, {0, Draw, 10, true, 0},
		}},
		{"negative hits give back, capped at the size", Params{Rate: 10, Size: 10}, 1, []step{
			{0, Draw, 8, true, 2}, {0, GiveBack, 3, true, 5}, {0, GiveBack, 100, true, 10},
		}},
		{"check-only takes nothing", Params{Rate: 10, Size: 10}, 1, []step{
			{0, Check, 0, true, 10}, {0, Draw, 10, true, 0}, {0, Check, 0, false, 0},
			{100 * time.Millisecond, Check, 0, true, 1},
		}},
		{"weight 1/4 divides rate and size", Params{Rate: 100, Size: 100}, 0.25, []step{
			{0, Draw, 25, true, 0}, {0, Draw, 1, false, 0}, {40 * time.Millisecond, Draw, 1, true, 0},
		}},
		{"1 per day over 7 replicas floors the size at one token", Params{Rate: 1.0 / 86400, Size: 1}, 1.0 / 7, []step{
			{0, Draw, 1, true, 0}, {0, Draw, 1, false, 0},
			{24 * time.Hour, Draw, 1, false, 1.0 / 7},
			{6 * 24 * time.Hour, Draw, 1, true, 0},
		}},
		{"requests_per_unit 0 blocks everything, no floor", Params{}, 0.5, []step{
			{0, Draw, 1, false, 0}, {0, Check, 0, false, 0}, {time.Hour, Draw, 1, false, 0},
		}},
		{"wait policy reserves within max_wait", Params{Rate: 100, Size: 1, MaxWait: 15 * time.Millisecond}, 1, []step{
			{0, Draw, 1, true, 0}, {0, Draw, 1, true, -1}, {0, Draw, 1, false, -1},
			{10 * time.Millisecond, Draw, 1, true, -1}, {5 * time.Millisecond, Draw, 1, true, -1.5}, {0, Draw, 1, false, -1.5},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			run(t, tc.p, tc.w, tc.steps)
		})
	}
}

func TestWaitReportsDuration(t *testing.T) {
	p := Params{Rate: 100, Size: 1, MaxWait: 15 * time.Millisecond}
	wt := InitialWeight(1)
	s := Full(0, wt)
	s.apply(&p, 1, Draw, 1)
	res := s.apply(&p, 1, Draw, 1)
	if !res.OK || res.Wait != 10*time.Millisecond {
		t.Fatalf("want a 10ms wait, got %+v", res)
	}
}

func TestResetDurations(t *testing.T) {
	p := Params{Rate: 10, Size: 10}
	wt := InitialWeight(1)
	s := Full(0, wt)
	if r := s.apply(&p, 1, Draw, 4); r.Reset != 400*time.Millisecond {
		t.Fatalf("time until full: %v", r.Reset)
	}
	s.apply(&p, 1, Draw, 6)
	if r := s.apply(&p, 1, Draw, 3); r.OK || r.Reset != 300*time.Millisecond {
		t.Fatalf("time until enough for 3: %+v", r)
	}
}

func TestClockBackwardsNeverCreatesTokens(t *testing.T) {
	p := Params{Rate: 10, Size: 10}
	wt := InitialWeight(1)
	s := Full(100*sec, wt)
	s.apply(&p, 1, Draw, 10)
	// A reading an hour older than the last: no tokens appear.
	s.advance(&p, wt, 100*sec-3600*sec)
	if r := s.apply(&p, 1, Draw, 1); r.OK {
		t.Fatal("a backwards step created a token")
	}
	// The older reading counted as the last one, so time is measured from
	// there: 100 ms after it, one token exists, not an hour's worth.
	s.advance(&p, wt, 100*sec+int64(100*time.Millisecond))
	if r := s.apply(&p, 1, Draw, 0); math.Abs(r.Tokens-1) > 1e-9 {
		t.Fatalf("100 ms after the last reading: %v tokens, want 1", r.Tokens)
	}
	// A forward step refills to full, never beyond.
	s.advance(&p, wt, 10_000*sec)
	if r := s.apply(&p, 1, Draw, 0); r.Tokens != 10 {
		t.Fatalf("forward step: %v tokens", r.Tokens)
	}
}

func TestWeightChangeKeepsFillRatio(t *testing.T) {
	p := Params{Rate: 100, Size: 100}
	w1 := InitialWeight(0.5)
	s := Full(0, w1)
	s.advance(&p, w1, 0)
	s.apply(&p, w1.W, Draw, 25) // 25 of 50 left: half full
	// Scale down 2 -> 4 replicas at t=0: the bucket stays half full of a smaller size.
	w2 := w1.Next(0.25, 0)
	s.advance(&p, w2, 0)
	if r := s.apply(&p, w2.W, Draw, 0); math.Abs(r.Tokens-12.5) > 1e-9 || r.Size != 25 {
		t.Fatalf("after shrinking: %+v", r)
	}
	// Scale up 4 -> 1: still half full, now of 100.
	w3 := w2.Next(1, 0)
	s.advance(&p, w3, 0)
	if r := s.apply(&p, w3.W, Draw, 0); math.Abs(r.Tokens-50) > 1e-9 {
		t.Fatalf("after growing: %+v", r)
	}
}

func TestWeightChangeRefillsAtOldRateUntilTheChange(t *testing.T) {
	// Floor active (B·w < 1), so the ratio rate depends on the weight: 1 token per
	// 10 s cluster-wide, size 1 → at w=1 the bucket refills in 10 s, at w=0.1 in 100 s.
	p := Params{Rate: 0.1, Size: 1}
	w1 := InitialWeight(1)
	s := Full(0, w1)
	s.apply(&p, 1, Draw, 1)
	// 5 s at w=1 (half refilled), then the weight drops to 0.1 for 5 s more (+5%).
	w2 := w1.Next(0.1, 5*sec)
	s.advance(&p, w2, 10*sec)
	if math.Abs(s.Fill-0.55) > 1e-9 {
		t.Fatalf("fill %.6f, want 0.55", s.Fill)
	}
}

func TestWeightHistoryBounded(t *testing.T) {
	w := InitialWeight(1)
	for i := 0; i < 1000; i++ {
		w = w.Next(1/float64(i%5+1), int64(i))
	}
	n := 0
	for x := w; x != nil; x = x.prev {
		n++
	}
	if n > keptEpochs {
		t.Fatalf("history holds %d epochs", n)
	}
	// A bucket from a trimmed epoch still advances without panicking.
	s := State{Fill: 0, Last: 0, Epoch: 3}
	p := Params{Rate: 1, Size: 1}
	s.advance(&p, w, 2000*sec)
	if s.Fill != 1 || s.Epoch != w.Epoch {
		t.Fatalf("state %+v", s)
	}
}

func TestLocalFigures(t *testing.T) {
	cases := []struct {
		p          Params
		w          float64
		rate, size float64
	}{
		{Params{Rate: 100, Size: 200}, 0.1, 10, 20},
		{Params{Rate: 1, Size: 3}, 0.1, 0.1, 1},
		{Params{}, 0.5, 0, 0},
	}
	for _, tc := range cases {
		r, b := tc.p.Local(tc.w)
		if math.Abs(r-tc.rate) > 1e-12 || math.Abs(b-tc.size) > 1e-12 {
			t.Errorf("%+v at %v: rate %v size %v", tc.p, tc.w, r, b)
		}
	}
}

// TestTrimmedEpochsRefillNoLooser: a bucket idle across more weight changes
// than are kept must not be refilled, for the forgotten time, at a weight it
// never had. Under the one-token floor the refill rate follows the weight, so
// a bucket that lived at w=0.001 and is brought up at w=0.5 once gave 50
// tokens where its history allows about 5.
func TestTrimmedEpochsRefillNoLooser(t *testing.T) {
	for _, changes := range []int{7, 8, 9, 20} {
		p := &Params{Rate: 10, Size: 100}
		s := NewStore(0)
		wt := InitialWeight(0.001) // B·w = 0.1: floored, refills 0.01 of itself a second
		s.Do(Request{Key: 1, Params: p, Op: Draw, N: 1}, wt, 0)
		sec := int64(time.Second)
		for i := range changes {
			w := 0.5
			if i%2 == 1 {
				w = 1
			}
			wt = wt.Next(w, 10*sec+int64(i)*int64(time.Millisecond))
		}
		now := 10*sec + 30*int64(time.Millisecond)
		admitted := 0
		for range 200 {
			if res, _ := s.Do(Request{Key: 1, Params: p, Op: Draw, N: 1}, wt, now); res.OK {
				admitted++
			}
		}
		// 10 s at w=0.001 refill 0.1 of the bucket; the last ~30 ms at w ≥ 0.5
		// add about 0.015: at most 0.12 of a bucket of up to 100, plus one.
		if admitted > 13 {
			t.Errorf("%d weight changes: admitted %d, the history allows about 12", changes, admitted)
		}
	}
}
