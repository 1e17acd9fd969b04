package bucket

import (
	"math"
	"sync"
	"sync/atomic"
)

// shardCount spreads buckets over independently locked maps. With 256 shards two
// cores almost never contend on distinct keys; one hot key still serialises, as a
// single token bucket must.
const shardCount = 256

// DefaultMaxBuckets is the default cap on live buckets (--max-buckets).
const DefaultMaxBuckets = 1_000_000

// entry is a bucket as stored: its state and the two figures of the limit it
// was last brought up to date under. Decisions refill it at the request's
// Params; the figures tell when those changed (bring), and they are what
// the sweeper and a snapshot judge it by until its next use, so a reload
// that changes its rule's limit lowers them (Relimit) to figures that refill
// no faster than either limit. It holds no pointers, so the maps that hold
// entries by value are never scanned by the garbage collector, however many
// buckets are live: a GC cycle costs the same with a million buckets as
// with none. 32 bytes: its group rides in State's padding.
type entry struct {
	State
	rate, size float32 // cluster-wide
}

// bring refills e up to now under p. A bucket last brought up to date under
// other figures (a reload changed its rule's limit, or a restore or a
// sweep's judgment lowered them) refills the time since then at the slower
// of the two, since it does not know when the change came, and lives by p
// from then on. Its fill ratio carries over either way: a changed limit
// never hands out a fresh burst.
func (e *entry) bring(p *Params, wt *Weight, now int64) {
	if e.rate != float32(p.Rate) || e.size != float32(p.Size) {
		e.relimit(p, wt, now)
		return
	}
	e.advance(p, wt, now)
}

func (e *entry) relimit(p *Params, wt *Weight, now int64) {
	was := e.params()
	slow := Slower(&was, p)
	e.advance(&slow, wt, now)
	e.rate, e.size = float32(p.Rate), float32(p.Size)
}

// run brings e up to now and applies r: bring, the rule's ramp, then the
// operation.
func (e *entry) run(r *Request, wt *Weight, now int64) Result {
	e.bring(r.Params, wt, now)
	if r.Ramp != nil {
		r.Ramp.hold(&e.State, r.Params, now)
	}
	return e.apply(r.Params, wt.W, r.Op, r.N)
}

func newEntry(now int64, wt *Weight, r *Request) entry {
	e := entry{State: Full(now, wt), rate: float32(r.Params.Rate), size: float32(r.Params.Size)}
	e.group, e.tag = r.Group, r.Tag
	return e
}

func (e *entry) params() Params { return Params{Rate: float64(e.rate), Size: float64(e.size)} }

type shard struct {
	mu sync.Mutex
	m  table
	_  [16]byte // keep neighbouring shards' locks off one cache line
}

// The cap covers every bucket, overflow buckets included, so the store never
// holds more than --max-buckets. A slice of it is kept for the shared overflow
// buckets that rules and overrides fall back to once the rest is full: 1% of
// the cap, at least 16 (a quarter of a cap below 64, and at least one) and at
// most maxOverflowReserve. Past the whole cap nothing new is held at all: a
// request that would need a new bucket is refused, which is tighter, never
// looser.
const maxOverflowReserve = 4096

func overflowReserve(capacity int64) int64 {
	return max(min(max(capacity/100, min(16, capacity/4)), maxOverflowReserve), 1)
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
	swept    atomic.Uint64
	// floor is the latest reading a sweep judged buckets full at. A bucket
	// created later starts no earlier than floor: a request that read the clock
	// before a sweep dropped its bucket must not refill, a second time, the
	// time up to the sweep.
	floor atomic.Int64
	// ramp, while set, caps the fill a new bucket starts at (ramp.go).
	ramp         atomic.Pointer[Ramp]
	rampRejected atomic.Uint64
	rampWithheld atomic.Uint64 // tokens, rounded down per bucket
	// maint keeps sweeps and exports, which judge buckets by their own
	// figures, off the buckets while a reload changes limits (Relimit):
	// they take it for reading one shard at a time; Relimit for writing,
	// from before the new limits are installed until every bucket's
	// figures are lowered. Decisions never take it.
	maint sync.RWMutex
}

// NewStore returns an empty store holding at most max buckets, overflow
// buckets included. max <= 0 means DefaultMaxBuckets.
func NewStore(max int) *Store {
	if max <= 0 {
		max = DefaultMaxBuckets
	}
	s := &Store{max: int64(max)}
	s.floor.Store(math.MinInt64)
	return s
}

// Request is one operation against one bucket.
type Request struct {
	Key uint64
	// OverflowKey is the bucket Key shares with others when Key is new and the
	// store is at its cap: one per rule, or one per (domain, override limit).
	OverflowKey uint64
	Params      *Params
	Op          Op
	N           float64
	// Group names the weight history wt belongs to, for the sweeper: a bucket
	// must always be used with the same group, since its Epoch counts that
	// group's changes. Stores with one weight leave it 0.
	Group uint16
	// From, when FromWeight is set, is another bucket of the same limit that
	// Key takes over from: a missing Key starts no fuller than From is now,
	// judged at FromWeight (the weight From lives by). A key that moves to a
	// bucket of its own (a value that became hot) so carries its debt along
	// instead of starting with a fresh burst.
	From       uint64
	FromWeight *Weight
	// FromOverflow is From's overflow bucket, which From's key may have
	// drawn from while the store was at its cap: a missing Key starts no
	// fuller than it either (with FromWeight set).
	FromOverflow uint64
	// Tag names the rule a new bucket belongs to, for snapshots; 0 for none
	// (a request's own limit).
	Tag uint16
	// Ramp, when set, is the ramp of a rule a reload added: no bucket of
	// it, found or created, holds more than the ramp allows at now.
	Ramp *Ramp
}

// Do applies r at now with weight wt. A missing bucket is full, and it is
// created only when r leaves it less than full: a check, a give-back or a
// refused draw costs no memory. overflowed reports that the store was at its
// cap and r used its overflow bucket instead.
func (s *Store) Do(r Request, wt *Weight, now int64) (res Result, overflowed bool) {
	// The common case, an existing bucket, in one frame and without a defer:
	// this is the hot path of every decision.
	sh := &s.shards[r.Key%shardCount]
	sh.mu.Lock()
	if e := sh.m.get(r.Key); e != nil {
		// bring, written out: one call on the common path, as before.
		if e.rate != float32(r.Params.Rate) || e.size != float32(r.Params.Size) {
			e.relimit(r.Params, wt, now)
		} else {
			e.advance(r.Params, wt, now)
		}
		if r.Ramp != nil {
			r.Ramp.hold(&e.State, r.Params, now)
		}
		res = e.apply(r.Params, wt.W, r.Op, r.N)
		sh.mu.Unlock()
		return res, false
	}
	sh.mu.Unlock()
	return s.create(&r, wt, now)
}

// create applies r to a bucket that was missing when Do looked, at its own key
// while the store has room, else at its overflow key.
func (s *Store) create(r *Request, wt *Weight, now int64) (Result, bool) {
	debt := s.debt(r, wt, now)
	if r.Ramp != nil {
		debt = min(debt, r.Ramp.Fill(r.Params, now))
	}
	fill := debt
	if rp := s.ramp.Load(); rp != nil {
		fill = min(fill, rp.Fill(r.Params, now))
	}
	if res, ok := s.do(r.Key, r, wt, now, s.max-overflowReserve(s.max), fill); ok {
		if fill < debt && r.Op == Draw {
			_, size := r.Params.Local(wt.W)
			s.rampWithheld.Add(uint64((debt - fill) * size))
			// Refused: would the draw have passed without the ramp?
			if !res.OK && debt*size+epsilon >= r.N && r.N <= size+epsilon {
				s.rampRejected.Add(1)
			}
		}
		return res, false
	}
	s.overflow.Add(1)
	// An overflow bucket starts full: it is shared. One of a key that took
	// over from another (From) is that key's own, and starts with its debt.
	// One of a rule a reload added starts on the rule's ramp.
	ovFill := 1.0
	if r.FromWeight != nil {
		ovFill = fill
	}
	if r.Ramp != nil {
		ovFill = min(ovFill, r.Ramp.Fill(r.Params, now))
	}
	res, ok := s.do(r.OverflowKey, r, wt, now, s.max, ovFill)
	if !ok {
		// Even the overflow bucket cannot be held: refuse, never admit unmetered.
		return Result{OK: r.Op == GiveBack}, true
	}
	return res, true
}

// do applies r to the bucket at key, creating it at fill when missing. When
// the bucket is missing, would be kept, and the store already holds limit
// buckets, it changes nothing and reports false. Another request may have
// created the bucket since Do looked, so it looks again under the lock.
func (s *Store) do(key uint64, r *Request, wt *Weight, now int64, limit int64, fill float64) (Result, bool) {
	sh := &s.shards[key%shardCount]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if ep := sh.m.get(key); ep != nil {
		return ep.run(r, wt, now), true
	}
	e := newEntry(max(now, s.floor.Load()), wt, r)
	e.Fill = fill
	res := e.State.Do(r.Params, wt, now, r.Op, r.N)
	switch {
	case e.Fill >= 1:
		return res, true // still full: nothing worth keeping
	case !s.reserve(limit):
		return Result{}, false
	}
	sh.m.put(key, e)
	return res, true
}

// debt is the fill a new bucket for r starts at: full, unless r's overflow
// bucket holds less. A key may have drawn from the overflow bucket while the
// store was at its cap; when a sweep then frees a place, a full bucket of its
// own would hand it a second burst at once. Starting at the overflow bucket's
// fill can only be tighter, for that key and for any other that arrives while
// the overflow bucket is in use.
func (s *Store) debt(r *Request, wt *Weight, now int64) float64 {
	fill := s.fillOf(r.OverflowKey, r.Params, wt, now)
	if r.FromWeight != nil {
		fill = min(fill, s.fillOf(r.From, r.Params, r.FromWeight, now), s.fillOf(r.FromOverflow, r.Params, r.FromWeight, now))
	}
	return fill
}

// fillOf is the fill of the bucket at key brought up to now at wt, without
// changing it; 1 when it is missing.
func (s *Store) fillOf(key uint64, p *Params, wt *Weight, now int64) float64 {
	sh := &s.shards[key%shardCount]
	sh.mu.Lock()
	ep := sh.m.get(key)
	if ep == nil {
		sh.mu.Unlock()
		return 1
	}
	e := *ep // a copy: the bucket is not changed
	sh.mu.Unlock()
	e.bring(p, wt, now)
	return min(1, e.Fill)
}

// Move hands the bucket at from (living by fromW) over to the bucket at to,
// which lives by toW in group toGroup: to ends no fuller than from is now,
// and from is dropped. A missing from changes nothing; a missing to is
// created at from's fill unless that is full. The place from held in the
// store passes to to, so a move never needs room. It is how a key that had
// a bucket of its own (a hot value) goes back to its usual bucket without
// a fresh burst there.
func (s *Store) Move(from uint64, fromW *Weight, to uint64, toW *Weight, toGroup uint16, now int64) {
	sh := &s.shards[from%shardCount]
	sh.mu.Lock()
	var src entry
	ep := sh.m.get(from)
	ok := ep != nil
	if ok {
		src = *ep
		sh.m.delete(from)
	}
	sh.mu.Unlock()
	if !ok {
		return
	}
	p := src.params()
	src.advance(&p, fromW, now)
	dh := &s.shards[to%shardCount]
	dh.mu.Lock()
	defer dh.mu.Unlock()
	dst := dh.m.get(to)
	switch {
	case dst != nil:
		dst.bring(&p, toW, now)
		dst.Fill = min(dst.Fill, src.Fill)
		s.live.Add(-1)
	case src.Fill < 1:
		e := src
		e.Last, e.Epoch, e.group = max(src.Last, now), toW.Epoch, toGroup
		dh.m.put(to, e)
	default:
		s.live.Add(-1)
	}
}

// reserve counts one more bucket if fewer than limit are held. It is exact
// under concurrency: shards race for the last places, and only limit win.
func (s *Store) reserve(limit int64) bool {
	for {
		n := s.live.Load()
		if n >= limit {
			return false
		}
		if s.live.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Live is the number of buckets counted against the cap.
func (s *Store) Live() int { return int(s.live.Load()) }

// Overflowed is how many operations went to an overflow bucket since start.
func (s *Store) Overflowed() uint64 { return s.overflow.Load() }

// Max is the cap on live buckets.
func (s *Store) Max() int { return int(s.max) }

// Sweep drops every bucket that has refilled to full by now, judged at wt. A
// full bucket is indistinguishable from a missing one, so this loses nothing.
// It returns how many buckets it dropped. It holds one shard's lock at a time.
// It is SweepGroups for a store whose buckets all live in group 0.
func (s *Store) Sweep(wt *Weight, now int64) int { return s.SweepGroups([]*Weight{wt}, now) }

// SweepGroups is Sweep for buckets of several groups: each bucket is judged
// by weights[its group]. A bucket whose group has no weight here is kept:
// judged by another group's weight it could be dropped while not yet full,
// and come back full, which is looser.
func (s *Store) SweepGroups(weights []*Weight, now int64) int {
	// The floor is raised before anything is dropped, so a request that finds
	// its bucket gone (under the same shard lock) also sees the floor.
	for f := s.floor.Load(); f < now; f = s.floor.Load() {
		if s.floor.CompareAndSwap(f, now) {
			break
		}
	}
	dropped := 0
	for i := range s.shards {
		sh := &s.shards[i]
		s.maint.RLock()
		sh.mu.Lock()
		n := sh.m.sweep(func(_ uint64, e *entry) bool {
			// A bucket last used after now is judged at its own last reading
			// by a later sweep: dropping it here could let it restart at now,
			// earlier than the time it has already been refilled to.
			if int(e.group) >= len(weights) || weights[e.group] == nil {
				return false
			}
			p := e.params()
			return e.Last <= now && e.FullAt(&p, weights[e.group], now)
		})
		s.live.Add(-int64(n))
		dropped += n
		sh.mu.Unlock()
		s.maint.RUnlock()
	}
	s.swept.Add(uint64(dropped))
	return dropped
}

// Swept is how many buckets sweeps have dropped since start.
func (s *Store) Swept() uint64 { return s.swept.Load() }

// Relimit is how a reload puts new limits in force for buckets that stay.
// install, which installs the new limits, runs with every sweep and export
// held off; then every bucket whose tag is a key of slower has its figures
// lowered to Slower of its own and slower[tag], before any sweep or export
// sees it again. A bucket's figures are what those judge it by until its
// next use, so a bucket nobody uses across the reload is never judged full
// at a rate faster than the one in force, and one untouched across several
// reloads at no rate faster than the slowest of them; its next use refills
// the time since at those figures and takes the request's (bring). Tags are
// 16 bits: another rule's buckets sharing one are lowered too, which is
// tighter, never looser, until their next use. Decisions go on meanwhile,
// each shard held only while its buckets are lowered.
func (s *Store) Relimit(slower map[uint16]Params, install func()) {
	if len(slower) == 0 {
		install()
		return
	}
	s.maint.Lock()
	defer s.maint.Unlock()
	install()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.m.all(func(_ uint64, e *entry) bool {
			if p, ok := slower[e.tag]; ok && e.tag != 0 {
				was := e.params()
				q := Slower(&was, &p)
				e.rate, e.size = float32(q.Rate), float32(q.Size)
			}
			return true
		})
		sh.mu.Unlock()
	}
}
