package bucket

import (
	"testing"
	"time"
)

// Under a ramp a new bucket starts at the time since the start over the
// rule's burst time (capped), existing buckets are untouched, and the draws
// the ramp refused are counted.
func TestRamp(t *testing.T) {
	s := NewStore(0)
	wt := InitialWeight(1)
	p := &Params{Rate: 10, Size: 20}                        // burst time 2 s
	s.Do(Request{Key: 1, Params: p, Op: Draw, N: 1}, wt, 0) // exists before the ramp: 19 left
	s.SetRamp(&Ramp{Start: 0, Cap: 10 * time.Second})
	draws := func(key uint64, n int, now int64) int {
		ok := 0
		for range n {
			if res, _ := s.Do(Request{Key: key, Params: p, Op: Draw, N: 1}, wt, now); res.OK {
				ok++
			}
		}
		return ok
	}
	if got := draws(2, 30, 0); got != 0 {
		t.Errorf("a new key at the ramp's start admitted %d", got)
	}
	if got := draws(3, 30, int64(500*time.Millisecond)); got != 5 {
		t.Errorf("a new key a quarter into a 2 s ramp admitted %d, want a quarter of 20", got)
	}
	if got := draws(1, 30, 0); got != 19 {
		t.Errorf("a bucket from before the ramp admitted %d, want its 19", got)
	}
	if got := draws(4, 30, int64(2*time.Second)); got != 20 {
		t.Errorf("a new key once the ramp is over admitted %d, want 20", got)
	}
	// Refused outright: key 2's first draw. Withheld: key 2's 20 tokens and
	// 15 of key 3's.
	if n := s.RampRejected(); n != 1 {
		t.Errorf("%d draws counted as refused by the ramp, want 1", n)
	}
	if n := s.RampWithheld(); n != 35 {
		t.Errorf("%d tokens withheld, want 35", n)
	}
	if s.Ramp(int64(time.Second)) == nil || s.Ramp(int64(10*time.Second)) != nil {
		t.Error("Ramp: in progress at 1 s, over at 10 s")
	}
	// A fixed ramp applies to every rule; a cap bounds a long burst time.
	long := &Params{Rate: 1, Size: 3600}
	if d := (&Ramp{Cap: 10 * time.Second}).Duration(long); d != 10*time.Second {
		t.Errorf("capped: %v", d)
	}
	if d := (&Ramp{Fixed: 3 * time.Second, Cap: 10 * time.Second}).Duration(long); d != 3*time.Second {
		t.Errorf("fixed: %v", d)
	}
}
