package descriptors

import (
	"math"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// Status is the decision for one request descriptor.
type Status struct {
	Code Code
	// Rule is the rule that matched, nil for an override or no match.
	Rule *Rule
	// Limit is the limit applied; nil means no limit (no current_limit).
	Limit *Limit
	// Remaining estimates the tokens left cluster-wide: local tokens ÷ weight,
	// floored and capped at the burst.
	Remaining uint32
	// Reset is the time until the bucket is full (OK) or holds enough tokens for
	// this request (OVER_LIMIT).
	Reset time.Duration
	// Wait is how long the answer must be held for a wait-policy reservation.
	Wait time.Duration
	// Shadowed: the rule is in shadow mode and the decision would have been
	// OVER_LIMIT.
	Shadowed bool
	// Replaced: the limit was dropped because another matched limit replaces it.
	Replaced bool
	// Overflow: the store was at its cap and the rule's overflow bucket was used.
	Overflow bool
	// Override: the limit came from the request, not the config.
	Override bool
	// Quota: the descriptor is in quota mode (its rule's quota_mode, or the
	// engine's global quota mode). An over-limit quota descriptor is OVER_LIMIT
	// in its own status, but refuses the request only together with every
	// other quota descriptor of the request.
	Quota bool
	// hot is the hot value whose bucket the descriptor used, if any: a
	// give-back must go to the same bucket.
	hot *HotValue
}

// installed is a Set with the per-rule hashes the store keys start from.

// Decision is the answer to one request.
type Decision struct {
	// Statuses has one status per request descriptor, in order.
	Statuses []Status
	// Code is OVER_LIMIT if a descriptor that is neither in shadow nor in quota
	// mode is over its limit, or if the request has quota-mode descriptors and
	// every one of them is over; OK otherwise, never UNKNOWN. This is
	// upstream's rule.
	Code Code
	// Set is the set the request was decided with. A reload may install another
	// the moment Decide returns; whatever reads the statuses' rules (metrics,
	// by rule ID) must read them against this set, never the current one.
	Set *Set
}

// Decide answers one request into dec. hits is the request's hits_addend; now
// is on the engine's clock. dec.Statuses is reused when large enough, so a
// caller that keeps its Decision decides without allocating (and filling the
// caller's value, rather than returning one, keeps the hot path as short as
// it was before Decision existed). Bad input returns a *RequestError and
// changes no bucket.
func (e *Engine) Decide(dec *Decision, domain string, descs []*commonv3.RateLimitDescriptor, hits uint32, now int64) error {
	in := e.cur.Load()
	dec.Set, dec.Code = in.set, OK
	out := dec.Statuses[:0]
	if err := Validate(domain, descs); err != nil {
		dec.Statuses = out
		return err
	}
	if cap(out) < len(descs) {
		out = make([]Status, len(descs))
	}
	out = out[:len(descs)]
	dec.Statuses = out
	sl := in.domains[domain]
	dom := sl.dom
	for i, d := range descs {
		st := &out[i]
		*st = Status{Code: OK}
		if dom == nil {
			continue // unknown domain: OK, no limit, as upstream
		}
		if d.Limit != nil {
			st.Limit, st.Override = e.override(d.Limit), true
			continue
		}
		if r := match(&dom.root, d.Entries, nil); r != nil {
			st.Rule, st.Limit = r, r.limit
		}
	}
	if in.set.hasReplaces {
		markReplaced(out)
	}
	quotaAll := e.quota.Load()
	overall := OK
	quotas, quotasOver := 0, 0
	for i, d := range descs {
		st := &out[i]
		lim := st.Limit
		if lim != nil && lim.unlimited {
			st.Remaining = math.MaxUint32
			continue
		}
		// As upstream: under global quota mode every descriptor that is not
		// unlimited is a quota descriptor, matched or not; otherwise those whose
		// rule says quota_mode (an override never inherits it).
		if st.Quota = quotaAll || (st.Rule != nil && st.Rule.quotaMode && lim != nil); st.Quota {
			quotas++
		}
		if lim == nil || st.Replaced {
			continue
		}
		op, n := operation(d, hits)
		var req bucket.Request
		if st.Override {
			req.Key, req.OverflowKey = e.overrideKeys(domain, d)
		} else {
			req.Key = e.ruleKey(in, st.Rule, d.Entries)
			req.OverflowKey, req.Tag = in.overflow[st.Rule.id], in.tags[st.Rule.id]
			if in.ramps != nil {
				req.Ramp = in.ramps[st.Rule.id]
			}
		}
		req.Params, req.Op, req.N = &lim.params, op, n
		var dr *DemandRule
		if in.demand != nil && st.Rule != nil && !st.Override && lim.share != ShareReplica {
			dr = in.demand[st.Rule.id]
		}
		if dr != nil && dr.hot != nil {
			drawn := 0.0 // only draws are candidates' demand
			if op == bucket.Draw {
				drawn = n
			}
			st.hot = dr.hotValue(st.Rule, d.Entries, req.Key, drawn)
		}
		usual := req.Key
		w := e.route(&req, sl.group, lim, dr, st.hot)
		res, ovf := e.store.Do(req, w, now)
		if dr != nil && op == bucket.Draw {
			m := dr.stripe(usual)
			m.offered.Add(uint64(n))
			if st.hot != nil {
				st.hot.offered.Add(uint64(n))
			}
			if res.OK {
				m.admitted.Add(uint64(n))
				if st.hot != nil {
					st.hot.admitted.Add(uint64(n))
				}
			}
		}
		st.Overflow = ovf
		st.Reset, st.Wait = res.Reset, res.Wait
		if lim.params.Blocked() {
			st.Reset = lim.Window()
		}
		if res.OK {
			st.Remaining = remaining(res.Tokens, w.W, lim.burst)
		} else if st.Rule != nil && st.Rule.shadowMode {
			st.Shadowed = true
		} else {
			// As upstream: an OVER_LIMIT descriptor has nothing left, whatever
			// fraction of a token the local bucket holds.
			st.Code = OverLimit
			if st.Quota {
				quotasOver++
			} else {
				overall = OverLimit
			}
		}
	}
	if quotas > 0 && quotasOver == quotas {
		overall = OverLimit
	}
	if overall == OverLimit {
		e.cancelWaits(in, domain, descs, hits, out, sl.group, now)
	}
	dec.Code = overall
	return nil
}

// cancelWaits gives back the tokens that wait-policy descriptors reserved in a
// request answered OVER_LIMIT anyway: holding that answer would only delay a
// refusal, and the reservation would spend tokens on a request that never
// passes.
func (e *Engine) cancelWaits(in *installed, domain string, descs []*commonv3.RateLimitDescriptor, hits uint32, out []Status, group uint16, now int64) {
	for i := range out {
		st := &out[i]
		if st.Wait == 0 {
			continue
		}
		_, n := operation(descs[i], hits)
		req := bucket.Request{Params: &st.Limit.params, Op: bucket.GiveBack, N: n}
		switch {
		case st.Override:
			req.Key, req.OverflowKey = e.overrideKeys(domain, descs[i])
		default:
			req.Key, req.OverflowKey = e.ruleKey(in, st.Rule, descs[i].Entries), in.overflow[st.Rule.id]
			req.Tag = in.tags[st.Rule.id]
		}
		var dr *DemandRule
		if in.demand != nil && st.Rule != nil && !st.Override && st.Limit.share != ShareReplica {
			if dr = in.demand[st.Rule.id]; dr != nil {
				// The draw was counted as admitted; it was not.
				dr.stripe(req.Key).admitted.Add(^uint64(uint64(n) - 1))
				if st.hot != nil {
					st.hot.admitted.Add(^uint64(uint64(n) - 1))
				}
			}
		}
		wt := e.route(&req, group, st.Limit, dr, st.hot)
		if st.Overflow {
			req.Key = req.OverflowKey
		}
		res, _ := e.store.Do(req, wt, now)
		st.Wait, st.Reset = 0, res.Reset
		st.Remaining = remaining(res.Tokens, wt.W, st.Limit.burst)
	}
}

// route sends req, keyed to the usual bucket of its rule (or override), to
// the bucket and weight group it lives by, and returns the weight: the
// domain's group, 1 for share: replica, a demand rule's own group, or a hot
// value's group and bucket, which starts no fuller than the usual one.
func (e *Engine) route(req *bucket.Request, domainGroup uint16, lim *Limit, dr *DemandRule, hv *HotValue) *bucket.Weight {
	switch {
	case lim.share == ShareReplica:
		req.Group = replicaGroup
	case hv != nil:
		req.From, req.FromWeight, req.FromOverflow = req.Key, e.weights[domainGroup].Load(), req.OverflowKey
		req.Key, req.OverflowKey = mix(req.Key, hv.salt), mix(req.OverflowKey, hv.salt)
		req.Group = hv.group
	case dr != nil:
		req.Group = dr.group
	default:
		req.Group = domainGroup
	}
	return e.weights[req.Group].Load()
}

// operation is what descriptor d asks of its bucket: hits tokens (its own
// hits_addend when set, else the request's, 0 counting as 1), or a check when
// its own hits_addend is 0, or a give-back with is_negative_hits.
func operation(d *commonv3.RateLimitDescriptor, hits uint32) (bucket.Op, float64) {
	op, n := bucket.Draw, float64(max(hits, 1))
	if d.HitsAddend != nil {
		n = float64(d.HitsAddend.Value)
		if n == 0 {
			op = bucket.Check
		}
	}
	if d.IsNegativeHits {
		op = bucket.GiveBack
	}
	return op, n
}

// markReplaced drops, within one request, every limit named in another matched
// limit's replaces.
func markReplaced(out []Status) {
	replacements(len(out), func(i int) *Limit { return out[i].Limit }, func(_, dropped int, _ string) {
		out[dropped].Replaced = true
	})
	for i := range out {
		if out[i].Replaced {
			out[i].Limit = nil
		}
	}
}

// replacements calls drop for every pair of a request's n limits where the
// limit at by names the limit at dropped in its replaces. limit(i) is nil for a
// descriptor without a limit. Decide and Explain share it, so what explain
// reports is what a decision does.
//
// An unlimited limit is never dropped, though its own replaces count: upstream
// gathers every matched limit's replaces, unlimited ones included, and sets
// the unlimited ones aside before it drops what is named, so an unlimited
// descriptor always answers OK with limit_remaining MaxUint32 and is never a
// quota descriptor.
func replacements(n int, limit func(int) *Limit, drop func(by, dropped int, name string)) {
	for i := 0; i < n; i++ {
		li := limit(i)
		if li == nil || len(li.replaces) == 0 {
			continue
		}
		for j := 0; j < n; j++ {
			lj := limit(j)
			if j == i || lj == nil || lj.name == "" || lj.unlimited {
				continue
			}
			for _, name := range li.replaces {
				if name == lj.name {
					drop(i, j, name)
				}
			}
		}
	}
}

func remaining(tokens, w float64, burst uint64) uint32 {
	if tokens <= 0 || w <= 0 {
		return 0
	}
	r := math.Floor(tokens/w + 1e-9)
	// The built-in min, not math.Min: no call, and r is never NaN or a
	// signed zero that math.Min would treat apart.
	return uint32(min(r, float64(burst), math.MaxUint32))
}

// ruleKey is the bucket of rule r for these entries: the rule's identity plus
// the value at every depth that picks a bucket (key-only and wildcard levels,
// except wildcards with share_threshold, whose matches share one bucket).
