package controller

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/sharelimit/sharelimit/demand"
	"github.com/sharelimit/sharelimit/demand/consulkv"
)

// Measuring and reporting: what this replica's report says, and when it is
// written.

// due returns the report to write now, or nil: the first, one whose units or
// rules changed, one whose demand moved by more than threshold, or the
// heartbeat. Called with mu held.
func (c *Controller) due(rules []Rule, now time.Time) *demand.Report {
	if len(rules) == 0 {
		return nil
	}
	every := c.stretched()
	since := now.Sub(c.lastAt)
	if c.last != nil && since < every {
		return nil
	}
	r := c.report(rules, now)
	if c.last == nil || since >= heartbeats*every || c.last.Units != r.Units || len(c.last.Rules) != len(r.Rules) {
		return r
	}
	for i, rd := range r.Rules {
		if moved(c.last.Rules[i], rd) {
			return r
		}
	}
	return nil
}

// report is the report of rules' demand as metered now. Called with mu held.
func (c *Controller) report(rules []Rule, now time.Time) *demand.Report {
	r := &demand.Report{Seq: c.seq + 1, At: now.UnixNano(), Units: uint32(max(c.set.View().LocalWeight, 1)), Node: c.set.Node}
	values := 0
	for _, rule := range rules {
		rt := c.rates[rule.Identity]
		rd := demand.RuleDemand{ID: demand.RuleIDOf(rule.Identity), Offered: rt.Offered, Admitted: rt.Admitted}
		if rule.PerValue {
			rd.Values = c.values(rule, c.eng.Weight(rule.DomainGroup))
			if values+len(rd.Values) > demand.MaxValues {
				rd.Values = nil // past the format's bound: its values keep equal shares
			}
			values += len(rd.Values)
		}
		r.Rules = append(r.Rules, rd)
	}
	slices.SortFunc(r.Rules, func(a, b demand.RuleDemand) int { return cmp.Compare(a.ID, b.ID) })
	r.Rules = slices.CompactFunc(r.Rules, func(a, b demand.RuleDemand) bool { return a.ID == b.ID })
	return r
}

// moved reports whether a rule's figures moved enough since the last
// report to be worth a write.
func moved(old, rd demand.RuleDemand) bool {
	if old.ID != rd.ID || demand.Moved(old.Offered, rd.Offered, threshold, 1) || len(old.Values) != len(rd.Values) {
		return true
	}
	for j, v := range rd.Values {
		if ov := old.Values[j]; ov.ID != v.ID || demand.Moved(ov.Offered, v.Offered, threshold, 1) {
			return true
		}
	}
	return false
}

// write publishes r and records it as decoded.
func (c *Controller) write(ctx context.Context, r *demand.Report, now time.Time) {
	b, err := demand.AppendReport(nil, r)
	if err != nil {
		c.log.Error("demand report not encodable", "service", c.set.Service, "err", err)
		return
	}
	decoded, err := demand.DecodeReport(b)
	if err != nil {
		c.log.Error("demand report does not decode", "service", c.set.Service, "err", err)
		return
	}
	c.mu.Lock()
	st := c.st
	c.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, writeTimeout)
	index, err := st.Publish(wctx, b)
	cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case errors.Is(err, consulkv.ErrNoSession):
		// Nothing was written; try again next tick.
	case err != nil:
		// Nothing was written, or (an error on the way back) it may have
		// been: either way the history does not record it. A division
		// that counted it lists this replica at an index it does not
		// know, which it reads as Unknown, the floor of its share.
		cause := writeCause(err)
		c.failures++
		c.writeErrs[cause]++
		c.writeErr = cause + ": " + err.Error()
		c.lastAt = now // try again in an interval
		if c.writeLog.fail("", cause, now) {
			c.log.Warn("demand report not written; until one is, the leader counts this replica at its equal share or less, and it takes no more",
				"service", c.set.Service, "cause", cause, "err", err)
		}
	default:
		c.writes++
		c.seq = r.Seq
		if v, at, ok := st.Adopted(); ok && c.set.Hold > 0 {
			// The previous process's report, which a division in force
			// may count: this replica's share is read from it, as that
			// process read it, rather than at the least.
			if old, err := demand.DecodeReport(v); err == nil {
				c.hist.Add(at, old)
			}
		}
		c.hist.Add(index, decoded)
		if c.params != nil {
			c.hist.Pin(c.params, c.set.Node) // the parameters may have come first
		}
		c.last, c.lastAt = &decoded, now
		c.writeErr = ""
		if cause := c.writeLog.ok(""); cause != "" {
			c.log.Info("demand report written again", "service", c.set.Service, "after", cause)
		}
	}
}

// meterValues reads a per-value rule's hot values' meters and folds its
// sampled candidates in. Called with mu held.
func (c *Controller) meterValues(r Rule, now time.Time) {
	tau := c.set.Interval / tauDivisor
	cd := c.cands[r.Identity]
	if cd == nil {
		cd = &demand.Candidates{Cap: 4 * max(c.set.TopKeys, 1)}
		c.cands[r.Identity] = cd
	}
	// Candidates are sampled, one draw in 16: a whole interval's smoothing
	// keeps a value seen once in a tick from looking hot.
	counts, scale := c.eng.Candidates(r.Identity)
	cd.Observe(counts, scale, now, c.set.Interval)
	old := c.hotRates[r.Identity]
	next := make(map[uint64]*demand.Rates, len(old))
	for _, hv := range r.Hot {
		rt := old[hv.ID]
		if rt == nil {
			// Newly hot: an exact meter of its own, which reads its first
			// window as it is. Until that window is read the report says
			// 0 for it, which gives this replica the floor of its share
			// (tighter) rather than a sampled estimate that may be low,
			// which would leave it a full bucket under a share smaller
			// than what it is asked for.
			rt = &demand.Rates{Warm: true}
			cd.Forget(hv.ID)
		}
		rt.Update(hv.Offered, hv.Admitted, now, tau)
		next[hv.ID] = rt
	}
	c.hotRates[r.Identity] = next
}

// values is what a report says of per-value rule r: its demand for each
// value the engine holds hot (0 included), then its hottest other values
// that could qualify, at most topKeys of them; sorted by ID. Called with mu
// held.
func (c *Controller) values(r Rule, equal float64) []demand.ValueDemand {
	var out []demand.ValueDemand
	for vid, rt := range c.hotRates[r.Identity] {
		out = append(out, demand.ValueDemand{ID: vid, Offered: rt.Offered, Admitted: rt.Admitted})
	}
	if cd := c.cands[r.Identity]; cd != nil {
		least := demand.QualifyRatio * equal * r.Limit
		for _, v := range cd.Top(c.set.TopKeys) {
			if v.Offered <= least {
				break
			}
			if _, hot := c.hotRates[r.Identity][v.ID]; !hot {
				out = append(out, v)
			}
		}
	}
	slices.SortFunc(out, func(a, b demand.ValueDemand) int { return cmp.Compare(a.ID, b.ID) })
	return out
}
