package loadgen

import (
	"context"
	"net"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/sharelimit/sharelimit/server"
)

// noopStopGrace bounds how long ServeNoop waits for in-flight calls when its
// context ends before it closes their connections.
const noopStopGrace = 2 * time.Second

// ServeNoop runs the gRPC floor on lis: a RateLimitService that answers OK to every
// request, with one OK status per descriptor, and does nothing else. It uses the
// same grpc-go server options as `sharelimit serve`, so the difference between the
// two under the same load is the cost of deciding. It returns nil once ctx is
// cancelled and the server has stopped, or the error that stopped it serving. It
// closes lis.
func ServeNoop(ctx context.Context, lis net.Listener) error {
	s := grpc.NewServer(server.GRPCOptions()...)
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
// descriptors. The statuses are shared, read-only messages: a floor should not
// allocate what it does not have to.
type noopService struct {
	rlsv3.UnimplementedRateLimitServiceServer
	ok []*rlsv3.RateLimitResponse_DescriptorStatus
}

var _ rlsv3.RateLimitServiceServer = (*noopService)(nil)

// noopSharedStatuses is how many descriptors a no-op answer can cover without
// allocating statuses.
const noopSharedStatuses = 256

func newNoopService() *noopService {
	s := &noopService{ok: make([]*rlsv3.RateLimitResponse_DescriptorStatus, noopSharedStatuses)}
	for i := range s.ok {
		s.ok[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
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
