package daemon

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sharelimit/sharelimit/demand"
	"github.com/sharelimit/sharelimit/server"
)

// What demand sharing shows: its series on /metrics and its part of the
// admin pages, read from the demanders under their locks.

var (
	admittedRatioDesc = prometheus.NewDesc("sharelimit_cluster_admitted_ratio",
		"Per demand-shared rule: the cluster's admitted rate, as the replicas last reported it, divided by the rule's limit.",
		[]string{"service", "rule"}, nil)
	demandShareDesc = prometheus.NewDesc("sharelimit_demand_share",
		"Per demand-shared rule: this replica's share of the limit in force (its group's weight).",
		[]string{"service", "rule"}, nil)
	demandOfferedDesc = prometheus.NewDesc("sharelimit_demand_offered_per_second",
		"Per demand-shared rule: this replica's smoothed offered demand, in tokens per second.",
		[]string{"service", "rule"}, nil)
	demandHotValuesDesc = prometheus.NewDesc("sharelimit_demand_hot_values",
		"Per per-value demand rule: the values shared by demand on this replica (at most --demand-top-keys); the others keep equal shares.",
		[]string{"service", "rule"}, nil)
)

// demandRules is the collector of every view's demand-rule series: one
// collector, since their series share names across services.
type demandRules struct{ views views }

// Describe is the prometheus.Collector's.
func (demandRules) Describe(ch chan<- *prometheus.Desc) {
	ch <- admittedRatioDesc
	ch <- demandShareDesc
	ch <- demandOfferedDesc
	ch <- demandHotValuesDesc
}

// Collect reports each demand rule's figures.
func (c demandRules) Collect(ch chan<- prometheus.Metric) {
	for _, v := range c.views {
		if v.demand != nil {
			v.demand.collect(ch)
		}
	}
}

// collect reports this service's demand rules' figures. A per-value
// rule's share is its equal share (its values that are not hot); its hot
// values are counted, not listed, to keep the series' cardinality bounded.
func (d *demander) collect(ch chan<- prometheus.Metric) {
	rules := d.rules()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, b := range rules {
		path := b.Rule.Path()
		ch <- prometheus.MustNewConstMetric(demandShareDesc, prometheus.GaugeValue, d.engine.GroupWeight(b.State.Group()).W, d.v.service, path)
		if r := d.rates[b.State.Identity()]; r != nil {
			ch <- prometheus.MustNewConstMetric(demandOfferedDesc, prometheus.GaugeValue, r.Offered, d.v.service, path)
		}
		if b.State.PerValue() {
			ch <- prometheus.MustNewConstMetric(demandHotValuesDesc, prometheus.GaugeValue, float64(len(b.State.HotValues())), d.v.service, path)
			continue
		}
		if d.params == nil || b.Rule.Limit() == nil {
			continue
		}
		if rp := d.params.Find(demand.RuleIDOf(b.State.Identity())); rp != nil && rp.Limit > 0 {
			ch <- prometheus.MustNewConstMetric(admittedRatioDesc, prometheus.GaugeValue, rp.Admitted/rp.Limit, d.v.service, path)
		}
	}
}

// status is the service's demand sharing for the admin pages; nil while it
// has no demand-shared rule.
func (d *demander) status() *server.DemandStatus {
	rules := d.rules()
	if len(rules) == 0 {
		return nil
	}
	now := d.wall()
	d.mu.Lock()
	defer d.mu.Unlock()
	st := &server.DemandStatus{Leading: d.leader != nil && d.leader.IsLeader(), Writes: d.writes, Errors: d.failures, WriteError: d.writeErr}
	if st.Leading {
		st.Division = slices.Clone(d.division)
		for _, b := range d.bad {
			st.BadReports = append(st.BadReports, server.DemandBadReport{Node: b.node, Cause: b.cause, Error: b.err})
		}
	}
	if p := d.params; p != nil {
		st.Counted = d.standing.String()
		st.Leader = p.Leader
		st.ParamsAgeSeconds = now.Sub(time.Unix(0, p.At)).Seconds()
		st.Stale = now.Sub(time.Unix(0, p.At)) > d.staleAfter()
	}
	for _, b := range rules {
		equal := d.engine.GroupWeight(b.State.DomainGroup()).W
		r := server.DemandRule{Rule: b.Rule.Path(), Share: d.engine.GroupWeight(b.State.Group()).W, Equal: equal}
		if rt := d.rates[b.State.Identity()]; rt != nil {
			r.Offered, r.Admitted = rt.Offered, rt.Admitted
		}
		if b.State.PerValue() {
			st.Rules = append(st.Rules, r)
			st.Rules = append(st.Rules, d.hotRows(b, equal)...)
			continue
		}
		if d.params != nil {
			if rp := d.params.Find(demand.RuleIDOf(b.State.Identity())); rp != nil && rp.Limit > 0 {
				r.ClusterAdmittedRatio = rp.Admitted / rp.Limit
			}
		}
		st.Rules = append(st.Rules, r)
	}
	return st
}

// register adds the demand series of this service.
func (d *demander) register(reg prometheus.Registerer) {
	labels := prometheus.Labels{"service": d.v.service}
	counter := func(name, help string, f func() uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, func() float64 {
			d.mu.Lock()
			defer d.mu.Unlock()
			return float64(f())
		})
	}
	// One series per cause, each from the start, so that an alert can
	// watch the rate of any of them.
	byCause := func(name, help string, causes []string, m map[string]uint64) []prometheus.Collector {
		var out []prometheus.Collector
		for _, c := range causes {
			out = append(out, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help,
				ConstLabels: prometheus.Labels{"service": d.v.service, "cause": c}}, func() float64 {
				d.mu.Lock()
				defer d.mu.Unlock()
				return float64(m[c])
			}))
		}
		return out
	}
	reg.MustRegister(byCause("sharelimit_demand_write_errors_total",
		"Demand report writes that failed, by cause: held (another session holds the key), session_gone, denied (403), unreachable, other.",
		writeCauses, d.writeErrs)...)
	reg.MustRegister(byCause("sharelimit_demand_bad_reports_total",
		"Reports this replica, as leader, could not use in a division (once per division), by cause: undecodable, version, oversized, wrong_node.",
		readCauses, d.badReps)...)
	reg.MustRegister(
		counter("sharelimit_demand_writes_total", "Demand reports this replica wrote to Consul.", func() uint64 { return d.writes }),
		counter("sharelimit_demand_bad_params_total", "Leader parameters ignored as undecodable.", func() uint64 { return d.badParam }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sharelimit_demand_leader", ConstLabels: labels,
			Help: "1 while this replica is the service's demand leader."}, func() float64 {
			d.mu.Lock()
			l := d.leader
			d.mu.Unlock()
			if l != nil && l.IsLeader() {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sharelimit_demand_params_age_seconds", ConstLabels: labels,
			Help: "Age of the leader's parameters in force, by the leader's clock; 0 when there are none."}, func() float64 {
			d.mu.Lock()
			defer d.mu.Unlock()
			if d.params == nil {
				return 0
			}
			return d.wall().Sub(time.Unix(0, d.params.At)).Seconds()
		}),
	)
}
