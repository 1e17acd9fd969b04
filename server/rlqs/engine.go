package rlqs

// Kind is what a bucket id resolves to.
type Kind uint8

// The kinds of resolution. Every kind but Limited is answered with a blanket
// rule: Unlimited with ALLOW_ALL (the YAML says so), the rest with DENY_ALL.
const (
	UnknownDomain Kind = iota // the report's domain has no rules
	NoRule                    // no rule path has the id's key set and values
	NoLimit                   // the rule has no limit (RLS answers it OK, but it is no quota)
	Unlimited                 // the rule says unlimited
	Limited                   // a limit, to be divided
)

var kindNames = [...]string{"unknown_domain", "no_rule", "no_limit", "unlimited", "limited"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "invalid"
}

// Target is what RLS would use for the values of a bucket id: the rule, the
// bucket key, the limit and the weight in force for that key now.
type Target struct {
	Kind Kind
	// Rule names the rule (its config path), for pages and metrics.
	Rule string
	// Key is the engine's bucket key: ids with the same Key share one share.
	Key uint64
	// Rate and Burst are the cluster's limit R (per second) and burst B.
	Rate, Burst float64
	// Weight is w, the part of R and B that is this replica's share.
	Weight float64
	// WindowSeconds is the limit's unit in whole seconds (1 for per-second).
	WindowSeconds int64
	// Ref is the engine's own handle for the rule, passed back to Lease.
	Ref any
}

// Lease gives the RLS draws on one bucket key their own weight, the RLS
// consumer's part of the share. Its methods are called by the divider only.
type Lease interface {
	// Set makes RLS draws on the key use weight w (an absolute weight, as
	// Target.Weight is: RLS then admits at most w·R per second, w·B at once).
	Set(w float64, now int64)
	// Counts are the RLS tokens offered and admitted on the key since the
	// lease began; the divider takes differences.
	Counts() (offered, admitted uint64)
	// Release ends the lease: RLS draws use the key's usual weight again.
	Release(now int64)
}

// drawnBefore reports whether RLS had drawn on l's key before the lease,
// when l can tell (a lease that cannot is taken as never drawn on).
func drawnBefore(l Lease) bool {
	d, ok := l.(interface{ DrawnBefore() bool })
	return ok && d.DrawnBefore()
}

// Engine is what the service needs from the rules engine. Safe for
// concurrent use by its implementations' contract.
type Engine interface {
	// Resolve maps a domain and bucket id to what RLS would use.
	Resolve(domain string, id map[string]string) Target
	// Lease leases t's bucket key (a Limited target). An error means no
	// lease can be had now; the service then denies the id over RLQS, so
	// RLS keeps the whole share.
	Lease(t Target, now int64) (Lease, error)
	// Reported counts requests an Envoy decided itself for t's key (RLQS
	// reports), so demand sharing sees this replica's RLQS traffic.
	Reported(t Target, offered, admitted uint64)
}
