package controller

import (
	"time"

	"github.com/sharelimit/sharelimit/demand"
)

// Applying the leader's parameters: each rule's weight, and each hot
// value's, is this replica's share under them; a smaller one applies at
// once, a larger one once it has waited the grow delay. Every fault falls
// back to at most the equal share.

// onParams is the watch's delivery: the leader's parameters, or nil when
// the key is gone.
func (c *Controller) onParams(value []byte, _ uint64) {
	if value == nil {
		return // the last parameters stand until they go stale
	}
	p, err := demand.DecodeParams(value)
	c.mu.Lock()
	if err != nil {
		c.badParam++
		c.mu.Unlock()
		c.log.Warn("demand parameters ignored", "service", c.set.Service, "err", err)
		return
	}
	c.params, c.gotAt = &p, c.wall()
	c.hist.Pin(c.params, c.set.Node)
	c.mu.Unlock()
	c.apply(c.wall())
}

// staleAfter is how old parameters may be before equal shares return.
func (c *Controller) staleAfter() time.Duration {
	return max(10*time.Second, 10*c.stretched())
}

// growDelay is how long a grown share waits: one query interval of the
// params watch and some slack, by when every replica has the parameters
// that shrink the others.
func (c *Controller) growDelay() time.Duration {
	return time.Duration(float64(time.Second)/c.set.QueryRate) + growSlack
}

// fresh reports whether the parameters in force are young enough to use.
// Called with mu held.
func (c *Controller) fresh(now time.Time) bool {
	return c.params != nil && now.Sub(time.Unix(0, c.params.At)) <= c.staleAfter()
}

// usable is the parameters in force for rule r when they are fresh and
// divide the limit this replica's config has; nil otherwise (the rule then
// keeps equal shares). Called with mu held.
func (c *Controller) usable(r Rule, now time.Time) *demand.RuleParams {
	if !c.fresh(now) {
		return nil
	}
	rp := c.params.Find(demand.RuleIDOf(r.Identity))
	if rp == nil || !(r.Limit > 0) || rp.Limit < r.Limit*(1-1e-6) || rp.Limit > r.Limit*(1+1e-6) {
		return nil // the leader divides another limit: its config differs
	}
	return rp
}

// target is this replica's weight for one demand rule with one bucket: its
// demand share under the current parameters, or its equal share without
// usable ones; and whether they were usable. Called with mu held.
func (c *Controller) target(r Rule, now time.Time) (float64, bool) {
	equal := c.eng.Weight(r.DomainGroup)
	rp := c.usable(r, now)
	if rp == nil {
		return equal, false
	}
	return c.weigh(c.params.Rule(rp), func(rep *demand.Report) (float64, bool) {
		if rd := rep.Find(rp.ID); rd != nil {
			return rd.Offered, true
		}
		return 0, false
	}, rp.Limit, equal, now), true
}

// valueTarget is this replica's weight for hot value vp of per-value rule
// rp. Called with mu held.
func (c *Controller) valueTarget(rp *demand.RuleParams, vp *demand.ValueParams, equal float64, now time.Time) float64 {
	return c.weigh(c.params.ValueRule(rp, vp), func(rep *demand.Report) (float64, bool) {
		if rd := rep.Find(rp.ID); rd != nil {
			if v := rd.FindValue(vp.ID); v != nil {
				return v.Offered, true
			}
		}
		return 0, false
	}, rp.Limit, equal, now)
}

// weigh is this replica's weight under division rule, given what its own
// report as the division counted it said (own: the figure, or false when
// the report did not name it, which the leader counted as absent). Called
// with mu held.
func (c *Controller) weigh(rule demand.Rule, own func(*demand.Report) (float64, bool), limit, equal float64, now time.Time) float64 {
	mv := c.set.View()
	view := uint32(max(mv.TotalWeight, 1))
	// Only a report the parameters list, at an index this replica wrote,
	// was divided with: the leader counted any other replica at its equal
	// share and left it that, or counted a report under this replica's
	// name that it does not know (a previous process's, say) and left it
	// that report's share, at least the floor.
	rep, standing := c.hist.Reported(c.params, c.set.Node)
	units, offered, absent := uint32(max(mv.LocalWeight, 1)), 0.0, false
	switch standing {
	case demand.Counted:
		units = rep.Units
		var named bool
		offered, named = own(&rep)
		absent = !named
	case demand.Absent:
		absent = true
	case demand.Unknown:
		// The smallest share a counted replica gets: demand 0.
	}
	share, ok := demand.Share(rule, units, offered, absent, view)
	if !ok {
		return equal
	}
	w := min(1, max(share/limit, 1e-9))
	if standing != demand.Counted {
		// Never more than the equal share from a division that did not
		// count this replica's own report (Share gives no more already;
		// the membership's equal share may be smaller still).
		w = min(w, equal)
	}
	if mv.Local == 0 {
		// This node has no passing instance: the leader does not count
		// this replica's report (it is not one of the replicas the view
		// divides among), so it may take no more than its equal share.
		w = min(w, equal)
	}
	if c.st != nil {
		if _, renewed := c.st.Session(); now.Sub(renewed) > sessionTTL-sessionMargin {
			// The session may expire soon, its report with it, and the
			// leader then counts this replica at its equal share: take
			// no more than that before it can happen.
			w = min(w, equal)
		}
	}
	return w
}

// apply sets each demand rule's weight, and each hot value's: a smaller one
// at once, a larger one once it has waited growDelay.
func (c *Controller) apply(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	mono := c.set.Clock()
	if c.params != nil {
		_, c.standing = c.hist.Reported(c.params, c.set.Node)
	}
	for _, r := range c.rules() {
		if r.PerValue {
			c.applyValues(r, now, mono)
			continue
		}
		want, usable := c.target(r, now)
		c.shares[r.Identity] = want
		c.aim(r.Group, want, now, mono, c.delayFor(usable))
	}
}

// delayFor is how long a grow waits: growDelay under usable parameters;
// without them (stale, or none, so the equal share stands), with a hold, at
// least the hold. Parameters go stale when the leader has died with its
// node still passing, and nobody can take the lead until its session
// expires; its Envoys may enforce its share for the hold after its last
// answer, and the equal shares the others grow to would not leave it.
func (c *Controller) delayFor(usable bool) time.Duration {
	if usable {
		return c.growDelay()
	}
	return max(c.growDelay(), c.set.Hold)
}

// aim moves group g's weight towards want: a smaller one at once, a larger
// one once it has waited delay. Called with mu held.
func (c *Controller) aim(g int, want float64, now time.Time, mono int64, delay time.Duration) {
	cur := c.eng.Weight(g)
	if want <= cur {
		delete(c.grows, g)
		c.eng.SetWeight(g, want, mono)
		return
	}
	// A grow waits growDelay from the parameters that asked for it. A
	// bigger one, from newer parameters the others may not have yet, waits
	// its own full delay, while the smaller one already waiting still
	// applies at its time.
	steps := c.grows[g]
	if n := len(steps); n == 0 || want > steps[n-1].w {
		steps = append(steps, grow{w: want, at: now.Add(delay)})
	}
	// Grows asked for more than want now are capped at it.
	apply := cur
	keep := steps[:0]
	for _, st := range steps {
		st.w = min(st.w, want)
		if !now.Before(st.at) {
			apply = max(apply, st.w)
			continue
		}
		keep = append(keep, st)
	}
	if apply > cur {
		c.eng.SetWeight(g, apply, mono)
	}
	if len(keep) == 0 {
		delete(c.grows, g)
	} else {
		c.grows[g] = keep
	}
}

// applyValues makes the values the parameters name the hot values of
// per-value rule r and sets each one's weight. Without fresh parameters the
// hot values stay, at their equal share. Called with mu held.
func (c *Controller) applyValues(r Rule, now time.Time, mono int64) {
	equal := c.eng.Weight(r.DomainGroup)
	rp := c.usable(r, now)
	hot := r.Hot
	if c.fresh(now) {
		hot = c.rehot(r, rp, equal, mono)
	}
	for _, hv := range hot {
		want := equal
		if rp != nil {
			if vp := rp.FindValue(hv.ID); vp != nil {
				want = c.valueTarget(rp, vp, equal, now)
			}
		}
		c.aim(hv.Group, want, now, mono, c.delayFor(rp != nil))
	}
}

// rehot makes the values rp names hot in rule r, and keeps those that cool
// until their share is back at equal; it returns the hot values. Called
// with mu held.
func (c *Controller) rehot(r Rule, rp *demand.RuleParams, equal float64, mono int64) []Hot {
	// The parameters' hot values first, then those that cool: a value the
	// parameters no longer name goes back to its usual bucket only once its
	// share has grown back to the equal share, which waits growDelay like
	// any grow (a peer may still hold the large share these parameters
	// took from it).
	var ids []uint64
	if rp != nil {
		for _, v := range rp.Values {
			ids = append(ids, v.ID)
		}
	}
	named := len(ids)
	for _, hv := range r.Hot {
		if rp != nil && rp.FindValue(hv.ID) != nil {
			continue
		}
		if c.eng.Weight(hv.Group) < equal*(1-1e-9) {
			ids = append(ids, hv.ID)
		}
	}
	if named > r.Slots/2 && !c.warnedSlots {
		c.warnedSlots = true
		c.log.Warn("the leader made more values hot than --demand-top-keys here: give every replica of the service the same --demand-top-keys",
			"service", c.set.Service, "rule", r.Path, "hot", named, "top_keys", r.Slots/2)
	}
	if sameIDs(ids, r.Hot) {
		return r.Hot
	}
	before := map[uint64]int{}
	for _, hv := range r.Hot {
		before[hv.ID] = hv.Group
	}
	after := c.eng.SetHot(r.Identity, ids, mono)
	// A slot that changed hands starts afresh: no grow meant for its last
	// value applies to the next.
	for _, hv := range after {
		if g, ok := before[hv.ID]; !ok || g != hv.Group {
			delete(c.grows, hv.Group)
		}
		delete(before, hv.ID)
	}
	for _, g := range before {
		delete(c.grows, g)
	}
	return after
}

// sameIDs reports whether hot holds exactly the values ids names.
func sameIDs(ids []uint64, hot []Hot) bool {
	if len(ids) != len(hot) {
		return false
	}
	set := make(map[uint64]bool, len(ids))
	for _, id := range ids {
		set[id] = true
	}
	for _, hv := range hot {
		if !set[hv.ID] {
			return false
		}
	}
	return true
}
