package descriptors

import (
	"fmt"
	"strings"
	"time"
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

// Share says how a limit is divided among the replicas that enforce it
// (rate_limit.share).
type Share uint8

const (
	// ShareCluster divides the limit by this replica's membership weight: the
	// replicas together enforce it once. The default.
	ShareCluster Share = iota
	// ShareReplica does not divide it: every replica enforces the whole limit
	// on its own, a per-instance protection such as a guard for one backend.
	ShareReplica
	// ShareDemand divides the limit by demand: each replica's share follows
	// the demand it reports, from the parameters its service's leader
	// publishes (package demand), and is the equal share without them. Only
	// a rule with one bucket can be shared by demand.
	ShareDemand
)

func (s Share) String() string {
	switch s {
	case ShareReplica:
		return "replica"
	case ShareDemand:
		return "demand"
	}
	return "cluster"
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
