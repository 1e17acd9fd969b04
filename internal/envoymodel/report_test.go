package envoymodel

import (
	"context"
	"fmt"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/protobuf/proto"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// usageOf finds id's usage in r.
func usageOf(r *rlqsv3.RateLimitQuotaUsageReports, id map[string]string) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	for _, u := range r.GetBucketQuotaUsages() {
		if proto.Equal(u.GetBucketId(), &rlqsv3.BucketId{Bucket: id}) {
			return u
		}
	}
	return nil
}

// want is the expected usage of one bucket: allowed, denied, whole seconds.
type want struct{ allowed, denied, elapsed int }

func checkUsage(t *testing.T, r *rlqsv3.RateLimitQuotaUsageReports, id map[string]string, w want) {
	t.Helper()
	u := usageOf(r, id)
	if u == nil {
		t.Errorf("report %v has no bucket %v", r, id)
		return
	}
	got := want{int(u.NumRequestsAllowed), int(u.NumRequestsDenied), int(u.TimeElapsed.AsDuration() / time.Second)}
	if got != w || u.TimeElapsed.Nanos != 0 {
		t.Errorf("bucket %v: got %+v (time_elapsed %v), want %+v", id, got, u.TimeElapsed.AsDuration(), w)
	}
}

func TestInitialReport(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
		w    want
	}{
		{"an allowed first request", Config{}, want{1, 0, 0}},
		{"a denied first request", Config{NoAssignment: denyAll}, want{0, 1, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := start(t, tc.cfg, false)
			e.m.Allow(tenant)
			e.stream()
			r := e.report()
			if r.Domain != "edge" || len(r.BucketQuotaUsages) != 1 {
				t.Fatalf("initial report = %v, want one bucket with the domain", r)
			}
			checkUsage(t, r, tenant, tc.w)
			// A second request on the same bucket sends nothing.
			e.m.Allow(tenant)
			other := map[string]string{"rule": "per_tenant", "tenant": "b"}
			e.m.Allow(other)
			r = e.report()
			if len(r.BucketQuotaUsages) != 1 || usageOf(r, other) == nil {
				t.Errorf("second initial report = %v, want bucket %v alone", r, other)
			}
			e.noReport()
		})
	}
}

func TestPeriodicReports(t *testing.T) {
	t.Parallel()
	e := start(t, Config{}, false)
	idle := map[string]string{"rule": "idle"}
	e.first(tenant)
	e.m.Allow(idle)
	e.report()
	e.clock.advance(2600 * time.Millisecond)
	e.allowN(tenant, 4)
	late := map[string]string{"rule": "late"}
	e.m.Allow(late) // created 0.4 s before the tick: time_elapsed 0 with counts.
	e.report()
	e.clock.advance(400 * time.Millisecond)
	e.m.Allow(late)
	e.tick()
	r := e.report()
	if r.Domain != "edge" || len(r.BucketQuotaUsages) != 3 {
		t.Fatalf("periodic report = %v, want all 3 buckets with the domain", r)
	}
	checkUsage(t, r, tenant, want{4, 0, 3})
	checkUsage(t, r, idle, want{0, 0, 3})
	checkUsage(t, r, late, want{1, 0, 0})
	e.clock.advance(5 * time.Second)
	e.tick()
	r = e.report()
	for _, id := range []map[string]string{tenant, idle, late} {
		checkUsage(t, r, id, want{0, 0, 5})
	}
	e.noReport()
}

// TestReportsEveryInterval runs the model's own timer on its real clock.
func TestReportsEveryInterval(t *testing.T) {
	t.Parallel()
	e := start(t, Config{Interval: 20 * time.Millisecond}, true)
	begin := time.Now()
	e.first(tenant)
	for i := range 3 {
		e.m.Allow(tenant)
		r := e.report()
		if len(r.BucketQuotaUsages) != 1 || r.Domain != "edge" {
			t.Fatalf("periodic report %d = %v", i, r)
		}
	}
	if took := time.Since(begin); took < 3*20*time.Millisecond {
		t.Errorf("3 periodic reports in %v, before 3 intervals of 20ms", took)
	}
}

func TestDefaultIntervalIsEnvoys(t *testing.T) {
	t.Parallel()
	e := start(t, Config{}, true)
	if e.m.interval != 5*time.Second {
		t.Errorf("interval = %v, want 5s", e.m.interval)
	}
}

// TestStreamLoss: a stream the server ends is forgotten, assignments stay,
// and the next tick opens a new stream whose first message is the full
// report, with the domain.
func TestStreamLoss(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		end  error
	}{
		{"server returns OK", nil},
		{"server returns an error", fmt.Errorf("going away")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := start(t, Config{}, false)
			s := e.first(tenant)
			e.respond(s, assignment(tenant, denyAll, secs(60)))
			s.end <- tc.end
			testutil.Within(t, e.closed, "the stream forgotten")
			e.clock.advance(30 * time.Second)
			if got := e.allowN(tenant, 3); got != 0 {
				t.Errorf("after the stream ended, admitted %d of 3 under DENY_ALL, want 0", got)
			}
			e.tick()
			s2 := e.stream()
			r := e.report()
			if r.Domain != "edge" || len(r.BucketQuotaUsages) != 1 {
				t.Fatalf("first message on the new stream = %v", r)
			}
			checkUsage(t, r, tenant, want{0, 3, 30})
			e.respond(s2, assignment(tenant, allowAll, secs(60)))
			if !e.m.Allow(tenant) {
				t.Error("assignment on the new stream not applied")
			}
		})
	}
}

// TestReportDroppedWhileTheServerIsDown: a tick that cannot open a stream
// drops its report, counters included; the next one after the server is
// back carries only what came after.
func TestReportDroppedWhileTheServerIsDown(t *testing.T) {
	t.Parallel()
	e := start(t, Config{}, false)
	s := e.first(tenant)
	e.respond(s, assignment(tenant, allowAll, secs(3600)))
	e.gs.Stop()
	testutil.Within(t, e.closed, "the stream forgotten")
	e.allowN(tenant, 5)
	e.tick() // the report of the 5 is dropped
	e.serve(e.addr)
	e.conn.Connect()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for st := e.conn.GetState(); st != connectivity.Ready; st = e.conn.GetState() {
		if !e.conn.WaitForStateChange(ctx, st) {
			t.Fatal("connection not ready again")
		}
	}
	e.noReport()
	e.allowN(tenant, 2)
	e.tick()
	e.stream()
	checkUsage(t, e.report(), tenant, want{2, 0, 0})
}
