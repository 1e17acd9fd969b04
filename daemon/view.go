package daemon

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/sharelimit/sharelimit/demand/controller"
	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/internal/human"
	"github.com/sharelimit/sharelimit/internal/monotime"
	"github.com/sharelimit/sharelimit/membership"
	"github.com/sharelimit/sharelimit/server"
)

// view is one membership view and the engine group it divides: the default
// view (--consul-service, or the static count), which divides every domain
// not mapped elsewhere, or one --domain-service service's. Its watch, when it
// has one, publishes through its damper, when it has one; the view in force
// becomes the group's weight. Its series read it at scrape time, so nothing
// sets them. Safe for concurrent use.
type view struct {
	service string   // the Consul service; "" for static and DNS membership
	name    string   // the DNS name counted (--peers-dns); "" otherwise
	domains []string // the domains mapped to it; nil for the default view
	group   int
	consul  *membership.Consul // nil: static or DNS
	dns     *membership.DNS    // nil: static or Consul
	damper  *membership.Damper // nil: static, or --membership-hold 0
	cur     atomic.Pointer[membership.View]
	engine  *engine.Engine
	clock   monotime.Clock
	// reshare tells RLQS of a weight published; nil until the daemon has
	// built it.
	reshare func()
	// demand shares this view's demand rules; nil for a static view. Set
	// before the watch runs.
	demand *controller.Controller
	// join is told of each view published, for the join ramp; nil until
	// the daemon has decided it.
	join atomic.Pointer[joiner]
	// marks is told of each change of weight, to mark it on the status
	// page's sparklines; nil until the admin pages exist.
	marks atomic.Pointer[server.Admin]
}

// publish puts a view in force: the engine re-divides the group's limits,
// and no other group's.
func (v *view) publish(mv membership.View) {
	old := v.cur.Swap(&mv)
	if a := v.marks.Load(); a != nil && old != nil && old.Weight != mv.Weight {
		a.Mark(server.MarkMembership, fmt.Sprintf("%s: %d replicas, weight %s", v.label(), mv.Total, human.Share(mv.Weight)))
	}
	v.engine.SetGroupWeight(v.group, mv.Weight, v.clock())
	if v.reshare != nil {
		v.reshare()
	}
	if j := v.join.Load(); j != nil {
		j.observed(v, mv)
	}
	if v.demand != nil {
		// The equal share moved, and the units the shares scale by: a
		// shrink applies at once here too.
		v.demand.ViewChanged()
	}
}

// run runs the view's watch, damper and demand controller, those it has, in g.
func (v *view) run(ctx context.Context, g *errgroup.Group) {
	if v.consul != nil {
		g.Go(func() error { return v.consul.Run(ctx) })
	}
	if v.dns != nil {
		g.Go(func() error { return v.dns.Run(ctx) })
	}
	if v.damper != nil {
		g.Go(func() error { return v.damper.Run(ctx) })
	}
	if v.demand != nil {
		g.Go(func() error { return v.demand.Run(ctx) })
	}
}

// watched reports whether a source watches the view (Consul or DNS), so
// that it changes and is confirmed; a static view is neither.
func (v *view) watched() bool { return v.consul != nil || v.dns != nil }

// label names the view in logs and marks: its Consul service, its DNS
// name, or "default view" for static membership.
func (v *view) label() string {
	switch {
	case v.service != "":
		return v.service
	case v.name != "":
		return v.name
	}
	return "default view"
}

// labelKey is the log attribute label goes under.
func (v *view) labelKey() string {
	if v.name != "" {
		return "name"
	}
	return "service"
}

// observe is the watch's OnUpdate: through the damper when there is one.
func (v *view) observe(mv membership.View) {
	if v.damper != nil {
		v.damper.Update(mv)
		return
	}
	v.publish(mv)
}

// admin is the view as the admin pages show it, with the change the damper
// holds back, if any.
func (v *view) admin() server.View {
	cur := v.cur.Load()
	out := server.View{Source: cur.Source, Service: v.service, Name: v.name, Domains: v.domains, Total: cur.Total, Local: cur.Local,
		TotalWeight: cur.TotalWeight, LocalWeight: cur.LocalWeight, Weight: cur.Weight,
		ObservedAt: cur.ObservedAt, AgeSeconds: age(*cur), LastError: cur.LastError, Errors: cur.Errors, Fault: cur.Fault}
	if v.damper != nil {
		if p, at, ok := v.damper.Pending(); ok {
			out.Pending = &server.Pending{Total: p.Total, Local: p.Local, Weight: p.Weight, At: at, InSecs: max(0, time.Until(at).Seconds())}
		}
	}
	if v.demand != nil {
		out.Demand = v.demand.Status()
	}
	return out
}

// register adds the view's series, labelled by its service ("" for static
// and DNS membership).
func (v *view) register(reg prometheus.Registerer) {
	labels := prometheus.Labels{"service": v.service}
	source := "static"
	switch {
	case v.consul != nil:
		source = "consul"
	case v.dns != nil:
		source = "dns"
	}
	gauge := func(name, help string, f func(membership.View) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, func() float64 { return f(*v.cur.Load()) })
	}
	reg.MustRegister(
		gauge("sharelimit_membership_total", "Replicas enforcing the service's limits, as last observed and in force.",
			func(v membership.View) float64 { return float64(v.Total) }),
		gauge("sharelimit_membership_local", "Replicas of the service on this node, as in force.",
			func(v membership.View) float64 { return float64(v.Local) }),
		gauge("sharelimit_membership_weight", "This replica's share of each of the service's global limits, in force.",
			func(v membership.View) float64 { return v.Weight }),
		gauge("sharelimit_membership_last_success_timestamp_seconds", "When the membership source last confirmed the view in force (0: never).",
			func(v membership.View) float64 {
				if v.ObservedAt.IsZero() {
					return 0
				}
				return float64(v.ObservedAt.UnixNano()) / 1e9
			}),
		gauge("sharelimit_membership_age_seconds", "Seconds since the membership view in force was last confirmed.", age),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sharelimit_membership_errors_total", ConstLabels: labels,
			Help: "Membership watch errors since start."}, func() float64 { return float64(v.cur.Load().Errors) }),
		newFaultCollector(v),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sharelimit_membership_info",
			Help:        "1, labelled by the view's source (static, consul or dns) and, with dns, the name counted (--peers-dns).",
			ConstLabels: prometheus.Labels{"service": v.service, "source": source, "name": v.name}},
			func() float64 { return 1 }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sharelimit_membership_pending_weight", ConstLabels: labels,
			Help: "The weight a held membership change (--membership-hold) will apply if it holds; 0 when none is held."},
			func() float64 {
				if v.damper == nil {
					return 0
				}
				p, _, ok := v.damper.Pending()
				if !ok {
					return 0
				}
				return p.Weight
			}),
	)
}

// faultCollector exports sharelimit_membership_fault for one view: 1 for
// the cause that keeps the view in force from being the cluster's, and no
// series when nothing does.
type faultCollector struct {
	v    *view
	desc *prometheus.Desc
}

func newFaultCollector(v *view) faultCollector {
	return faultCollector{v: v, desc: prometheus.NewDesc("sharelimit_membership_fault",
		"1 while a fault keeps the membership view from being the cluster's, by cause: acl_filtered, forbidden, none_passing, suspect (a first answer short of the saved view), absent (this node has no counted instance), error, unshared (upstream's deployment at a static --replicas 1: each replica enforces every limit whole).",
		[]string{"cause"}, prometheus.Labels{"service": v.service})}
}

func (f faultCollector) Describe(ch chan<- *prometheus.Desc) { ch <- f.desc }

func (f faultCollector) Collect(ch chan<- prometheus.Metric) {
	if cause := f.v.cur.Load().Fault; cause != "" {
		ch <- prometheus.MustNewConstMetric(f.desc, prometheus.GaugeValue, 1, cause)
	}
}

// views are every membership view: the default first, then one per mapped
// service in flag order.
type views []*view

// Admin is the views as the admin pages show them.
func (vs views) Admin() []server.View {
	out := make([]server.View, len(vs))
	for i, v := range vs {
		out[i] = v.admin()
	}
	return out
}

// age is how long ago the view was confirmed; 0 for one never confirmed.
func age(v membership.View) float64 {
	if v.ObservedAt.IsZero() {
		return 0
	}
	return time.Since(v.ObservedAt).Seconds()
}

// grace is --membership-grace as membership.ConsulConfig takes it: there 0
// is the default and a negative grace is none.
func grace(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
