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
}

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
	// plans is by descriptor: the plan of each wait-policy reservation the
	// request made (Status.Wait > 0), for its give-back. Other entries are
	// stale. It grows the first time a request of its size reserves, and is
	// reused after.
	plans []plan
}

// plan is one descriptor's bucket request, built once, by plan: the draw
// applies it, and a give-back replays it with the operation reversed, so the
// tokens go back to the very bucket, at the very weight, they came from.
type plan struct {
	req bucket.Request
	wt  *bucket.Weight
	// dr is the demand rule that meters the draw, nil when none does; usual
	// is the key it meters by (the rule's usual bucket, before route).
	dr    *DemandRule
	usual uint64
	// hot is the hot value whose bucket the draw used, nil when none.
	hot *HotValue
}

// tally is what one request's statuses add up to: its overall code and its
// quota descriptors, over and in all.
type tally struct {
	overall            Code
	quotas, quotasOver int
}

// Decide answers one request into dec. hits is the request's hits_addend; now
// is on the engine's clock. dec.Statuses is reused when large enough, so a
// caller that keeps its Decision decides without allocating (and filling the
// caller's value, rather than returning one, keeps the hot path as short as
// it was before Decision existed). Bad input returns a *RequestError and
// changes no bucket.
//
// It runs in four steps: match finds each descriptor's limit, plan builds
// its bucket request, the store draws, and account turns the result into
// the status and the request's code. A request refused anyway gives back
// its wait-policy reservations by replaying their plans (cancelWaits).
func (e *Engine) Decide(dec *Decision, domain string, descs []*commonv3.RateLimitDescriptor, hits uint32, now int64) error {
	in := e.cur.Load()
	dec.Set, dec.Code = in.set, OK
	if err := Validate(domain, descs); err != nil {
		dec.Statuses = dec.Statuses[:0]
		return err
	}
	out := dec.Statuses
	if cap(out) < len(descs) {
		out = make([]Status, len(descs))
	}
	out = out[:len(descs)]
	dec.Statuses = out
	sl := in.domains[domain]
	e.match(in, sl.dom, descs, out)
	quotaAll := e.quota.Load()
	t := tally{overall: OK}
	for i, d := range descs {
		st := &out[i]
		if !t.limited(st, quotaAll) {
			continue
		}
		var p plan
		e.plan(&p, in, sl.group, domain, d, st, hits)
		res, ovf := e.store.Do(p.req, p.wt, now)
		if p.dr != nil {
			p.meter(res.OK)
		}
		t.account(st, &p, res, ovf)
		if st.Wait != 0 {
			dec.keep(i, &p)
		}
	}
	if t.quotas > 0 && t.quotasOver == t.quotas {
		t.overall = OverLimit
	}
	if t.overall == OverLimit {
		e.cancelWaits(dec, now)
	}
	dec.Code = t.overall
	return nil
}

// match sets each status to OK with the limit its descriptor asks for: the
// request's own (an override), the rule it matches in dom, or none (dom nil:
// an unknown domain, OK with no limit, as upstream); then it drops the
// limits that others replace.
func (e *Engine) match(in *installed, dom *Domain, descs []*commonv3.RateLimitDescriptor, out []Status) {
	for i, d := range descs {
		st := &out[i]
		*st = Status{Code: OK}
		if dom == nil {
			continue
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
}

// limited reports whether st has a limit to draw from. On the way it answers
// an unlimited limit (MaxUint32 remaining) and counts st among the quota
// descriptors when it is one.
func (t *tally) limited(st *Status, quotaAll bool) bool {
	lim := st.Limit
	if lim != nil && lim.unlimited {
		st.Remaining = math.MaxUint32
		return false
	}
	// As upstream: under global quota mode every descriptor that is not
	// unlimited is a quota descriptor, matched or not; otherwise those whose
	// rule says quota_mode (an override never inherits it).
	if st.Quota = quotaAll || (st.Rule != nil && st.Rule.quotaMode && lim != nil); st.Quota {
		t.quotas++
	}
	return lim != nil && !st.Replaced
}

// plan builds into p the bucket request of descriptor d, whose status st has
// a limit: its keys, tag and ramp, the demand rule and hot value that meter
// it, and the bucket and weight group it is routed to. It is the only place
// a bucket request is derived.
func (e *Engine) plan(p *plan, in *installed, group uint16, domain string, d *commonv3.RateLimitDescriptor, st *Status, hits uint32) {
	lim := st.Limit
	op, n := operation(d, hits)
	p.req.Params, p.req.Op, p.req.N = &lim.params, op, n
	if st.Override {
		p.req.Key, p.req.OverflowKey = e.overrideKeys(domain, d)
	} else {
		id := st.Rule.id
		p.req.Key = e.ruleKey(in, st.Rule, d.Entries)
		p.req.OverflowKey, p.req.Tag = in.overflow[id], in.tags[id]
		if in.ramps != nil {
			p.req.Ramp = in.ramps[id]
		}
		if in.demand != nil && lim.share != ShareReplica {
			p.dr = in.demand[id]
		}
	}
	p.usual = p.req.Key
	if p.dr != nil && p.dr.hot != nil {
		drawn := 0.0 // only draws are candidates' demand
		if op == bucket.Draw {
			drawn = n
		}
		p.hot = p.dr.hotValue(st.Rule, d.Entries, p.usual, drawn)
	}
	p.wt = e.route(&p.req, group, lim, p.dr, p.hot)
}

// meter counts a draw in its demand rule's meter (p.dr, not nil), and its
// hot value's: what it was offered, and, when ok, admitted.
func (p *plan) meter(ok bool) {
	if p.req.Op != bucket.Draw {
		return
	}
	n := uint64(p.req.N)
	m := p.dr.stripe(p.usual)
	m.offered.Add(n)
	if p.hot != nil {
		p.hot.offered.Add(n)
	}
	if ok {
		m.admitted.Add(n)
		if p.hot != nil {
			p.hot.admitted.Add(n)
		}
	}
}

// account fills st from the store's answer to p, and counts it in t when
// it is over its limit.
func (t *tally) account(st *Status, p *plan, res bucket.Result, overflowed bool) {
	lim := st.Limit
	st.Overflow = overflowed
	st.Reset, st.Wait = res.Reset, res.Wait
	if lim.params.Blocked() {
		st.Reset = lim.Window()
	}
	switch {
	case res.OK:
		st.Remaining = remaining(res.Tokens, p.wt.W, lim.burst)
	case st.Rule != nil && st.Rule.shadowMode:
		st.Shadowed = true
	default:
		// As upstream: an OVER_LIMIT descriptor has nothing left, whatever
		// fraction of a token the local bucket holds.
		st.Code = OverLimit
		if st.Quota {
			t.quotasOver++
		} else {
			t.overall = OverLimit
		}
	}
}

// keep holds p, the plan of descriptor i, for a give-back.
func (dec *Decision) keep(i int, p *plan) {
	if len(dec.plans) < len(dec.Statuses) {
		dec.plans = make([]plan, len(dec.Statuses))
	}
	dec.plans[i] = *p
}

// cancelWaits gives back the tokens that wait-policy descriptors reserved in a
// request answered OVER_LIMIT anyway: holding that answer would only delay a
// refusal, and the reservation would spend tokens on a request that never
// passes. Each give-back replays its reservation's plan: the same bucket
// (the overflow bucket when the draw used it), weight, meter and hot value.
func (e *Engine) cancelWaits(dec *Decision, now int64) {
	for i := range dec.Statuses {
		st := &dec.Statuses[i]
		if st.Wait == 0 {
			continue
		}
		p := &dec.plans[i]
		p.unmeter()
		req := p.req
		req.Op = bucket.GiveBack
		if st.Overflow {
			req.Key = req.OverflowKey
		}
		res, _ := e.store.Do(req, p.wt, now)
		st.Wait, st.Reset = 0, res.Reset
		st.Remaining = remaining(res.Tokens, p.wt.W, st.Limit.burst)
	}
}

// unmeter takes back what meter counted as admitted for a draw that was
// given back: it was not.
func (p *plan) unmeter() {
	if p.dr == nil {
		return
	}
	n := ^(uint64(p.req.N) - 1) // -n
	p.dr.stripe(p.usual).admitted.Add(n)
	if p.hot != nil {
		p.hot.admitted.Add(n)
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
