package bucket

import (
	"testing"
	"time"
)

// TestNoOpRequestsCreateNoBucket: a request that leaves a bucket full carries
// no information, so it must not cost a bucket, or a client could fill the store
// without ever being limited.
func TestNoOpRequestsCreateNoBucket(t *testing.T) {
	cases := []struct {
		name string
		p    Params
		op   Op
		n    float64
		ok   bool
	}{
		{"check only", Params{Rate: 1, Size: 5}, Check, 0, true},
		{"give back", Params{Rate: 1, Size: 5}, GiveBack, 3, true},
		{"draw larger than the bucket", Params{Rate: 1, Size: 5}, Draw, 6, false},
		{"wait draw larger than the bucket", Params{Rate: 1000, Size: 5, MaxWait: time.Second}, Draw, 6, false},
		{"blocked limit", Params{}, Draw, 1, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := NewStore(10)
			wt := InitialWeight(1)
			for k := uint64(1); k <= 100; k++ {
				res, ovf := s.Do(Request{Key: k, OverflowKey: 1 << 60, Params: &tc.p, Op: tc.op, N: tc.n}, wt, 0)
				if res.OK != tc.ok || ovf {
					t.Fatalf("key %d: ok=%v overflow=%v", k, res.OK, ovf)
				}
			}
			if s.Live() != 0 || s.Overflowed() != 0 {
				t.Fatalf("%d live buckets, %d overflowed, want none", s.Live(), s.Overflowed())
			}
		})
	}
}

// TestOverflowBucketsAreCounted: overflow buckets count against the cap, and
// however many distinct overflow keys arrive past it, the store never holds
// more than the cap, never one bucket per key.
func TestOverflowBucketsAreCounted(t *testing.T) {
	const maxBuckets = 10
	s := NewStore(maxBuckets)
	wt := InitialWeight(1)
	p := &Params{Rate: 1, Size: 5}
	for k := uint64(1); k <= 5000; k++ {
		// Each request names an overflow bucket of its own: the worst case.
		s.Do(Request{Key: k, OverflowKey: 1<<40 + k, Params: p, Op: Draw, N: 1}, wt, 0)
	}
	held := 0
	for i := range s.shards {
		held += s.shards[i].m.len()
	}
	if held != s.Live() {
		t.Fatalf("the store holds %d buckets but counts %d", held, s.Live())
	}
	if held > maxBuckets {
		t.Fatalf("5000 keys past a cap of %d left %d buckets", maxBuckets, held)
	}
}

func TestOverflowReserve(t *testing.T) {
	for _, tc := range []struct{ capacity, want int64 }{
		{1, 1}, {4, 1}, {8, 2}, {64, 16}, {100, 16}, {10_000, 100}, {1_000_000, 4096}, {100_000_000, 4096},
	} {
		if got := overflowReserve(tc.capacity); got != tc.want {
			t.Errorf("cap %d: reserve %d, want %d", tc.capacity, got, tc.want)
		}
	}
}
