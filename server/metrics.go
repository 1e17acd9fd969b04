package server

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sharelimit/sharelimit/descriptors"
)

// maxDetailedValues bounds the label values a detailed_metric or value_to_metric
// rule may create: past it, further values are counted under "_other_". Request
// values are chosen by clients; without a bound they would grow memory and the
// scrape without limit.
const maxDetailedValues = 100

// Metrics is every Prometheus series the daemon exports, on a registry of its
// own. Safe for concurrent use.
type Metrics struct {
	Registry *prometheus.Registry

	decisions    *prometheus.CounterVec
	detailed     *prometheus.CounterVec
	shadow       *prometheus.CounterVec
	noLimit      prometheus.Counter
	invalid      prometheus.Counter
	panics       prometheus.Counter
	waits        prometheus.Counter
	latency      prometheus.Histogram
	Reloads      *prometheus.CounterVec
	ReloadLast   prometheus.Gauge
	Generation   prometheus.Gauge
	Rules        prometheus.Gauge
	MemberTotal  prometheus.Gauge
	MemberLocal  prometheus.Gauge
	MemberWeight prometheus.Gauge
	MemberLastOK prometheus.Gauge
	BucketsSwept prometheus.Counter
	Draining     prometheus.Gauge
	overLimit    overLimitSample
	memberErrors atomic.Uint64

	// bound maps each bound *descriptors.Set to its *boundRules. The hot path
	// reads it without a lock; entries change only under mu.
	bound sync.Map
	// mu serialises Bind and Unbind, and guards the maps below and the
	// reference counts of everything in them. The hot path takes it only to
	// count a decision of a set that is no longer bound.
	mu        sync.Mutex
	rules     map[ruleKey]*ruleSeries // by (domain, rule path)
	overrides map[string]*ruleSeries  // by domain
}

// SetMembershipErrors publishes the membership source's running error count.
func (m *Metrics) SetMembershipErrors(n uint64) { m.memberErrors.Store(n) }

// NewMetrics registers every series. live, overflowed and max read the bucket
// store; viewAge reads the age of the membership view.
func NewMetrics(live func() int, overflowed func() uint64, maxBuckets int, viewAge func() float64) *Metrics {
	m := &Metrics{Registry: prometheus.NewRegistry(), rules: map[ruleKey]*ruleSeries{}, overrides: map[string]*ruleSeries{}}
	f := func(c prometheus.Collector) { m.Registry.MustRegister(c) }
	f(collectors.NewGoCollector())
	f(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sharelimit_decisions_total",
		Help: "Decisions per descriptor, by domain, rule (the config path, or 'override') and code (OK, OVER_LIMIT)."}, []string{"domain", "rule", "code"})
	m.detailed = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sharelimit_decisions_detailed_total",
		Help: "Decisions of detailed_metric / value_to_metric rules with the request's value; at most 100 values per rule, then _other_."}, []string{"domain", "rule", "value", "code"})
	m.shadow = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sharelimit_shadow_over_limit_total",
		Help: "Decisions a shadow-mode rule answered OK that would have been OVER_LIMIT."}, []string{"domain", "rule"})
	m.noLimit = prometheus.NewCounter(prometheus.CounterOpts{Name: "sharelimit_no_limit_total",
		Help: "Descriptors that matched no limit (unknown domain, no rule at that depth, or replaced)."})
	m.invalid = prometheus.NewCounter(prometheus.CounterOpts{Name: "sharelimit_invalid_requests_total",
		Help: "Requests refused with InvalidArgument."})
	m.panics = prometheus.NewCounter(prometheus.CounterOpts{Name: "sharelimit_panics_total",
		Help: "Panics recovered in request handlers and answered Internal."})
	m.waits = prometheus.NewCounter(prometheus.CounterOpts{Name: "sharelimit_wait_policy_delays_total",
		Help: "Answers held back by a wait-policy reservation."})
	m.latency = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sharelimit_request_duration_seconds",
		Help:    "Time to decide one ShouldRateLimit request, in the handler.",
		Buckets: []float64{1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 0.025, 0.1}})
	m.Reloads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sharelimit_config_reloads_total",
		Help: "Config loads by result (success, failure)."}, []string{"result"})
	m.ReloadLast = prometheus.NewGauge(prometheus.GaugeOpts{Name: "sharelimit_config_last_reload_success_timestamp_seconds",
		Help: "When the config in force was loaded."})
	m.Generation = prometheus.NewGauge(prometheus.GaugeOpts{Name: "sharelimit_config_generation",
		Help: "Counts successful config loads; the one in force."})
	m.Rules = prometheus.NewGauge(prometheus.GaugeOpts{Name: "sharelimit_config_rules",
		Help: "Descriptors in the config in force."})
	m.MemberTotal = prometheus.NewGauge(prometheus.GaugeOpts{Name: "sharelimit_membership_total",
		Help: "Replicas enforcing the limits, as last observed."})
	m.MemberLocal = prometheus.NewGauge(prometheus.GaugeOpts{Name: "sharelimit_membership_local",
		Help: "Replicas on this node, as last observed."})
	m.MemberWeight = prometheus.NewGauge(prometheus.GaugeOpts{Name: "sharelimit_membership_weight",
		Help: "This replica's share of every global limit."})
	m.MemberLastOK = prometheus.NewGauge(prometheus.GaugeOpts{Name: "sharelimit_membership_last_success_timestamp_seconds",
		Help: "When the membership source last confirmed the view (0: never)."})
	m.BucketsSwept = prometheus.NewCounter(prometheus.CounterOpts{Name: "sharelimit_buckets_swept_total",
		Help: "Buckets dropped because they had refilled to full."})
	m.Draining = prometheus.NewGauge(prometheus.GaugeOpts{Name: "sharelimit_draining",
		Help: "1 while shutting down."})
	for _, c := range []prometheus.Collector{m.decisions, m.detailed, m.shadow, m.noLimit, m.invalid, m.panics, m.waits, m.latency,
		m.Reloads, m.ReloadLast, m.Generation, m.Rules, m.MemberTotal, m.MemberLocal, m.MemberWeight, m.MemberLastOK,
		m.BucketsSwept, m.Draining} {
		f(c)
	}
	f(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sharelimit_membership_errors_total",
		Help: "Membership watch errors since start."}, func() float64 { return float64(m.memberErrors.Load()) }))
	f(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sharelimit_membership_age_seconds",
		Help: "Seconds since the membership view was last confirmed."}, viewAge))
	f(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sharelimit_buckets",
		Help: "Live token buckets (full buckets are swept)."}, func() float64 { return float64(live()) }))
	f(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sharelimit_buckets_max",
		Help: "The --max-buckets cap."}, func() float64 { return float64(maxBuckets) }))
	f(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sharelimit_bucket_overflow_total",
		Help: "Decisions that used a rule's shared overflow bucket because --max-buckets was reached."}, func() float64 { return float64(overflowed()) }))
	m.Reloads.WithLabelValues("success")
	m.Reloads.WithLabelValues("failure")
	return m
}

// overrideRule labels the decisions of per-request overrides. A rule path always
// has a dot, so it cannot collide.
const overrideRule = "override"

// otherValue labels the detailed decisions of values past the cap.
const otherValue = "_other_"

// codeNames are the code labels, by codeIndex.
var codeNames = [2]string{"OK", "OVER_LIMIT"}

func codeIndex(st *descriptors.Status) int {
	if st.Code == descriptors.OverLimit {
		return 1
	}
	return 0
}

func detailed(r *descriptors.Rule) bool { return r.DetailedMetric() || r.ValueToMetric() }

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

	// Guarded by Metrics.mu.
	refs         int             // bound sets that have the rule
	detailedRefs int             // of those, the sets in which it is detailed
	detailed     *detailedValues // nil while detailedRefs is 0
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
		}
	}
	for d, s := range b.override {
		if s.refs--; s.refs == 0 {
			delete(m.overrides, d)
			m.deleteSeries(s)
		}
	}
}

func (m *Metrics) newSeries(domain, rule string) *ruleSeries {
	return &ruleSeries{
		domain: domain,
		rule:   rule,
		ok:     m.decisions.WithLabelValues(domain, rule, codeNames[0]),
		over:   m.decisions.WithLabelValues(domain, rule, codeNames[1]),
		shadow: m.shadow.WithLabelValues(domain, rule),
	}
}

func (m *Metrics) deleteSeries(s *ruleSeries) {
	m.decisions.DeleteLabelValues(s.domain, s.rule, codeNames[0])
	m.decisions.DeleteLabelValues(s.domain, s.rule, codeNames[1])
	m.shadow.DeleteLabelValues(s.domain, s.rule)
}

// count records the decisions of one request decided with set.
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
func (m *Metrics) count(set *descriptors.Set, domain string, descs []*commonv3.RateLimitDescriptor, sts []descriptors.Status) {
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
		if st.Shadowed {
			br.series.shadow.Inc()
		}
		if br.detailed != nil {
			br.detailed.inc(lastValue(d), code)
		}
	}
}

// lookup finds a decision's series in a bound set. It checks that the
// status's rule is the set's own, so a status from another set can never
// index the wrong rule's counters.
func (b *boundRules) lookup(st *descriptors.Status, domain string) boundRule {
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
func (m *Metrics) unbound(st *descriptors.Status, domain string) boundRule {
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

// detailedValues are one rule path's per-value series, at most
// maxDetailedValues values and then otherValue. Every bound set in which the
// rule is detailed shares them, so no reload can reset the cap and let clients
// mint another maxDetailedValues series.
//
// Counting a known value is an atomic load, a map lookup and an atomic add: the
// map is immutable, and replaced whole (copy on write) on the rare insert, under
// mu. Safe for concurrent use.
type detailedValues struct {
	vec          *prometheus.CounterVec
	domain, rule string
	vals         atomic.Pointer[map[string]*detailedEntry]
	// full is set once vals holds maxDetailedValues values; vals never
	// changes after that, so a miss can be settled without the lock.
	full  atomic.Bool
	other detailedEntry
	mu    sync.Mutex // serialises inserts, series creation and retire
	dead  bool       // guarded by mu: the series were deleted; create no more
}

// detailedEntry is one value's series. Each code's series is created on its
// first use, so a value exports only the codes it has seen.
type detailedEntry struct {
	value string
	codes [2]atomic.Pointer[counter] // by codeIndex
}

// counter boxes a prometheus.Counter for atomic.Pointer.
type counter struct{ prometheus.Counter }

func newDetailedValues(vec *prometheus.CounterVec, domain, rule string) *detailedValues {
	dv := &detailedValues{vec: vec, domain: domain, rule: rule, other: detailedEntry{value: otherValue}}
	dv.vals.Store(&map[string]*detailedEntry{})
	return dv
}

func (dv *detailedValues) inc(value string, code int) {
	e := (*dv.vals.Load())[value]
	if e == nil && dv.full.Load() {
		// The insert that filled the map happened before full was set, so this
		// load sees the final map: the value is in it, or it is an other.
		if e = (*dv.vals.Load())[value]; e == nil {
			e = &dv.other
		}
	}
	if e != nil {
		if c := e.codes[code].Load(); c != nil {
			c.Inc()
			return
		}
	}
	dv.slow(value, e, code)
}

// slow admits a new value, or creates a code's series, under the lock.
func (dv *detailedValues) slow(value string, e *detailedEntry, code int) {
	dv.mu.Lock()
	defer dv.mu.Unlock()
	if dv.dead {
		// Unbind deleted the rule's series: one created now would be exported
		// forever for a rule that is gone. This late decision goes uncounted.
		return
	}
	if e == nil {
		vals := *dv.vals.Load()
		if e = vals[value]; e == nil {
			if len(vals) >= maxDetailedValues {
				e = &dv.other
			} else {
				next := make(map[string]*detailedEntry, len(vals)+1)
				for k, v := range vals {
					next[k] = v
				}
				// The map outlives the request: keep the value, not the buffer
				// it may point into.
				e = &detailedEntry{value: strings.Clone(value)}
				next[e.value] = e
				dv.vals.Store(&next)
				if len(next) >= maxDetailedValues {
					dv.full.Store(true)
				}
			}
		}
	}
	c := e.codes[code].Load()
	if c == nil {
		c = &counter{dv.vec.WithLabelValues(dv.domain, dv.rule, e.value, codeNames[code])}
		e.codes[code].Store(c)
	}
	c.Inc()
}

// retire deletes the rule's detailed series for good; slow creates none after
// it. Called under Metrics.mu when no bound set has the rule detailed.
func (dv *detailedValues) retire() {
	dv.mu.Lock()
	defer dv.mu.Unlock()
	dv.dead = true
	dv.vec.DeletePartialMatch(prometheus.Labels{"domain": dv.domain, "rule": dv.rule})
}

func (m *Metrics) recordOverLimit(domain string, st *descriptors.Status, d *commonv3.RateLimitDescriptor) {
	if !m.overLimit.sample() {
		return
	}
	rule := overrideRule
	if st.Rule != nil {
		rule = st.Rule.Path()
	}
	m.overLimit.record(domain, rule, entriesText(d))
}

// entriesText renders a descriptor's entries as key=value pairs.
func entriesText(d *commonv3.RateLimitDescriptor) string {
	var b strings.Builder
	for i, e := range d.GetEntries() {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(e.GetKey())
		b.WriteByte('=')
		b.WriteString(e.GetValue())
	}
	return b.String()
}

func (m *Metrics) observe(d time.Duration) { m.latency.Observe(d.Seconds()) }
