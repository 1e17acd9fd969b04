package engine

import (
	"math"
	"time"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// Snapshots (--state-file). The engine saves its buckets with the weight of
// each group and its seed, and restores them into a new process: each bucket
// refilled for the time the daemon was down at the rate it had, and put in
// the group its rule uses now. A bucket carries its rule's tag, so one whose
// rule is gone (or has another path or share) is dropped; one whose rule's
// limit changed keeps its fill ratio, as across a reload. A hot value's
// bucket is saved under its usual key, with the debt it holds: a restarted
// daemon starts with no hot values.

// tagOf is the tag of rule identity on its buckets: 16 bits of the rule's
// cross-replica ID, never 0 (the tag of a request's own limit). Two rules
// can share a tag: whatever uses tags takes the tighter choice between
// them.
func tagOf(identity string) uint16 {
	t := uint16(ruleIDOf(identity))
	if t == 0 {
		t = 1
	}
	return t
}

// Weights returns each group's current weight, by group: a snapshot saves
// them, and restoring refills each bucket for the time the daemon was down
// at its group's.
func (e *Engine) Weights() []float64 {
	out := make([]float64, e.groups.Load())
	for i := range out {
		out[i] = e.weights[i].Load().W
	}
	return out
}

// Export calls emit with every bucket worth saving, as of now: see
// bucket.Store.Export, which it runs shard by shard. Buckets of hot values
// and leased keys are not emitted; their debt goes with the usual bucket.
func (e *Engine) Export(now int64, emit func([]bucket.Saved)) {
	ws := e.weightEpochs()
	e.swapMu.Lock()
	for _, g := range e.freeGroups {
		ws[g] = nil // what is left in them is orphaned
	}
	e.swapMu.Unlock()
	merge := map[uint64]bucket.Saved{}
	for _, d := range *e.demandOf.Load() {
		if d == nil || d.hot == nil {
			continue
		}
		d.hot.mu.Lock()
		for _, sl := range d.hot.slots {
			if int(sl.group) < len(ws) {
				ws[sl.group] = nil
			}
		}
		d.hot.mu.Unlock()
		for _, hv := range d.HotValues() {
			k := hv.key.Load()
			if k == 0 {
				continue
			}
			sv, ok := e.store.Peek(mix(k, hv.salt), e.weights[hv.group].Load(), now)
			if !ok || sv.Fill >= 1 {
				continue
			}
			sv.Key, sv.Group = k, d.domainGroup
			if m, seen := merge[k]; seen {
				sv.Fill = min(sv.Fill, m.Fill)
			}
			merge[k] = sv
		}
	}
	e.leasedDebts(ws, merge, now)
	e.store.Export(ws, now, func(batch []bucket.Saved) {
		for i := range batch {
			if m, ok := merge[batch[i].Key]; ok {
				batch[i].Fill = min(batch[i].Fill, m.Fill)
				delete(merge, batch[i].Key)
			}
		}
		emit(batch)
	})
	if len(merge) > 0 {
		rest := make([]bucket.Saved, 0, len(merge))
		for _, sv := range merge {
			rest = append(rest, sv)
		}
		emit(rest)
	}
}

// Restored counts what a restore did with the buckets it was given.
type Restored struct {
	Kept   int // in the store now
	Gone   int // their rule is gone, or has another path or share now
	Full   int // refilled while the daemon was down
	NoRoom int // the store was at its cap
}

// Restore adds saved buckets at now: each refilled for elapsed (the time
// the daemon was down) at its saved group's weight savedW[group] (no
// refill when that weight is unknown: tighter, never looser), and put in
// the group its rule uses now. A bucket whose rule's limit is not the one
// it was saved under keeps its fill ratio and refills the downtime at the
// slower of the two limits, as across a reload (Swap). A bucket of a
// request's own limit (tag 0) has no rule to ask: groupOf maps its saved
// group to today's, false dropping it. Call it before the engine serves, on
// an engine made with the snapshot's seed (Options.Seed) and its rules.
func (e *Engine) Restore(saved []bucket.Saved, savedW []float64, elapsed time.Duration, groupOf func(uint16) (uint16, bool), now int64) Restored {
	return e.restore(e.cur.Load(), saved, savedW, elapsed, groupOf, now)
}

// RestoreFor is Restore against set, the rules about to be installed,
// before they are: a source that installs its first rules while the daemon
// serves (xDS with --force-start-without-initial-config) restores their
// buckets before any request can reach them.
func (e *Engine) RestoreFor(set *descriptors.Set, saved []bucket.Saved, savedW []float64, elapsed time.Duration, groupOf func(uint16) (uint16, bool), now int64) Restored {
	e.swapMu.Lock()
	in := e.prepare(set)
	e.swapMu.Unlock()
	return e.restore(in, saved, savedW, elapsed, groupOf, now)
}

// target is where a saved bucket of a tag can go: a rule's group and
// figures.
type target struct {
	group uint16
	p     bucket.Params
}

// targets are the targets of in's rules that draw, by tag.
func targets(in *installed) map[uint16][]target {
	byTag := map[uint16][]target{}
	for i, r := range in.set.Rules() {
		l := r.Limit()
		if !draws(l) {
			continue
		}
		g := in.domains[r.Domain()].group
		switch {
		case l.Share() == descriptors.ShareReplica:
			g = replicaGroup
		case in.demand != nil && in.demand[i] != nil:
			g = in.demand[i].group
		}
		tag := in.rules[i].tag
		byTag[tag] = append(byTag[tag], target{group: g, p: in.rules[i].params})
	}
	return byTag
}

func (e *Engine) restore(in *installed, saved []bucket.Saved, savedW []float64, elapsed time.Duration, groupOf func(uint16) (uint16, bool), now int64) Restored {
	byTag := targets(in)
	var res Restored
	secs := max(elapsed.Seconds(), 0)
	for _, b := range saved {
		var g uint16
		var ok bool
		p := bucket.Params{Rate: float64(b.Rate), Size: float64(b.Size)}
		if b.Tag == 0 {
			g, ok = groupOf(b.Group)
		} else {
			g, ok = e.retarget(&b, &p, byTag[b.Tag])
		}
		fill := b.Fill
		if int(b.Group) < len(savedW) {
			if w := savedW[b.Group]; w > 0 && w <= 1 {
				if r, size := p.Local(w); size > 0 {
					fill += secs * r / size
				}
			}
		}
		if !(fill < 1) {
			res.Full++
			continue
		}
		if !ok || int(g) >= int(e.groups.Load()) || math.IsNaN(fill) {
			res.Gone++
			continue
		}
		b.Fill, b.Group = fill, g
		if !e.store.Restore(b, e.weights[g].Load(), now) {
			res.NoRoom++
			continue
		}
		res.Kept++
	}
	return res
}

// retarget finds the group of saved bucket b among the targets of its tag,
// false for none. Two rules can share a tag (16 bits): a bucket saved under
// share: replica goes only to such a rule, and among the others the one
// whose group weighs least takes it, at the slowest of their limits, which
// is tighter whichever was meant. It sets p, the figures b's downtime
// refills at, to the slower of those it was saved under (p on entry) and
// those in force, and b's to those in force, which it lives by from now on.
func (e *Engine) retarget(b *bucket.Saved, p *bucket.Params, ts []target) (g uint16, ok bool) {
	var cur bucket.Params
	for _, t := range ts {
		if (t.group == replicaGroup) != (b.Group == replicaGroup) {
			continue
		}
		if !ok {
			cur = t.p
		}
		cur = bucket.Slower(&cur, &t.p)
		if !ok || e.weights[t.group].Load().W < e.weights[g].Load().W {
			g, ok = t.group, true
		}
	}
	if ok {
		*p = bucket.Slower(p, &cur)
		b.Rate, b.Size = float32(cur.Rate), float32(cur.Size)
	}
	return g, ok
}
