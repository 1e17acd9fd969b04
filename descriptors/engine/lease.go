package engine

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// Bucket shares and leases. RLQS hands parts of this replica's share of a
// bucket (w·R, w·B) to the Envoys that report it; RLS may draw on the same
// bucket. BucketShare says what the share is. A Lease gives RLS's draws on
// that one bucket a weight of their own, the part of the share left to them,
// so that RLS and the RLQS assignments together never exceed the share. A
// leased key draws from a bucket of its own in a weight group of its own,
// as a hot value does (hot.go): keyed by its usual bucket and a generation
// no other shares, starting no fuller than the bucket RLS drew on before
// (Request.From), and handing its debt back to that bucket on Release.

// BucketShare is what this replica enforces, now, for one bucket of one
// rule: what RLS draws on for the same values. Rate and Burst are the
// limit's cluster-wide R and B; this replica's share is Weight·Rate and
// Weight·Burst. It is a value: a reload or a weight change makes it stale,
// and the caller asks again.
type BucketShare struct {
	// Set is the set it was resolved against.
	Set *descriptors.Set
	// Rule is the rule the id selects (descriptors.Domain.MatchBucket); nil
	// when none does or the domain is unknown. It may have no limit, or an
	// unlimited or blocked one: then Key, Rate, Burst and Weight are 0.
	Rule *descriptors.Rule
	// Entries are the id as the rule's descriptor, in its path's key order.
	Entries []*commonv3.RateLimitDescriptor_Entry
	// Key is the bucket RLS draws on for Entries, as Decide plans it: the
	// rule's usual bucket, which a lease is keyed by.
	Key uint64
	// Rate is R in tokens a second, Burst is B in tokens, cluster-wide.
	Rate, Burst float64
	// Weight is the weight RLS's draws on Key are divided by now, as
	// Decide routes them: 1 for share: replica, the hot value's group when
	// the value is hot, the demand rule's group for a rule shared by demand
	// with one bucket, else the domain's group. It is the whole share, not
	// a lease's part of it.
	Weight float64
	// Lease is the lease on Key in force, nil when none.
	Lease *Lease
}

// BucketShare resolves an RLQS bucket id of domain to the bucket, limit and
// weight that RLS would use for the same values now. It is a read: it
// changes no bucket, meter or candidate count.
func (e *Engine) BucketShare(domain string, id map[string]string) BucketShare {
	in := e.cur.Load()
	s := BucketShare{Set: in.set}
	sl, ok := in.domains[domain]
	if !ok {
		return s
	}
	s.Rule, s.Entries = sl.dom.MatchBucket(id)
	if s.Rule == nil || !draws(s.Rule.Limit()) {
		return s
	}
	r := s.Rule
	info := &in.rules[r.ID()]
	s.Key = e.ruleKey(info, s.Entries)
	s.Rate, s.Burst = info.params.Rate, info.params.Size
	g := sl.group
	switch dr := demandRuleOf(in, r); {
	case r.Limit().Share() == descriptors.ShareReplica:
		g = replicaGroup
	case dr != nil && dr.hot != nil:
		if set := dr.hot.set.Load(); set != nil {
			if hv := (*set)[valueID(dr.rid, info.picks, s.Entries)]; hv != nil {
				g = hv.group
			}
		}
	case dr != nil:
		g = dr.group
	}
	s.Weight = e.weights[g].Load().W
	if ls := info.leases.Load(); ls != nil {
		s.Lease = (*ls)[s.Key]
	}
	return s
}

// demandRuleOf is rule r's demand state in in, nil when it has none.
func demandRuleOf(in *installed, r *descriptors.Rule) *DemandRule {
	if in.demand == nil {
		return nil
	}
	return in.demand[r.ID()]
}

// ErrLease marks a lease that cannot be made.
var ErrLease = errors.New("lease")

// MinLeaseWeight is the smallest weight a lease holds: a part of 0 (RLS has
// no demand on the key) is held as this. The leased bucket, as every
// bucket, still holds at least one token (bucket.Params.Local).
const MinLeaseWeight = 1e-6

// Lease is one bucket key of one rule given a weight of its own for RLS's
// draws: while it is in force, Decide draws on the key from the lease's
// bucket, divided by the lease's weight, and counts the draws. It is made by
// Engine.Lease and ended by Release, or by a reload that drops its rule (a
// reload that keeps the rule's identity keeps it). Its weight is absolute,
// as BucketShare.Weight is, not a part of it: when the share changes (a
// membership or demand division, a value turning hot or cold), the caller
// sets the lease's weight again. Like every bucket, the leased one holds at
// least one token, whatever the weight. It is safe for concurrent use.
type Lease struct {
	e        *Engine
	identity string // its rule's
	key      uint64 // the usual bucket
	group    uint16
	salt     uint64
	// mu guards ended, so that Set never changes the weight of a group a
	// lease gave back and another took.
	mu    sync.Mutex
	ended bool
	// back is the bucket RLS drew on for the key without the lease, as the
	// last draw through the lease found it: where Release hands the debt.
	back              atomic.Pointer[leaseBack]
	offered, admitted atomic.Uint64
}

// leaseBack is a bucket RLS draws on without the lease: a hot value's
// (hot and dr set: the value may cool before the lease ends) or the usual.
type leaseBack struct {
	key   uint64
	group uint16
	hot   *HotValue
	dr    *DemandRule
}

// target is where the debt goes when the lease ends at b: b, or, when b is
// a hot value's bucket and the value has cooled since, the usual bucket,
// to which the value's own debt went (SetHot).
func (b *leaseBack) target(usual uint64) (uint64, uint16) {
	if b.hot == nil {
		return b.key, b.group
	}
	if set := b.dr.hot.set.Load(); set != nil && (*set)[b.hot.id] == b.hot {
		return b.key, b.group
	}
	return usual, b.dr.domainGroup
}

// Lease gives the bucket key of rule r (BucketShare.Key) its own weight w:
// RLS's draws on it, from now on, come from a bucket of their own that
// starts no fuller than the one they drew on before, refilled at w. r may
// come from an earlier set: the lease is on the rule of r's identity in the
// set in force. It fails, wrapping ErrLease, when that set has no rule of
// r's identity that draws or key is leased already; and, wrapping ErrGroup
// too, when no weight group is free (MaxGroups). Then RLS keeps drawing on
// the key at the whole share: the caller must count the whole share as
// RLS's and assign the key's RLQS consumers nothing (DENY_ALL).
func (e *Engine) Lease(r *descriptors.Rule, key uint64, w float64, now int64) (*Lease, error) {
	e.swapMu.Lock()
	defer e.swapMu.Unlock()
	e.noteNow(now)
	in := e.cur.Load()
	if r == nil {
		return nil, fmt.Errorf("%w: no rule", ErrLease)
	}
	id := ruleOfIdentity(in, r.Identity(), r.ID())
	if id < 0 {
		return nil, fmt.Errorf("%w: rule %s is not in force or has no limit to draw on", ErrLease, r.Path())
	}
	info := &in.rules[id]
	var cur map[uint64]*Lease
	if p := info.leases.Load(); p != nil {
		cur = *p
	}
	if cur[key] != nil {
		return nil, fmt.Errorf("%w: rule %s: key %#x is leased already", ErrLease, r.Path(), key)
	}
	w = leaseWeight(w)
	gs := e.takeGroups(1, w)
	if gs == nil {
		return nil, fmt.Errorf("%w: rule %s: %w: no weight group is free", ErrLease, r.Path(), ErrGroup)
	}
	l := &Lease{e: e, identity: r.Identity(), key: key, group: gs[0], salt: uint64(gs[0])<<32 | uint64(e.hotGen.Add(1))}
	next := make(map[uint64]*Lease, len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	next[key] = l
	info.leases.Store(&next)
	return l, nil
}

// Release ends the lease at now: RLS's draws on its key go back to the
// bucket they drew on before, which ends no fuller than the lease's bucket,
// and its weight group is free again. Releasing an ended lease does
// nothing.
func (l *Lease) Release(now int64) {
	e := l.e
	e.swapMu.Lock()
	defer e.swapMu.Unlock()
	e.noteNow(now)
	if !l.end() {
		return
	}
	in := e.cur.Load()
	if id := ruleOfIdentity(in, l.identity, -1); id >= 0 {
		info := &in.rules[id]
		if p := info.leases.Load(); p != nil && (*p)[l.key] == l {
			var next map[uint64]*Lease
			if len(*p) > 1 {
				next = make(map[uint64]*Lease, len(*p)-1)
				for k, v := range *p {
					if k != l.key {
						next[k] = v
					}
				}
			}
			if next == nil {
				info.leases.Store(nil)
			} else {
				info.leases.Store(&next)
			}
		}
	}
	// After the lease is out of the set, so a draw that misses it finds
	// the debt where it goes. One already past its look may still make
	// the leased bucket again; unused from then on, it is swept.
	if b := l.back.Load(); b != nil {
		k, g := b.target(l.key)
		e.store.Move(mix(l.key, l.salt), e.weights[l.group].Load(), k, e.weights[g].Load(), g, now)
	}
	e.freeGroups = append(e.freeGroups, l.group)
}

// end marks l ended; false when it was already. Called with swapMu held.
func (l *Lease) end() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return false
	}
	l.ended = true
	return true
}

// Set changes the lease's weight to w at now (a w below MinLeaseWeight is
// held as that, one above 1 as 1). A smaller weight keeps the leased
// bucket's fill ratio, as any bucket does when its weight changes; a larger
// one keeps its tokens: a bucket keeps its ratio, so an idle (full) one
// would take the whole grow at once, tokens no refill made, where RLQS
// moves the share between RLS and Envoys back and forth. It changes nothing
// once the lease has ended (Active), or for a NaN.
func (l *Lease) Set(w float64, now int64) {
	if math.IsNaN(w) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	w = leaseWeight(w)
	if old := l.e.weights[l.group].Load(); old != nil && w > old.W {
		// Emptier first, at the old weight (a draw meanwhile finds fewer
		// tokens, never more), then the weight: the same tokens.
		k := mix(l.key, l.salt)
		if sv, ok := l.e.store.Peek(k, old, now); ok && sv.Fill > 0 {
			sv.Fill *= old.W / w
			l.e.store.Restore(sv, old, now)
		}
	}
	l.e.SetGroupWeight(int(l.group), w, now)
}

// leaseWeight is w held to [MinLeaseWeight, 1].
func leaseWeight(w float64) float64 { return min(max(w, MinLeaseWeight), 1) }

// Weight is the lease's weight in force; 0 once it has ended.
func (l *Lease) Weight() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return 0
	}
	return l.e.weights[l.group].Load().W
}

// Key is the bucket key the lease is on.
func (l *Lease) Key() uint64 { return l.key }

// Active reports whether the lease is in force: not released, and not
// dropped by a reload that removed its rule.
func (l *Lease) Active() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.ended
}

// Counts are the tokens RLS's draws on the key asked for and got while the
// lease was in force: the RLS consumer's demand.
func (l *Lease) Counts() (offered, admitted uint64) { return l.offered.Load(), l.admitted.Load() }

// leaseRoute sends p, routed to the bucket RLS draws on without a lease, to
// the lease on its key in m, if there is one. The leased bucket starts no
// fuller than that bucket: for a hot value, the hot bucket. (A hot bucket
// not made yet counts as full there, though it would start at the usual
// bucket's fill: a lease that begins between a value turning hot and its
// first draw may start that much fuller, once.)
func (e *Engine) leaseRoute(p *plan, m map[uint64]*Lease) {
	l := m[p.usual]
	if l == nil {
		return
	}
	req := &p.req
	if b := l.back.Load(); b == nil || b.key != req.Key || b.group != req.Group {
		nb := &leaseBack{key: req.Key, group: req.Group}
		if p.hot != nil {
			nb.hot, nb.dr = p.hot, p.dr
		}
		l.back.Store(nb)
	}
	req.From, req.FromWeight, req.FromOverflow = req.Key, p.wt, req.OverflowKey
	req.Key, req.OverflowKey = mix(p.usual, l.salt), mix(req.OverflowKey, l.salt)
	req.Group = l.group
	p.wt = e.weights[l.group].Load()
	p.lease, p.metered = l, true
}

// ruleOfIdentity is the ID in in of the rule of identity that draws, -1
// when there is none; hint is where to look first.
func ruleOfIdentity(in *installed, identity string, hint int) int {
	if r := in.set.Rule(hint); r != nil && r.Identity() == identity && draws(r.Limit()) {
		return hint
	}
	for i := range in.set.Len() {
		if r := in.set.Rule(i); r.Identity() == identity && draws(r.Limit()) {
			return i
		}
	}
	return -1
}

// carryLeases gives the leases of every rule of old to the rule of in with
// its identity, when that one draws, and ends the rest, freeing their
// groups. Called with swapMu held, before in is installed.
func (e *Engine) carryLeases(old, in *installed) {
	if old == nil {
		return
	}
	for i := range old.rules {
		p := old.rules[i].leases.Load()
		if p == nil {
			continue
		}
		r := old.set.Rule(i)
		if id := ruleOfIdentity(in, r.Identity(), i); id >= 0 {
			in.rules[id].leases.Store(p)
			continue
		}
		for _, l := range *p {
			if l.end() {
				e.freeGroups = append(e.freeGroups, l.group)
			}
		}
	}
}

// countLease counts a draw of p, through lease p.lease, as offered and,
// when ok, admitted.
func (p *plan) countLease(ok bool) {
	n := uint64(p.req.N)
	p.lease.offered.Add(n)
	if ok {
		p.lease.admitted.Add(n)
	}
}

// leasedDebts readies a snapshot (Export): it keeps the buckets of leased
// keys out of it (ws[group] nil) and merges each one's fill into merge
// under the key's usual bucket, so a restore, which knows no leases, finds
// the debt there.
func (e *Engine) leasedDebts(ws []*bucket.Weight, merge map[uint64]bucket.Saved, now int64) {
	in := e.cur.Load()
	for i := range in.rules {
		p := in.rules[i].leases.Load()
		if p == nil {
			continue
		}
		for _, l := range *p {
			if int(l.group) < len(ws) {
				ws[l.group] = nil
			}
			b := l.back.Load()
			if b == nil {
				continue
			}
			sv, ok := e.store.Peek(mix(l.key, l.salt), e.weights[l.group].Load(), now)
			if !ok || sv.Fill >= 1 {
				continue
			}
			sv.Key, sv.Group = l.key, b.group
			if m, seen := merge[l.key]; seen {
				sv.Fill = min(sv.Fill, m.Fill)
			}
			merge[l.key] = sv
		}
	}
}
