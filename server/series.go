package server

import (
	"sync/atomic"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sharelimit/sharelimit/descriptors"

	"github.com/sharelimit/sharelimit/descriptors/engine"
)

// overrideRule labels the decisions of per-request overrides. A rule path always
// has a dot, so it cannot collide.
const overrideRule = "override"

// otherValue labels the detailed decisions of values past the cap.
const otherValue = "_other_"

// codeName is the code label of a codeIndex.
func codeName(i int) string {
	if i == 1 {
		return "OVER_LIMIT"
	}
	return "OK"
}

func codeIndex(st *engine.Status) int {
	if st.Code == engine.OverLimit {
		return 1
	}
	return 0
}

func detailed(r *descriptors.Rule) bool { return r.MetricKeyVaries() }

// ruleKey names a rule's series.
type ruleKey struct{ domain, path string }

// ruleSeries are the series of one rule path, or of one domain's overrides.
// Every bound set that has the rule shares them, so a reload that keeps the
// rule keeps its counts and its detailed values, and one that drops it can
// delete them. The counters are bound once, so counting a decision is an
// atomic add with no label lookup, lock or allocation.
type ruleSeries struct {
	domain, rule     string
	ok, over, shadow prometheus.Counter
	// admitted is the rule's slots (admitted.go); nil until it decides.
	admitted atomic.Pointer[admittedRing]
	// up is the rule's hits in upstream's terms (upstream.go); nil while
	// upstream's series are off, and for overrides, which upstream counts
	// under a key per request.
	up *upstreamCounts

	// Guarded by Metrics.mu.
	refs         int             // bound sets that have the rule
	detailedRefs int             // of those, the sets in which it is detailed
	detailed     *detailedValues // nil while detailedRefs is 0
	unlimited    bool            // the rule's limit, as last bound, is unlimited: upstream counts it nowhere
}

// boundRules is one bound set's way to its series, by Rule.ID. It does not
// change once stored in Metrics.bound, except refs.
type boundRules struct {
	set      *descriptors.Set
	refs     int // Binds not yet undone by an Unbind; guarded by Metrics.mu
	rules    []boundRule
	override map[string]*ruleSeries // by domain
}

type boundRule struct {
	series   *ruleSeries
	detailed *detailedValues // nil unless the rule is detailed in this set
}

// Bind prepares the counters of a set before it is installed. Binding a set
// that is already bound only takes another reference to it.
//
// Series are reference counted by the bound sets that have their rule, so a
// reload must Bind the new set before it Unbinds the old one: then a rule in
// both never drops to zero references, and keeps its counts and its detailed
// values exactly.
func (m *Metrics) Bind(set *descriptors.Set) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if v, ok := m.bound.Load(set); ok {
		v.(*boundRules).refs++
		return
	}
	domains := set.Domains()
	b := &boundRules{set: set, refs: 1, rules: make([]boundRule, set.Len()), override: make(map[string]*ruleSeries, len(domains))}
	for i, r := range set.Rules() {
		if r.Limit() == nil {
			continue // a level that only leads deeper decides nothing
		}
		key := ruleKey{r.Domain(), r.Path()}
		s := m.rules[key]
		if s == nil {
			s = m.newSeries(r.Domain(), r.Path())
			m.rules[key] = s
		}
		s.refs++
		s.unlimited = r.Limit().Unlimited()
		b.rules[i].series = s
		if detailed(r) {
			if s.detailedRefs == 0 {
				s.detailed = newDetailedValues(m.detailed, r.Domain(), r.Path())
			}
			s.detailedRefs++
			b.rules[i].detailed = s.detailed
		}
	}
	for _, dom := range domains {
		d := dom.Name()
		s := m.overrides[d]
		if s == nil {
			s = m.newSeries(d, overrideRule)
			m.overrides[d] = s
		}
		s.refs++
		b.override[d] = s
	}
	m.bound.Store(set, b)
}

// Unbind undoes a Bind of a set that was replaced. The series of a rule (or a
// domain's overrides) that no bound set has any more are deleted from the
// registry, so rules removed by reloads do not export stale series forever.
// Unbinding a set that is not bound does nothing.
func (m *Metrics) Unbind(set *descriptors.Set) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.bound.Load(set)
	if !ok {
		return
	}
	b := v.(*boundRules)
	if b.refs--; b.refs > 0 {
		return
	}
	m.bound.Delete(set)
	for _, br := range b.rules {
		s := br.series
		if s == nil {
			continue
		}
		if br.detailed != nil {
			if s.detailedRefs--; s.detailedRefs == 0 {
				s.detailed.retire()
				s.detailed = nil
			}
		}
		if s.refs--; s.refs == 0 {
			delete(m.rules, ruleKey{s.domain, s.rule})
			m.deleteSeries(s)
			m.retire(s)
		}
	}
	for d, s := range b.override {
		if s.refs--; s.refs == 0 {
			delete(m.overrides, d)
			m.deleteSeries(s)
			m.retire(s)
		}
	}
}

func (m *Metrics) newSeries(domain, rule string) *ruleSeries {
	s := &ruleSeries{
		domain: domain,
		rule:   rule,
		ok:     m.decisions.WithLabelValues(domain, rule, codeName(0)),
		over:   m.decisions.WithLabelValues(domain, rule, codeName(1)),
		shadow: m.shadow.WithLabelValues(domain, rule),
	}
	if m.up != nil && rule != overrideRule {
		s.up = new(upstreamCounts)
	}
	return s
}

func (m *Metrics) deleteSeries(s *ruleSeries) {
	m.decisions.DeleteLabelValues(s.domain, s.rule, codeName(0))
	m.decisions.DeleteLabelValues(s.domain, s.rule, codeName(1))
	m.shadow.DeleteLabelValues(s.domain, s.rule)
}

// count records the decisions of one request decided with set, whose
// hits_addend is hits, in the series and, as decided in slot n of the
// daemon's clock, in the rules' slots.
//
// A reload binds the new set, installs it, then unbinds the old one, while
// requests decided with the old set may still be on their way here. So:
//   - If count finds set still bound, it increments counters it reached through
//     the binding. Should Unbind delete their series meanwhile, the increments
//     land on counter objects the registry no longer exports: lost, harmlessly,
//     for a rule that is gone. A rule still in force has the same counters in
//     both sets, so its count is exact.
//   - If set is no longer bound (or a status's rule is not set's), count finds
//     the rule's series by path, under mu, among the rules a bound set still
//     has: a rule still in force is counted exactly, one that is gone is not.
//
// count never creates a decisions or shadow series (only Bind does), and
// detailed series are created only by a detailedValues that Unbind has not
// retired, so a late count cannot bring back a series Unbind deleted.
//
// count only counts: responses are built from the set (parts.go), so a
// binding's lifecycle never changes an answer.
func (m *Metrics) count(set *descriptors.Set, domain string, descs []*commonv3.RateLimitDescriptor, sts []engine.Status, hits uint32, n int64) {
	var b *boundRules
	if v, ok := m.bound.Load(set); ok {
		b = v.(*boundRules)
	}
	for i := range sts {
		st := &sts[i]
		if st.Limit == nil {
			m.noLimit.Inc()
			continue
		}
		var d *commonv3.RateLimitDescriptor
		if i < len(descs) {
			d = descs[i]
		}
		code := codeIndex(st)
		if code == 1 {
			m.recordOverLimit(domain, st, d)
		}
		br := b.lookup(st, domain)
		if br.series == nil {
			if br = m.unbound(st, domain); br.series == nil {
				continue // the rule is gone, and so are its series
			}
		}
		if code == 1 {
			br.series.over.Inc()
		} else {
			br.series.ok.Inc()
		}
		br.series.account(n, code == 1)
		if st.Shadowed {
			br.series.shadow.Inc()
		}
		var e *detailedEntry
		if br.detailed != nil {
			var buf [256]byte
			e = br.detailed.inc(st.Rule.AppendMetricKey(buf[:0], d.GetEntries()), code)
		}
		if up := br.series.up; up != nil && !st.Override && !st.Limit.Unlimited() {
			// A detailed rule's hits count under the request's key only,
			// as upstream's do; none when the key went uncounted.
			switch {
			case e != nil:
				m.up.count(&e.upstreamHits, st, hitsOf(d, hits))
			case br.detailed == nil:
				m.up.count(&up.upstreamHits, st, hitsOf(d, hits))
			}
		}
	}
}

// lookup finds a decision's series in a bound set. It checks that the
// status's rule is the set's own, so a status from another set can never
// index the wrong rule's counters.
func (b *boundRules) lookup(st *engine.Status, domain string) boundRule {
	switch {
	case b == nil:
		return boundRule{}
	case st.Override || st.Rule == nil:
		return boundRule{series: b.override[domain]}
	case st.Rule.ID() < len(b.rules) && b.set.Rule(st.Rule.ID()) == st.Rule:
		return b.rules[st.Rule.ID()]
	}
	return boundRule{}
}

// unbound finds the series of a decision made with a set that is no longer
// bound. Only requests in flight across a reload come here, so a lock is fine.
func (m *Metrics) unbound(st *engine.Status, domain string) boundRule {
	m.mu.Lock()
	defer m.mu.Unlock()
	if st.Override || st.Rule == nil {
		return boundRule{series: m.overrides[domain]}
	}
	s := m.rules[ruleKey{st.Rule.Domain(), st.Rule.Path()}]
	if s == nil {
		return boundRule{}
	}
	br := boundRule{series: s}
	if detailed(st.Rule) {
		br.detailed = s.detailed // nil when no set in force has it detailed
	}
	return br
}
