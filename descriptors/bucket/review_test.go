package bucket

import (
	"testing"
	"time"
)

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

// TestOverflowDebtCarriesToANewBucket: a key that drew from its rule's
// overflow bucket while the store was full must not, once a sweep frees a
// place, get a full bucket of its own on top: at one instant it got twice its
// limit.
func TestOverflowDebtCarriesToANewBucket(t *testing.T) {
	s := NewStore(4) // reserve 1: three places for keys, one for overflow
	wt := InitialWeight(1)
	p := &Params{Rate: 1, Size: 5}
	const victim, overflow = 99, 1000
	for k := uint64(1); k <= 3; k++ {
		s.Do(Request{Key: k, OverflowKey: overflow, Params: p, Op: Draw, N: 1}, wt, 0)
	}
	admitted := 0
	now := int64(time.Second) // the three junk keys are full again
	for range 10 {
		if res, _ := s.Do(Request{Key: victim, OverflowKey: overflow, Params: p, Op: Draw, N: 1}, wt, now); res.OK {
			admitted++
		}
	}
	s.Sweep(wt, now) // frees the junk places: the victim gets its own bucket
	for range 10 {
		if res, _ := s.Do(Request{Key: victim, OverflowKey: overflow, Params: p, Op: Draw, N: 1}, wt, now); res.OK {
			admitted++
		}
	}
	if admitted > 6 {
		t.Errorf("one key admitted %d at one instant; its bucket allows 5 (+1)", admitted)
	}
}
