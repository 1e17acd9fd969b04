package server

import (
	"math"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/sharelimit/sharelimit/descriptors/engine"
)

// Upstream's Prometheus series. envoyproxy/ratelimit counts gostats stats,
// ratelimit.service.rate_limit.<stats key>.<stat>, and with USE_PROMETHEUS
// its built-in statsd_exporter mapping turns them into
// ratelimit_service_rate_limit_<stat>{domain, key1[, key2]} and a few
// service-wide series. This file exports the same names, types and labels,
// so a dashboard or an alert written for upstream reads them unchanged.
//
// Nearly everything is derived at scrape time from what the request path
// counts already (latency, refusals, config loads). What upstream counts per
// rule is in hits, not decisions, and says near_limit; for that the request
// path adds to one more counter per decision while the series are on
// (upstreamHits), and to nothing when they are off.

// UpstreamOptions are the settings of upstream's series.
type UpstreamOptions struct {
	// Path is where the handler serves the exposition (upstream's
	// PROMETHEUS_PATH); any other path is 404.
	Path string
	// Milliseconds reports ratelimit_service_response_time_seconds in
	// milliseconds, as upstream's PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS.
	Milliseconds bool
	// ConfigLoads reads the config loads so far, those put in force and
	// those refused; nil exports no config_load series.
	ConfigLoads func() (ok, failed float64)
}

// upstreamCounting is set once, by CountUpstream, before any rule is bound.
type upstreamCounting struct {
	// nearRatio is upstream's NEAR_LIMIT_RATIO.
	nearRatio float64
}

// upstreamHits are one stats key's counts in upstream's terms: hits (each
// descriptor's hits_addend), not decisions. A shadow-mode hit over its limit
// is over_limit and shadow_mode, never within_limit, as upstream counts it.
// Safe for concurrent use; the zero value counts from zero.
type upstreamHits struct {
	within, over, shadow, near atomic.Uint64
}

// upstreamCounts are a rule's hits, alone on their cache line: every decision
// of the rule adds to them, and nothing that only reads may share the line.
type upstreamCounts struct {
	upstreamHits
	_ [64 - 32]byte
}

// CountUpstream makes the request path count what upstream's series need
// beyond sharelimit's own, with upstream's NEAR_LIMIT_RATIO. Call it before
// the first Bind: only the rules bound after it are counted.
func (m *Metrics) CountUpstream(nearLimitRatio float64) {
	m.up = &upstreamCounting{nearRatio: nearLimitRatio}
}

// hitsOf is what upstream adds to a descriptor's stats: its hits_addend when
// set (0 too), else the request's, 0 counting as 1. A give-back (negative
// hits) is no hit.
func hitsOf(d *commonv3.RateLimitDescriptor, reqHits uint32) uint64 {
	switch {
	case d.GetIsNegativeHits():
		return 0
	case d.GetHitsAddend() != nil:
		return d.GetHitsAddend().GetValue()
	}
	return uint64(max(reqHits, 1))
}

// count adds one decision of h hits to c.
func (u *upstreamCounting) count(c *upstreamHits, st *engine.Status, h uint64) {
	switch {
	case h == 0:
	case st.Shadowed:
		c.over.Add(h)
		c.shadow.Add(h)
	case st.Code == engine.OverLimit:
		c.over.Add(h)
	default:
		c.within.Add(h)
		if n := u.near(st, h); n > 0 {
			c.near.Add(n)
		}
	}
}

// near is how many of an admitted decision's h hits were near the limit.
// Upstream's fixed window counts a hit near once its counter passes
// floor(limit × ratio), in float32 as upstream computes it; here a hit is
// near once it leaves fewer than burst − floor(burst × ratio) tokens
// cluster-wide (Status.Remaining), and, as upstream, only the hits past that
// line count. From a full bucket the two agree hit for hit.
func (u *upstreamCounting) near(st *engine.Status, h uint64) uint64 {
	b := st.Limit.Burst()
	line := b - min(b, uint64(math.Floor(float64(float32(b)*float32(u.nearRatio)))))
	rem := uint64(st.Remaining)
	if rem >= line {
		return 0
	}
	return min(h, line-rem)
}

// statIPv4 finds what upstream's SanitizeStatName rewrites: an IPv4 address
// in a stat name, whose dots would split it into components.
var statIPv4 = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

var statReplacer = strings.NewReplacer(":", "_", "|", "_")

// upstreamLabels are the labels upstream's mapping gives a stats key
// (domain.key_value.key2...): with two components, domain and key1 (its glob
// rule); with more, domain, key1 and key2, the rest dropped (its regex
// rule). The key is first sanitised as upstream names its stats: ':' and '|'
// become '_', and so do the dots of an IPv4 address.
func upstreamLabels(key string) (labels []string, ok bool) {
	key = statIPv4.ReplaceAllStringFunc(statReplacer.Replace(key), func(ip string) string {
		return strings.ReplaceAll(ip, ".", "_")
	})
	parts := strings.SplitN(key, ".", 4)
	for i := range parts {
		parts[i] = strings.ToValidUTF8(parts[i], "\uFFFD")
	}
	switch len(parts) {
	case 1:
		return nil, false
	case 2:
		return parts, true
	}
	return parts[:3], true
}

// The per-key stats, in the order of upstreamCollector.rl.
var upstreamStats = [...]string{"total_hits", "within_limit", "over_limit", "near_limit", "shadow_mode"}

// upstreamCollector exports upstream's series. It is unchecked (Describe
// sends nothing): upstream's mapping gives ratelimit_service_rate_limit_*
// two label sets, domain and key1 for a two-component key, and domain, key1
// and key2 for a deeper one, and so does this.
type upstreamCollector struct {
	m    *Metrics
	opts UpstreamOptions
	rl   [len(upstreamStats)][2]*prometheus.Desc // by stat, then without and with key2

	serviceError, requests, responseTime, loadOK, loadError, globalShadow *prometheus.Desc
}

var _ prometheus.Collector = (*upstreamCollector)(nil)

func newUpstreamCollector(m *Metrics, o UpstreamOptions) *upstreamCollector {
	c := &upstreamCollector{m: m, opts: o}
	help := map[string]string{
		"total_hits":   "Hits (hits_addend) on each stats key that has a limit, as upstream's ratelimit.service.rate_limit.<key>.total_hits.",
		"within_limit": "Hits admitted, as upstream's within_limit.",
		"over_limit":   "Hits refused, and shadow-mode hits over their limit, as upstream's over_limit.",
		"near_limit":   "Admitted hits that left less than (1 - NEAR_LIMIT_RATIO) of the bucket's burst, cluster-wide; upstream's near_limit.",
		"shadow_mode":  "Shadow-mode hits over their limit, answered OK; upstream's shadow_mode.",
	}
	for i, s := range upstreamStats {
		name := "ratelimit_service_rate_limit_" + s
		c.rl[i][0] = prometheus.NewDesc(name, help[s], []string{"domain", "key1"}, nil)
		c.rl[i][1] = prometheus.NewDesc(name, help[s], []string{"domain", "key1", "key2"}, nil)
	}
	c.serviceError = prometheus.NewDesc("ratelimit_service_should_rate_limit_error",
		"Requests that failed, by upstream's err_type: service_error is a request refused as invalid, or a recovered panic.", []string{"err_type"}, nil)
	c.requests = prometheus.NewDesc("ratelimit_service_total_requests",
		"ShouldRateLimit calls: decided, refused as invalid, or recovered from a panic.", []string{"grpc_method"}, nil)
	unit := "seconds"
	if o.Milliseconds {
		unit = "milliseconds (PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS)"
	}
	c.responseTime = prometheus.NewDesc("ratelimit_service_response_time_seconds",
		"Time to decide a ShouldRateLimit call, in "+unit+"; sharelimit_request_duration_seconds under upstream's name.", []string{"grpc_method"}, nil)
	c.loadOK = prometheus.NewDesc("ratelimit_service_config_load_success", "Configs loaded and put in force.", nil, nil)
	c.loadError = prometheus.NewDesc("ratelimit_service_config_load_error", "Configs refused; the rules in force stayed.", nil, nil)
	c.globalShadow = prometheus.NewDesc("ratelimit_service_global_shadow_mode",
		"Requests over a limit answered OK because of global shadow mode (--shadow-mode, SHADOW_MODE).", nil, nil)
	return c
}

// Describe sends nothing: the collector is unchecked.
func (c *upstreamCollector) Describe(chan<- *prometheus.Desc) {}

// keyHits are a stats key's hits summed over what maps to its labels.
type keyHits struct {
	labels                     []string
	within, over, shadow, near uint64
}

// Collect derives every series from the counts as they are now.
func (c *upstreamCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	type ruleRef struct {
		key string
		up  *upstreamCounts
		dv  *detailedValues
	}
	m.mu.Lock()
	rules := make([]ruleRef, 0, len(m.rules))
	for _, s := range m.rules {
		if s.up != nil && !s.unlimited {
			rules = append(rules, ruleRef{s.rule, s.up, s.detailed})
		}
	}
	m.mu.Unlock()

	// Several keys may map to one label set (keys deeper than key2, two
	// rules with one stats key): upstream's mapping sums them, and a
	// collector must not send one series twice.
	byLabels := map[string]*keyHits{}
	var order []string
	add := func(key string, h *upstreamHits, always bool) {
		w, o, s, n := h.within.Load(), h.over.Load(), h.shadow.Load(), h.near.Load()
		if !always && w+o == 0 {
			return
		}
		labels, ok := upstreamLabels(key)
		if !ok {
			return
		}
		id := strings.Join(labels, "\x00")
		k := byLabels[id]
		if k == nil {
			k = &keyHits{labels: labels}
			byLabels[id] = k
			order = append(order, id)
		}
		k.within += w
		k.over += o
		k.shadow += s
		k.near += n
	}
	for _, r := range rules {
		if r.dv == nil {
			add(r.key, &r.up.upstreamHits, true)
			continue
		}
		// A detailed rule's keys are the requests' (upstream's detailed
		// key); the values past its cap count under the rule's own key.
		for _, e := range *r.dv.vals.Load() {
			add(e.value, &e.upstreamHits, false)
		}
		add(r.key, &r.dv.other.upstreamHits, false)
	}
	for _, id := range order {
		k := byLabels[id]
		deep := 0
		if len(k.labels) == 3 {
			deep = 1
		}
		for i, v := range [len(upstreamStats)]uint64{k.within + k.over, k.within, k.over, k.near, k.shadow} {
			ch <- prometheus.MustNewConstMetric(c.rl[i][deep], prometheus.CounterValue, float64(v), k.labels...)
		}
	}

	invalid, panics := float64(counterValue(m.invalid)), float64(counterValue(m.panics))
	var lat dto.Metric
	if err := m.latency.Write(&lat); err == nil {
		h := lat.GetHistogram()
		ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(h.GetSampleCount())+invalid+panics, "ShouldRateLimit")
		scale := 1.0
		if c.opts.Milliseconds {
			scale = 1000
		}
		buckets := make(map[float64]uint64, len(h.GetBucket()))
		for _, b := range h.GetBucket() {
			buckets[b.GetUpperBound()*scale] = b.GetCumulativeCount()
		}
		ch <- prometheus.MustNewConstHistogram(c.responseTime, h.GetSampleCount(), h.GetSampleSum()*scale, buckets, "ShouldRateLimit")
	}
	ch <- prometheus.MustNewConstMetric(c.serviceError, prometheus.CounterValue, invalid+panics, "service_error")
	if c.opts.ConfigLoads != nil {
		ok, failed := c.opts.ConfigLoads()
		ch <- prometheus.MustNewConstMetric(c.loadOK, prometheus.CounterValue, ok)
		ch <- prometheus.MustNewConstMetric(c.loadError, prometheus.CounterValue, failed)
	}
	ch <- prometheus.MustNewConstMetric(c.globalShadow, prometheus.CounterValue, float64(m.globalShadow.Load()))
}

// UpstreamHandler serves, at o.Path, upstream's series followed by every
// series of the registry: one scrape has what both upstream's dashboards and
// sharelimit's read. Call CountUpstream first, or the per-key series stay
// empty.
func (m *Metrics) UpstreamHandler(o UpstreamOptions) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newUpstreamCollector(m, o))
	h := promhttp.HandlerFor(prometheus.Gatherers{reg, m.Registry}, promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != o.Path {
			http.NotFound(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}
