// Package descriptors is sharelimit's rule engine: it parses upstream
// envoyproxy/ratelimit's descriptor YAML (plus sharelimit's extensions), compiles
// it into an immutable match tree, and decides requests against it with the
// token buckets of package bucket.
//
// The package is pure: no I/O beyond the readers and directories it is handed,
// no globals, no metrics. The daemon swaps whole compiled Sets on reload; an
// Engine keeps bucket state across swaps for every rule that did not change.
package descriptors

import (
	"fmt"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// Unit is a rate limit's time unit. Its values are those of Envoy's
// RateLimitResponse.RateLimit.Unit, so a Unit converts to the wire enum directly.
type Unit int32

// The units of upstream's YAML. A month is 30 days and a year 365, as upstream.
const (
	UnitUnknown Unit = 0
	Second      Unit = 1
	Minute      Unit = 2
	Hour        Unit = 3
	Day         Unit = 4
	Month       Unit = 5
	Year        Unit = 6
	Week        Unit = 7
)

// Duration is the length of one unit.
func (u Unit) Duration() time.Duration {
	switch u {
	case Second:
		return time.Second
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return 24 * time.Hour
	case Week:
		return 7 * 24 * time.Hour
	case Month:
		return 30 * 24 * time.Hour
	case Year:
		return 365 * 24 * time.Hour
	}
	return 0
}

func (u Unit) String() string {
	switch u {
	case Second:
		return "second"
	case Minute:
		return "minute"
	case Hour:
		return "hour"
	case Day:
		return "day"
	case Week:
		return "week"
	case Month:
		return "month"
	case Year:
		return "year"
	}
	return fmt.Sprintf("unit(%d)", int32(u))
}

// ParseUnit reads a unit name, case-insensitively.
func ParseUnit(s string) (Unit, bool) {
	switch strings.ToLower(s) {
	case "second":
		return Second, true
	case "minute":
		return Minute, true
	case "hour":
		return Hour, true
	case "day":
		return Day, true
	case "week":
		return Week, true
	case "month":
		return Month, true
	case "year":
		return Year, true
	}
	return UnitUnknown, false
}

// Policy says what a draw on an empty bucket does.
type Policy uint8

const (
	// Reject answers OVER_LIMIT at once (upstream's only behaviour).
	Reject Policy = iota
	// Wait reserves the tokens and holds the answer until they exist, if that is
	// within MaxWait.
	Wait
)

func (p Policy) String() string {
	if p == Wait {
		return "wait"
	}
	return "reject"
}

// Limit is a rate_limit block, compiled. It is immutable once built and shared by
// every request and every bucket of its rule.
type Limit struct {
	RequestsPerUnit uint32
	Unit            Unit
	UnitMultiplier  uint32 // >= 1
	Unlimited       bool
	Name            string
	Replaces        []string
	// Burst is the cluster-wide bucket size; requests_per_unit unless set.
	Burst   uint64
	Policy  Policy
	MaxWait time.Duration

	// Params are the bucket figures derived from the fields above.
	Params bucket.Params
	// Proto is the limit as Envoy receives it in current_limit. It is shared by
	// every response and must never be modified.
	Proto *rlsv3.RateLimitResponse_RateLimit
}

// MaxWindow is the longest window a limit may have (unit × unit_multiplier).
// A longer one is no rate anyone means, and past about 292 years the product
// no longer fits a time.Duration: it once wrapped negative, and a negative
// rate blocks everything.
const MaxWindow = 10 * 365 * 24 * time.Hour

// WindowOK reports whether unit u times mult is a window a limit may have: u
// is a known unit and the window is at most MaxWindow. A mult of 0 counts as
// 1, as in Window. It divides rather than multiplies, so no mult overflows it.
func WindowOK(u Unit, mult uint32) bool {
	d := u.Duration()
	return d > 0 && time.Duration(max(mult, 1)) <= MaxWindow/d
}

// Window is the limit's period: unit × unit_multiplier. It is 0 for an
// unknown unit. Parse refuses a window past MaxWindow; one built by hand is
// cut to MaxWindow rather than left to wrap negative.
func (l *Limit) Window() time.Duration {
	d := l.Unit.Duration()
	if d <= 0 {
		return 0
	}
	if !WindowOK(l.Unit, l.UnitMultiplier) {
		return MaxWindow
	}
	return d * time.Duration(max(l.UnitMultiplier, 1))
}

// finish derives Params and Proto from the configured fields.
func (l *Limit) finish() {
	if l.UnitMultiplier == 0 {
		l.UnitMultiplier = 1
	}
	if l.Unlimited {
		return
	}
	if l.Burst == 0 {
		l.Burst = uint64(l.RequestsPerUnit)
	}
	if l.RequestsPerUnit > 0 {
		l.Params = bucket.Params{
			Rate:    float64(l.RequestsPerUnit) / l.Window().Seconds(),
			Size:    float64(l.Burst),
			MaxWait: l.MaxWait,
		}
		if l.Policy != Wait {
			l.Params.MaxWait = 0
		}
	}
	l.Proto = &rlsv3.RateLimitResponse_RateLimit{
		Name:            l.Name,
		RequestsPerUnit: l.RequestsPerUnit,
		Unit:            rlsv3.RateLimitResponse_RateLimit_Unit(l.Unit),
	}
	if l.UnitMultiplier > 1 {
		l.Proto.UnitMultiplier = wrapperspb.UInt32(l.UnitMultiplier)
	}
}

// identity is what a bucket's state is tied to across reloads: change any of it
// and the rule starts with fresh buckets.
func (l *Limit) identity() string {
	return fmt.Sprintf("%d/%s*%d burst=%d %s %s", l.RequestsPerUnit, l.Unit, l.UnitMultiplier, l.Burst, l.Policy, l.MaxWait)
}

func (l *Limit) String() string {
	if l.Unlimited {
		return "unlimited"
	}
	s := fmt.Sprintf("%d per %s", l.RequestsPerUnit, l.Unit)
	if l.UnitMultiplier > 1 {
		s = fmt.Sprintf("%d per %d %ss", l.RequestsPerUnit, l.UnitMultiplier, l.Unit)
	}
	if l.Burst != uint64(l.RequestsPerUnit) {
		s += fmt.Sprintf(", burst %d", l.Burst)
	}
	if l.Policy == Wait {
		s += fmt.Sprintf(", wait up to %s", l.MaxWait)
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

// Rule is one descriptor of the YAML, compiled. Rules are immutable.
type Rule struct {
	// ID is the rule's index in its Set's Rules.
	ID     int
	Domain string
	Key    string
	Value  string
	Kind   MatchKind
	// Path is upstream's stats key for the rule: domain.key_value.key2...
	Path  string
	Limit *Limit // nil when this level only leads to deeper rules

	ShadowMode     bool
	DetailedMetric bool
	ValueToMetric  bool
	ShareThreshold bool
	QuotaMode      bool
	Metadata       map[string]any

	Pos    Pos
	Parent *Rule
	Depth  int // 1 for a top-level descriptor

	children level
	// varying[i] is true when the value at depth i+1 picks a bucket: key-only
	// levels, and wildcard levels without share_threshold.
	varying  []bool
	identity string
}

// Children returns the rules one level below r, in config order.
func (r *Rule) Children() []*Rule { return r.children.order }

// PerValue reports whether the rule keeps one bucket per runtime value set.
func (r *Rule) PerValue() bool {
	for _, v := range r.varying {
		if v {
			return true
		}
	}
	return false
}

// level is the set of rules at one depth under one parent.
type level struct {
	byKey map[string]*keyGroup
	order []*Rule
}

type keyGroup struct {
	exact map[string]*Rule
	wild  []*Rule // config order
	def   *Rule
}

// Domain is one file's rules.
type Domain struct {
	Name string
	File string
	root level
}

// Rules returns the top-level rules in config order.
func (d *Domain) Rules() []*Rule { return d.root.order }

// Set is a whole compiled configuration. It is immutable and safe for concurrent
// use; the daemon replaces it whole on reload.
type Set struct {
	Domains map[string]*Domain
	// Rules lists every descriptor, depth-first in file order, files sorted.
	Rules []*Rule
	// Files are the files the set was loaded from.
	Files []string

	hasReplaces bool
}

// Pos is a position in a config file.
type Pos struct {
	File      string
	Line, Col int
}

func (p Pos) String() string { return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Col) }
