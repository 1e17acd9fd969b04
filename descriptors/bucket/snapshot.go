package bucket

import "math"

// Saved is one bucket as a snapshot keeps it: its fill as of the snapshot's
// time, the group whose weight it lived by, the rule it belongs to, and its
// limit's cluster-wide figures.
type Saved struct {
	Key        uint64
	Fill       float64
	Group, Tag uint16
	Rate, Size float32
}

// Export calls emit with every live bucket, brought up to now at its
// group's weight (weights[group]; a bucket of a group without one is left
// out), shard by shard: a shard's lock is held only while its buckets are
// copied, never while emit runs, so a snapshot of a million buckets holds
// up no decision for longer than one shard's copy. A bucket already full
// at now is left out: it is the same as a missing one. The batch passed to
// emit is reused after emit returns.
func (s *Store) Export(weights []*Weight, now int64, emit func(batch []Saved)) {
	var raw []kv
	var batch []Saved
	for i := range s.shards {
		sh := &s.shards[i]
		raw = raw[:0]
		s.maint.RLock()
		sh.mu.Lock()
		sh.m.all(func(k uint64, e *entry) bool {
			raw = append(raw, kv{k, *e})
			return true
		})
		sh.mu.Unlock()
		s.maint.RUnlock()
		// Brought up to now outside the lock: the copies are the
		// snapshot's, the buckets themselves are not changed.
		batch = batch[:0]
		for _, x := range raw {
			e := x.e
			if int(e.group) >= len(weights) || weights[e.group] == nil {
				continue
			}
			p := e.params()
			e.advance(&p, weights[e.group], now)
			if e.Fill >= 1 {
				continue
			}
			batch = append(batch, Saved{Key: x.k, Fill: e.Fill, Group: e.group, Tag: e.tag, Rate: e.rate, Size: e.size})
		}
		if len(batch) > 0 {
			emit(batch)
		}
	}
}

type kv struct {
	k uint64
	e entry
}

// Restore adds b, a bucket saved by Export, at now: it starts at b.Fill in
// group b.Group, whose weight is wt. A bucket already held at b.Key (a
// request got there first) keeps the emptier of the two. It reports false,
// changing nothing, when the store is at its cap (less the overflow
// reserve) or b is full, or b's fill is not a number.
func (s *Store) Restore(b Saved, wt *Weight, now int64) bool {
	if !(b.Fill < 1) || math.IsNaN(b.Fill) || wt == nil {
		return false
	}
	e := entry{State: State{Fill: max(b.Fill, minRestoredFill), Last: now, Epoch: wt.Epoch}, rate: b.Rate, size: b.Size}
	e.group, e.tag = b.Group, b.Tag
	sh := &s.shards[b.Key%shardCount]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if cur := sh.m.get(b.Key); cur != nil {
		p := cur.params()
		cur.advance(&p, wt, now)
		cur.Fill = min(cur.Fill, e.Fill)
		return true
	}
	if !s.reserve(s.max - overflowReserve(s.max)) {
		return false
	}
	sh.m.put(b.Key, e)
	return true
}

// minRestoredFill bounds how far below empty a restored bucket may start:
// wait-policy reservations take a bucket below 0, never below -1 (a draw
// takes at most its size); a snapshot that says less is not believed that
// far.
const minRestoredFill = -1

// Peek returns the bucket at key brought up to now at wt, as Export would
// save it, without changing it; false when there is none.
func (s *Store) Peek(key uint64, wt *Weight, now int64) (Saved, bool) {
	sh := &s.shards[key%shardCount]
	sh.mu.Lock()
	ep := sh.m.get(key)
	if ep == nil {
		sh.mu.Unlock()
		return Saved{}, false
	}
	e := *ep
	sh.mu.Unlock()
	p := e.params()
	e.advance(&p, wt, now)
	return Saved{Key: key, Fill: e.Fill, Group: e.group, Tag: e.tag, Rate: e.rate, Size: e.size}, true
}
