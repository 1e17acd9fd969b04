package engine

import (
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors"
)

// Hot values. A rule with a bucket per value (a per-IP limit, say) is shared
// by demand value by value, but only for its hottest values: the demand
// controller makes at most --demand-top-keys values of each such rule hot,
// and every other value keeps its equal share. A hot value has a weight
// group of its own (a slot, reused when the value cools) and a bucket of
// its own, keyed by its usual bucket and the slot's generation. The bucket
// starts no fuller than the usual one (Request.From) and, when the value
// cools, hands its debt back to it (Store.Move): becoming hot or cold hands
// out no burst.
//
// Which values are hot is the cluster's decision, so a value is named the
// same way in every replica: ValueID, FNV-1a of the rule's RuleID and the
// values that pick the bucket. The store's keys stay seeded per process; a
// crafted collision of value IDs only makes two values follow one division
// of L, each with a bucket of its own, so the sum over replicas of either
// still stays within L.

// DefaultTopKeys is --demand-top-keys: the values of each per-value demand
// rule that can be hot at once.
const DefaultTopKeys = 64

// MaxTopKeys bounds --demand-top-keys.
const MaxTopKeys = 1024

// CandidateSampling: one draw in this many on a value that is not hot is
// counted towards the rule's candidates, so finding the hot values costs a
// lock on one request in 16, not on each.
const CandidateSampling = 16

// candidatesPerKey: a rule's candidate tracker holds this many values per
// hot slot. It is a Misra-Gries summary in candidateShards parts, by value
// ID: any value drawing more than 1/(c+1) of the sampled tokens of its part
// since the last take is in it, c being the part's capacity.
const candidatesPerKey = 4

// HotValue is one hot value of a per-value demand rule on this replica: its
// weight group and its meter. It is created by SetHot and read by the
// demand controller; Decide counts into it.
type HotValue struct {
	id    uint64
	group uint16
	salt  uint64
	// key is the value's usual bucket, recorded by the first request that
	// used the hot bucket: where the debt goes back when the value cools.
	key      atomic.Uint64
	label    atomic.Pointer[string]
	offered  atomic.Uint64
	admitted atomic.Uint64
}

// ID is the value's ValueID.
func (h *HotValue) ID() uint64 { return h.id }

// Group is the weight group of the value's bucket.
func (h *HotValue) Group() int { return int(h.group) }

// Counts are the tokens the value's hot bucket was asked for and gave since
// it became hot.
func (h *HotValue) Counts() (offered, admitted uint64) { return h.offered.Load(), h.admitted.Load() }

// Label is the value as the first request that used the hot bucket named
// it ("key=value, ..."), or "" before any did. It comes from a request:
// escape it wherever it is shown.
func (h *HotValue) Label() string {
	if l := h.label.Load(); l != nil {
		return *l
	}
	return ""
}

// hotSlot is a weight group a rule's hot values take turns in.
type hotSlot struct {
	group uint16
}

// hotState is a per-value demand rule's hot values and candidates.
type hotState struct {
	set   atomic.Pointer[map[uint64]*HotValue] // read by Decide; copied on write
	mu    sync.Mutex                           // guards what follows, and SetHot
	slots []hotSlot                            // every slot the rule ever took
	free  []int                                // indices into slots not in use
	top   int                                  // the engine's top-keys
	// cands are the candidates, split by value ID so the cores sampling
	// different values take different locks; each part is a summary of
	// its own values.
	cands [candidateShards]candidateShard
}

// candidateShards is how many locks a rule's candidates are split over.
const candidateShards = 8

type candidateShard struct {
	mu     sync.Mutex
	counts map[uint64]uint64 // Misra-Gries summary of sampled tokens
	_      [40]byte
}

// sample counts n tokens of value id, sampled, into the rule's candidates.
func (h *hotState) sample(id uint64, n uint64) {
	sh := &h.cands[id%candidateShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.counts == nil {
		sh.counts = make(map[uint64]uint64)
	}
	sh.add(id, n, shardCapacity(h.top))
}

// shardCapacity is the values one candidate shard holds with top-keys top:
// the rule's candidates hold candidateShards times this.
func shardCapacity(top int) int { return max(candidatesPerKey*top/candidateShards, candidatesPerKey) }

// add counts n tokens of id into a summary of at most capa values. Called
// with mu held.
func (sh *candidateShard) add(id, n uint64, capa int) {
	if _, ok := sh.counts[id]; ok || len(sh.counts) < capa {
		sh.counts[id] += n
		return
	}
	// Full: take the smallest count (or n) off every value, the newcomer
	// included, and drop those at zero (Misra-Gries, weighted).
	dec := n
	for _, c := range sh.counts {
		dec = min(dec, c)
	}
	for k, c := range sh.counts {
		if c <= dec {
			delete(sh.counts, k)
		} else {
			sh.counts[k] = c - dec
		}
	}
	if n > dec && len(sh.counts) < capa {
		sh.counts[id] = n - dec
	}
}

// Candidates returns, and forgets, the sampled token counts of the rule's
// values that were not hot since the last call: each count is about
// 1/CandidateSampling of the value's tokens. Nil for a rule shared by
// demand with one bucket.
func (d *DemandRule) Candidates() map[uint64]uint64 {
	if d.hot == nil {
		return nil
	}
	var out map[uint64]uint64
	for i := range d.hot.cands {
		sh := &d.hot.cands[i]
		sh.mu.Lock()
		c := sh.counts
		sh.counts = nil
		sh.mu.Unlock()
		if out == nil {
			out = c
			continue
		}
		for id, n := range c {
			out[id] += n
		}
	}
	return out
}

// PerValue reports whether the rule has a bucket per value: its hot values
// are shared by demand, the rest keep the equal share.
func (d *DemandRule) PerValue() bool { return d.hot != nil }

// RuleID is the rule's name across replicas: FNV-1a of its identity.
func (d *DemandRule) RuleID() uint64 { return d.rid }

// HotValues returns the rule's hot values, in no particular order.
func (d *DemandRule) HotValues() []*HotValue {
	if d.hot == nil {
		return nil
	}
	set := d.hot.set.Load()
	if set == nil {
		return nil
	}
	return valuesOf(*set)
}

// valuesOf lists a hot set's values.
func valuesOf(m map[uint64]*HotValue) []*HotValue {
	out := make([]*HotValue, 0, len(m))
	for _, hv := range m {
		out = append(out, hv)
	}
	return out
}

// SetHot makes exactly ids (at most the rule's slots: twice its top-keys)
// the hot values of per-value demand rule d, at now on the engine's clock.
// A value that stays hot keeps its group and meter. A new one takes a free
// slot, whose group starts at the rule's equal share. A value that is no
// longer hot hands its bucket's debt back to its usual bucket. It returns
// the hot values.
func (e *Engine) SetHot(d *DemandRule, ids []uint64, now int64) []*HotValue {
	e.noteNow(now)
	return e.setHot(d, ids, now)
}

func (e *Engine) setHot(d *DemandRule, ids []uint64, now int64) []*HotValue {
	if d == nil || d.hot == nil {
		return nil
	}
	h := d.hot
	h.mu.Lock()
	defer h.mu.Unlock()
	var old map[uint64]*HotValue
	if p := h.set.Load(); p != nil {
		old = *p
	}
	top := len(h.slots)
	next := make(map[uint64]*HotValue, min(len(ids), top))
	for _, id := range ids {
		if len(next) >= top {
			break
		}
		if hv := old[id]; hv != nil {
			next[id] = hv
		}
	}
	var gone []*HotValue
	for id, hv := range old {
		if next[id] == nil {
			gone = append(gone, hv)
		}
	}
	// Slots of values that cooled are free again.
	for _, hv := range gone {
		for i := range h.slots {
			if h.slots[i].group == hv.group {
				h.free = append(h.free, i)
			}
		}
	}
	equal := e.weights[d.domainGroup].Load().W
	for _, id := range ids {
		if len(next) >= top || len(h.free) == 0 {
			break
		}
		if next[id] != nil {
			continue
		}
		i := h.free[len(h.free)-1]
		h.free = h.free[:len(h.free)-1]
		g := h.slots[i].group
		e.SetGroupWeight(int(g), equal, now)
		// Every hot value's buckets carry a generation no other shares,
		// so none finds a bucket an earlier value left in its group.
		next[id] = &HotValue{id: id, group: g, salt: uint64(g)<<32 | uint64(e.hotGen.Add(1))}
	}
	h.set.Store(&next)
	// After the new set is in place, so a request that sees the value cold
	// finds its debt in the usual bucket. A request already past its look
	// at the old set may still recreate the hot bucket; it starts at the
	// usual bucket's fill and, unused from then on, is swept.
	dw := e.weights[d.domainGroup].Load()
	for _, hv := range gone {
		if k := hv.key.Load(); k != 0 {
			e.store.Move(mix(k, hv.salt), e.weights[hv.group].Load(), k, dw, d.domainGroup, now)
		}
	}
	return valuesOf(next)
}

// Slots is how many values of d can be hot at once on this replica.
func (d *DemandRule) Slots() int {
	if d.hot == nil {
		return 0
	}
	d.hot.mu.Lock()
	defer d.hot.mu.Unlock()
	return len(d.hot.slots)
}

// hotValue resolves value-level demand for a request on per-value demand
// rule d whose usual bucket is key, and whose entries at picks pick it: the value's HotValue when it is hot,
// else nil, after counting a sample of its n drawn tokens (0 for a check or
// a give-back) as a candidate.
func (d *DemandRule) hotValue(picks []int, entries []*commonv3.RateLimitDescriptor_Entry, key uint64, n float64) *HotValue {
	h := d.hot
	set := h.set.Load()
	sample := n > 0 && rand.Uint32()%CandidateSampling == 0
	if (set == nil || len(*set) == 0) && !sample {
		return nil
	}
	id := valueID(d.rid, picks, entries)
	if set != nil {
		if hv := (*set)[id]; hv != nil {
			if hv.key.Load() == 0 {
				hv.key.CompareAndSwap(0, key)
			}
			if hv.label.Load() == nil {
				l := valueLabel(picks, entries)
				hv.label.CompareAndSwap(nil, &l)
			}
			return hv
		}
	}
	if sample {
		h.sample(id, uint64(n))
	}
	return nil
}

// ValueID names a value of a per-value rule the same way in every replica:
// FNV-1a of the rule's RuleID and, at every depth that picks a bucket, the
// value and a separator byte (0xff, which no UTF-8 text holds).
func valueID(rid uint64, picks []int, entries []*commonv3.RateLimitDescriptor_Entry) uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	for i := 0; i < 8; i++ {
		h = (h ^ (rid >> (8 * i) & 0xff)) * prime
	}
	for _, i := range picks {
		s := entries[i].Value
		for j := 0; j < len(s); j++ {
			h = (h ^ uint64(s[j])) * prime
		}
		h = (h ^ 0xff) * prime
	}
	return h
}

// ValueID is the ValueID of the value entries pick for per-value rule r
// under rule ID rid.
func ValueID(rid uint64, r *descriptors.Rule, entries []*commonv3.RateLimitDescriptor_Entry) uint64 {
	var picks []int
	for i := range r.Depth() {
		if r.PicksBucket(i) {
			picks = append(picks, i)
		}
	}
	return valueID(rid, picks, entries)
}

// valueLabel is the value entries pick at picks, as "key=value, ...".
func valueLabel(picks []int, entries []*commonv3.RateLimitDescriptor_Entry) string {
	var b strings.Builder
	for _, i := range picks {
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(entries[i].Key + "=" + entries[i].Value)
	}
	return b.String()
}

// ruleIDOf is FNV-1a of a rule identity, as demand.RuleIDOf.
func ruleIDOf(identity string) uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	for i := 0; i < len(identity); i++ {
		h = (h ^ uint64(identity[i])) * prime
	}
	return h
}
