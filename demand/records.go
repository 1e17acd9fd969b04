package demand

import (
	"cmp"
	"hash/fnv"
	"slices"
)

// RuleID names a demand-shared rule the same way in every replica: FNV-1a of
// the rule's identity (its domain, path and limit), so two replicas whose
// config differs for a rule never read each other's figures for it.
type RuleID uint64

// RuleIDOf is the RuleID of a rule identity.
func RuleIDOf(identity string) RuleID {
	h := fnv.New64a()
	h.Write([]byte(identity))
	return RuleID(h.Sum64())
}

// Report is what one replica publishes: its demand per rule.
type Report struct {
	Seq   uint64 // increases with every report of a process
	At    int64  // the writer's wall clock, Unix nanoseconds
	Units uint32 // the replica's weight units
	Node  string
	Rules []RuleDemand // sorted by ID
}

// RuleDemand is one rule's figures in a report, per second, smoothed.
type RuleDemand struct {
	ID       RuleID
	Offered  float64 // tokens asked for, admitted or not
	Admitted float64 // tokens admitted
	// Values are a per-value rule's values: each hot value of the
	// parameters the replica last had (demand 0 included), then its own
	// hottest other values, as candidates. Sorted by ID.
	Values []ValueDemand
}

// ValueDemand is one value's figures in a report, per second.
type ValueDemand struct {
	ID       uint64
	Offered  float64
	Admitted float64
}

// FindValue returns value id's figures, or nil.
func (r *RuleDemand) FindValue(id uint64) *ValueDemand {
	i, ok := slices.BinarySearchFunc(r.Values, id, func(v ValueDemand, id uint64) int { return cmp.Compare(v.ID, id) })
	if !ok {
		return nil
	}
	return &r.Values[i]
}

// Params is what the leader publishes for a service: the division of each
// demand-shared rule, from one snapshot of the reports.
type Params struct {
	At       int64  // the leader's wall clock when it divided, Unix nanoseconds
	Snapshot uint64 // the Consul index the reports were read at
	// Reports are the reports the division counted, each by the index of
	// its write and its node's tag, sorted by index: a replica finds its
	// own there, and one that does not took no part in the division
	// beyond its equal share (History.Reported). Indices are at most
	// Snapshot and at least 1, without duplicates.
	Reports  []ReportRef
	Units    uint32 // U, the units divided among
	Headroom float64
	Floor    float64
	Leader   string
	Rules    []RuleParams // sorted by ID
}

// ReportRef names one report a division counted: the Consul index its
// write got (a write's index is its own: no other report has it) and the
// tag of the node whose key held it.
type ReportRef struct {
	Index uint64
	Node  NodeTag
}

// NodeTag is a node name in two bytes, as a parameter set lists the
// reports it divided. Two nodes may share a tag: a replica that finds its
// tag at an index it did not write reads that as a report it cannot know
// (Unknown), which is tighter, never looser, than what it would otherwise
// take.
type NodeTag uint16

// TagOf is node's tag: the low bits of FNV-1a of its name.
func TagOf(node string) NodeTag {
	h := fnv.New64a()
	h.Write([]byte(node))
	return NodeTag(h.Sum64())
}

// RuleParams is one rule's division.
type RuleParams struct {
	ID       RuleID
	Limit    float64 // L as the leader's config has it, per second
	K, R     float64
	Admitted float64 // the cluster's admitted rate, per second
	// Values are a per-value rule's hot values, each divided on its own
	// (its limit is the rule's); every other value keeps the equal share.
	// Sorted by ID. A per-value rule's own K and R are 0.
	Values []ValueParams
}

// ValueParams is one hot value's division.
type ValueParams struct {
	ID       uint64
	K, R     float64
	Admitted float64
}

// FindValue returns hot value id's division, or nil.
func (r *RuleParams) FindValue(id uint64) *ValueParams {
	i, ok := slices.BinarySearchFunc(r.Values, id, func(v ValueParams, id uint64) int { return cmp.Compare(v.ID, id) })
	if !ok {
		return nil
	}
	return &r.Values[i]
}

// ValueRule is hot value v of rule r's division as Share takes it.
func (p *Params) ValueRule(r *RuleParams, v *ValueParams) Rule {
	return Rule{Limit: r.Limit, Units: p.Units, Headroom: p.Headroom, Floor: p.Floor, K: v.K, R: v.R}
}

// Rule is r's division as Share takes it.
func (p *Params) Rule(r *RuleParams) Rule {
	return Rule{Limit: r.Limit, Units: p.Units, Headroom: p.Headroom, Floor: p.Floor, K: r.K, R: r.R}
}

// Find returns the parameters of rule id, or nil.
func (p *Params) Find(id RuleID) *RuleParams {
	i, ok := slices.BinarySearchFunc(p.Rules, id, func(r RuleParams, id RuleID) int { return cmp.Compare(r.ID, id) })
	if !ok {
		return nil
	}
	return &p.Rules[i]
}

// Find returns rule id's figures in the report, or nil.
func (r *Report) Find(id RuleID) *RuleDemand {
	i, ok := slices.BinarySearchFunc(r.Rules, id, func(d RuleDemand, id RuleID) int { return cmp.Compare(d.ID, id) })
	if !ok {
		return nil
	}
	return &r.Rules[i]
}
