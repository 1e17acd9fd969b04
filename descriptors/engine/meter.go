package engine

// MaxReported is the most one MeterReported call counts: a billion
// requests, far more than any client decides between two calls (RLQS
// counts a report's rate tick by tick, every 100 ms), far less than would
// wrap a meter.
const MaxReported = 1_000_000_000

// MeterReported counts, in demand sharing's meters, requests that were decided
// outside Decide for the bucket s names: those RLQS clients enforced
// themselves and reported (num_requests_allowed + num_requests_denied
// offered, num_requests_allowed admitted). Without it a replica whose
// traffic arrives over RLQS would report no demand, and the leader would
// give its share to the others. It counts what Decide's own draws count for
// the same bucket: the rule's meter, and for a per-value rule the value's
// hot meter when the value is hot, or a candidate sample of it when not.
// A rule not shared by demand, or an s that names no rule of the set in
// force, counts nothing. One call counts at most MaxReported: the meters
// are cumulative and read as differences, and a count near 2^64 would wrap
// them (read as a meter restarted) or drown every other demand.
func (e *Engine) MeterReported(s BucketShare, offered, admitted uint64) {
	in := e.cur.Load()
	if s.Rule == nil || s.Set != in.set || offered == 0 {
		return
	}
	dr := demandRuleOf(in, s.Rule)
	if dr == nil {
		return
	}
	offered = min(offered, MaxReported)
	admitted = min(admitted, offered)
	m := dr.stripe(s.Key)
	m.offered.Add(offered)
	m.admitted.Add(admitted)
	if dr.hot == nil {
		return
	}
	info := &in.rules[s.Rule.ID()]
	id := valueID(dr.rid, info.picks, s.Entries)
	if set := dr.hot.set.Load(); set != nil {
		if hv := (*set)[id]; hv != nil {
			hv.offered.Add(offered)
			hv.admitted.Add(admitted)
			return
		}
	}
	// A report stands for many requests: it is one sample of all of them,
	// where Decide samples one request in CandidateSampling.
	dr.hot.sample(id, offered)
}
