package loadgen

import (
	"context"
	"fmt"
	"net"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sharelimit/sharelimit/server"
)

// noopStopGrace bounds how long ServeNoop waits for in-flight calls when its
// context ends before it closes their connections.
const noopStopGrace = 2 * time.Second

// NoopServer is how the floor's gRPC server is built.
type NoopServer string

const (
	// NoopTuned is built on serve's own grpc-go options (and, in `bench
	// --serve-noop`, serve's GC pacing): the difference between it and
	// sharelimit under the same load is the cost of deciding.
	NoopTuned NoopServer = "tuned"
	// NoopPlain is grpc.NewServer() with no options at Go's default GC
	// setting: what a plain grpc-go RLS server costs, the floor a user would
	// write.
	NoopPlain NoopServer = "plain"
)

// ParseNoopServer returns the NoopServer named s.
func ParseNoopServer(s string) (NoopServer, error) {
	switch NoopServer(s) {
	case NoopTuned, NoopPlain:
		return NoopServer(s), nil
	}
	return "", fmt.Errorf("parse noop server: %q is not one of tuned, plain", s)
}

// ServeNoop runs the gRPC floor on lis: a RateLimitService that answers OK to every
// request, with one OK status per descriptor carrying the fields a real answer
// has, and does nothing else. kind says how its grpc-go server is built. It
// returns nil once ctx is cancelled and the server has stopped, or the error that
// stopped it serving. It closes lis.
func ServeNoop(ctx context.Context, lis net.Listener, kind NoopServer) error {
	var opts []grpc.ServerOption
	if kind != NoopPlain {
		opts = server.GRPCOptions()
	}
	s := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(s, newNoopService())

	served := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-ctx.Done():
			stopWithin(s, noopStopGrace)
		case <-served:
		}
	}()
	err := s.Serve(lis)
	close(served)
	<-stopped
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// stopWithin stops s gracefully, or forcibly once grace has passed.
func stopWithin(s *grpc.Server, grace time.Duration) {
	done := make(chan struct{})
	go func() {
		s.GracefulStop()
		close(done)
	}()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.Stop()
		<-done
	}
}

// noopService answers OK without looking at the request beyond counting its
// descriptors. Each status carries what a real answer to a limited descriptor
// carries (current_limit, limit_remaining, duration_until_reset), so the floor
// marshals as much as sharelimit does. The statuses are shared, read-only
// messages: a floor should not allocate what it does not have to.
type noopService struct {
	rlsv3.UnimplementedRateLimitServiceServer
	ok []*rlsv3.RateLimitResponse_DescriptorStatus
}

var _ rlsv3.RateLimitServiceServer = (*noopService)(nil)

// noopSharedStatuses is how many descriptors a no-op answer can cover without
// allocating statuses.
const noopSharedStatuses = 256

// noopStatus is the answer to each descriptor: the fields and sizes of
// sharelimit's answer to docs/bench/bench.yaml's rules (which have no name).
var noopStatus = &rlsv3.RateLimitResponse_DescriptorStatus{
	Code: rlsv3.RateLimitResponse_OK,
	CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{
		RequestsPerUnit: 1_000_000_000,
		Unit:            rlsv3.RateLimitResponse_RateLimit_SECOND,
	},
	LimitRemaining:     999_999_999,
	DurationUntilReset: &durationpb.Duration{Nanos: 1},
}

func newNoopService() *noopService {
	s := &noopService{ok: make([]*rlsv3.RateLimitResponse_DescriptorStatus, noopSharedStatuses)}
	for i := range s.ok {
		s.ok[i] = noopStatus
	}
	return s
}

// ShouldRateLimit implements rlsv3.RateLimitServiceServer.
func (s *noopService) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	n := len(req.GetDescriptors())
	statuses := s.ok[:min(n, len(s.ok))]
	if n > len(s.ok) {
		statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
		for i := range statuses {
			statuses[i] = s.ok[0]
		}
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: statuses}, nil
}
