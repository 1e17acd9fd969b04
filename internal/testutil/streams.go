package testutil

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
)

// OpenStreams opens the two long-lived streams a stop must end: a health Watch
// of service (answered SERVING) and a reflection stream that has answered one
// request and waits for the next. Both live until ctx ends or the server ends
// them.
func OpenStreams(t testing.TB, ctx context.Context, conn *grpc.ClientConn, service string) (healthpb.Health_WatchClient, reflectionpb.ServerReflection_ServerReflectionInfoClient) {
	t.Helper()
	watch, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatal(err)
	}
	if h, err := watch.Recv(); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch: %v %v", h, err)
	}
	refl, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := refl.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := refl.Recv(); err != nil {
		t.Fatal(err)
	}
	return watch, refl
}
