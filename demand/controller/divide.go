package controller

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sharelimit/sharelimit/demand"
	"github.com/sharelimit/sharelimit/demand/consulkv"
)

// Dividing, on the leader: one snapshot of the reports becomes the
// parameters every replica computes its share from.

// reportEntry is one report of a snapshot, and whether the division counts
// it: only a report the parameters list does (a report under a key of
// another node's name, or at an index they cannot name, adds its units to
// the division and nothing else).
type reportEntry struct {
	rep     demand.Report
	counted bool
	index   uint64
}

// figure is what one report says of the thing divided: its offered and
// admitted rates, and whether it names it at all.
type figure func(rep *demand.Report) (offered, admitted float64, named bool)

// divide is the leader's division of one snapshot of the reports.
func (c *Controller) divide(snap consulkv.Snapshot) ([]byte, error) {
	now := c.wall()
	if b, err := c.frozen(snap.Reports, now); b != nil || err != nil {
		return b, err
	}
	reps, bad := c.entries(snap)
	h, f := demand.DefaultHeadroom, demand.DefaultFloor
	p := demand.Params{At: now.UnixNano(), Snapshot: snap.Index, Headroom: h, Floor: f, Leader: c.set.Node}
	p.Reports = listCounted(reps)
	c.noteBad(bad, now)
	view := uint32(max(c.set.View().TotalWeight, 1))
	var division []Replica
	values := 0
	for _, r := range c.rules() {
		if r.Limit == 0 {
			continue // no limit: nothing to divide
		}
		id := demand.RuleIDOf(r.Identity)
		if r.PerValue {
			rp, units, shown := c.divideValues(r, id, view, reps, h, f, demand.MaxValues-values)
			values += len(rp.Values)
			if len(rp.Values) > 0 {
				p.Units = units
			}
			p.Rules = append(p.Rules, rp)
			division = append(division, shown...)
			continue
		}
		fig := ruleFigure(id)
		rule, shares, wants, admitted := apportion(r.Limit, view, reps, fig, h, f)
		if rule.Units == 0 {
			continue
		}
		p.Units = rule.Units
		p.Rules = append(p.Rules, demand.RuleParams{ID: id, Limit: rule.Limit, K: rule.K, R: rule.R, Admitted: admitted})
		// What each replica gets, for the admin pages: the busiest first,
		// at most maxShown of them.
		shown := rows(r.Path, "", reps, fig, rule, shares, wants)
		division = append(division, shown[:min(len(shown), maxShown)]...)
	}
	c.mu.Lock()
	c.division = division
	c.mu.Unlock()
	slices.SortFunc(p.Rules, func(a, b demand.RuleParams) int { return cmp.Compare(a.ID, b.ID) })
	p.Rules = slices.CompactFunc(p.Rules, func(a, b demand.RuleParams) bool { return a.ID == b.ID })
	return demand.AppendParams(nil, &p)
}

// entries reads the reports of snap the division is made of, and those it
// cannot use.
func (c *Controller) entries(snap consulkv.Snapshot) ([]reportEntry, []badReport) {
	var reps []reportEntry
	var bad []badReport
	for _, kv := range snap.Reports {
		if !c.passing(kv.Node) {
			// Its node has left the service (deregistered, or failing its
			// check): it is not one of the replicas the view divides among.
			continue
		}
		r, why := readReport(kv)
		if why != nil {
			bad = append(bad, *why)
			if why.cause != readWrongNode {
				continue // its replica is not listed, and keeps its equal share
			}
		}
		// A report stands until its session ends (it is then deleted)
		// or its node leaves the service. Judging it stale sooner would
		// hand its share to the others while the replica, cut off from
		// Consul, still enforces it; the replica itself falls back to at
		// most its equal share before its session can expire (weigh).
		reps = append(reps, reportEntry{rep: r, counted: why == nil && kv.ModifyIndex >= 1 && kv.ModifyIndex <= snap.Index, index: kv.ModifyIndex})
	}
	return reps, bad
}

// frozen is the division in force, stamped now, for Config.Hold after a
// replica left or restarted, and after this replica took the lead from
// another; nil and no error otherwise. A replica has left when its report
// comes from a node with no passing instance (deregistered, or failing its
// check), or when the division in force counted a report of its node and
// no report of it comes from a passing node now (it went with its session,
// which this leader may have ended itself when it took the lead from it).
// It has restarted when its report comes under another session than
// before. Such a replica may leave Envoys enforcing its old share through
// RLQS assignments until they expire, and a new division would hand that
// share to the others, or measure the new process's demand before its
// Envoys have reported to it; a new leader cannot tell what the last one
// saw. The division in force keeps every replica's share as it is (each
// computes its own from the report it counted; a restarted replica does not
// know its old one, and takes the least). Without parameters in force there
// is nothing to keep, and the division goes on.
func (c *Controller) frozen(reports []consulkv.KVReport, now time.Time) ([]byte, error) {
	hold := c.set.Hold
	if hold <= 0 {
		return nil, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	gone := c.departures(reports, now)
	holding := false
	for tag, since := range c.left {
		switch {
		case now.Sub(since) < hold:
			holding = true
		case !gone[tag]:
			delete(c.left, tag) // back, or no longer known
		}
	}
	if c.born.IsZero() {
		c.born = now // this process's first division, or this call
	}
	if p := c.params; p != nil && (p.Leader != c.set.Node || p.At < c.born.UnixNano()) && p.At != c.took {
		c.took, c.tookAt = p.At, now // the lead, from another leader or process
	}
	holding = holding || (c.took != 0 && now.Sub(c.tookAt) < hold)
	if !holding || c.params == nil {
		return nil, nil
	}
	p := *c.params
	p.At, p.Leader = now.UnixNano(), c.set.Node
	return demand.AppendParams(nil, &p)
}

// departures notes in c.left when each replica that left or restarted was
// first found so, and returns the replicas gone now. Called with mu held.
func (c *Controller) departures(reports []consulkv.KVReport, now time.Time) map[demand.NodeTag]bool {
	live := make(map[demand.NodeTag]bool, len(reports))
	gone := make(map[demand.NodeTag]bool)
	sessions := make(map[string]string, len(reports))
	for _, kv := range reports {
		tag := demand.TagOf(kv.Node)
		if !c.passing(kv.Node) {
			gone[tag] = true
			continue
		}
		live[tag] = true
		if s, ok := c.sessions[kv.Node]; ok && s != kv.Session {
			c.noteLeft(tag, now) // a new process
		}
		sessions[kv.Node] = kv.Session
	}
	c.sessions = sessions
	if c.params != nil {
		for _, ref := range c.params.Reports {
			if !live[ref.Node] {
				gone[ref.Node] = true
			}
		}
	}
	for tag := range gone {
		if live[tag] {
			delete(gone, tag) // another node of the same tag: not told apart
			continue
		}
		c.noteLeft(tag, now)
	}
	return gone
}

func (c *Controller) noteLeft(tag demand.NodeTag, now time.Time) {
	if _, ok := c.left[tag]; !ok {
		c.left[tag] = now
	}
}

// listCounted uncounts what the division cannot count, and lists the rest,
// by index. Two reports written at one index (one transaction) could not
// be told apart by their replicas: neither counts. Past MaxReports, the
// rest count at their equal shares.
func listCounted(reps []reportEntry) []demand.ReportRef {
	atIndex := map[uint64]int{}
	for _, e := range reps {
		if e.counted {
			atIndex[e.index]++
		}
	}
	var out []demand.ReportRef
	for i := range reps {
		e := &reps[i]
		if e.counted && (atIndex[e.index] > 1 || len(out) == demand.MaxReports) {
			e.counted = false
		}
		if e.counted {
			out = append(out, demand.ReportRef{Index: e.index, Node: demand.TagOf(e.rep.Node)})
		}
	}
	slices.SortFunc(out, func(a, b demand.ReportRef) int { return cmp.Compare(a.Index, b.Index) })
	return out
}

// apportion divides limit among reps by what fig finds in each: a report
// the division does not count, or that does not name the thing divided,
// counts at its equal share. It returns the division, each replica's share
// and want, and the admitted rate the counted reports add up to.
func apportion(limit float64, view uint32, reps []reportEntry, fig figure, h, f float64) (demand.Rule, []float64, []demand.Want, float64) {
	wants := make([]demand.Want, 0, len(reps))
	var admitted float64
	for _, e := range reps {
		w := demand.Want{Units: e.rep.Units, Absent: true}
		if off, adm, named := fig(&e.rep); named && e.counted {
			w.Offered, w.Absent = off, false
			admitted += adm
		}
		wants = append(wants, w)
	}
	rule, shares := demand.Apportion(limit, view, wants, h, f)
	return rule, shares, wants, admitted
}

// rows are the admin pages' rows of one division, busiest first.
func rows(path, value string, reps []reportEntry, fig figure, rule demand.Rule, shares []float64, wants []demand.Want) []Replica {
	out := make([]Replica, 0, len(reps))
	for i, e := range reps {
		r := Replica{Rule: path, Value: value, Node: e.rep.Node, Units: e.rep.Units, Offered: wants[i].Offered,
			Share: shares[i] / rule.Limit, Absent: wants[i].Absent}
		if _, adm, named := fig(&e.rep); named {
			r.Admitted = adm
		}
		out = append(out, r)
	}
	slices.SortStableFunc(out, func(a, b Replica) int { return cmpDesc(a.Offered, b.Offered) })
	return out
}

// ruleFigure finds rule id's figures in a report.
func ruleFigure(id demand.RuleID) figure {
	return func(rep *demand.Report) (float64, float64, bool) {
		if rd := rep.Find(id); rd != nil {
			return rd.Offered, rd.Admitted, true
		}
		return 0, 0, false
	}
}

// valueFigure finds value vid of rule id's figures in a report.
func valueFigure(id demand.RuleID, vid uint64) figure {
	return func(rep *demand.Report) (float64, float64, bool) {
		if rd := rep.Find(id); rd != nil {
			if v := rd.FindValue(vid); v != nil {
				return v.Offered, v.Admitted, true
			}
		}
		return 0, 0, false
	}
}

// divideValues is the leader's division of per-value rule r (id): it makes
// the values with the most demand over the counted reports hot (at most
// topKeys of those some replica offers more than half its equal share) and
// divides each, at most room of them. It returns the rule's parameters, the
// units divided among and, for the admin pages, each hot value's division,
// busiest values first, at most maxShown rows.
func (c *Controller) divideValues(r Rule, id demand.RuleID, view uint32, reps []reportEntry, h, f float64, room int) (demand.RuleParams, uint32, []Replica) {
	rp := demand.RuleParams{ID: id, Limit: r.Limit}
	total, qualifies, units := valueDemand(&rp, view, reps)
	hot := map[uint64]bool{}
	c.mu.Lock()
	if c.params != nil {
		if old := c.params.Find(id); old != nil {
			for _, v := range old.Values {
				hot[v.ID] = true
			}
		}
	}
	c.mu.Unlock()
	labels := map[uint64]string{}
	for _, hv := range r.Hot {
		labels[hv.ID] = hv.Label
	}
	ids := demand.Hottest(total, qualifies, hot, min(c.set.TopKeys, max(room, 0)))
	// The admin pages list the busiest values first.
	byDemand := slices.Clone(ids)
	slices.SortStableFunc(byDemand, func(a, b uint64) int { return cmpDesc(total[a], total[b]) })
	var shown []Replica
	for _, vid := range byDemand {
		fig := valueFigure(id, vid)
		rule, shares, wants, admitted := apportion(r.Limit, view, reps, fig, h, f)
		if rule.Units == 0 {
			continue
		}
		units = rule.Units
		rp.Values = append(rp.Values, demand.ValueParams{ID: vid, K: rule.K, R: rule.R, Admitted: admitted})
		label := labels[vid]
		if label == "" {
			label = fmt.Sprintf("#%016x", vid)
		}
		shown = append(shown, rows(r.Path, label, reps, fig, rule, shares, wants)...)
	}
	slices.SortFunc(rp.Values, func(a, b demand.ValueParams) int { return cmp.Compare(a.ID, b.ID) })
	return rp, units, shown[:min(len(shown), maxShown)]
}

// valueDemand sums the counted reports' demand for each value of per-value
// rule rp (and their admitted rate into rp), and finds the values some
// replica offers more than QualifyRatio of its equal share. units is what
// the units divided among will be: the view's, or the reports' if more.
func valueDemand(rp *demand.RuleParams, view uint32, reps []reportEntry) (total map[uint64]float64, qualifies map[uint64]bool, units uint32) {
	total, qualifies = map[uint64]float64{}, map[uint64]bool{}
	var counted uint64
	for _, e := range reps {
		counted += uint64(e.rep.Units)
	}
	units = uint32(min(max(uint64(view), counted), math.MaxUint32))
	for _, e := range reps {
		rd := e.rep.Find(rp.ID)
		if !e.counted || rd == nil {
			continue
		}
		rp.Admitted += rd.Admitted
		equal := demand.Equal(rp.Limit, e.rep.Units, units)
		for _, v := range rd.Values {
			total[v.ID] += v.Offered
			if v.Offered > demand.QualifyRatio*equal {
				qualifies[v.ID] = true
			}
		}
	}
	return total, qualifies, units
}

// cmpDesc orders the larger first; NaN ties with everything.
func cmpDesc(a, b float64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}
