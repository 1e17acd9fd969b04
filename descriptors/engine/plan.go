package engine

import (
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

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
	// lease is the lease whose bucket the draw used, nil when none.
	lease *Lease
	// metered says a demand rule or a lease counts the draw.
	metered bool
}

// plan builds into p the bucket request of descriptor d, whose status st has
// a limit: its keys, tag and ramp, the demand rule and hot value that meter
// it, and the bucket and weight group it is routed to. It is the only place
// a bucket request is derived.
func (e *Engine) plan(p *plan, in *installed, group uint16, domain string, d *commonv3.RateLimitDescriptor, st *Status, hits uint32) {
	lim := st.Limit
	op, n := operation(d, hits)
	p.req.Params, p.req.Op, p.req.N = st.params, op, n
	var info *ruleInfo
	var leases *map[uint64]*Lease
	if st.Override {
		p.req.Key, p.req.OverflowKey = e.overrideKeys(domain, d)
	} else {
		id := st.Rule.ID()
		info = &in.rules[id]
		p.req.Key = e.ruleKey(info, d.Entries)
		p.req.OverflowKey, p.req.Tag = info.overflow, info.tag
		leases = info.leases.Load()
		if in.ramps != nil {
			p.req.Ramp = in.ramps[id]
		}
		if in.demand != nil && lim.Share() != descriptors.ShareReplica {
			p.dr = in.demand[id]
		}
	}
	p.usual, p.metered = p.req.Key, p.dr != nil
	if p.dr != nil && p.dr.hot != nil {
		drawn := 0.0 // only draws are candidates' demand
		if op == bucket.Draw {
			drawn = n
		}
		p.hot = p.dr.hotValue(info.picks, d.Entries, p.usual, drawn)
	}
	p.wt = e.route(&p.req, group, lim, p.dr, p.hot)
	// The one test a rule without a lease pays.
	if leases != nil {
		e.leaseRoute(p, *leases)
	}
}

// draw applies p's bucket request to the store at now. It is one call, so
// that it inlines: the hot path pays for no frame of its own.
func (e *Engine) draw(p *plan, now int64) (bucket.Result, bool) { return e.store.Do(p.req, p.wt, now) }

// meter counts a draw in its demand rule's meter, its hot value's and its
// lease's (p.metered: one of them is set): what it was offered, and, when
// ok, admitted.
func (p *plan) meter(ok bool) {
	if p.req.Op != bucket.Draw {
		return
	}
	if p.lease != nil {
		p.countLease(ok)
	}
	if p.dr == nil {
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

// unmeter takes back what meter counted as admitted for a draw that was
// given back: it was not.
func (p *plan) unmeter() {
	n := ^(uint64(p.req.N) - 1) // -n
	if p.lease != nil && p.req.Op == bucket.Draw {
		p.lease.admitted.Add(n)
	}
	if p.dr == nil {
		return
	}
	p.dr.stripe(p.usual).admitted.Add(n)
	if p.hot != nil {
		p.hot.admitted.Add(n)
	}
}

// route sends req, keyed to the usual bucket of its rule (or override), to
// the bucket and weight group it lives by, and returns the weight: the
// domain's group, 1 for share: replica, a demand rule's own group, or a hot
// value's group and bucket, which starts no fuller than the usual one.
func (e *Engine) route(req *bucket.Request, domainGroup uint16, lim *descriptors.Limit, dr *DemandRule, hv *HotValue) *bucket.Weight {
	switch {
	case lim.Share() == descriptors.ShareReplica:
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
