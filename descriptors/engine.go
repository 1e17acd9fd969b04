package descriptors

import (
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// installed is a Set with the per-rule hashes the store keys start from.
type installed struct {
	set      *Set
	ids      []uint64 // by Rule.ID
	overflow []uint64 // by Rule.ID
}

// Engine decides requests. It holds the current Set, the current weight and the
// buckets. It is safe for concurrent use: Decide takes no engine-wide lock, and a
// Swap or SetWeight is seen by the next Decide.
type Engine struct {
	cur       atomic.Pointer[installed]
	weight    atomic.Pointer[bucket.Weight]
	store     *bucket.Store
	seed      maphash.Seed
	overrides atomic.Pointer[map[overrideSpec]*Limit]
	ovMu      sync.Mutex
	quota     atomic.Bool
}

// NewEngine returns an engine deciding with set at weight w, keeping buckets in
// store. It starts no goroutines; the caller runs Sweep.
func NewEngine(set *Set, w float64, store *bucket.Store) *Engine {
	e := &Engine{store: store, seed: maphash.MakeSeed()}
	e.weight.Store(bucket.InitialWeight(w))
	e.overrides.Store(&map[overrideSpec]*Limit{})
	if set == nil {
		set = Empty()
	}
	e.Swap(set)
	return e
}

// Swap installs set and returns the set it replaced. Buckets of every rule whose
// domain, path and limit are unchanged keep their state: their keys are derived
// from exactly those, so the new set finds them where the old one left them.
func (e *Engine) Swap(set *Set) *Set {
	in := &installed{set: set, ids: make([]uint64, len(set.rules)), overflow: make([]uint64, len(set.rules))}
	for i, r := range set.rules {
		in.ids[i] = maphash.String(e.seed, r.identity)
		in.overflow[i] = mix(in.ids[i], 0x6f766572666c6f77) // "overflow"
	}
	old := e.cur.Swap(in)
	if old == nil {
		return nil
	}
	return old.set
}

// SetQuotaMode turns global quota mode on or off: every descriptor that is not
// unlimited is then in quota mode, as upstream's QUOTA_MODE.
func (e *Engine) SetQuotaMode(on bool) { e.quota.Store(on) }

// QuotaMode reports global quota mode.
func (e *Engine) QuotaMode() bool { return e.quota.Load() }

// Set returns the installed set.
func (e *Engine) Set() *Set { return e.cur.Load().set }

// Store returns the bucket store.
func (e *Engine) Store() *bucket.Store { return e.store }

// Weight returns the current weight epoch.
func (e *Engine) Weight() *bucket.Weight { return e.weight.Load() }

// SetWeight re-divides every limit: from now on each bucket refills at w's
// share, keeping its fill ratio. Buckets adopt it lazily on their next use.
func (e *Engine) SetWeight(w float64, now int64) {
	if !(w > 0) || w > 1 {
		return // a weight outside (0,1] is a bug upstream of here; keep the last
	}
	for {
		old := e.weight.Load()
		if old.W == w {
			return
		}
		if e.weight.CompareAndSwap(old, old.Next(w, now)) {
			return
		}
	}
}

// Sweep drops buckets that have refilled to full; see bucket.Store.Sweep.
func (e *Engine) Sweep(now int64) int { return e.store.Sweep(e.weight.Load(), now) }
