package engine

import (
	"math"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// Swap installs set and returns the set it replaced. A rule whose identity
// (its domain, path, share and share_threshold) the set in force has too
// keeps its buckets: their keys are derived from exactly those, so the new
// set finds them where the old one left them. When the rule's limit changed
// (requests_per_unit, unit, unit_multiplier, burst, policy or max_wait),
// each of its buckets keeps its fill ratio, as a weight change does, and
// refills the time since its last use at the slower of the two limits
// (bucket.Slower): a bucket does not record when the reload came, and the
// slower guess is never looser than the truth. A wait-policy bucket's
// reservations stay owed, as the same share of the new bucket. So a changed
// limit, lowered or raised, never hands out a fresh burst.
//
// A rule new to the set in force starts with full buckets under Swap, as at
// start-up: Swap is for the first set and for sets installed before the
// engine serves. A reload while the engine serves is SwapAt.
func (e *Engine) Swap(set *descriptors.Set) *descriptors.Set {
	e.swapMu.Lock()
	defer e.swapMu.Unlock()
	return e.swap(set, 0, false)
}

// SwapAt is Swap for a reload at now, while the engine serves. It also holds
// a rule that may be a renamed one to a ramp. A rule is new when the set in
// force has no rule of its identity that draws: one added, renamed (another
// key or value at any depth, or another domain), given another share or
// share_threshold, or one that was unlimited, blocked (requests_per_unit: 0)
// or without a limit. A rule is retired when it drew and no longer does. The
// engine cannot tell a renamed rule from a new one; it knows a rename
// retires a rule, in the same reload or (a removal, then an addition) in an
// earlier one. So a new rule starts full, as at start-up, unless some rule
// retired less than its own burst time B ÷ R ago (by then that rule's spent
// burst has refilled at its own rate): then the new rule's buckets start
// empty at now and fill linearly over its own burst time, as the join ramp's
// do. The ramp holds the buckets the rule finds as well as those it creates,
// so a rule renamed and renamed back (or blocked and unblocked) finds its
// old buckets no fuller than the ramp. A ramp in progress carries over a
// reload that keeps the rule, over the longer of its old and new burst
// times.
//
// What it costs: a genuinely new rule added less than that time after a rule
// retired admits at most R·t in its first t < B/R on each replica (its share
// of it), without its burst; at weight 1 no request on a key passes before
// the ramp holds one token, 1/R after the reload (6 minutes for a rule of 10
// an hour), and later on a replica with a share. A rule added when no rule
// retired within that time starts full.
func (e *Engine) SwapAt(set *descriptors.Set, now int64) *descriptors.Set {
	e.swapMu.Lock()
	defer e.swapMu.Unlock()
	e.noteNow(now)
	return e.swap(set, now, true)
}

// swap installs set; timed says now is the time of a reload while serving,
// when new rules ramp. Called with swapMu held (or from New).
func (e *Engine) swap(set *descriptors.Set, now int64, timed bool) *descriptors.Set {
	in := e.prepare(set)
	lower := e.carry(e.cur.Load(), in, now, timed)
	e.carryLeases(e.cur.Load(), in)
	var old *installed
	e.store.Relimit(lower, func() { old = e.cur.Swap(in) })
	if old == nil {
		return nil
	}
	return old.set
}

// draws reports whether l is a limit its rule's buckets enforce: not
// unlimited and not blocked (requests_per_unit: 0 admits nothing and keeps
// no bucket). A nil l does not draw.
func draws(l *descriptors.Limit) bool {
	if l == nil || l.Unlimited() {
		return false
	}
	p := l.Params()
	return !p.Blocked()
}

// carry matches each rule of in that draws with the rule of old that has
// its identity. It returns, by tag, the figures that the buckets of rules
// whose limit changed are to be judged by until their next use (Relimit:
// the slower of old and new, and of every changed rule sharing the tag),
// and it sets in.ramps: a ramp in progress carries over, and when timed, a
// new rule starts one at now if a rule retired recently (SwapAt). Called
// with swapMu held.
func (e *Engine) carry(old, in *installed, now int64, timed bool) map[uint16]bucket.Params {
	if old == nil {
		return nil
	}
	was := drawing(old)
	if timed {
		e.retire(was, in, now)
	}
	var lower map[uint16]bucket.Params
	for i, r := range in.set.Rules() {
		if !draws(r.Limit()) {
			continue
		}
		info := &in.rules[i]
		o := was[r.Identity()]
		if o == nil {
			if timed && now < e.retiredUntil {
				in.setRamp(i, newRamp(now, &info.params))
			}
			continue
		}
		in.setRamp(i, carriedRamp(old, o.ID(), &info.params, now, timed))
		lower = relimit(lower, info.tag, &old.rules[o.ID()].params, &info.params)
	}
	return lower
}

// drawing is every rule of in that draws, by identity.
func drawing(in *installed) map[string]*descriptors.Rule {
	rules := in.set.Rules()
	was := make(map[string]*descriptors.Rule, len(rules))
	for _, r := range rules {
		if draws(r.Limit()) {
			was[r.Identity()] = r
		}
	}
	return was
}

// retire notes the rules of was that no longer draw in in: until each has
// refilled its burst, a rule a reload adds ramps. Called with swapMu held.
func (e *Engine) retire(was map[string]*descriptors.Rule, in *installed, now int64) {
	rules := in.set.Rules()
	drawsNow := make(map[string]bool, len(rules))
	for _, r := range rules {
		if draws(r.Limit()) {
			drawsNow[r.Identity()] = true
		}
	}
	for id, r := range was {
		if drawsNow[id] {
			continue
		}
		p := r.Limit().Params()
		d := int64(p.BurstTime())
		until := now + d
		if now > math.MaxInt64-d {
			until = math.MaxInt64
		}
		e.retiredUntil = max(e.retiredUntil, until)
	}
}

// newRamp is the ramp of a new rule of figures p added at now; nil when
// its buckets fill at once.
func newRamp(now int64, p *bucket.Params) *bucket.Ramp {
	if d := p.BurstTime(); d > 0 {
		return &bucket.Ramp{Start: now, Fixed: d}
	}
	return nil
}

// carriedRamp is the ramp that rule id of old, still running at now (or
// installed untimed), carries over to the same rule at figures p; nil for
// none.
func carriedRamp(old *installed, id int, p *bucket.Params, now int64, timed bool) *bucket.Ramp {
	if old.ramps == nil || old.ramps[id] == nil {
		return nil
	}
	prev := old.ramps[id]
	if timed && now >= prev.End() {
		return nil
	}
	// The longer burst time keeps the ramp's line below what either limit
	// refills from its start.
	return &bucket.Ramp{Start: prev.Start, Fixed: max(prev.Fixed, p.BurstTime())}
}

// relimit adds to lower, when figures op became p, the figures the tag's
// buckets are judged by until their next use: the slowest of every change
// under the tag. It returns lower, made when first needed.
func relimit(lower map[uint16]bucket.Params, tag uint16, op, p *bucket.Params) map[uint16]bucket.Params {
	if float32(op.Rate) == float32(p.Rate) && float32(op.Size) == float32(p.Size) {
		return lower
	}
	if lower == nil {
		lower = map[uint16]bucket.Params{}
	}
	q := *p
	if have, ok := lower[tag]; ok {
		q = bucket.Slower(&have, p)
	}
	lower[tag] = q
	return lower
}

// setRamp gives rule i ramp rp, when not nil.
func (in *installed) setRamp(i int, rp *bucket.Ramp) {
	if rp == nil {
		return
	}
	if in.ramps == nil {
		in.ramps = make([]*bucket.Ramp, len(in.rules))
	}
	in.ramps[i] = rp
}

// Ramping returns the rules of the installed set whose reload ramp (SwapAt)
// still runs at now, in rule order.
func (e *Engine) Ramping(now int64) []*descriptors.Rule {
	in := e.cur.Load()
	var out []*descriptors.Rule
	for id, rp := range in.ramps {
		if rp != nil && now < rp.End() {
			out = append(out, in.set.Rule(id))
		}
	}
	return out
}

// prepare builds what installing set takes: its keys, tags, domains' groups
// and demand state. Called with swapMu held.
func (e *Engine) prepare(set *descriptors.Set) *installed {
	rules := set.Rules()
	in := &installed{set: set, rules: make([]ruleInfo, len(rules))}
	for i, r := range rules {
		info := &in.rules[i]
		info.key = keyHash(e.seed, r.Identity())
		info.tag = tagOf(r.Identity())
		info.overflow = mix(info.key, 0x6f766572666c6f77) // "overflow"
		if l := r.Limit(); l != nil {
			info.params = l.Params()
		}
		for d := range r.Depth() {
			if r.PicksBucket(d) {
				info.picks = append(info.picks, d)
			}
		}
	}
	domains := set.Domains()
	in.domains = make(map[string]slot, len(domains))
	for _, dom := range domains {
		in.domains[dom.Name()] = slot{dom: dom, group: uint16(e.DomainGroup(dom.Name()))}
	}
	// Rules that are gone give their slots back first, so an edited rule
	// (a new identity) can take them.
	e.releaseGone(in, e.lastNow.Load())
	e.bindDemand(in)
	return in
}
