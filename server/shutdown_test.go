package server

import (
	"context"
	"net"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
)

type okRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (okRLS) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// TestStreamCloserAfterClose: a client that opens a stream once the stop has
// begun gets Unavailable rather than a stream that would hold the stop open,
// while unary calls, which end by themselves, are still answered.
func TestStreamCloserAfterClose(t *testing.T) {
	streams := NewStreamCloser()
	gs := NewGRPCServer(okRLS{}, NewHealth(), nil, streams.ServerOption())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	defer gs.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	streams.Close()

	watch, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("watch after Close: %v, want Unavailable", err)
	}
	refl, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	refl.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
	if _, err := refl.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("reflection after Close: %v, want Unavailable", err)
	}
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d"}); err != nil {
		t.Errorf("unary call after Close: %v", err)
	}
}
