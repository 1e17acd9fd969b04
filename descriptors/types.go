package descriptors

import (
	"fmt"
	"maps"
	"slices"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// Limit is a rate_limit block, compiled. It is immutable once built and shared
// by every request and every bucket of its rule, so all its state is
// unexported and read through methods. The zero value is not meaningful.
type Limit struct {
	requestsPerUnit uint32
	unit            Unit
	unitMultiplier  uint32 // >= 1
	unlimited       bool
	name            string
	replaces        []string
	burst           uint64 // the cluster-wide bucket size; requests_per_unit unless set
	policy          Policy
	maxWait         time.Duration
	share           Share

	params bucket.Params // derived from the fields above
}

// RequestsPerUnit is the cluster-wide limit per window.
func (l *Limit) RequestsPerUnit() uint32 { return l.requestsPerUnit }

// Unit is the limit's time unit.
func (l *Limit) Unit() Unit { return l.unit }

// UnitMultiplier is how many units make one window; at least 1.
func (l *Limit) UnitMultiplier() uint32 { return l.unitMultiplier }

// Unlimited reports whether the limit admits everything.
func (l *Limit) Unlimited() bool { return l.unlimited }

// Name is the limit's name, which other limits' replaces refer to.
func (l *Limit) Name() string { return l.name }

// Replaces returns the names of the limits this one drops from a request.
func (l *Limit) Replaces() []string { return slices.Clone(l.replaces) }

// Burst is the cluster-wide bucket size.
func (l *Limit) Burst() uint64 { return l.burst }

// Policy says what a draw on an empty bucket does.
func (l *Limit) Policy() Policy { return l.policy }

// Share says whether the limit is divided among the replicas (cluster, the
// default) or enforced whole by each (replica).
func (l *Limit) Share() Share { return l.share }

// MaxWait is how long a wait-policy draw may hold its answer.
func (l *Limit) MaxWait() time.Duration { return l.maxWait }

// Params are the limit's bucket figures.
func (l *Limit) Params() bucket.Params { return l.params }

// Window is the limit's period: unit × unit_multiplier. It is 0 for an
// unknown unit. Parse refuses a window past MaxWindow; one built by hand is
// cut to MaxWindow rather than left to wrap negative.
func (l *Limit) Window() time.Duration {
	d := l.unit.Duration()
	if d <= 0 {
		return 0
	}
	if !WindowOK(l.unit, l.unitMultiplier) {
		return MaxWindow
	}
	return d * time.Duration(max(l.unitMultiplier, 1))
}

// RequestLimit is the Limit of a request's own limit (a descriptor's
// override): requests_per_unit rpu per mult units u, mult 0 counting as 1,
// shared by cluster, with no name, burst or policy of its own.
func RequestLimit(rpu uint32, u Unit, mult uint32) *Limit {
	l := &Limit{requestsPerUnit: rpu, unit: u, unitMultiplier: mult}
	l.finish()
	return l
}

// finish derives params from the configured fields.
func (l *Limit) finish() {
	if l.unitMultiplier == 0 {
		l.unitMultiplier = 1
	}
	if l.unlimited {
		return
	}
	if l.burst == 0 {
		l.burst = uint64(l.requestsPerUnit)
	}
	if l.requestsPerUnit > 0 {
		l.params = bucket.Params{
			Rate:    float64(l.requestsPerUnit) / l.Window().Seconds(),
			Size:    float64(l.burst),
			MaxWait: l.maxWait,
		}
		if l.policy != Wait {
			l.params.MaxWait = 0
		}
	}
}

// draws reports whether l is a limit its rule's buckets enforce: not
// unlimited and not blocked (requests_per_unit: 0 admits nothing and keeps
// no bucket). A nil l does not draw.
func (l *Limit) draws() bool { return l != nil && !l.unlimited && !l.params.Blocked() }

func (l *Limit) String() string {
	if l.unlimited {
		return "unlimited"
	}
	s := fmt.Sprintf("%d per %s", l.requestsPerUnit, l.unit)
	if l.unitMultiplier > 1 {
		s = fmt.Sprintf("%d per %d %ss", l.requestsPerUnit, l.unitMultiplier, l.unit)
	}
	if l.burst != uint64(l.requestsPerUnit) {
		s += fmt.Sprintf(", burst %d", l.burst)
	}
	if l.policy == Wait {
		s += fmt.Sprintf(", wait up to %s", l.maxWait)
	}
	switch l.share {
	case ShareReplica:
		s += ", per replica"
	case ShareDemand:
		s += ", shared by demand"
	}
	return s
}

// MatchKind says how a rule's value matches a request's value.
type MatchKind uint8

const (
	// Exact rules have a plain value.
	Exact MatchKind = iota
	// Wildcard rules have a value with one or more '*'.
	Wildcard
	// KeyOnly rules have no value and match any value of their key.
	KeyOnly
)

func (k MatchKind) String() string {
	switch k {
	case Wildcard:
		return "wildcard"
	case KeyOnly:
		return "key-only"
	}
	return "exact"
}

// Rule is one descriptor of the YAML, compiled. Rules are immutable and safe
// for concurrent use; all their state is read through methods.
type Rule struct {
	id     int // the rule's index in its Set
	domain string
	key    string
	value  string
	kind   MatchKind
	path   string // upstream's stats key: domain.key_value.key2...
	limit  *Limit // nil when this level only leads to deeper rules

	shadowMode     bool
	detailedMetric bool
	valueToMetric  bool
	shareThreshold bool
	quotaMode      bool
	metadata       map[string]any

	pos    Pos
	parent *Rule
	depth  int // 1 for a top-level descriptor

	children level
	// varying[i] is true when the value at depth i+1 picks a bucket: key-only
	// levels, and wildcard levels without share_threshold.
	varying []bool
	// identity is what the rule's buckets are keyed and tagged by, and its
	// demand state and its ID across replicas are named by: its domain, the
	// key and value at every depth, which depths pick a bucket, and its
	// limit's share. A reload that keeps it keeps the rule's buckets, whatever
	// it does to the limit's figures (compile.go).
	identity string
}

// ID is the rule's index in its Set's Rules: dense, from 0, so per-rule state
// can live in a slice.
func (r *Rule) ID() int { return r.id }

// Domain is the domain of the file the rule came from.
func (r *Rule) Domain() string { return r.domain }

// Key is the descriptor key the rule matches.
func (r *Rule) Key() string { return r.key }

// Value is the value the rule matches: plain, with wildcards, or "" for any.
func (r *Rule) Value() string { return r.value }

// Kind says how Value matches.
func (r *Rule) Kind() MatchKind { return r.kind }

// Path is upstream's stats key for the rule: domain.key_value.key2...
func (r *Rule) Path() string { return r.path }

// Limit is the rule's limit; nil when the rule only leads to deeper rules.
func (r *Rule) Limit() *Limit { return r.limit }

// ShadowMode reports whether over-limit decisions are answered OK (and counted).
func (r *Rule) ShadowMode() bool { return r.shadowMode }

// DetailedMetric reports whether decisions are counted per request value.
func (r *Rule) DetailedMetric() bool { return r.detailedMetric }

// ValueToMetric reports whether the value goes into the metric name, as upstream.
func (r *Rule) ValueToMetric() bool { return r.valueToMetric }

// ShareThreshold reports whether every value matching a wildcard shares one bucket.
func (r *Rule) ShareThreshold() bool { return r.shareThreshold }

// QuotaMode reports the rule's quota_mode.
func (r *Rule) QuotaMode() bool { return r.quotaMode }

// Metadata returns a deep copy of the rule's metadata, nil when it has none:
// nested maps and lists are copied too, so no caller can change the rule's.
func (r *Rule) Metadata() map[string]any {
	if r.metadata == nil {
		return nil
	}
	return deepCopy(r.metadata).(map[string]any)
}

// deepCopy copies the maps and lists a YAML document decodes to; scalars are
// values already.
func deepCopy(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = deepCopy(e)
		}
		return out
	case map[any]any:
		out := make(map[any]any, len(x))
		for k, e := range x {
			out[k] = deepCopy(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = deepCopy(e)
		}
		return out
	}
	return v
}

// Pos is where the rule is written.
func (r *Rule) Pos() Pos { return r.pos }

// Depth is 1 for a top-level descriptor, 2 one level below, and so on.
func (r *Rule) Depth() int { return r.depth }

// Children returns the rules one level below r, in config order.
func (r *Rule) Children() []*Rule { return slices.Clone(r.children.order) }

// PerValue reports whether the rule keeps one bucket per runtime value set.
func (r *Rule) PerValue() bool { return slices.Contains(r.varying, true) }

// PicksBucket reports whether the request's value at entry i (0 for the top
// level) picks the rule's bucket: it does at key-only levels and at wildcard
// levels without share_threshold, whose values each have a bucket.
func (r *Rule) PicksBucket(i int) bool { return i >= 0 && i < len(r.varying) && r.varying[i] }

// Identity is what the rule's buckets and runtime state are keyed by: its
// domain, the key and value at every depth, which depths pick a bucket, and
// its limit's share; not the limit's figures, so a reload that changes only
// those keeps them. Equal rules in two replicas' sets have equal identities.
func (r *Rule) Identity() string { return r.identity }

// level is the set of rules at one depth under one parent.
type level struct {
	byKey      map[string]*keyGroup
	order      []*Rule
	composites map[string]*Rule // by upstream's composite key_value
}

type keyGroup struct {
	exact map[string]*Rule
	wild  []*Rule // config order
	def   *Rule
}

// Domain is one file's rules. It is immutable and safe for concurrent use.
type Domain struct {
	name string
	file string
	pos  Pos // where the domain key is written
	root level
}

// Name is the domain's name.
func (d *Domain) Name() string { return d.name }

// File is the file the domain came from.
func (d *Domain) File() string { return d.file }

// Rules returns the top-level rules in config order.
func (d *Domain) Rules() []*Rule { return slices.Clone(d.root.order) }

// Match is Set.Match within d, for a caller that has found the domain.
func (d *Domain) Match(entries []*commonv3.RateLimitDescriptor_Entry) *Rule {
	return match(&d.root, entries, nil)
}

// Set is a whole compiled configuration. It is immutable and safe for
// concurrent use; the daemon replaces it whole on reload.
type Set struct {
	domains map[string]*Domain
	rules   []*Rule  // every descriptor, depth-first in file order, files sorted
	files   []string // the files the set was compiled from

	hasReplaces bool
}

// Empty is a set with no rules: every request is OK with no limit.
func Empty() *Set { return &Set{domains: map[string]*Domain{}} }

// Domain returns the named domain, or nil.
func (s *Set) Domain(name string) *Domain { return s.domains[name] }

// Domains returns every domain, sorted by name.
func (s *Set) Domains() []*Domain {
	out := make([]*Domain, 0, len(s.domains))
	for _, n := range slices.Sorted(maps.Keys(s.domains)) {
		out = append(out, s.domains[n])
	}
	return out
}

// Rules returns every rule, depth-first in file order, files sorted; a rule's
// index is its ID.
func (s *Set) Rules() []*Rule { return slices.Clone(s.rules) }

// Rule returns the rule with the given ID, or nil.
func (s *Set) Rule(id int) *Rule {
	if id < 0 || id >= len(s.rules) {
		return nil
	}
	return s.rules[id]
}

// Len is the number of rules.
func (s *Set) Len() int { return len(s.rules) }

// HasReplaces reports whether any limit of the set names others in its
// replaces: only then can one descriptor's limit drop another's.
func (s *Set) HasReplaces() bool { return s.hasReplaces }

// Files returns the files the set was compiled from.
func (s *Set) Files() []string { return slices.Clone(s.files) }

// Pos is a position in a config file.
type Pos struct {
	File      string
	Line, Col int
}

func (p Pos) String() string { return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Col) }
