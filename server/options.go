package server

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// MaxRecvMsgSize caps one gRPC request. Envoy's RateLimitRequest for even a large
// route is a few KiB; 1 MiB leaves room for any honest caller and bounds what a
// broken one can make the daemon buffer.
const MaxRecvMsgSize = 1 << 20

// GRPCOptions are the grpc-go server settings shared by `serve` and the load
// generator's no-op server, so a benchmark compares like with like.
func GRPCOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxRecvMsgSize),
		// Envoy keeps a handful of long-lived HTTP/2 connections to its rate-limit
		// cluster; many concurrent streams on each is the normal shape.
		grpc.MaxConcurrentStreams(1024),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             10 * time.Second,
			PermitWithoutStream: true,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time:    2 * time.Minute,
			Timeout: 20 * time.Second,
		}),
		// Reusing goroutines for streams removes a goroutine start per request,
		// which the profiles show on the unary path. Sized when the server is
		// built; see streamWorkers.
		grpc.NumStreamWorkers(streamWorkers()),
		grpc.ReadBufferSize(64 << 10),
		grpc.WriteBufferSize(64 << 10),
	}
}

// streamWorkers sizes grpc-go's stream worker pool. A worker per P is what
// grpc-go suggests (it says NumCPU; GOMAXPROCS is the CPU this process may
// use, cgroup quota included): fewer leave cores starting goroutines, more only
// wait. When every worker is busy grpc-go starts a goroutine as if there were no
// pool, so a pool that turns out too small costs speed, never requests.
func streamWorkers() uint32 { return uint32(max(runtime.GOMAXPROCS(0), 1)) }

// GC pacing. The daemon's live heap is small (a few MB) unless it holds many
// buckets, while gRPC allocates on every request. At Go's default GOGC of 100
// the collector then runs every few hundred requests; at 400 it costs about a
// sixth less CPU per decision (docs/BENCHMARKS.md). But 400 also lets a large
// heap grow to five times its live size: a million buckets would take ~500 MB
// instead of ~220. So the GC percentage follows the live heap: 400 while the
// live heap is small, falling towards 100 as it grows, so the headroom stays
// near gcHeadroom, never more than 4x and never less than Go's default.
const (
	maxGCPercent = 400
	minGCPercent = 100
	gcHeadroom   = 64 << 20
)

// gcPercentFor is the GOGC for a live heap of live bytes.
func gcPercentFor(live uint64) int {
	if live == 0 {
		return maxGCPercent
	}
	p := int(uint64(100*gcHeadroom) / live)
	return min(max(p, minGCPercent), maxGCPercent)
}

// GCTuner adjusts GOGC to the live heap, unless the operator set GOGC. The zero
// value is ready; Run owns its goroutine's lifetime.
type GCTuner struct {
	// Getenv reads the environment; nil means os.Getenv.
	Getenv func(string) string
}

// Run retunes every interval until ctx ends. It returns nil at once when GOGC is
// set: then the operator's choice stands.
func (g GCTuner) Run(ctx context.Context) error {
	getenv := g.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if getenv("GOGC") != "" {
		return nil
	}
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	tune := func() {
		metrics.Read(sample)
		if sample[0].Value.Kind() == metrics.KindUint64 {
			debug.SetGCPercent(gcPercentFor(sample[0].Value.Uint64()))
		}
	}
	tune()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			tune()
		}
	}
}
