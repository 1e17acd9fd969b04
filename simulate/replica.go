package simulate

import (
	"time"

	"github.com/sharelimit/sharelimit/demand"
)

// replica is one simulated replica.
type replica struct {
	name   string
	num    int // the number in its name: replicas sort by it
	tokens float64
	w      float64 // the share in force, a fraction of L
	grows  []pendingGrow
	// Equal shares: when the grow held by this replica's damper applies
	// (-1: none), and to what.
	holdAt    time.Duration
	holdW     float64
	offered   uint64 // the meter, in thousandths of a token
	admitted  uint64
	rates     demand.Rates
	hist      demand.History
	last      *demand.Report
	lastWrite time.Duration
	wrote     bool
	seq       uint64
	params    *demand.Params
	admBin    float64
}

// pendingGrow is a larger share waiting until at.
type pendingGrow struct {
	w  float64
	at time.Duration
}

// due reports whether r writes its demand at t, as the daemon decides:
// its first report at once; then never sooner than stretched after the
// last, always by twice that, and in between when its offered rate moved
// enough since the last report.
func (r *replica) due(t, stretched time.Duration, offered float64) bool {
	if !r.wrote {
		return true
	}
	since := t - r.lastWrite
	switch {
	case since < stretched:
		return false
	case since >= 2*stretched:
		return true
	}
	return r.last != nil && demand.Moved(r.last.Rules[0].Offered, offered, 0.1, 1)
}

// target is the share r's parameters give it, as a fraction of limit
// among k replicas; eq, the equal share, without parameters or a rule in
// them, or when the rule gives none.
func (r *replica) target(eq, limit float64, k int) float64 {
	p := r.params
	if p == nil {
		return eq
	}
	rp := p.Find(ruleID)
	rep, standing := r.hist.Reported(p, r.name)
	units, offered, absent := uint32(1), 0.0, false
	switch standing {
	case demand.Counted:
		offered = rep.Rules[0].Offered
	case demand.Absent:
		absent = true
	}
	if rp != nil {
		if g, ok := demand.Share(p.Rule(rp), units, offered, absent, uint32(k)); ok {
			return min(1, max(g/limit, 1e-9))
		}
	}
	return eq
}

// approach moves r's share toward target at t, as the daemon does: a
// smaller share at once; a larger one after the grow delay from the
// parameters that asked for it, a still larger one after its own, none
// past the latest target.
func (r *replica) approach(target float64, t time.Duration, burst float64) {
	if target <= r.w {
		setShare(r, target, burst)
		r.grows = r.grows[:0]
		return
	}
	if n := len(r.grows); n == 0 || target > r.grows[n-1].w {
		r.grows = append(r.grows, pendingGrow{w: target, at: t + queryGap + growSlack})
	}
	apply, keep := r.w, r.grows[:0]
	for _, g := range r.grows {
		g.w = min(g.w, target)
		if t >= g.at {
			apply = max(apply, g.w)
			continue
		}
		keep = append(keep, g)
	}
	r.grows = keep
	setShare(r, apply, burst)
}

// setShare applies a share as the engine does: rate and size both, keeping
// the bucket's fill ratio.
func setShare(r *replica, w, burst float64) {
	if w == r.w {
		return
	}
	oldSize, newSize := max(r.w*burst, 1), max(w*burst, 1)
	r.tokens *= newSize / oldSize
	r.w = w
}
