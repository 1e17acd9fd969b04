package h2_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sharelimit/sharelimit/server"
)

// TestRelayedCallsWithADeadlineDoNotLeak: a long-lived client connection
// (Envoy's, a sidecar prober's) makes health Checks with a deadline. Each
// relayed call must free what it used once it ends; the connection's memory
// must not grow with the number of calls it has made.
func TestRelayedCallsWithADeadlineDoNotLeak(t *testing.T) {
	d := start(t, true, server.Options{})
	hc := healthpb.NewHealthClient(d.conn)
	check := func(n int) {
		for range n {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
			cancel()
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	heap := func() uint64 {
		time.Sleep(100 * time.Millisecond) // the relays' goroutines end
		var ms runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	check(2000) // warm up
	before := heap()
	const calls = 8000
	check(calls)
	after := heap()
	per := (float64(after) - float64(before)) / calls
	t.Logf("heap %d -> %d: %.1f bytes kept per call", before, after, per)
	if per > 20 {
		t.Errorf("the connection keeps %.0f bytes per relayed call with a deadline, after the call has ended", per)
	}
}
