package controller

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sharelimit/sharelimit/demand"
)

// What demand sharing shows: its series on /metrics and its part of the
// admin pages, read from the controllers under their locks.

var (
	admittedRatioDesc = prometheus.NewDesc("sharelimit_cluster_admitted_ratio",
		"Per demand-shared rule: the cluster's admitted rate, as the replicas last reported it, divided by the rule's limit.",
		[]string{"service", "rule"}, nil)
	shareDesc = prometheus.NewDesc("sharelimit_demand_share",
		"Per demand-shared rule: this replica's share of the limit in force (its group's weight).",
		[]string{"service", "rule"}, nil)
	offeredDesc = prometheus.NewDesc("sharelimit_demand_offered_per_second",
		"Per demand-shared rule: this replica's smoothed offered demand, in tokens per second.",
		[]string{"service", "rule"}, nil)
	hotValuesDesc = prometheus.NewDesc("sharelimit_demand_hot_values",
		"Per per-value demand rule: the values shared by demand on this replica (at most --demand-top-keys); the others keep equal shares.",
		[]string{"service", "rule"}, nil)
)

// Series is the collector of every controller's per-rule series: one
// collector, since their series share names across services.
type Series []*Controller

// Describe is the prometheus.Collector's.
func (Series) Describe(ch chan<- *prometheus.Desc) {
	ch <- admittedRatioDesc
	ch <- shareDesc
	ch <- offeredDesc
	ch <- hotValuesDesc
}

// Collect reports each demand rule's figures.
func (s Series) Collect(ch chan<- prometheus.Metric) {
	for _, c := range s {
		c.collect(ch)
	}
}

// collect reports this service's demand rules' figures. A per-value
// rule's share is its equal share (its values that are not hot); its hot
// values are counted, not listed, to keep the series' cardinality bounded.
func (c *Controller) collect(ch chan<- prometheus.Metric) {
	rules := c.rules()
	c.mu.Lock()
	defer c.mu.Unlock()
	service := c.set.Service
	for _, r := range rules {
		ch <- prometheus.MustNewConstMetric(shareDesc, prometheus.GaugeValue, c.eng.Weight(r.Group), service, r.Path)
		if rt := c.rates[r.Identity]; rt != nil {
			ch <- prometheus.MustNewConstMetric(offeredDesc, prometheus.GaugeValue, rt.Offered, service, r.Path)
		}
		if r.PerValue {
			ch <- prometheus.MustNewConstMetric(hotValuesDesc, prometheus.GaugeValue, float64(len(r.Hot)), service, r.Path)
			continue
		}
		if c.params == nil || r.Limit == 0 {
			continue
		}
		if rp := c.params.Find(demand.RuleIDOf(r.Identity)); rp != nil && rp.Limit > 0 {
			ch <- prometheus.MustNewConstMetric(admittedRatioDesc, prometheus.GaugeValue, rp.Admitted/rp.Limit, service, r.Path)
		}
	}
}

// Status is the service's demand sharing for the admin pages; nil while it
// has no demand-shared rule.
func (c *Controller) Status() *Status {
	rules := c.rules()
	if len(rules) == 0 {
		return nil
	}
	now := c.wall()
	c.mu.Lock()
	defer c.mu.Unlock()
	st := &Status{Leading: c.st != nil && c.st.Leading(), Writes: c.writes, Errors: c.failures, WriteError: c.writeErr}
	if st.Leading {
		st.Division = slices.Clone(c.division)
		for _, b := range c.bad {
			st.BadReports = append(st.BadReports, BadReport{Node: b.node, Cause: b.cause, Error: b.err})
		}
	}
	if p := c.params; p != nil {
		st.Counted = c.standing.String()
		st.Leader = p.Leader
		st.ParamsAgeSeconds = now.Sub(time.Unix(0, p.At)).Seconds()
		st.Stale = now.Sub(time.Unix(0, p.At)) > c.staleAfter()
	}
	for _, r := range rules {
		equal := c.eng.Weight(r.DomainGroup)
		row := RuleRow{Rule: r.Path, Share: c.eng.Weight(r.Group), Equal: equal}
		if rt := c.rates[r.Identity]; rt != nil {
			row.Offered, row.Admitted = rt.Offered, rt.Admitted
		}
		if r.PerValue {
			st.Rules = append(st.Rules, row)
			st.Rules = append(st.Rules, c.hotRows(r, equal)...)
			continue
		}
		if c.params != nil {
			if rp := c.params.Find(demand.RuleIDOf(r.Identity)); rp != nil && rp.Limit > 0 {
				row.ClusterAdmittedRatio = rp.Admitted / rp.Limit
			}
		}
		st.Rules = append(st.Rules, row)
	}
	return st
}

// hotRows are the admin pages' rows of per-value rule r's hot values, the
// busiest first, at most maxShown. Called with mu held.
func (c *Controller) hotRows(r Rule, equal float64) []RuleRow {
	var rp *demand.RuleParams
	if c.params != nil {
		rp = c.params.Find(demand.RuleIDOf(r.Identity))
	}
	var out []RuleRow
	for _, hv := range r.Hot {
		row := RuleRow{Rule: r.Path, Value: hv.Label, Share: c.eng.Weight(hv.Group), Equal: equal}
		if row.Value == "" {
			row.Value = fmt.Sprintf("#%016x", hv.ID)
		}
		if rt := c.hotRates[r.Identity][hv.ID]; rt != nil {
			row.Offered, row.Admitted = rt.Offered, rt.Admitted
		}
		if rp != nil && rp.Limit > 0 {
			if vp := rp.FindValue(hv.ID); vp != nil {
				row.ClusterAdmittedRatio = vp.Admitted / rp.Limit
			}
		}
		out = append(out, row)
	}
	slices.SortFunc(out, func(a, b RuleRow) int {
		if x := cmpDesc(a.Offered, b.Offered); x != 0 {
			return x
		}
		return cmp.Compare(a.Value, b.Value)
	})
	return out[:min(len(out), maxShown)]
}

// Register adds the service's own demand series to reg.
func (c *Controller) Register(reg prometheus.Registerer) {
	labels := prometheus.Labels{"service": c.set.Service}
	counter := func(name, help string, f func() uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, func() float64 {
			c.mu.Lock()
			defer c.mu.Unlock()
			return float64(f())
		})
	}
	// One series per cause, each from the start, so that an alert can
	// watch the rate of any of them.
	byCause := func(name, help string, causes []string, m map[string]uint64) []prometheus.Collector {
		var out []prometheus.Collector
		for _, cause := range causes {
			out = append(out, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help,
				ConstLabels: prometheus.Labels{"service": c.set.Service, "cause": cause}}, func() float64 {
				c.mu.Lock()
				defer c.mu.Unlock()
				return float64(m[cause])
			}))
		}
		return out
	}
	reg.MustRegister(byCause("sharelimit_demand_write_errors_total",
		"Demand report writes that failed, by cause: held (another session holds the key), session_gone, denied (403), unreachable, other.",
		writeCauses, c.writeErrs)...)
	reg.MustRegister(byCause("sharelimit_demand_bad_reports_total",
		"Reports this replica, as leader, could not use in a division (once per division), by cause: undecodable, version, oversized, wrong_node.",
		readCauses, c.badReps)...)
	reg.MustRegister(
		counter("sharelimit_demand_writes_total", "Demand reports this replica wrote to Consul.", func() uint64 { return c.writes }),
		counter("sharelimit_demand_bad_params_total", "Leader parameters ignored as undecodable.", func() uint64 { return c.badParam }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sharelimit_demand_leader", ConstLabels: labels,
			Help: "1 while this replica is the service's demand leader."}, func() float64 {
			c.mu.Lock()
			st := c.st
			c.mu.Unlock()
			if st != nil && st.Leading() {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sharelimit_demand_params_age_seconds", ConstLabels: labels,
			Help: "Age of the leader's parameters in force, by the leader's clock; 0 when there are none."}, func() float64 {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.params == nil {
				return 0
			}
			return c.wall().Sub(time.Unix(0, c.params.At)).Seconds()
		}),
	)
}
