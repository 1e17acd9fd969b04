package descriptors

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// installed is a Set with the per-rule hashes the store keys start from, and
// each domain's weight group.
type installed struct {
	set      *Set
	ids      []uint64 // by Rule.ID
	overflow []uint64 // by Rule.ID
	tags     []uint16 // by Rule.ID: the rule's tag on its buckets (snapshot.go)
	domains  map[string]slot
	// demand is by Rule.ID: the rule's demand state when it is shared by
	// demand, else nil; nil when no rule is.
	demand []*DemandRule
	// ramps is by Rule.ID: the ramp of a rule a reload added, while it
	// may still run, else nil; nil when no rule has one (carry).
	ramps []*bucket.Ramp
}

// slot is a domain as Decide finds it: its rules and the group whose weight
// divides its limits.
type slot struct {
	dom   *Domain
	group uint16
}

// Weight groups. Every domain's limits are divided by the weight of one
// group: the default group, or the group AddGroup gave it (one per
// membership view, so each domain follows the replica count of its own
// service). Group 0 is reserved for share: replica limits, whose weight is 1
// for ever.
const (
	replicaGroup = 0
	// DefaultGroup divides the limits of every domain not given to another.
	DefaultGroup = 1
	// MaxGroups bounds the groups, DefaultGroup included: one per
	// membership view, one per demand-shared rule with one bucket, and one
	// per hot value of a per-value demand rule (up to --demand-top-keys of
	// each). A bucket records its group in two bytes of its padding.
	MaxGroups = 4095
)

// ErrGroup marks a weight group that cannot be added.
var ErrGroup = errors.New("weight group")

// Engine decides requests. It holds the current Set, the current weight of
// each group and the buckets. It is safe for concurrent use: Decide takes no
// engine-wide lock, and a Swap or SetWeight is seen by the next Decide.
type Engine struct {
	cur atomic.Pointer[installed]
	// weights[g] is group g's weight, nil past the last group;
	// weights[replicaGroup] never changes.
	weights   [MaxGroups + 1]atomic.Pointer[bucket.Weight]
	groups    atomic.Int32                      // groups in use, replicaGroup included
	groupOf   atomic.Pointer[map[string]uint16] // domain -> group, DefaultGroup when absent; copied on write
	swapMu    sync.Mutex                        // serialises Swap and AddGroup
	store     *bucket.Store
	seed      uint64 // keys the bucket keys (seed.go)
	overrides atomic.Pointer[map[overrideSpec]*Limit]
	ovMu      sync.Mutex
	quota     atomic.Bool
	// demandAll is --share-mode demand: every cluster-shared limit of a rule
	// with one bucket is shared by demand.
	demandAll atomic.Bool
	// demandOf is every demand rule's state by rule identity, kept across
	// reloads so a rule keeps its group and its meter; copied on write under
	// swapMu. A nil entry is an identity that found no free group and is
	// divided by its domain's group for the engine's life.
	demandOf atomic.Pointer[map[string]*DemandRule]
	// topKeys is --demand-top-keys.
	topKeys atomic.Int32
	// freeGroups are groups a gone per-value rule gave back; guarded by
	// swapMu.
	freeGroups []uint16
	// hotGen numbers every hot value's buckets.
	hotGen atomic.Uint32
	// lastNow is the time releaseGone moves debts at: the latest time the
	// engine was told of (SetGroupWeight, SetHot, SwapAt).
	lastNow atomic.Int64
	// retiredUntil is when the last rule a reload retired (a rule that
	// drew and no longer does: removed, renamed, given another share,
	// made unlimited or blocked) has refilled its burst, at its own rate:
	// until then a rule a reload adds may be that one renamed, and ramps
	// (SwapAt). Guarded by swapMu.
	retiredUntil int64
}

// NewEngine returns an engine deciding with set, every domain in the default
// group at weight w, keeping buckets in store. It starts no goroutines; the
// caller runs Sweep.
func NewEngine(set *Set, w float64, store *bucket.Store) *Engine {
	e := &Engine{store: store, seed: newSeed()}
	e.weights[replicaGroup].Store(bucket.InitialWeight(1))
	e.weights[DefaultGroup].Store(bucket.InitialWeight(w))
	e.groups.Store(DefaultGroup + 1)
	e.groupOf.Store(&map[string]uint16{})
	e.overrides.Store(&map[overrideSpec]*Limit{})
	e.demandOf.Store(&map[string]*DemandRule{})
	e.topKeys.Store(DefaultTopKeys)
	if set == nil {
		set = Empty()
	}
	e.Swap(set)
	return e
}

// AddGroup adds a weight group at weight w and moves domains into it: from
// now on their limits are divided by the group's weight, which SetGroupWeight
// changes. It returns the group. It must be called before the engine serves:
// a bucket's weight history belongs to its group, so a domain's group is
// fixed for the engine's life, and a domain already given to a group, an
// empty domain, or one group too many is an error wrapping ErrGroup.
func (e *Engine) AddGroup(domains []string, w float64) (int, error) {
	e.swapMu.Lock()
	defer e.swapMu.Unlock()
	n := int(e.groups.Load())
	if n > MaxGroups {
		return 0, fmt.Errorf("%w: more than %d groups", ErrGroup, MaxGroups)
	}
	if !(w > 0) || w > 1 {
		return 0, fmt.Errorf("%w: weight %v is not in (0, 1]", ErrGroup, w)
	}
	old := *e.groupOf.Load()
	for i, d := range domains {
		if _, dup := old[d]; dup || d == "" || slices.Contains(domains[:i], d) {
			return 0, fmt.Errorf("%w: domain %q is empty or already in a group", ErrGroup, d)
		}
	}
	g := uint16(n)
	e.weights[g].Store(bucket.InitialWeight(w))
	e.groups.Store(int32(n + 1))
	groupOf := maps.Clone(old)
	for _, d := range domains {
		groupOf[d] = g
	}
	e.groupOf.Store(&groupOf)
	e.swap(e.cur.Load().set, 0, false)
	return int(g), nil
}

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
func (e *Engine) Swap(set *Set) *Set {
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
func (e *Engine) SwapAt(set *Set, now int64) *Set {
	e.swapMu.Lock()
	defer e.swapMu.Unlock()
	e.noteNow(now)
	return e.swap(set, now, true)
}

// swap installs set; timed says now is the time of a reload while serving,
// when new rules ramp. Called with swapMu held.
func (e *Engine) swap(set *Set, now int64, timed bool) *Set {
	in := e.prepare(set)
	lower := e.carry(e.cur.Load(), in, now, timed)
	var old *installed
	e.store.Relimit(lower, func() { old = e.cur.Swap(in) })
	if old == nil {
		return nil
	}
	return old.set
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
	was := make(map[string]*Rule, len(old.set.rules))
	for _, r := range old.set.rules {
		if r.limit.draws() {
			was[r.identity] = r
		}
	}
	if timed {
		draws := make(map[string]bool, len(in.set.rules))
		for _, r := range in.set.rules {
			if r.limit.draws() {
				draws[r.identity] = true
			}
		}
		for id, r := range was {
			if !draws[id] {
				d := int64(r.limit.params.BurstTime())
				until := now + d
				if now > math.MaxInt64-d {
					until = math.MaxInt64
				}
				e.retiredUntil = max(e.retiredUntil, until)
			}
		}
	}
	var lower map[uint16]bucket.Params
	for i, r := range in.set.rules {
		if !r.limit.draws() {
			continue
		}
		p := &r.limit.params
		var rp *bucket.Ramp
		o := was[r.identity]
		switch {
		case o == nil && timed && now < e.retiredUntil:
			if d := p.BurstTime(); d > 0 {
				rp = &bucket.Ramp{Start: now, Fixed: d}
			}
		case o != nil:
			if old.ramps != nil && old.ramps[o.id] != nil && (!timed || now < old.ramps[o.id].End()) {
				// The longer burst time keeps the ramp's line below
				// what either limit refills from its start.
				prev := old.ramps[o.id]
				rp = &bucket.Ramp{Start: prev.Start, Fixed: max(prev.Fixed, p.BurstTime())}
			}
			op := &o.limit.params
			if float32(op.Rate) != float32(p.Rate) || float32(op.Size) != float32(p.Size) {
				if lower == nil {
					lower = map[uint16]bucket.Params{}
				}
				q := *p
				if have, ok := lower[in.tags[i]]; ok {
					q = bucket.Slower(&have, p)
				}
				lower[in.tags[i]] = q
			}
		}
		if rp != nil {
			if in.ramps == nil {
				in.ramps = make([]*bucket.Ramp, len(in.set.rules))
			}
			in.ramps[i] = rp
		}
	}
	return lower
}

// Ramping returns the rules of the installed set whose reload ramp (SwapAt)
// still runs at now, in rule order.
func (e *Engine) Ramping(now int64) []*Rule {
	in := e.cur.Load()
	var out []*Rule
	for id, rp := range in.ramps {
		if rp != nil && now < rp.End() {
			out = append(out, in.set.rules[id])
		}
	}
	return out
}

// prepare builds what installing set takes: its keys, tags, domains' groups
// and demand state. Called with swapMu held.
func (e *Engine) prepare(set *Set) *installed {
	in := &installed{set: set, ids: make([]uint64, len(set.rules)), overflow: make([]uint64, len(set.rules)),
		tags: make([]uint16, len(set.rules)), domains: make(map[string]slot, len(set.domains))}
	for i, r := range set.rules {
		in.ids[i] = keyHash(e.seed, r.identity)
		in.tags[i] = tagOf(r.identity)
		in.overflow[i] = mix(in.ids[i], 0x6f766572666c6f77) // "overflow"
	}
	groupOf := *e.groupOf.Load()
	for name, dom := range set.domains {
		g, ok := groupOf[name]
		if !ok {
			g = DefaultGroup
		}
		in.domains[name] = slot{dom: dom, group: g}
	}
	// Rules that are gone give their slots back first, so an edited rule
	// (a new identity) can take them.
	e.releaseGone(in, e.lastNow.Load())
	e.bindDemand(in)
	return in
}

// SetQuotaMode turns global quota mode on or off: every descriptor that is not
// unlimited is then in quota mode, as upstream's QUOTA_MODE.
func (e *Engine) SetQuotaMode(on bool) { e.quota.Store(on) }

// QuotaMode reports global quota mode.
func (e *Engine) QuotaMode() bool { return e.quota.Load() }

// Set returns the installed set.
func (e *Engine) Set() *Set { return e.cur.Load().set }

// Store returns the bucket store.
func (e *Engine) Store() *bucket.Store { return e.store }

// Weight returns the default group's current weight epoch.
func (e *Engine) Weight() *bucket.Weight { return e.weights[DefaultGroup].Load() }

// GroupWeight returns group g's current weight epoch; nil for no such group.
func (e *Engine) GroupWeight(g int) *bucket.Weight {
	if g < DefaultGroup || g >= int(e.groups.Load()) {
		return nil
	}
	return e.weights[g].Load()
}

// DomainGroup is the group whose weight divides domain's limits.
func (e *Engine) DomainGroup(domain string) int {
	if g, ok := (*e.groupOf.Load())[domain]; ok {
		return int(g)
	}
	return DefaultGroup
}

// RuleWeight is the weight r's limit is divided by: 1 for share: replica,
// its own group's for a rule shared by demand, else the current weight of its
// domain's group.
func (e *Engine) RuleWeight(r *Rule) *bucket.Weight {
	if r.limit != nil && r.limit.share == ShareReplica {
		return e.weights[replicaGroup].Load()
	}
	if d := (*e.demandOf.Load())[r.identity]; d != nil && e.sharedByDemand(r) {
		return e.weights[d.group].Load()
	}
	return e.weights[e.DomainGroup(r.domain)].Load()
}

// SetWeight re-divides the limits of the default group; see SetGroupWeight.
func (e *Engine) SetWeight(w float64, now int64) { e.SetGroupWeight(DefaultGroup, w, now) }

// SetGroupWeight re-divides every limit of group g: from now on each of its
// buckets refills at w's share, keeping its fill ratio. Buckets adopt it
// lazily on their next use. Other groups' buckets are not touched.
func (e *Engine) SetGroupWeight(g int, w float64, now int64) {
	if !(w > 0) || w > 1 || g < DefaultGroup || g >= int(e.groups.Load()) {
		return // a weight outside (0,1] is a bug upstream of here; keep the last
	}
	e.noteNow(now)
	p := &e.weights[g]
	for {
		old := p.Load()
		if old.W == w {
			return
		}
		if p.CompareAndSwap(old, old.Next(w, now)) {
			return
		}
	}
}

// noteNow records now as the latest time the engine was told of.
func (e *Engine) noteNow(now int64) {
	for n := e.lastNow.Load(); now > n; n = e.lastNow.Load() {
		if e.lastNow.CompareAndSwap(n, now) {
			return
		}
	}
}

// Sweep drops buckets that have refilled to full, each judged by its own
// group's weight; see bucket.Store.SweepGroups.
func (e *Engine) Sweep(now int64) int {
	ws := make([]*bucket.Weight, e.groups.Load())
	for i := range ws {
		ws[i] = e.weights[i].Load()
	}
	return e.store.SweepGroups(ws, now)
}
