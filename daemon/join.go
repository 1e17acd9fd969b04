package daemon

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/membership"
)

// joiner decides the join ramp (--join-ramp). A replica that joins a
// service whose other replicas serve, with nothing restored, starts its new
// buckets empty and lets them fill over the ramp: the cluster's buckets for
// the same keys are spent, and a full bucket per key would hand the joiner's
// first clients a fresh burst. The ramp starts when the replica first finds
// itself counted among others: at start with --replicas N > 1 or a saved
// view, or when Consul first lists its instance beside others (a node whose
// daemon starts before its app registers joins then, not at start). A
// replica that is alone, or that restored its state, does not ramp; a
// ramp started on the --replicas guess ends if Consul's first answer shows
// the replica alone or not yet counted. With --peers-dns a replica assumes
// it is listed, so it joins at the name's first answer listing others, and
// its ramp ends if that answer lists only one address. There is one ramp
// per process.
type joiner struct {
	store *bucket.Store
	clock func() int64
	ramp  time.Duration // --join-ramp; config.JoinRampAuto, 0 off
	views views

	mu        sync.Mutex
	off       bool // restored, --join-ramp 0, alone, or the join's ramp started
	started   bool // a ramp runs (or ran) on the views as they stand
	confirmed map[*view]bool
}

func newJoiner(store *bucket.Store, clock func() int64, ramp time.Duration, vs views, restored bool) *joiner {
	j := &joiner{store: store, clock: clock, ramp: ramp, views: vs, off: restored || ramp == 0, confirmed: map[*view]bool{}}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.decide()
	return j
}

// joined reports whether a view in force counts this replica among others.
// Called with mu held.
func (j *joiner) joined() bool {
	for _, v := range j.views {
		if mv := v.cur.Load(); mv != nil && mv.Local > 0 && mv.Total > mv.Local {
			return true
		}
	}
	return false
}

// decide starts the ramp when the replica has joined others, and ends one
// that started on the --replicas guess once Consul shows the replica alone
// (it serves on its own: no ramp, ever) or not counted yet (its join will
// start one). Called with mu held.
func (j *joiner) decide() {
	if j.off {
		return
	}
	switch {
	case j.joined():
		if !j.started {
			j.started = true
			r := &bucket.Ramp{Start: j.clock(), Cap: config.MaxAutoJoinRamp}
			if j.ramp > 0 {
				r.Fixed = j.ramp
			}
			j.store.SetRamp(r)
		}
		if j.allConfirmed() {
			j.off = true // one ramp per process
		}
	case j.allConfirmed():
		j.store.SetRamp(nil)
		j.started = false
		if j.alone() {
			j.off = true
		}
	}
}

// alone reports whether a view counts this replica and nobody else. Called
// with mu held.
func (j *joiner) alone() bool {
	for _, v := range j.views {
		if mv := v.cur.Load(); mv != nil && mv.Local > 0 && mv.Total == mv.Local {
			return true
		}
	}
	return false
}

// allConfirmed reports whether every watched view (Consul or DNS) has
// been confirmed (a static view is as good as confirmed). Called with mu
// held.
func (j *joiner) allConfirmed() bool {
	for _, v := range j.views {
		if v.watched() && !j.confirmed[v] {
			return false
		}
	}
	return true
}

// observed is told of every view v publishes.
func (j *joiner) observed(v *view, mv membership.View) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if !mv.ObservedAt.IsZero() {
		j.confirmed[v] = true
	}
	j.decide()
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
