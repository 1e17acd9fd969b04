package server

import (
	"runtime"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/sharelimit/sharelimit/server/wire"
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
		// RLS requests and answers by hand: a fixed handful of allocations per
		// request, answers in pooled buffers (package wire).
		wire.ServerOption(),
	}
}

// streamWorkers sizes grpc-go's stream worker pool. When every worker is busy,
// grpc-go starts a goroutine for the stream, and a new goroutine's stack starts
// small and is copied larger several times over a handler as deep as gRPC's:
// with a worker per P (grpc-go's suggestion) and 16 requests in flight, stack
// copying was 12% of the daemon's CPU. A worker keeps its grown stack, so the
// pool covers the requests in flight of a busy node. In single same-run A/Bs
// (docs/BENCHMARKS.md), 64 workers measured 1.04× the throughput of
// GOMAXPROCS and 0.90× its CPU per decision, and 256 1.13× and 0.93× those of
// 64. An idle worker costs its stack, which the garbage collector shrinks.
func streamWorkers() uint32 { return uint32(max(runtime.GOMAXPROCS(0), 256)) }
