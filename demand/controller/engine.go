package controller

import (
	"github.com/sharelimit/sharelimit/descriptors/engine"
)

// Engine is the rate-limit engine as demand sharing sees it: the demand
// rules' meters out, weights in. NewEngine adapts a *engine.Engine;
// tests fake it. Implementations must be safe for concurrent use.
type Engine interface {
	// Rules returns the installed demand rules of the domains whose limits
	// weight group domainGroup divides, as metered now.
	Rules(domainGroup int) []Rule
	// Candidates returns, and forgets, the sampled token counts of the
	// values of per-value rule identity that were not hot since the last
	// call; each sampled token stands for scale tokens.
	Candidates(identity string) (counts map[uint64]uint64, scale float64)
	// Weight returns weight group g's weight in force.
	Weight(g int) float64
	// SetWeight sets weight group g's weight, at now on the engine's clock.
	SetWeight(g int, w float64, now int64)
	// SetHot makes exactly ids the hot values of per-value rule identity,
	// at now on the engine's clock, as far as its slots go: a value that
	// stays hot keeps its group, a new one takes a free slot at the equal
	// share. It returns the hot values.
	SetHot(identity string, ids []uint64, now int64) []Hot
}

// Rule is one demand rule of the installed set, as the engine meters it.
type Rule struct {
	// Identity names the rule across reloads and replicas (its domain,
	// path and share); RuleIDOf it names it in reports and parameters.
	Identity string
	Path     string  // as the admin pages name it
	Limit    float64 // L, per second; 0 for a rule without a limit
	// Group is the weight group of the rule's bucket; for a per-value
	// rule, its domain's, which its values that are not hot use.
	Group int
	// DomainGroup is the group of the rule's domain: its equal share.
	DomainGroup int
	// PerValue: the rule has a bucket per value; its hot values are
	// shared by demand, the others keep the equal share.
	PerValue bool
	// Slots is how many values can be hot at once (per-value rules).
	Slots int
	// Offered and Admitted are the tokens the rule's buckets were asked
	// for and gave since the rule was first installed.
	Offered, Admitted uint64
	// Hot are a per-value rule's hot values, in no particular order.
	Hot []Hot
}

// Hot is one hot value of a per-value rule.
type Hot struct {
	ID    uint64 // the value's ID, the same in every replica
	Group int    // the weight group of its bucket
	// Label is the value as a request named it, "" before any did. It
	// comes from a request: escape it wherever it is shown.
	Label string
	// Offered and Admitted are the tokens its bucket was asked for and
	// gave since it became hot.
	Offered, Admitted uint64
}

// NewEngine adapts e to Engine.
func NewEngine(e *engine.Engine) Engine { return engineMeters{e} }

// engineMeters is a *engine.Engine as an Engine.
type engineMeters struct{ e *engine.Engine }

var _ Engine = engineMeters{}

func (m engineMeters) Rules(domainGroup int) []Rule {
	var out []Rule
	for _, b := range m.e.DemandRules() {
		st := b.State
		if st.DomainGroup() != domainGroup {
			continue
		}
		r := Rule{Identity: st.Identity(), Path: b.Rule.Path(), Group: st.Group(), DomainGroup: st.DomainGroup(),
			PerValue: st.PerValue(), Slots: st.Slots(), Hot: hotOf(st.HotValues())}
		if lim := b.Rule.Limit(); lim != nil {
			r.Limit = lim.Params().Rate
		}
		r.Offered, r.Admitted = st.Counts()
		out = append(out, r)
	}
	return out
}

func (m engineMeters) Candidates(identity string) (map[uint64]uint64, float64) {
	if st := m.find(identity); st != nil {
		return st.Candidates(), engine.CandidateSampling
	}
	return nil, engine.CandidateSampling
}

func (m engineMeters) Weight(g int) float64 { return m.e.GroupWeight(g).W }

func (m engineMeters) SetWeight(g int, w float64, now int64) { m.e.SetGroupWeight(g, w, now) }

func (m engineMeters) SetHot(identity string, ids []uint64, now int64) []Hot {
	return hotOf(m.e.SetHot(m.find(identity), ids, now))
}

// find is the installed demand rule of identity, or nil.
func (m engineMeters) find(identity string) *engine.DemandRule {
	for _, b := range m.e.DemandRules() {
		if b.State.Identity() == identity {
			return b.State
		}
	}
	return nil
}

func hotOf(hvs []*engine.HotValue) []Hot {
	if len(hvs) == 0 {
		return nil
	}
	out := make([]Hot, len(hvs))
	for i, hv := range hvs {
		off, adm := hv.Counts()
		out[i] = Hot{ID: hv.ID(), Group: hv.Group(), Label: hv.Label(), Offered: off, Admitted: adm}
	}
	return out
}
