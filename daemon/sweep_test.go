package daemon

import (
	"context"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/internal/testutil"
)

// TestSweepDropsRefilledBucketsAndStopsWithContext: the sweeper drops a
// bucket once it has refilled, and returns nil when its context ends.
func TestSweepDropsRefilledBucketsAndStopsWithContext(t *testing.T) {
	set, err := descriptors.Parse("d.yaml", strings.NewReader("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000}\n"))
	if err != nil {
		t.Fatal(err)
	}
	store := bucket.NewStore(10)
	e := newEngine(t, set, store, engine.Options{})
	if err := e.Decide(new(engine.Decision), "d", descs("k", "v"), 1, 0); err != nil || store.Live() != 1 {
		t.Fatalf("setup: %v, %d live", err, store.Live())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sweep(ctx, e, time.Millisecond, func() int64 { return int64(time.Hour) }) }()
	for store.Swept() == 0 {
		select {
		case err := <-done:
			t.Fatalf("sweep returned early: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	if store.Live() != 0 || store.Swept() != 1 {
		t.Errorf("after the first sweep: %d live, %d swept; want 0 and 1", store.Live(), store.Swept())
	}
	cancel()
	if err := testutil.Within(t, done, "the sweeper to stop"); err != nil {
		t.Fatal(err)
	}
}

func descs(key, value string) []*commonv3.RateLimitDescriptor {
	return []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}}
}
