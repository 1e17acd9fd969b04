package daemon

import (
	"fmt"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"

	"github.com/sharelimit/sharelimit/demand/controller"
	"github.com/sharelimit/sharelimit/server"
	"github.com/sharelimit/sharelimit/server/rlqs"
)

// newRLQS builds the RLQS service when --rlqs is on and registers its
// series; it returns the gRPC server options that serve it (none when off).
func (d *Daemon) newRLQS(metrics *server.Metrics) ([]grpc.ServerOption, error) {
	if !d.cfg.RLQS {
		return nil, nil
	}
	svc, err := rlqs.New(rlqs.Options{
		Engine: rlqs.FromEngine(d.engine), Clock: d.clock, TTL: d.cfg.RLQSTTL, AbandonAfter: d.cfg.RLQSAbandonAfter,
		Hold: rlqsHold, StartHold: rlqsStartHold, MaxBuckets: d.cfg.MaxBuckets, ShadowMode: d.cfg.ShadowMode, Logger: d.log.With("component", "rlqs"),
	})
	if err != nil {
		return nil, fmt.Errorf("--rlqs: %w", err)
	}
	d.rlqs = svc
	d.rlqsSnap = func() *rlqs.Snapshot {
		if !svc.Used() {
			return nil
		}
		snap := svc.Snapshot()
		return &snap
	}
	metrics.Registry.MustRegister(svc.Collector())
	return []grpc.ServerOption{server.AlsoServe(func(r grpc.ServiceRegistrar) {
		rlqsv3.RegisterRateLimitQuotaServiceServer(r, svc)
	})}, nil
}

// reshare tells RLQS that a weight changed (a membership view, a demand
// division, a value turning hot or cold): its shares are divided again, and
// shrinks pushed, at its next tick.
func (d *Daemon) reshare() {
	if d.rlqs != nil {
		d.rlqs.Reshare()
	}
}

// reshared is demand sharing's engine, telling RLQS of every weight it sets.
type reshared struct {
	controller.Engine
	d *Daemon
}

func (r reshared) SetWeight(g int, w float64, now int64) {
	r.Engine.SetWeight(g, w, now)
	r.d.reshare()
}

func (r reshared) SetHot(identity string, ids []uint64, now int64) []controller.Hot {
	hot := r.Engine.SetHot(identity, ids, now)
	r.d.reshare()
	return hot
}

// rlqsHold is how long a grown assignment waits. The share's own grows have
// waited already, before the engine's weight moved (--membership-hold in the
// damper, the grow delay in demand sharing), so this hold only has to let the
// shrinks of one division reach their streams before the grows of the next:
// two of the divider's ticks.
const rlqsHold = 200 * time.Millisecond

// rlqsStartHold is how long after start a stream's part is at most what its
// Envoy reported admitting: every Envoy reports, reconnecting after a
// restart, within its 5 s interval, and until it has, it may still enforce
// an assignment of the previous process.
const rlqsStartHold = 6 * time.Second
