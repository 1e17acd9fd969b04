package bucket

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestStoreModel is a model test of the store under concurrency, in the spirit
// of x/time/rate's TestSimultaneousRequests: many goroutines draw from one hot
// bucket and a few shared ones, with random stalls between reading the clock
// and drawing (so readings reach a bucket out of order), weight changes and a
// sweeper running throughout. The checker holds the exact bound for every
// bucket.
//
// The bound is kept in fill-ratio units, where it holds across weight changes:
// a bucket of local size b = B·w refills at r/b = R/B of itself per second
// whatever the weight (no floor is hit here), and a draw of n at weight w takes
// n/(B·w) of it. So for every bucket
//
//	Σ n/(B·w) ≤ 1 + (R/B)·(last reading − first reading) + rounding,
//
// which at a constant weight is admitted ≤ B·w + R·w·elapsed.
func TestStoreModel(t *testing.T) {
	cases := []struct {
		name      string
		keys      int
		stall     time.Duration // the longest stall between reading the clock and drawing
		reweigh   bool
		sweep     bool
		duration  time.Duration
		maxBucket int
	}{
		{name: "one hot bucket, stalls", keys: 1, stall: 2 * time.Millisecond, duration: 300 * time.Millisecond},
		{name: "shared keys, stalls, weight changes", keys: 4, stall: 2 * time.Millisecond, reweigh: true, duration: 300 * time.Millisecond},
		{name: "shared keys, stalls, weight changes, sweeper", keys: 4, stall: 2 * time.Millisecond, reweigh: true, sweep: true, duration: 300 * time.Millisecond},
		{name: "short stalls, sweeper", keys: 2, stall: 200 * time.Microsecond, sweep: true, duration: 300 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Not parallel: each case needs the goroutines to contend for real.
			const goroutines = 8
			p := &Params{Rate: 20_000, Size: 100}
			weights := []float64{1, 0.5, 0.25, 0.1} // B·w ≥ 10: no floor
			s := NewStore(1000)
			start := time.Now()
			clock := func() int64 { return int64(time.Since(start)) }
			var wt atomic.Pointer[Weight]
			wt.Store(InitialWeight(weights[0]))

			type tally struct {
				used       float64 // Σ n/(B·w) of admitted draws
				first, max int64
				seen       bool
				admitted   int
			}
			tallies := make([][]tally, goroutines)
			ctx, cancel := context.WithTimeout(context.Background(), tc.duration)
			defer cancel()
			var wg sync.WaitGroup
			for g := range goroutines {
				tallies[g] = make([]tally, tc.keys)
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(g), 42))
					for ctx.Err() == nil {
						key := uint64(rng.IntN(tc.keys))
						w := wt.Load()
						now := clock()
						if rng.IntN(8) == 0 {
							time.Sleep(time.Duration(rng.Int64N(int64(tc.stall))))
						}
						res, _ := s.Do(Request{Key: key, OverflowKey: 1 << 60, Params: p, Op: Draw, N: 1}, w, now)
						tl := &tallies[g][key]
						if !tl.seen || now < tl.first {
							tl.first = now
						}
						tl.max, tl.seen = max(tl.max, now), true
						if res.OK {
							tl.used += 1 / (p.Size * w.W)
							tl.admitted++
						}
					}
				}()
			}
			if tc.reweigh {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 1; ctx.Err() == nil; i++ {
						time.Sleep(3 * time.Millisecond)
						old := wt.Load()
						wt.Store(old.Next(weights[i%len(weights)], clock()))
					}
				}()
			}
			if tc.sweep {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil {
						s.Sweep(wt.Load(), clock())
						time.Sleep(time.Duration(rand.Int64N(int64(time.Millisecond))))
					}
				}()
			}
			wg.Wait()

			admitted := 0
			for k := range tc.keys {
				var all tally
				for g := range goroutines {
					tl := tallies[g][k]
					if !tl.seen {
						continue
					}
					if !all.seen || tl.first < all.first {
						all.first = tl.first
					}
					all.max, all.seen = max(all.max, tl.max), true
					all.used += tl.used
					all.admitted += tl.admitted
				}
				admitted += all.admitted
				elapsed := time.Duration(all.max - all.first).Seconds()
				bound := 1 + p.Rate/p.Size*elapsed + 1/(p.Size*weights[len(weights)-1]) // +1 token at the smallest size
				if all.used > bound {
					t.Errorf("key %d: drew %.4f buckets' worth, bound %.4f (elapsed %.6fs, %d admitted)", k, all.used, bound, elapsed, all.admitted)
				}
			}
			// The limits must bind, or the checker proves nothing.
			if admitted == 0 || s.Overflowed() != 0 {
				t.Fatalf("admitted %d, overflowed %d", admitted, s.Overflowed())
			}
			t.Logf("%d admitted", admitted)
		})
	}
}
