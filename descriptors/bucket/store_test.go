package bucket

import (
	"sync"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStoreCreatesFullAndKeepsState(t *testing.T) {
	s := NewStore(10)
	wt := InitialWeight(1)
	p := &Params{Rate: 1, Size: 2}
	r := Request{Key: 1, OverflowKey: 99, Params: p, Op: Draw, N: 1}
	for i, want := range []bool{true, true, false} {
		if res, _ := s.Do(r, wt, 0); res.OK != want {
			t.Fatalf("draw %d: ok=%v", i, res.OK)
		}
	}
	if s.Live() != 1 {
		t.Fatalf("live %d", s.Live())
	}
}

func TestSweepDropsOnlyFullBuckets(t *testing.T) {
	s := NewStore(100)
	wt := InitialWeight(1)
	p := &Params{Rate: 1, Size: 10}
	s.Do(Request{Key: 1, Params: p, Op: Draw, N: 1}, wt, 0)  // refills in 1 s
	s.Do(Request{Key: 2, Params: p, Op: Draw, N: 10}, wt, 0) // refills in 10 s
	if d := s.Sweep(wt, int64(2*time.Second)); d != 1 || s.Live() != 1 {
		t.Fatalf("dropped %d, live %d", d, s.Live())
	}
	// The kept bucket still has its state: 2 of 10 tokens at t=2s.
	st, ok := peek(s, 2, wt, int64(2*time.Second))
	if !ok || st.Fill < 0.19 || st.Fill > 0.21 {
		t.Fatalf("kept bucket %+v ok=%v", st, ok)
	}
	// Dropping a full bucket loses nothing: recreating it gives the same answer.
	if res, _ := s.Do(Request{Key: 1, Params: p, Op: Draw, N: 10}, wt, int64(2*time.Second)); !res.OK {
		t.Fatal("swept bucket did not come back full")
	}
}

func TestCapSendsNewKeysToOverflow(t *testing.T) {
	// A cap of 4 keeps one place for the overflow bucket and three for keys.
	s := NewStore(4)
	wt := InitialWeight(1)
	p := &Params{Rate: 1, Size: 5}
	for k := uint64(1); k <= 3; k++ {
		if _, ovf := s.Do(Request{Key: k, OverflowKey: 1000, Params: p, Op: Draw, N: 1}, wt, 0); ovf {
			t.Fatalf("key %d overflowed below the cap", k)
		}
	}
	// Past the cap, new keys share one overflow bucket: together they get one
	// bucket's worth, never more — tighter, never looser.
	admitted := 0
	for k := uint64(4); k < 100; k++ {
		res, ovf := s.Do(Request{Key: k, OverflowKey: 1000, Params: p, Op: Draw, N: 1}, wt, 0)
		if !ovf {
			t.Fatalf("key %d did not overflow", k)
		}
		if res.OK {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("overflow admitted %d, want the bucket size 5", admitted)
	}
	// The overflow bucket is counted like any other.
	if s.Live() != 4 || s.Overflowed() != 96 {
		t.Fatalf("live %d overflowed %d", s.Live(), s.Overflowed())
	}
	// Existing keys are unaffected by the flood.
	if res, ovf := s.Do(Request{Key: 1, OverflowKey: 1000, Params: p, Op: Draw, N: 1}, wt, 0); ovf || !res.OK {
		t.Fatalf("existing key affected: ok=%v ovf=%v", res.OK, ovf)
	}
}

func TestConcurrentDrawsNeverOverAdmit(t *testing.T) {
	s := NewStore(0)
	wt := InitialWeight(1)
	p := &Params{Rate: 1e-9, Size: 1000}
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for i := 0; i < 500; i++ {
				if res, _ := s.Do(Request{Key: 7, Params: p, Op: Draw, N: 1}, wt, 0); res.OK {
					n++
				}
			}
			mu.Lock()
			admitted += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	if admitted != 1000 {
		t.Fatalf("admitted %d of a 1000-token bucket", admitted)
	}
}

// peek returns a bucket's state brought up to now without changing it, and
// whether it exists.
func peek(s *Store, key uint64, wt *Weight, now int64) (State, bool) {
	sh := &s.shards[key%shardCount]
	sh.mu.Lock()
	var e entry
	ep := sh.m.get(key)
	ok := ep != nil
	if ok {
		e = *ep
	}
	sh.mu.Unlock()
	p := e.params()
	e.advance(&p, wt, now)
	return e.State, ok
}

// The group rides in State's padding: an entry stays 32 bytes, so a million
// buckets still cost what they did.
func TestEntryStays32Bytes(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n != 32 {
		t.Fatalf("entry is %d bytes", n)
	}
}

// A bucket whose group SweepGroups has no weight for is kept, never judged
// by another group's weight.
func TestSweepGroupsKeepsUnknownGroups(t *testing.T) {
	s := NewStore(0)
	p := &Params{Rate: 1, Size: 10}
	for g := range uint16(3) {
		s.Do(Request{Key: uint64(g), Params: p, Op: Draw, N: 1, Group: g}, InitialWeight(1), 0)
	}
	weights := []*Weight{InitialWeight(1), nil} // group 1: none; group 2: past the end
	if n := s.SweepGroups(weights, int64(10e9)); n != 1 {
		t.Fatalf("swept %d, want only group 0's bucket", n)
	}
	if s.Live() != 2 {
		t.Fatalf("%d live", s.Live())
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
