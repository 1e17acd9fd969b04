package engine

import (
	"math"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// Status is the decision for one request descriptor.
type Status struct {
	Code Code
	// Rule is the rule that matched, nil for an override or no match.
	Rule *descriptors.Rule
	// Limit is the limit applied; nil means no limit (no current_limit).
	Limit *descriptors.Limit
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
	// params are Limit's bucket figures, as the engine holds them.
	params *bucket.Params
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
	Set *descriptors.Set
	// plans is by descriptor: the plan of each wait-policy reservation the
	// request made (Status.Wait > 0), for its give-back. Other entries are
	// stale. It grows the first time a request of its size reserves, and is
	// reused after.
	plans []plan
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
// its bucket request, draw applies it to the store, and account meters it
// and turns the result into the status and the request's code. A request refused anyway gives back
// its wait-policy reservations by replaying their plans (cancelWaits).
func (e *Engine) Decide(dec *Decision, domain string, descs []*commonv3.RateLimitDescriptor, hits uint32, now int64) error {
	in := e.cur.Load()
	dec.Set, dec.Code = in.set, OK
	if err := ValidateRequest(domain, descs); err != nil {
		dec.Statuses = dec.Statuses[:0]
		return err
	}
	out := dec.statuses(len(descs))
	sl := in.domains[domain]
	e.match(in, sl.dom, descs, out)
	t := tally{overall: OK}
	for i, d := range descs {
		st := &out[i]
		if !t.limited(st, e.quota) {
			continue
		}
		var p plan
		e.plan(&p, in, sl.group, domain, d, st, hits)
		res, ovf := e.draw(&p, now)
		t.account(st, &p, res, ovf)
		if st.Wait != 0 {
			dec.keep(i, &p)
		}
	}
	if dec.Code = t.code(); dec.Code == OverLimit {
		e.cancelWaits(dec, now)
	}
	return nil
}

// statuses returns dec.Statuses resized to n, reusing its array when large
// enough.
func (dec *Decision) statuses(n int) []Status {
	out := dec.Statuses
	if cap(out) < n {
		out = make([]Status, n)
	}
	out = out[:n]
	dec.Statuses = out
	return out
}

// match sets each status to OK with the limit its descriptor asks for: the
// request's own (an override), the rule it matches in dom, or none (dom nil:
// an unknown domain, OK with no limit, as upstream); then it drops the
// limits that others replace.
func (e *Engine) match(in *installed, dom *descriptors.Domain, descs []*commonv3.RateLimitDescriptor, out []Status) {
	for i, d := range descs {
		st := &out[i]
		*st = Status{Code: OK}
		if dom == nil {
			continue
		}
		if d.Limit != nil {
			ov := e.override(d.Limit)
			st.Limit, st.params, st.Override = ov.limit, &ov.params, true
			continue
		}
		if r := dom.Match(d.Entries); r != nil {
			st.Rule, st.Limit, st.params = r, r.Limit(), &in.rules[r.ID()].params
		}
	}
	if in.set.HasReplaces() {
		markReplaced(out)
	}
}

// limited reports whether st has a limit to draw from. On the way it answers
// an unlimited limit (MaxUint32 remaining) and counts st among the quota
// descriptors when it is one.
func (t *tally) limited(st *Status, quotaAll bool) bool {
	lim := st.Limit
	if lim != nil && lim.Unlimited() {
		st.Remaining = math.MaxUint32
		return false
	}
	// As upstream: under global quota mode every descriptor that is not
	// unlimited is a quota descriptor, matched or not; otherwise those whose
	// rule says quota_mode (an override never inherits it).
	if st.Quota = quotaAll || (st.Rule != nil && st.Rule.QuotaMode() && lim != nil); st.Quota {
		t.quotas++
	}
	return lim != nil && !st.Replaced
}

// account fills st from the store's answer to p, meters p when a demand
// rule or a lease does, and counts st in t when it is over its limit.
func (t *tally) account(st *Status, p *plan, res bucket.Result, overflowed bool) {
	if p.metered {
		p.meter(res.OK)
	}
	lim := st.Limit
	st.Overflow = overflowed
	st.Reset, st.Wait = res.Reset, res.Wait
	if st.params.Blocked() {
		st.Reset = lim.Window()
	}
	switch {
	case res.OK:
		st.Remaining = remaining(res.Tokens, p.wt.W, lim.Burst())
	case st.Rule != nil && st.Rule.ShadowMode():
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

// code is the request's overall code: OVER_LIMIT when a descriptor that
// counts alone is over, or when every quota descriptor is.
func (t *tally) code() Code {
	if t.quotas > 0 && t.quotasOver == t.quotas {
		return OverLimit
	}
	return t.overall
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
		st.Remaining = remaining(res.Tokens, p.wt.W, st.Limit.Burst())
	}
}

// markReplaced drops, within one request, every limit named in another matched
// limit's replaces.
func markReplaced(out []Status) {
	descriptors.Replacements(len(out), func(i int) *descriptors.Limit { return out[i].Limit }, func(_, dropped int, _ string) {
		out[dropped].Replaced = true
	})
	for i := range out {
		if out[i].Replaced {
			out[i].Limit = nil
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
