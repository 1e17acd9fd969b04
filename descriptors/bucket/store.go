package bucket

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// shardCount spreads buckets over independently locked maps. With 256 shards two
// cores almost never contend on distinct keys; one hot key still serialises, as a
// single token bucket must.
const shardCount = 256

// DefaultMaxBuckets is the default cap on live buckets (--max-buckets).
const DefaultMaxBuckets = 1_000_000

// entry is a bucket as stored: its state and the limit it enforces, which the
// sweeper needs to decide whether the bucket has refilled. Maps hold pointers so
// a decision costs one map lookup under the shard lock, not a lookup and a store;
// an entry is 32 bytes, one allocation when its key is first seen.
type entry struct {
	State
	params *Params
}

type shard struct {
	mu sync.Mutex
	m  map[uint64]*entry
	_  [48]byte // keep neighbouring shards' locks off one cache line
}

// Store holds every live bucket, keyed by a 64-bit hash of the rule's identity
// and the request's values. Two keys that collide share a bucket, which can only
// make a limit tighter; with a per-process random seed an outsider cannot aim for
// a collision. A Store is safe for concurrent use; its zero value is not usable.
type Store struct {
	shards   [shardCount]shard
	max      int64
	live     atomic.Int64
	overflow atomic.Uint64
}

// NewStore returns an empty store holding at most max buckets (plus one overflow
// bucket per rule that has needed one). max <= 0 means DefaultMaxBuckets.
func NewStore(max int) *Store {
	if max <= 0 {
		max = DefaultMaxBuckets
	}
	s := &Store{max: int64(max)}
	for i := range s.shards {
		s.shards[i].m = make(map[uint64]*entry)
	}
	return s
}

// Request is one operation against one bucket.
type Request struct {
	Key uint64
	// OverflowKey is the rule's shared bucket, used when Key is new and the store
	// is at its cap.
	OverflowKey uint64
	Params      *Params
	Op          Op
	N           float64
}

// Do applies r at now with weight wt. It creates the bucket, full, on first use.
// overflowed reports that the store was full and r used the rule's overflow bucket.
func (s *Store) Do(r Request, wt *Weight, now int64) (res Result, overflowed bool) {
	sh := &s.shards[r.Key%shardCount]
	sh.mu.Lock()
	e := sh.m[r.Key]
	if e == nil {
		if s.live.Load() >= s.max {
			sh.mu.Unlock()
			s.overflow.Add(1)
			return s.doOverflow(r, wt, now), true
		}
		s.live.Add(1)
		e = &entry{State: Full(now, wt), params: r.Params}
		sh.m[r.Key] = e
	}
	e.Advance(r.Params, wt, now)
	res = e.Apply(r.Params, wt.W, r.Op, r.N)
	sh.mu.Unlock()
	return res, false
}

func (s *Store) doOverflow(r Request, wt *Weight, now int64) Result {
	sh := &s.shards[r.OverflowKey%shardCount]
	sh.mu.Lock()
	e := sh.m[r.OverflowKey]
	if e == nil {
		e = &entry{State: Full(now, wt), params: r.Params}
		e.overflow = true
		sh.m[r.OverflowKey] = e
	}
	e.Advance(r.Params, wt, now)
	res := e.Apply(r.Params, wt.W, r.Op, r.N)
	sh.mu.Unlock()
	return res
}

// Peek returns a bucket's state brought up to now without changing it, and
// whether it exists. A missing bucket is full.
func (s *Store) Peek(key uint64, wt *Weight, now int64) (State, bool) {
	sh := &s.shards[key%shardCount]
	sh.mu.Lock()
	e := sh.m[key]
	if e == nil {
		sh.mu.Unlock()
		return Full(now, wt), false
	}
	st := e.State
	sh.mu.Unlock()
	st.Advance(e.params, wt, now)
	return st, true
}

// Live is the number of buckets counted against the cap.
func (s *Store) Live() int { return int(s.live.Load()) }

// Overflowed is how many operations went to an overflow bucket since start.
func (s *Store) Overflowed() uint64 { return s.overflow.Load() }

// Max is the cap on live buckets.
func (s *Store) Max() int { return int(s.max) }

// Sweep drops every bucket that has refilled to full by now. A full bucket is
// indistinguishable from a missing one, so this loses nothing. It returns how many
// buckets it dropped. It holds one shard's lock at a time.
func (s *Store) Sweep(wt *Weight, now int64) int {
	dropped := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if e.FullAt(e.params, wt, now) {
				delete(sh.m, k)
				if !e.overflow {
					s.live.Add(-1)
				}
				dropped++
			}
		}
		sh.mu.Unlock()
	}
	return dropped
}

// Sweeper runs Sweep every interval until ctx ends. weight and now are read at
// each pass. Long-running parts are owned by their caller: this starts nothing.
func (s *Store) Sweeper(ctx context.Context, interval time.Duration, weight func() *Weight, now func() int64, onSweep func(dropped int)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			d := s.Sweep(weight(), now())
			if onSweep != nil {
				onSweep(d)
			}
		}
	}
}
