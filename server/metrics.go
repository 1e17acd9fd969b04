package server

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/descriptors/engine"
)

// maxDetailedValues bounds the stats keys a detailed_metric or value_to_metric
// rule may create: past it, further keys are counted under "_other_". Request
// values, and so the keys, are chosen by clients; without a bound they would
// grow memory and the scrape without limit.
const maxDetailedValues = 100

// Metrics are the series of the request path (decisions, latency, refusals),
// the bucket store's gauges and the drain, on a registry that the daemon's
// other parts (config, membership, sweeper) register their own series on.
// Safe for concurrent use.
type Metrics struct {
	Registry *prometheus.Registry

	decisions *prometheus.CounterVec
	detailed  *prometheus.CounterVec
	shadow    *prometheus.CounterVec
	noLimit   prometheus.Counter
	invalid   prometheus.Counter
	panics    prometheus.Counter
	waits     prometheus.Counter
	latency   prometheus.Histogram
	draining  prometheus.Gauge
	overLimit overLimitSample
	// globalShadow counts requests over a limit that --shadow-mode answered
	// OK (upstream's global_shadow_mode).
	globalShadow atomic.Uint64
	// up is set by CountUpstream (upstream.go), before any Bind; nil while
	// upstream's series are off.
	up *upstreamCounting

	// bound maps each bound *descriptors.Set to its *boundRules. The hot path
	// reads it without a lock; entries change only under mu.
	bound sync.Map
	// mu serialises Bind and Unbind, and guards the maps below and the
	// reference counts of everything in them. The hot path takes it only to
	// count a decision of a set that is no longer bound.
	mu        sync.Mutex
	rules     map[ruleKey]*ruleSeries // by (domain, rule path)
	overrides map[string]*ruleSeries  // by domain
	// retired are the slots of rules that reloads removed (admitted.go).
	retired []retiredRing
}

// NewMetrics registers the request path's series and the store's gauges on a
// new registry.
func NewMetrics(store *bucket.Store) *Metrics {
	m := &Metrics{Registry: prometheus.NewRegistry(), rules: map[ruleKey]*ruleSeries{}, overrides: map[string]*ruleSeries{}}
	f := func(c prometheus.Collector) { m.Registry.MustRegister(c) }
	f(collectors.NewGoCollector())
	f(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sharelimit_decisions_total",
		Help: "Decisions per descriptor, by domain, rule (the config path, or 'override') and code (OK, OVER_LIMIT)."}, []string{"domain", "rule", "code"})
	m.detailed = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sharelimit_decisions_detailed_total",
		Help: "Decisions of detailed_metric / value_to_metric rules by upstream's stats key for the request (domain.key_value...); at most 100 keys per rule, then _other_."}, []string{"domain", "rule", "key", "code"})
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
	m.draining = prometheus.NewGauge(prometheus.GaugeOpts{Name: "sharelimit_draining",
		Help: "1 while shutting down."})
	for _, c := range []prometheus.Collector{m.decisions, m.detailed, m.shadow, m.noLimit, m.invalid, m.panics, m.waits, m.latency, m.draining} {
		f(c)
	}
	f(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sharelimit_buckets",
		Help: "Live token buckets (full buckets are swept)."}, func() float64 { return float64(store.Live()) }))
	f(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sharelimit_buckets_max",
		Help: "The --max-buckets cap."}, func() float64 { return float64(store.Max()) }))
	f(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sharelimit_bucket_overflow_total",
		Help: "Decisions that used a rule's shared overflow bucket because --max-buckets was reached."}, func() float64 { return float64(store.Overflowed()) }))
	f(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sharelimit_buckets_swept_total",
		Help: "Buckets dropped because they had refilled to full."}, func() float64 { return float64(store.Swept()) }))
	return m
}

func (m *Metrics) recordOverLimit(domain string, st *engine.Status, d *commonv3.RateLimitDescriptor) {
	if !m.overLimit.sample() {
		return
	}
	rule := overrideRule
	if st.Rule != nil {
		rule = st.Rule.Path()
	}
	m.overLimit.record(clip(domain), rule, clip(entriesText(d)))
}

// maxSampleText bounds what an over-limit sample keeps of a request's
// domain and values: the client chooses them, and the status page and its
// ring must stay small whatever it sends.
const maxSampleText = 256

// clip returns s, or a copy of its first maxSampleText bytes (cut at a
// character) followed by "…": a copy, so a sample never keeps the request's
// own bytes alive.
func clip(s string) string {
	if len(s) <= maxSampleText {
		return strings.Clone(s)
	}
	n := maxSampleText
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
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
		if b.Len() > maxSampleText {
			break // clip keeps no more
		}
	}
	return b.String()
}

func (m *Metrics) observe(d time.Duration) { m.latency.Observe(d.Seconds()) }
