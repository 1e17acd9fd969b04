package daemon

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/internal/monotime"
	"github.com/sharelimit/sharelimit/membership"
	"github.com/sharelimit/sharelimit/server"
)

// views holds the membership view in force and turns each new one into the
// engine's weight. Its series read the view at scrape time, so nothing sets
// them. Safe for concurrent use.
type views struct {
	cur    atomic.Pointer[membership.View]
	engine *descriptors.Engine
	clock  monotime.Clock
}

func newViews(first membership.View, engine *descriptors.Engine, clock monotime.Clock, reg prometheus.Registerer) *views {
	v := &views{engine: engine, clock: clock}
	v.publish(first)
	gauge := func(name, help string, f func(membership.View) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return f(*v.cur.Load()) })
	}
	reg.MustRegister(
		gauge("sharelimit_membership_total", "Replicas enforcing the limits, as last observed.",
			func(v membership.View) float64 { return float64(v.Total) }),
		gauge("sharelimit_membership_local", "Replicas on this node, as last observed.",
			func(v membership.View) float64 { return float64(v.Local) }),
		gauge("sharelimit_membership_weight", "This replica's share of every global limit.",
			func(v membership.View) float64 { return v.Weight }),
		gauge("sharelimit_membership_last_success_timestamp_seconds", "When the membership source last confirmed the view (0: never).",
			func(v membership.View) float64 {
				if v.ObservedAt.IsZero() {
					return 0
				}
				return float64(v.ObservedAt.UnixNano()) / 1e9
			}),
		gauge("sharelimit_membership_age_seconds", "Seconds since the membership view was last confirmed.", age),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sharelimit_membership_errors_total",
			Help: "Membership watch errors since start."}, func() float64 { return float64(v.cur.Load().Errors) }),
	)
	return v
}

// publish puts a view in force: the engine re-divides every limit.
func (v *views) publish(view membership.View) {
	v.cur.Store(&view)
	v.engine.SetWeight(view.Weight, v.clock())
}

// Admin is the view as the admin pages show it.
func (v *views) Admin() server.View {
	cur := v.cur.Load()
	return server.View{Source: cur.Source, Total: cur.Total, Local: cur.Local, Weight: cur.Weight,
		ObservedAt: cur.ObservedAt, AgeSeconds: age(*cur), LastError: cur.LastError, Errors: cur.Errors}
}

// age is how long ago the view was confirmed; 0 for one never confirmed.
func age(v membership.View) float64 {
	if v.ObservedAt.IsZero() {
		return 0
	}
	return time.Since(v.ObservedAt).Seconds()
}
