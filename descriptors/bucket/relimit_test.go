package bucket

import (
	"math"
	"math/rand/v2"
	"testing"
)

// Slower refills, at every weight, exactly the lesser of what its two
// arguments refill: never more (never looser), and no less than needed.
func TestSlowerIsTheLesserAtEveryWeight(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	fig := func() Params {
		return Params{Rate: math.Exp(r.Float64()*16 - 8), Size: math.Exp(r.Float64()*12 - 2)}
	}
	for range 100000 {
		a, b := fig(), fig()
		s := Slower(&a, &b)
		for _, w := range []float64{1, r.Float64(), 1e-4} {
			if w == 0 {
				continue
			}
			got, want := s.ratioPerNano(w), min(a.ratioPerNano(w), b.ratioPerNano(w))
			if got > want*(1+1e-12) || got < want*(1-1e-12) {
				t.Fatalf("Slower(%+v, %+v) = %+v refills %g a ns at weight %g, want %g", a, b, s, got, w, want)
			}
		}
	}
	blocked := Params{}
	ok := Params{Rate: 1, Size: 1}
	if s := Slower(&blocked, &ok); !s.Blocked() {
		t.Fatalf("Slower with a blocked limit is %+v, want blocked", s)
	}
}

// A bucket used under other figures than it was last brought up to date
// under (its rule's limit changed) keeps its fill ratio and refills the
// time since at the slower of the two.
func TestBringAcrossALimitChange(t *testing.T) {
	t.Parallel()
	wt := InitialWeight(1)
	s := NewStore(100)
	slow := &Params{Rate: 1, Size: 10}   // 0.1 of the bucket a second
	fast := &Params{Rate: 100, Size: 20} // 5 buckets a second
	if res, _ := s.Do(Request{Key: 1, Params: slow, Op: Draw, N: 10}, wt, 0); !res.OK {
		t.Fatal("first draw refused")
	}
	// One second on, under fast: 0.1 of the bucket (at the slower rate),
	// of 20 tokens now: 2.
	res, _ := s.Do(Request{Key: 1, Params: fast, Op: Check}, wt, 1e9)
	if math.Abs(res.Tokens-2) > 1e-9 {
		t.Fatalf("after the change the bucket holds %v tokens, want 2", res.Tokens)
	}
	// From then on it lives by fast: 0.1 s more is half a bucket more.
	res, _ = s.Do(Request{Key: 1, Params: fast, Op: Check}, wt, 1.1e9)
	if math.Abs(res.Tokens-12) > 1e-6 {
		t.Fatalf("0.1 s later the bucket holds %v tokens, want 12", res.Tokens)
	}
}

// Relimit runs install with sweeps held off, then lowers the figures of the
// buckets of the tags it names, and only those, so a sweep judges them at
// the slower limit; their next use takes the request's figures.
func TestRelimit(t *testing.T) {
	t.Parallel()
	wt := InitialWeight(1)
	s := NewStore(100)
	fast := &Params{Rate: 10, Size: 10}        // a bucket a second
	slow := &Params{Rate: 10.0 / 60, Size: 10} // a bucket a minute
	for key, tag := range map[uint64]uint16{1: 7, 2: 8} {
		s.Do(Request{Key: key, Params: fast, Op: Draw, N: 10, Tag: tag}, wt, 0)
	}
	installed := false
	s.Relimit(map[uint16]Params{7: *slow}, func() { installed = true })
	if !installed {
		t.Fatal("install did not run")
	}
	// Two seconds on: full at the fast limit, not at the slow one.
	if n := s.Sweep(wt, 2e9); n != 1 {
		t.Fatalf("swept %d, want only the bucket whose limit was not lowered", n)
	}
	if sv, ok := s.Peek(1, wt, 2e9); !ok || sv.Fill > 2.0/60+1e-9 {
		t.Fatalf("lowered bucket %+v (present %v), want 2 s at a bucket a minute", sv, ok)
	}
	res, _ := s.Do(Request{Key: 1, Params: slow, Op: Check, Tag: 7}, wt, 2e9)
	if math.Abs(res.Tokens-10*2.0/60) > 1e-6 {
		t.Fatalf("next use holds %v tokens", res.Tokens)
	}
	// Nothing to lower: install runs all the same.
	installed = false
	s.Relimit(nil, func() { installed = true })
	if !installed {
		t.Fatal("install did not run without figures to lower")
	}
}

// A rule's ramp holds the buckets it finds as well as those it creates,
// and its overflow bucket too.
func TestRuleRampHoldsFoundBuckets(t *testing.T) {
	t.Parallel()
	wt := InitialWeight(1)
	p := &Params{Rate: 10, Size: 10}
	s := NewStore(100)
	s.Do(Request{Key: 1, OverflowKey: 9, Params: p, Op: Draw, N: 1}, wt, 0) // 0.9 full
	rp := &Ramp{Start: 0, Fixed: p.BurstTime()}
	if res, _ := s.Do(Request{Key: 1, OverflowKey: 9, Params: p, Op: Check, Ramp: rp}, wt, 5e8); math.Abs(res.Tokens-5) > 1e-9 {
		t.Fatalf("found bucket holds %v tokens half the ramp on, want 5", res.Tokens)
	}
	if res, _ := s.Do(Request{Key: 2, OverflowKey: 9, Params: p, Op: Check, Ramp: rp}, wt, 2e8); math.Abs(res.Tokens-2) > 1e-9 {
		t.Fatalf("new bucket holds %v tokens a fifth of the ramp on, want 2", res.Tokens)
	}
	full := NewStore(2) // one place for a bucket, one for overflow
	full.Do(Request{Key: 1, OverflowKey: 9, Params: p, Op: Draw, N: 1}, wt, 0)
	res, ovf := full.Do(Request{Key: 2, OverflowKey: 9, Params: p, Op: Draw, N: 1, Ramp: rp}, wt, 3e8)
	if !ovf || math.Abs(res.Tokens-2) > 1e-9 {
		t.Fatalf("overflow bucket (overflowed %v) holds %v tokens after a draw 0.3 of the ramp on, want 2", ovf, res.Tokens)
	}
}
