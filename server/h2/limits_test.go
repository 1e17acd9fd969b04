package h2_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sharelimit/sharelimit/server"
)

// TestRelayedCallsDoNotShareOneStreamLimit: one client holding 1024 health
// Watches (its own connection's limit) must not stop a *different* client's
// health Check. grpc-go alone limits streams per connection; the direct
// transport relays every connection's calls over one in-process connection
// whose 1024-stream limit all clients share.
func TestRelayedCallsDoNotShareOneStreamLimit(t *testing.T) {
	for _, direct := range []bool{false, true} {
		d := start(t, direct, server.Options{})
		hog, err := grpc.NewClient(d.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		hc := healthpb.NewHealthClient(hog)
		for i := 0; i < 1024; i++ {
			w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Recv(); err != nil {
				t.Fatalf("watch %d: %v", i, err)
			}
		}
		// Another client, on its own connection.
		cctx, ccancel := context.WithTimeout(context.Background(), 3*time.Second)
		_, err = healthpb.NewHealthClient(d.conn).Check(cctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
		ccancel()
		cancel()
		hog.Close()
		if err != nil {
			t.Errorf("direct=%v: another connection's health Check: %v", direct, err)
		}
	}
}
