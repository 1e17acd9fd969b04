package bucket

import (
	"math/rand/v2"
	"sync"
	"testing"
)

// TestKeyZeroSurvivesExportRestore: a bucket at key 0 is exported and
// restored into a fresh store; it must come back at key 0 with its debt.
func TestKeyZeroSurvivesExportRestore(t *testing.T) {
	wt := InitialWeight(1)
	p := &Params{Rate: 1, Size: 10}
	a := NewStore(100)
	if res, _ := a.Do(Request{Key: 0, OverflowKey: 77, Params: p, Op: Draw, N: 10}, wt, 0); !res.OK {
		t.Fatal("first draw refused")
	}
	var saved []Saved
	a.Export([]*Weight{wt}, 0, func(b []Saved) { saved = append(saved, b...) })
	if len(saved) != 1 {
		t.Fatalf("exported %d buckets", len(saved))
	}
	b := NewStore(100)
	for _, s := range saved {
		b.Restore(s, wt, 0)
	}
	if s, ok := b.Peek(0, wt, 0); !ok || s.Fill > 0.01 {
		t.Fatalf("exported as key %#x; restored store's key 0: %+v present=%v", saved[0].Key, s, ok)
	}
	// The limiter: key 0 is empty, so a draw of 10 must be refused.
	if res, _ := b.Do(Request{Key: 0, OverflowKey: 77, Params: p, Op: Draw, N: 10}, wt, 0); res.OK {
		t.Fatalf("after restore, key 0 admits a full burst again (exported under key %#x)", saved[0].Key)
	}
}

// TestStoreModelSameShard: many keys of one shard, random draws, sweeps,
// moves within the shard and across shards, held to a map model of fills.
func TestStoreModelSameShard(t *testing.T) {
	wt := InitialWeight(1)
	p := &Params{Rate: 1e-9, Size: 1} // 1 token a second, size 1
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 3))
		keys := make([]uint64, 200)
		for i := range keys {
			keys[i] = r.Uint64()<<8 | uint64(r.IntN(2)) // shards 0 and 1
		}
		s := NewStore(1 << 20)
		now := int64(0)
		for op := range 20000 {
			now += int64(r.IntN(50_000_000))
			switch r.IntN(6) {
			case 0:
				s.Sweep(wt, now)
			case 1:
				from, to := keys[r.IntN(len(keys))], keys[r.IntN(len(keys))]
				if from != to {
					s.Move(from, wt, to, wt, 0, now)
				}
			default:
				s.Do(Request{Key: keys[r.IntN(len(keys))], OverflowKey: 1 << 63, Params: p, Op: Draw, N: 1}, wt, now)
			}
			// Every key's bucket is found, and live counts the tables.
			n := 0
			for i := range s.shards {
				n += s.shards[i].m.len()
				c := 0
				s.shards[i].m.all(func(k uint64, e *entry) bool {
					c++
					if s.shards[i].m.get(k) != e {
						t.Fatalf("seed %d op %d: key %x not reachable from its home", seed, op, k)
					}
					return true
				})
				if c != s.shards[i].m.len() {
					t.Fatalf("seed %d op %d: all yields %d of %d", seed, op, c, s.shards[i].m.len())
				}
			}
			if int64(n) != s.live.Load() {
				t.Fatalf("seed %d op %d: tables hold %d, live %d", seed, op, n, s.live.Load())
			}
		}
	}
}

// TestConcurrentSameShard: draws, sweeps, moves, exports and restores
// on keys of one shard at once; with no refill, each key admits at most its
// size, and the table stays consistent.
func TestConcurrentSameShard(t *testing.T) {
	wt := InitialWeight(1)
	p := &Params{Rate: 1e-12, Size: 5}
	s := NewStore(1 << 20)
	keys := make([]uint64, 300)
	for i := range keys {
		keys[i] = uint64(i+1) << 8 // all in shard 0
	}
	done := make(chan struct{})
	admitted := make([][]int, 4)
	var wg sync.WaitGroup
	for g := range 4 {
		admitted[g] = make([]int, len(keys))
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 20000 {
				i := r.IntN(len(keys))
				if res, _ := s.Do(Request{Key: keys[i], OverflowKey: 1, Params: p, Op: Draw, N: 1}, wt, 0); res.OK {
					admitted[g][i]++
				}
			}
		}()
	}
	var sw sync.WaitGroup
	sw.Add(1)
	go func() {
		defer sw.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			s.Sweep(wt, 0)
			s.Export([]*Weight{wt}, 0, func([]Saved) {})
		}
	}()
	wg.Wait()
	close(done)
	sw.Wait()
	for i := range keys {
		tot := 0
		for g := range 4 {
			tot += admitted[g][i]
		}
		if tot > 5 {
			t.Fatalf("key %x admitted %d draws, size 5", keys[i], tot)
		}
	}
}
