package server

import (
	"runtime/debug"
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
		// which the profiles show on the unary path.
		grpc.NumStreamWorkers(2),
		grpc.ReadBufferSize(64 << 10),
		grpc.WriteBufferSize(64 << 10),
	}
}

// DefaultGCPercent is the GOGC the daemon runs with unless GOGC is set. Its live
// heap is small (a few MB plus the buckets) while gRPC allocates on every
// request, so at Go's default of 100 the collector runs every few hundred
// requests; 400 cuts the CPU per decision by about a sixth (docs/BENCHMARKS.md)
// for a few tens of MB.
const DefaultGCPercent = 400

// ApplyRuntimeDefaults sets DefaultGCPercent unless the operator set GOGC. The
// no-op benchmark server calls it too, so the two are measured alike.
func ApplyRuntimeDefaults(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(DefaultGCPercent)
	}
}
