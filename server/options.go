package server

import (
	"runtime"
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
