package simulate

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/sharelimit/sharelimit/demand"
)

// ruleID is the one rule every simulated replica shares.
const ruleID = demand.RuleID(1)

// kvReport is a report in the simulated KV.
type kvReport struct {
	rep   demand.Report
	index uint64
}

// equalShares applies the equal share at t through each replica's
// membership damper: a smaller weight at once; a larger one once it has held
// for Hold, and then the smallest seen while it was held; none when the
// share came back to the one in force during the hold.
func (s *sim) equalShares(t time.Duration) {
	eq := 1 / float64(len(s.reps))
	for _, r := range s.reps {
		switch {
		case eq < r.w:
			setShare(r, eq, s.burst)
			r.holdAt = -1
		case eq > r.w && r.holdAt < 0:
			r.holdAt, r.holdW = t+s.c.Hold, eq
		case eq > r.w:
			r.holdW = min(r.holdW, eq)
		case r.holdAt >= 0:
			r.holdAt = -1
		}
		if r.holdAt >= 0 && t >= r.holdAt {
			setShare(r, r.holdW, s.burst)
			r.holdAt = -1
		}
	}
}

// demandShares runs one step of demand sharing at t. Every replica writes
// at the same stretched interval; the leader divides twice per interval;
// its parameters reach the replicas after the watch delay; each replica
// then moves its share toward what they give it.
func (s *sim) demandShares(t time.Duration) error {
	k := len(s.reps)
	eq := 1 / float64(k)
	stretched := demand.Stretch(s.c.Interval, k, s.c.MaxWrites)
	now := time.Unix(0, 0).Add(t)
	if t >= s.nextDivide {
		s.nextDivide = t + stretched/2
		if err := s.divide(t, now); err != nil {
			return err
		}
	}
	s.deliver(t)
	for _, r := range s.reps {
		// The meter counts thousandths of a token (the buckets are
		// fluid); the rates are scaled back here.
		r.rates.Update(r.offered, r.admitted, now, s.c.Interval/4)
		offered, admitted := r.rates.Offered/1000, r.rates.Admitted/1000
		if r.due(t, stretched, offered) {
			if err := s.report(r, t, now, offered, admitted); err != nil {
				return err
			}
		}
		r.approach(r.target(eq, s.c.Limit, k), t, s.burst)
	}
	return nil
}

// divide is the leader's work at t: divide L among the reports in the KV,
// encode the parameters as the daemon would, and hand them to the watch.
func (s *sim) divide(t time.Duration, now time.Time) error {
	k := len(s.reps)
	wants := make([]demand.Want, 0, len(s.kv))
	var admitted float64
	var counted []demand.ReportRef
	for _, name := range slices.Sorted(maps.Keys(s.kv)) { // a fixed order: the sums are the same every run
		x := s.kv[name]
		wants = append(wants, demand.Want{Units: x.rep.Units, Offered: x.rep.Rules[0].Offered})
		admitted += x.rep.Rules[0].Admitted
		counted = append(counted, demand.ReportRef{Index: x.index, Node: demand.TagOf(name)})
	}
	slices.SortFunc(counted, func(a, b demand.ReportRef) int { return cmp.Compare(a.Index, b.Index) })
	rule := demand.Divide(s.c.Limit, uint32(k), wants, demand.DefaultHeadroom, demand.DefaultFloor)
	p := demand.Params{At: now.UnixNano(), Snapshot: s.index, Reports: counted, Units: rule.Units, Headroom: rule.Headroom, Floor: rule.Floor, Leader: s.reps[0].name,
		Rules: []demand.RuleParams{{ID: ruleID, Limit: rule.Limit, K: rule.K, R: rule.R, Admitted: admitted}}}
	b, err := demand.AppendParams(nil, &p)
	if err != nil {
		return err
	}
	p, err = demand.DecodeParams(b)
	if err != nil {
		return err
	}
	s.res.ParamsBytes = len(b)
	s.leaderBytes += float64(len(s.kv) * s.res.ReportBytes)
	s.paramsBytes += float64(k * len(b))
	s.index++
	s.pending = append(s.pending, pendingParams{t + watchDelay, p})
	return nil
}

// deliver hands every replica the parameters the watch delivers by t.
func (s *sim) deliver(t time.Duration) {
	for len(s.pending) > 0 && s.pending[0].at <= t {
		p := s.pending[0].p
		s.pending = s.pending[1:]
		for _, r := range s.reps {
			r.params = &p
		}
	}
}

// report writes r's demand at t to the KV, encoded as the daemon would,
// and keeps it in r's history.
func (s *sim) report(r *replica, t time.Duration, now time.Time, offered, admitted float64) error {
	r.seq++
	rep := demand.Report{Seq: r.seq, At: now.UnixNano(), Units: 1, Node: r.name,
		Rules: []demand.RuleDemand{{ID: ruleID, Offered: offered, Admitted: admitted}}}
	b, err := demand.AppendReport(nil, &rep)
	if err != nil {
		return err
	}
	dec, err := demand.DecodeReport(b)
	if err != nil {
		return err
	}
	s.res.ReportBytes = len(b)
	s.index++
	s.kv[r.name] = kvReport{dec, s.index}
	r.hist.Add(s.index, dec)
	r.last, r.lastWrite, r.wrote = &dec, t, true
	s.writes++
	s.bin.Writes++
	return nil
}
