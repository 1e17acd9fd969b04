package loadgen

import (
	"context"
	"net"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// startNoop serves the tuned ServeNoop on a loopback port for the rest of the
// test.
func startNoop(t testing.TB) string { return startNoopKind(t, NoopTuned) }

func startNoopKind(t testing.TB, kind NoopServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeNoop(ctx, lis, kind) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeNoop: %v", err)
		}
	})
	return lis.Addr().String()
}

// TestNoopAnswersLikeARealServer: both floors answer each descriptor with the
// fields sharelimit's answer carries, so they marshal as much as it does.
func TestNoopAnswersLikeARealServer(t *testing.T) {
	t.Parallel()
	for _, kind := range []NoopServer{NoopTuned, NoopPlain} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			conn, err := grpc.NewClient(startNoopKind(t, kind), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			req := newRequestBuilder(newKeySpace(ShapeRemoteAddress, 10), "bench", 3, 0).build(0)
			resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Statuses) != 3 {
				t.Fatalf("%d statuses for 3 descriptors", len(resp.Statuses))
			}
			for i, st := range resp.Statuses {
				if st.Code != rlsv3.RateLimitResponse_OK || st.CurrentLimit.GetRequestsPerUnit() == 0 ||
					st.LimitRemaining == 0 || st.DurationUntilReset == nil {
					t.Fatalf("status %d carries less than a real answer: %v", i, st)
				}
			}
		})
	}
}
