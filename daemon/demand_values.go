package daemon

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sharelimit/sharelimit/demand"
	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/server"
)

// Demand sharing of per-value rules: the demander's part that meters a
// rule's hot values and candidates, reports them, makes the parameters' hot
// values hot in the engine and, leading, chooses and divides them. Kept
// apart from demand.go, which shares rules with one bucket.

// meterValues reads a per-value rule's hot values' meters and folds its
// sampled candidates in. Called with mu held.
func (d *demander) meterValues(b descriptors.DemandBinding, now time.Time) {
	id := b.State.Identity()
	tau := d.set.interval / demandTauDivisor
	c := d.cands[id]
	if c == nil {
		c = &demand.Candidates{Cap: 4 * max(d.set.topKeys, 1)}
		d.cands[id] = c
	}
	// Candidates are sampled, one draw in 16: a whole interval's smoothing
	// keeps a value seen once in a tick from looking hot.
	c.Observe(b.State.Candidates(), descriptors.CandidateSampling, now, d.set.interval)
	old := d.hotRates[id]
	next := make(map[uint64]*demand.Rates, len(old))
	for _, hv := range b.State.HotValues() {
		r := old[hv.ID()]
		if r == nil {
			// Newly hot: an exact meter of its own, which reads its first
			// window as it is. Until that window is read the report says
			// 0 for it, which gives this replica the floor of its share
			// (tighter) rather than a sampled estimate that may be low,
			// which would leave it a full bucket under a share smaller
			// than what it is asked for.
			r = &demand.Rates{Warm: true}
			c.Forget(hv.ID())
		}
		off, adm := hv.Counts()
		r.Update(off, adm, now, tau)
		next[hv.ID()] = r
	}
	d.hotRates[id] = next
}

// values is what a report says of per-value rule b: its demand for each
// value the engine holds hot (0 included), then its hottest other values
// that could qualify, at most topKeys of them; sorted by ID. Called with mu
// held.
func (d *demander) values(b descriptors.DemandBinding, equal float64) []demand.ValueDemand {
	id := b.State.Identity()
	var out []demand.ValueDemand
	for vid, r := range d.hotRates[id] {
		out = append(out, demand.ValueDemand{ID: vid, Offered: r.Offered, Admitted: r.Admitted})
	}
	if c := d.cands[id]; c != nil {
		lim := b.Rule.Limit()
		least := 0.0
		if lim != nil {
			least = demand.QualifyRatio * equal * lim.Params().Rate
		}
		for _, v := range c.Top(d.set.topKeys) {
			if v.Offered <= least {
				break
			}
			if _, hot := d.hotRates[id][v.ID]; !hot {
				out = append(out, v)
			}
		}
	}
	slices.SortFunc(out, func(a, b demand.ValueDemand) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// valueTarget is this replica's weight for hot value vp of per-value rule
// rp. Called with mu held.
func (d *demander) valueTarget(rp *demand.RuleParams, vp *demand.ValueParams, equal float64, now time.Time) float64 {
	return d.weigh(d.params.ValueRule(rp, vp), func(rep *demand.Report) (float64, bool) {
		if rd := rep.Find(rp.ID); rd != nil {
			if v := rd.FindValue(vp.ID); v != nil {
				return v.Offered, true
			}
		}
		return 0, false
	}, rp.Limit, equal, now)
}

// applyValues makes the values the parameters name the hot values of
// per-value rule b and sets each one's weight. Without fresh parameters the
// hot values stay, at their equal share. Called with mu held.
func (d *demander) applyValues(b descriptors.DemandBinding, now time.Time, mono int64) {
	equal := d.engine.GroupWeight(b.State.DomainGroup()).W
	rp := d.usable(b, now)
	fresh := d.params != nil && now.Sub(time.Unix(0, d.params.At)) <= d.staleAfter()
	if fresh {
		// The parameters' hot values first, then those that cool: a value
		// the parameters no longer name goes back to its usual bucket only
		// once its share has grown back to the equal share, which waits
		// growDelay like any grow (a peer may still hold the large share
		// these parameters took from it).
		var ids []uint64
		if rp != nil {
			for _, v := range rp.Values {
				ids = append(ids, v.ID)
			}
		}
		named := len(ids)
		cur := b.State.HotValues()
		for _, hv := range cur {
			if rp != nil && rp.FindValue(hv.ID()) != nil {
				continue
			}
			if d.engine.GroupWeight(hv.Group()).W < equal*(1-1e-9) {
				ids = append(ids, hv.ID())
			}
		}
		if named > b.State.Slots()/2 && !d.warnedSlots {
			d.warnedSlots = true
			d.log.Warn("the leader made more values hot than --demand-top-keys here: give every replica of the service the same --demand-top-keys",
				"service", d.v.service, "rule", b.Rule.Path(), "hot", named, "top_keys", b.State.Slots()/2)
		}
		if !sameIDs(ids, cur) {
			before := map[uint64]int{}
			for _, hv := range cur {
				before[hv.ID()] = hv.Group()
			}
			after := d.engine.SetHot(b.State, ids, mono)
			// A slot that changed hands starts afresh: no grow meant for
			// its last value applies to the next.
			for _, hv := range after {
				if g, ok := before[hv.ID()]; !ok || g != hv.Group() {
					delete(d.grows, hv.Group())
				}
				delete(before, hv.ID())
			}
			for _, g := range before {
				delete(d.grows, g)
			}
		}
	}
	for _, hv := range b.State.HotValues() {
		want := equal
		if rp != nil {
			if vp := rp.FindValue(hv.ID()); vp != nil {
				want = d.valueTarget(rp, vp, equal, now)
			}
		}
		d.aim(hv.Group(), want, now, mono)
	}
}

// sameIDs reports whether hot holds exactly the values ids names.
func sameIDs(ids []uint64, hot []*descriptors.HotValue) bool {
	if len(ids) != len(hot) {
		return false
	}
	set := make(map[uint64]bool, len(ids))
	for _, id := range ids {
		set[id] = true
	}
	for _, hv := range hot {
		if !set[hv.ID()] {
			return false
		}
	}
	return true
}

// divideValues is the leader's division of per-value rule id (limit L): it
// makes the values with the most demand over the fresh reports hot (at most
// topKeys of those some replica offers more than half its equal share) and
// divides each, at most room of them. It returns the rule's parameters and,
// for the admin pages, each hot value's division, busiest values first, at
// most maxShownReplicas rows.
func (d *demander) divideValues(b descriptors.DemandBinding, id demand.RuleID, limit float64, view uint32, reps []reportEntry, h, f float64, room int) (demand.RuleParams, uint32, []server.DemandReplica) {
	rp := demand.RuleParams{ID: id, Limit: limit}
	total := map[uint64]float64{}
	qualifies := map[uint64]bool{}
	var counted uint64
	for _, e := range reps {
		counted += uint64(e.rep.Units)
	}
	units := uint32(min(max(uint64(view), counted), math.MaxUint32))
	equalUnits := units
	for _, e := range reps {
		rd := e.rep.Find(id)
		if !e.counted || rd == nil {
			continue
		}
		rp.Admitted += rd.Admitted
		equal := demand.Equal(limit, e.rep.Units, equalUnits)
		for _, v := range rd.Values {
			total[v.ID] += v.Offered
			if v.Offered > demand.QualifyRatio*equal {
				qualifies[v.ID] = true
			}
		}
	}
	hot := map[uint64]bool{}
	d.mu.Lock()
	if d.params != nil {
		if old := d.params.Find(id); old != nil {
			for _, v := range old.Values {
				hot[v.ID] = true
			}
		}
	}
	labels := map[uint64]string{}
	for _, hv := range b.State.HotValues() {
		labels[hv.ID()] = hv.Label()
	}
	d.mu.Unlock()
	ids := demand.Hottest(total, qualifies, hot, min(d.set.topKeys, max(room, 0)))
	// The admin pages list the busiest values first.
	byDemand := slices.Clone(ids)
	slices.SortStableFunc(byDemand, func(a, b uint64) int { return cmpDesc(total[a], total[b]) })
	var shown []server.DemandReplica
	for _, vid := range byDemand {
		wants := make([]demand.Want, 0, len(reps))
		var admitted float64
		for _, e := range reps {
			w := demand.Want{Units: e.rep.Units, Absent: true}
			if rd := e.rep.Find(id); rd != nil && e.counted {
				if v := rd.FindValue(vid); v != nil {
					w.Offered, w.Absent = v.Offered, false
					admitted += v.Admitted
				}
			}
			wants = append(wants, w)
		}
		rule := demand.Divide(limit, view, wants, h, f)
		if rule.Units == 0 {
			continue
		}
		units = rule.Units
		rp.Values = append(rp.Values, demand.ValueParams{ID: vid, K: rule.K, R: rule.R, Admitted: admitted})
		label := labels[vid]
		if label == "" {
			label = fmt.Sprintf("#%016x", vid)
		}
		start := len(shown)
		for i, e := range reps {
			g, _ := demand.Share(rule, wants[i].Units, wants[i].Offered, wants[i].Absent, view)
			r := server.DemandReplica{Rule: b.Rule.Path(), Value: label, Node: e.rep.Node, Units: e.rep.Units,
				Offered: wants[i].Offered, Share: g / rule.Limit, Absent: wants[i].Absent}
			if rd := e.rep.Find(id); rd != nil {
				if v := rd.FindValue(vid); v != nil {
					r.Admitted = v.Admitted
				}
			}
			shown = append(shown, r)
		}
		slices.SortStableFunc(shown[start:], func(a, b server.DemandReplica) int { return cmpDesc(a.Offered, b.Offered) })
	}
	slices.SortFunc(rp.Values, func(a, b demand.ValueParams) int { return cmp.Compare(a.ID, b.ID) })
	return rp, units, shown[:min(len(shown), maxShownReplicas)]
}

// hotRows are the admin pages' rows of per-value rule b's hot values, the
// busiest first, at most maxShownReplicas. Called with mu held.
func (d *demander) hotRows(b descriptors.DemandBinding, equal float64) []server.DemandRule {
	var rp *demand.RuleParams
	if d.params != nil {
		rp = d.params.Find(demand.RuleIDOf(b.State.Identity()))
	}
	var rows []server.DemandRule
	for _, hv := range b.State.HotValues() {
		r := server.DemandRule{Rule: b.Rule.Path(), Value: hv.Label(), Share: d.engine.GroupWeight(hv.Group()).W, Equal: equal}
		if r.Value == "" {
			r.Value = fmt.Sprintf("#%016x", hv.ID())
		}
		if rt := d.hotRates[b.State.Identity()][hv.ID()]; rt != nil {
			r.Offered, r.Admitted = rt.Offered, rt.Admitted
		}
		if rp != nil && rp.Limit > 0 {
			if vp := rp.FindValue(hv.ID()); vp != nil {
				r.ClusterAdmittedRatio = vp.Admitted / rp.Limit
			}
		}
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(a, b server.DemandRule) int {
		if c := cmpDesc(a.Offered, b.Offered); c != 0 {
			return c
		}
		return cmp.Compare(a.Value, b.Value)
	})
	return rows[:min(len(rows), maxShownReplicas)]
}
