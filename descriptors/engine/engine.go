package engine

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// installed is a Set with what the engine keeps of each of its rules, and
// each domain's weight group.
type installed struct {
	set     *descriptors.Set
	rules   []ruleInfo // by Rule.ID
	domains map[string]slot
	// demand is by Rule.ID: the rule's demand state when it is shared by
	// demand, else nil; nil when no rule is.
	demand []*DemandRule
	// ramps is by Rule.ID: the ramp of a rule a reload added, while it
	// may still run, else nil; nil when no rule has one (carry).
	ramps []*bucket.Ramp
}

// ruleInfo is what a bucket request of one rule is built from.
type ruleInfo struct {
	key      uint64 // the hash its bucket keys start from
	overflow uint64 // its overflow bucket
	tag      uint16 // its tag on its buckets (snapshot.go)
	// params are its limit's figures, held here so that a bucket request
	// can point at them.
	params bucket.Params
	// picks are the entries whose value picks the bucket (Rule.PicksBucket).
	picks []int
	// leases are the rule's leases by usual bucket key, nil when it has
	// none (lease.go); carried over reloads that keep the rule.
	leases atomic.Pointer[map[uint64]*Lease]
}

// slot is a domain as Decide finds it: its rules and the group whose weight
// divides its limits.
type slot struct {
	dom   *descriptors.Domain
	group uint16
}

// Weight groups. Every domain's limits are divided by the weight of one
// group: the default group, or the group Options.Groups gives it (one per
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
	// each), and one per lease (lease.go). A bucket records its group in
	// two bytes of its padding.
	MaxGroups = 4095
)

// ErrGroup marks a weight group that cannot be made.
var ErrGroup = errors.New("weight group")

// Options are what an engine is built with. None of them changes while it
// serves: a bucket's weight history belongs to its group, and its key to
// the seed, for the bucket's life.
type Options struct {
	// Weight is the default group's weight at start, in (0, 1]; 0 is 1.
	Weight float64
	// Groups are the weight groups beside the default one: Groups[i] is
	// group DefaultGroup+1+i, whose weight divides the limits of its
	// domains, and SetGroupWeight changes.
	Groups []Group
	// Seed keys the buckets' keys: a snapshot's, so its buckets can be
	// restored (Restore); 0 draws a random one. A seed of its own keeps an
	// outsider from aiming two keys at one bucket.
	Seed uint64
	// QuotaMode is global quota mode: every descriptor that is not
	// unlimited is then in quota mode, as upstream's QUOTA_MODE.
	QuotaMode bool
	// DemandAll is --share-mode demand: every limit shared by cluster (the
	// default share) is shared by demand, not only those that say share:
	// demand.
	DemandAll bool
	// TopKeys is --demand-top-keys: how many values of each per-value
	// demand rule the service's leader makes hot. Each such rule takes
	// twice as many weight groups, so a value cooling (which waits for its
	// share to grow back to the equal share) never keeps a newly hot one
	// out. 0 is DefaultTopKeys; a negative count leaves per-value rules at
	// their equal shares, as if they were not shared by demand. It is cut
	// to MaxTopKeys.
	TopKeys int
}

// Group is a weight group's domains and its weight at start, in (0, 1].
type Group struct {
	Domains []string
	Weight  float64
}

// Engine decides requests. It holds the current Set, the current weight of
// each group and the buckets. It is safe for concurrent use: Decide takes no
// engine-wide lock, and a Swap or SetGroupWeight is seen by the next Decide.
// Its zero value is not usable; New makes one.
type Engine struct {
	cur atomic.Pointer[installed]
	// weights[g] is group g's weight, nil past the last group;
	// weights[replicaGroup] never changes.
	weights [MaxGroups + 1]atomic.Pointer[bucket.Weight]
	groups  atomic.Int32      // groups in use, replicaGroup included
	groupOf map[string]uint16 // domain -> group, DefaultGroup when absent
	swapMu  sync.Mutex        // serialises Swap and the demand groups
	store   *bucket.Store
	seed    uint64 // keys the bucket keys (seed.go)
	// quota, demandAll and topKeys are Options'.
	quota     bool
	demandAll bool
	topKeys   int
	overrides atomic.Pointer[map[overrideSpec]*override]
	ovMu      sync.Mutex
	// demandOf is every demand rule's state by rule identity, kept across
	// reloads so a rule keeps its group and its meter; copied on write under
	// swapMu. A nil entry is an identity that found no free group and is
	// divided by its domain's group for the engine's life.
	demandOf atomic.Pointer[map[string]*DemandRule]
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

// New returns an engine deciding with set (nil for no rules), keeping
// buckets in store, built with opts. It starts no goroutines; the caller
// runs Sweep. A group New cannot make (a weight outside (0, 1], a domain
// that is empty or in two groups, one group too many) is an error wrapping
// ErrGroup.
func New(set *descriptors.Set, store *bucket.Store, opts Options) (*Engine, error) {
	w := opts.Weight
	if w == 0 {
		w = 1
	}
	if !(w > 0) || w > 1 {
		return nil, fmt.Errorf("%w: weight %v is not in (0, 1]", ErrGroup, w)
	}
	e := &Engine{store: store, seed: opts.Seed, quota: opts.QuotaMode, demandAll: opts.DemandAll, groupOf: map[string]uint16{}}
	if e.seed == 0 {
		e.seed = newSeed()
	}
	switch {
	case opts.TopKeys == 0:
		e.topKeys = DefaultTopKeys
	case opts.TopKeys > 0:
		e.topKeys = min(opts.TopKeys, MaxTopKeys)
	}
	e.weights[replicaGroup].Store(bucket.InitialWeight(1))
	e.weights[DefaultGroup].Store(bucket.InitialWeight(w))
	e.groups.Store(DefaultGroup + 1)
	for i, g := range opts.Groups {
		if err := e.addGroup(g); err != nil {
			return nil, fmt.Errorf("groups[%d]: %w", i, err)
		}
	}
	e.overrides.Store(&map[overrideSpec]*override{})
	e.demandOf.Store(&map[string]*DemandRule{})
	if set == nil {
		set = descriptors.Empty()
	}
	e.swap(set, 0, false)
	return e, nil
}

// addGroup adds g as the next group, for New.
func (e *Engine) addGroup(g Group) error {
	n := int(e.groups.Load())
	if n > MaxGroups {
		return fmt.Errorf("%w: more than %d groups", ErrGroup, MaxGroups)
	}
	if !(g.Weight > 0) || g.Weight > 1 {
		return fmt.Errorf("%w: weight %v is not in (0, 1]", ErrGroup, g.Weight)
	}
	for i, d := range g.Domains {
		if _, dup := e.groupOf[d]; dup || d == "" || slices.Contains(g.Domains[:i], d) {
			return fmt.Errorf("%w: domain %q is empty or already in a group", ErrGroup, d)
		}
	}
	e.weights[n].Store(bucket.InitialWeight(g.Weight))
	e.groups.Store(int32(n + 1))
	for _, d := range g.Domains {
		e.groupOf[d] = uint16(n)
	}
	return nil
}

// QuotaMode reports global quota mode (Options.QuotaMode).
func (e *Engine) QuotaMode() bool { return e.quota }

// Set returns the installed set.
func (e *Engine) Set() *descriptors.Set { return e.cur.Load().set }

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
	if g, ok := e.groupOf[domain]; ok {
		return int(g)
	}
	return DefaultGroup
}

// RuleWeight is the weight r's limit is divided by: 1 for share: replica,
// its own group's for a rule shared by demand, else the current weight of its
// domain's group.
func (e *Engine) RuleWeight(r *descriptors.Rule) *bucket.Weight {
	if l := r.Limit(); l != nil && l.Share() == descriptors.ShareReplica {
		return e.weights[replicaGroup].Load()
	}
	if d := (*e.demandOf.Load())[r.Identity()]; d != nil && e.sharedByDemand(r) {
		return e.weights[d.group].Load()
	}
	return e.weights[e.DomainGroup(r.Domain())].Load()
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
	return e.store.SweepGroups(e.weightEpochs(), now)
}

// weightEpochs returns every group's current weight epoch, by group.
func (e *Engine) weightEpochs() []*bucket.Weight {
	ws := make([]*bucket.Weight, e.groups.Load())
	for i := range ws {
		ws[i] = e.weights[i].Load()
	}
	return ws
}
