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

// entry is a bucket as stored: its state and the two figures of its limit the
// sweeper needs to tell whether it has refilled. It holds no pointers, so the
// maps that hold entries by value are never scanned by the garbage collector,
// however many buckets are live: a GC cycle costs the same with a million
// buckets as with none. 32 bytes.
type entry struct {
	State
	rate, size float32 // cluster-wide, for the sweeper only; decisions use the request's Params
}

func newEntry(now int64, wt *Weight, p *Params) entry {
	return entry{State: Full(now, wt), rate: float32(p.Rate), size: float32(p.Size)}
}

func (e *entry) params() Params { return Params{Rate: float64(e.rate), Size: float64(e.size)} }

type shard struct {
	mu sync.Mutex
	m  map[uint64]entry
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
		s.shards[i].m = make(map[uint64]entry)
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
	e, ok := sh.m[r.Key]
	if !ok {
		if s.live.Load() >= s.max {
			sh.mu.Unlock()
			s.overflow.Add(1)
			return s.doOverflow(r, wt, now), true
		}
		s.live.Add(1)
		e = newEntry(now, wt, r.Params)
	}
	e.Advance(r.Params, wt, now)
	res = e.Apply(r.Params, wt.W, r.Op, r.N)
	sh.m[r.Key] = e
	sh.mu.Unlock()
	return res, false
}

func (s *Store) doOverflow(r Request, wt *Weight, now int64) Result {
	sh := &s.shards[r.OverflowKey%shardCount]
	sh.mu.Lock()
	e, ok := sh.m[r.OverflowKey]
	if !ok {
		e = newEntry(now, wt, r.Params)
		e.overflow = true
	}
	e.Advance(r.Params, wt, now)
	res := e.Apply(r.Params, wt.W, r.Op, r.N)
	sh.m[r.OverflowKey] = e
	sh.mu.Unlock()
	return res
}

// Peek returns a bucket's state brought up to now without changing it, and
// whether it exists. A missing bucket is full.
func (s *Store) Peek(key uint64, wt *Weight, now int64) (State, bool) {
	sh := &s.shards[key%shardCount]
	sh.mu.Lock()
	e, ok := sh.m[key]
	sh.mu.Unlock()
	if !ok {
		return Full(now, wt), false
	}
	p := e.params()
	e.Advance(&p, wt, now)
	return e.State, true
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
			if p := e.params(); e.FullAt(&p, wt, now) {
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
