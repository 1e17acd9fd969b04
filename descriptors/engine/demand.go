package engine

import (
	"maps"
	"sync/atomic"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// The engine's side of demand sharing: which rules are shared by demand,
// the state each keeps across reloads (its weight group, its meter, a
// per-value rule's slots), and the weight groups they take and give back.
// hot.go holds a per-value rule's hot values.

// DemandRule is the engine's state for one rule shared by demand: the weight
// group its buckets use, which the demand controller sets, and the meter of
// what its one bucket was asked for and gave. It lives for the engine's
// life, across reloads that keep the rule's identity (a changed limit does).
type DemandRule struct {
	identity    string
	rid         uint64
	group       uint16
	domainGroup uint16
	// meter is spread over cache lines by bucket key, so the cores
	// deciding different values of a per-value rule do not all write one
	// line.
	meter [meterStripes]stripe
	// hot is a per-value rule's hot values (hot.go); nil for a rule with
	// one bucket.
	hot *hotState
}

// Identity is the rule's identity: its domain, path and share, not its
// limit's figures, so a reload that changes only those keeps the rule's
// demand state. Replicas give the same rule the same identity; the leader's
// parameters carry the rate they divide, which tells replicas whose limits
// differ apart.
func (d *DemandRule) Identity() string { return d.identity }

// Group is the weight group the rule's bucket uses: for a per-value rule,
// its domain's, which its values that are not hot use.
func (d *DemandRule) Group() int { return int(d.group) }

// DomainGroup is the group of the rule's domain: its equal share.
func (d *DemandRule) DomainGroup() int { return int(d.domainGroup) }

// Counts are the tokens the rule's bucket (or, per value, all its buckets)
// was asked for and gave since the rule was first installed.
func (d *DemandRule) Counts() (offered, admitted uint64) {
	for i := range d.meter {
		offered += d.meter[i].offered.Load()
		admitted += d.meter[i].admitted.Load()
	}
	return offered, admitted
}

// meterStripes is how many cache lines a demand rule's meter spans.
const meterStripes = 16

type stripe struct {
	offered, admitted atomic.Uint64
	_                 [48]byte
}

// stripe is the meter stripe of the bucket at key.
func (d *DemandRule) stripe(key uint64) *stripe { return &d.meter[(key>>32)%meterStripes] }

// DemandBinding is a demand rule of the installed set.
type DemandBinding struct {
	Rule  *descriptors.Rule
	State *DemandRule
}

// DemandRules returns the installed set's demand rules, in rule order.
func (e *Engine) DemandRules() []DemandBinding {
	in := e.cur.Load()
	var out []DemandBinding
	for id, d := range in.demand {
		if d != nil {
			out = append(out, DemandBinding{Rule: in.set.Rule(id), State: d})
		}
	}
	return out
}

// sharedByDemand reports whether r's limit is divided by demand.
func (e *Engine) sharedByDemand(r *descriptors.Rule) bool {
	l := r.Limit()
	if !draws(l) || (r.PerValue() && e.topKeys == 0) {
		return false
	}
	return l.Share() == descriptors.ShareDemand || (l.Share() == descriptors.ShareCluster && e.demandAll)
}

// bindDemand finds or makes the demand state of every demand rule of in. A
// new demand rule gets a group of its own, at its domain's current weight
// (the equal share), until the controller sets its share; when no group is
// left, it stays in its domain's group for the engine's life.
func (e *Engine) bindDemand(in *installed) {
	var states map[string]*DemandRule
	old := *e.demandOf.Load()
	for i, r := range in.set.Rules() {
		if !e.sharedByDemand(r) {
			continue
		}
		d, seen := old[r.Identity()]
		if !seen {
			if states == nil {
				states = maps.Clone(old)
			}
			d = e.newDemandRule(r, in.domains[r.Domain()].group)
			states[r.Identity()] = d
			old = states
		}
		if d == nil {
			continue
		}
		if in.demand == nil {
			in.demand = make([]*DemandRule, len(in.rules))
		}
		in.demand[i] = d
	}
	if states != nil {
		e.demandOf.Store(&states)
	}
}

// newDemandRule makes the demand state of r, whose domain is in group dg,
// taking its groups; nil when there are not enough left. Called with swapMu
// held.
func (e *Engine) newDemandRule(r *descriptors.Rule, dg uint16) *DemandRule {
	equal := e.weights[dg].Load().W
	id := r.Identity()
	if !r.PerValue() {
		if gs := e.takeGroups(1, equal); gs != nil {
			return &DemandRule{identity: id, rid: ruleIDOf(id), group: gs[0], domainGroup: dg}
		}
		return nil
	}
	// Its values that are not hot stay in the domain's group. Its slots
	// are taken now, all of them, so a value the service's leader makes
	// hot always finds one: a replica that could not hold a hot value
	// would enforce its equal share where the division counted a smaller
	// one.
	gs := e.takeGroups(2*e.topKeys, equal)
	if gs == nil {
		return nil
	}
	d := &DemandRule{identity: id, rid: ruleIDOf(id), group: dg, domainGroup: dg, hot: &hotState{top: e.topKeys}}
	for i, g := range gs {
		d.hot.slots = append(d.hot.slots, hotSlot{group: g})
		d.hot.free = append(d.hot.free, len(gs)-1-i)
	}
	return d
}

// takeGroups returns n groups at weight w: freed ones first, then new ones;
// nil, taking none, when there are not n. Called with swapMu held.
func (e *Engine) takeGroups(n int, w float64) []uint16 {
	if n <= 0 || len(e.freeGroups)+MaxGroups+1-int(e.groups.Load()) < n {
		return nil
	}
	out := make([]uint16, 0, n)
	for len(out) < n && len(e.freeGroups) > 0 {
		g := e.freeGroups[len(e.freeGroups)-1]
		e.freeGroups = e.freeGroups[:len(e.freeGroups)-1]
		// The group's history goes on (its old buckets, orphans now, are
		// judged by it); only its weight changes.
		old := e.weights[g].Load()
		e.weights[g].Store(old.Next(w, old.Since))
		out = append(out, g)
	}
	for len(out) < n {
		g := int(e.groups.Load())
		e.weights[g].Store(bucket.InitialWeight(w))
		e.groups.Store(int32(g + 1))
		out = append(out, uint16(g))
	}
	return out
}

// releaseGone gives back the slots of per-value demand rules that in no
// longer holds: their hot values cool (their debt goes back to the usual
// buckets, in case the rule comes back) and their groups can serve other
// rules. The hot buckets left in them are never found again: every hot
// value's buckets are keyed by a generation no other value shares. A rule
// with one bucket keeps its group: its bucket, which a returning rule finds
// again, records it. Called with swapMu held, before in is installed: a
// decision still on the old set finds the values cold, their debt in the
// usual buckets.
func (e *Engine) releaseGone(in *installed, now int64) {
	old := *e.demandOf.Load()
	rules := in.set.Rules()
	present := make(map[string]bool, len(rules))
	for _, r := range rules {
		present[r.Identity()] = true
	}
	var states map[string]*DemandRule
	for id, d := range old {
		if present[id] || d == nil || d.hot == nil {
			continue
		}
		e.setHot(d, nil, now)
		d.hot.mu.Lock()
		for _, sl := range d.hot.slots {
			e.freeGroups = append(e.freeGroups, sl.group)
		}
		d.hot.slots, d.hot.free = nil, nil
		d.hot.mu.Unlock()
		if states == nil {
			states = maps.Clone(old)
		}
		delete(states, id)
	}
	if states != nil {
		e.demandOf.Store(&states)
	}
}
