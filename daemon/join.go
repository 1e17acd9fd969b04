package daemon

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/membership"
)

// joiner decides the join ramp (--join-ramp). A replica that starts with
// nothing restored while other replicas of its service serve starts its new
// buckets empty and lets them fill over the ramp, since the cluster's
// buckets for the same keys are spent; a replica that is alone, or that
// restored its state, does not. The decision is made at start from the
// views in force (--replicas, or the saved ones), and revised once, when
// Consul first confirms a view: the ramp starts then if the replica turns
// out not to be alone, or ends if every view shows it alone.
type joiner struct {
	store *bucket.Store
	clock func() int64
	ramp  time.Duration // --join-ramp; config.JoinRampAuto, 0 off
	views views

	mu        sync.Mutex
	off       bool // restored, or --join-ramp 0: never ramps
	started   bool
	confirmed map[*view]bool
}

func newJoiner(store *bucket.Store, clock func() int64, ramp time.Duration, vs views, restored bool) *joiner {
	j := &joiner{store: store, clock: clock, ramp: ramp, views: vs, off: restored || ramp == 0, confirmed: map[*view]bool{}}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.others() {
		j.start()
	}
	return j
}

// others reports whether a view in force shows another replica. Called
// with mu held.
func (j *joiner) others() bool {
	for _, v := range j.views {
		if mv := v.cur.Load(); mv != nil && mv.Total > mv.Local {
			return true
		}
	}
	return false
}

// start starts the ramp now. Called with mu held.
func (j *joiner) start() {
	if j.off || j.started {
		return
	}
	j.started = true
	r := &bucket.Ramp{Start: j.clock(), Cap: config.MaxAutoJoinRamp}
	if j.ramp > 0 {
		r.Fixed = j.ramp
	}
	j.store.SetRamp(r)
}

// observed is told of every view v publishes; it acts on each view's first
// confirmation by Consul.
func (j *joiner) observed(v *view, mv membership.View) {
	if mv.ObservedAt.IsZero() {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.confirmed[v] || j.off {
		return
	}
	j.confirmed[v] = true
	switch {
	case j.others() && j.store.Ramp(j.clock()) == nil && !j.started:
		j.start()
	case !j.others():
		j.store.SetRamp(nil) // alone after all: nothing to ramp against
	}
}

// register adds the ramp's series.
func (j *joiner) register(reg prometheus.Registerer) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sharelimit_join_ramp_active",
			Help: "1 while the join ramp fills new buckets from empty (--join-ramp)."}, func() float64 {
			if j.store.Ramp(j.clock()) != nil {
				return 1
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sharelimit_join_ramp_rejected_total",
			Help: "First draws on a key that the join ramp refused and a full bucket would have admitted."}, func() float64 {
			return float64(j.store.RampRejected())
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sharelimit_join_ramp_withheld_tokens_total",
			Help: "Tokens the join ramp held back from the buckets it started: the most it can have refused."}, func() float64 {
			return float64(j.store.RampWithheld())
		}),
	)
}
