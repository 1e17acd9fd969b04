package bucket

import (
	"math"
	"testing"
)

// A key that moves to a bucket of its own (From) starts it no fuller than
// the bucket it leaves: the move hands out no burst.
func TestFromCarriesDebt(t *testing.T) {
	s := NewStore(0)
	p := &Params{Rate: 1, Size: 10}
	equal, own := InitialWeight(0.5), InitialWeight(0.5)
	// The usual bucket: 5 local tokens, all drawn.
	for i := 0; i < 5; i++ {
		if res, _ := s.Do(Request{Key: 1, Params: p, Op: Draw, N: 1}, equal, 0); !res.OK {
			t.Fatalf("draw %d refused", i)
		}
	}
	r := Request{Key: 2, OverflowKey: 99, Params: p, Op: Draw, N: 1, Group: 1, From: 1, FromWeight: equal}
	if res, _ := s.Do(r, own, 0); res.OK {
		t.Fatalf("the new bucket admitted with its predecessor empty: %+v", res)
	}
	// 1 s later the predecessor holds 0.5 local tokens (0.1 of its size):
	// the new bucket starts there too, and the draw is still refused.
	if res, _ := s.Do(r, own, 1e9); res.OK || math.Abs(res.Tokens-0.5) > 1e-9 {
		t.Fatalf("at 1 s: %+v, want refused with 0.5 tokens", res)
	}
}

// Move hands a bucket's debt back: the destination ends no fuller than the
// source, the source is gone, and the live count is unchanged.
func TestMoveCarriesDebt(t *testing.T) {
	p := &Params{Rate: 1, Size: 10}
	hot, equal := InitialWeight(0.8), InitialWeight(0.25)
	for _, tc := range []struct {
		name     string
		dstDrawn float64 // tokens drawn from the destination first; -1: none there
		want     float64 // destination's fill after the move
	}{
		{"missing destination", -1, 0.25},
		{"fuller destination", 0.5, 0.25},
		{"emptier destination", 2.5, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore(0)
			// Source: 8 local tokens, 6 drawn: fill 0.25.
			s.Do(Request{Key: 1, Params: p, Op: Draw, N: 6, Group: 2}, hot, 0)
			if tc.dstDrawn >= 0 {
				s.Do(Request{Key: 7, Params: p, Op: Draw, N: tc.dstDrawn, Group: 1}, equal, 0)
			}
			before := s.Live()
			s.Move(1, hot, 7, equal, 1, 0)
			if _, ok := peek(s, 1, hot, 0); ok {
				t.Fatal("source still there")
			}
			st, ok := peek(s, 7, equal, 0)
			if !ok || math.Abs(st.Fill-tc.want) > 1e-9 {
				t.Fatalf("destination %+v (present %v), want fill %v", st, ok, tc.want)
			}
			if s.Live() != 1 {
				t.Fatalf("live %d (was %d), want 1: the source's place passes on or is freed", s.Live(), before)
			}
			// The moved bucket is judged by its new group.
			if n := s.SweepGroups([]*Weight{nil, equal, nil}, 100e9); n != 1 || s.Live() != 0 {
				t.Fatalf("swept %d, live %d", n, s.Live())
			}
		})
	}
}

// A full source moves nothing and frees its place.
func TestMoveFullSource(t *testing.T) {
	s := NewStore(0)
	p := &Params{Rate: 1, Size: 10}
	w := InitialWeight(1)
	s.Do(Request{Key: 1, Params: p, Op: Draw, N: 1}, w, 0)
	s.Move(1, w, 2, w, 0, 5e9) // refilled by then
	if s.Live() != 0 {
		t.Fatalf("live %d", s.Live())
	}
	if _, ok := peek(s, 2, w, 5e9); ok {
		t.Fatal("a full bucket was moved")
	}
	s.Move(3, w, 4, w, 0, 5e9) // missing source
	if s.Live() != 0 {
		t.Fatalf("live %d", s.Live())
	}
}
