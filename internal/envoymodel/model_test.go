package envoymodel

import (
	"errors"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
)

var tenant = map[string]string{"rule": "per_tenant", "tenant": "a"}

func TestNewRefuses(t *testing.T) {
	t.Parallel()
	conn, err := grpc.NewClient("127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"no connection", Config{Domain: "edge"}},
		{"no domain", Config{Conn: conn}},
		{"token bucket as no-assignment behaviour", Config{Conn: conn, Domain: "edge", NoAssignment: tb(1, 1, time.Second)}},
		{"negative interval", Config{Conn: conn, Domain: "edge", Interval: -time.Second}},
	} {
		if _, err := New(tc.cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: New err = %v, want ErrConfig", tc.name, err)
		}
	}
}

func TestNoAssignmentBehaviour(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		s    *typev3.RateLimitStrategy
		want int
	}{
		{"unset is ALLOW_ALL", nil, 3},
		{"ALLOW_ALL", allowAll, 3},
		{"DENY_ALL, the first request included", denyAll, 0},
		{"requests_per_time_unit allows everything", perUnit, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := start(t, Config{NoAssignment: tc.s}, false)
			if got := e.allowN(tenant, 3); got != tc.want {
				t.Errorf("admitted %d of 3, want %d", got, tc.want)
			}
			if a, d := e.m.Totals(); a != uint64(tc.want) || d != uint64(3-tc.want) {
				t.Errorf("Totals = %d, %d", a, d)
			}
		})
	}
}

// step is one moment of a script: advance the clock, optionally apply an
// action, then make n requests and expect want admitted.
type step struct {
	dt     time.Duration
	action *rlqsv3.RateLimitQuotaResponse_BucketAction
	n      int
	want   int
}

func runSteps(t *testing.T, cfg Config, steps []step) {
	t.Helper()
	e := start(t, cfg, false)
	s := e.first(tenant)
	for i, st := range steps {
		e.clock.advance(st.dt)
		if st.action != nil {
			e.respond(s, st.action)
		}
		if got := e.allowN(tenant, st.n); got != st.want {
			t.Errorf("step %d: admitted %d of %d, want %d", i, got, st.n, st.want)
		}
	}
}

func TestAssignments(t *testing.T) {
	t.Parallel()
	long := secs(3600)
	for _, tc := range []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{"blanket rules are enforced", Config{}, []step{
			{0, assignment(tenant, denyAll, long), 3, 0},
			{0, assignment(tenant, allowAll, long), 3, 3},
		}},
		{"a first token bucket starts full and refills continuously", Config{}, []step{
			{0, assignment(tenant, tb(5, 10, time.Second), long), 8, 5},
			{200 * time.Millisecond, nil, 8, 2},
			{time.Minute, nil, 8, 5},
		}},
		{"the same bucket again keeps its tokens", Config{}, []step{
			{0, assignment(tenant, tb(5, 1, time.Second), long), 5, 5},
			{0, assignment(tenant, tb(5, 1, time.Second), long), 1, 0},
		}},
		{"a changed bucket keeps the fill fraction", Config{}, []step{
			{0, assignment(tenant, tb(10, 1, 100*time.Second), long), 5, 5},
			{0, assignment(tenant, tb(20, 1, 100*time.Second), long), 30, 10},
		}},
		{"a change of fill seconds alone keeps the old rate", Config{}, []step{
			{0, assignment(tenant, tb(4, 1, time.Second), long), 4, 4},
			{0, assignment(tenant, tb(4, 1, 1000*time.Second), long), 0, 0},
			{2 * time.Second, nil, 4, 2},
		}},
		{"nanos that differ make it a new bucket at the new rate", Config{}, []step{
			{0, assignment(tenant, tb(4, 1, time.Second), long), 4, 4},
			{0, assignment(tenant, tb(4, 1, 1000*time.Second+1), long), 0, 0},
			{2 * time.Second, nil, 4, 0},
		}},
		{"a token bucket after a blanket rule starts full", Config{}, []step{
			{0, assignment(tenant, tb(3, 1, 100*time.Second), long), 3, 3},
			{0, assignment(tenant, denyAll, long), 1, 0},
			{0, assignment(tenant, tb(3, 1, 100*time.Second), long), 5, 3},
		}},
		{"a fill interval under a second is unlimited", Config{}, []step{
			{0, assignment(tenant, tb(1, 1, 500*time.Millisecond), long), 100, 100},
		}},
		{"requests_per_time_unit is ignored, the old state and TTL stay", Config{}, []step{
			{0, assignment(tenant, tb(2, 1, 100*time.Second), secs(10)), 3, 2},
			{5 * time.Second, assignment(tenant, perUnit, secs(3600)), 1, 0},
			{5 * time.Second, nil, 4, 4},
		}},
		{"a strategy left unset is ignored", Config{}, []step{
			{0, assignment(tenant, denyAll, long), 1, 0},
			{0, assignment(tenant, nil, long), 1, 0},
		}},
		{"an action with neither assignment nor abandon expires at once", Config{NoAssignment: denyAll}, []step{
			{0, assignment(tenant, allowAll, long), 1, 1},
			{0, &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: &rlqsv3.BucketId{Bucket: tenant}}, 2, 0},
		}},
		{"key order on the wire does not matter", Config{}, []step{
			{0, assignment(map[string]string{"tenant": "a", "rule": "per_tenant"}, denyAll, long), 2, 0},
		}},
		{"actions for other or empty ids are dropped", Config{}, []step{
			{0, assignment(map[string]string{"rule": "per_tenant"}, denyAll, long), 2, 2},
			{0, assignment(map[string]string{}, denyAll, long), 2, 2},
			{0, assignment(nil, denyAll, long), 2, 2},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runSteps(t, tc.cfg, tc.steps)
		})
	}
}

func TestTTLAndExpiredBehaviour(t *testing.T) {
	t.Parallel()
	deny := Config{NoAssignment: denyAll}
	withFallback := func(s *typev3.RateLimitStrategy, timeout time.Duration) Config {
		return Config{NoAssignment: allowAll, Expired: s, ExpiredTimeout: timeout}
	}
	for _, tc := range []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{"TTL in whole seconds", deny, []step{
			{0, assignment(tenant, allowAll, secs(2)), 1, 1},
			{1999 * time.Millisecond, nil, 1, 1},
			{time.Millisecond, nil, 1, 0},
		}},
		{"unset TTL expires at once", deny, []step{{0, assignment(tenant, allowAll, nil), 1, 0}}},
		{"TTL under a second expires at once", deny, []step{
			{0, assignment(tenant, allowAll, &durationpb.Duration{Nanos: 900_000_000}), 1, 0},
		}},
		{"TTL of 1.9 s is 1 s", deny, []step{
			{0, assignment(tenant, allowAll, durationpb.New(1900*time.Millisecond)), 1, 1},
			{time.Second, nil, 1, 0},
		}},
		{"a new action restarts the TTL", deny, []step{
			{0, assignment(tenant, allowAll, secs(2)), 1, 1},
			{1500 * time.Millisecond, assignment(tenant, allowAll, secs(2)), 1, 1},
			{1500 * time.Millisecond, nil, 1, 1},
			{500 * time.Millisecond, nil, 1, 0},
		}},
		{"fallback for its timeout, then no-assignment", withFallback(denyAll, 3*time.Second), []step{
			{0, assignment(tenant, allowAll, secs(1)), 1, 1},
			{time.Second, nil, 2, 0},
			{2999 * time.Millisecond, nil, 1, 0},
			{time.Millisecond, nil, 2, 2},
		}},
		{"fallback timeout is whole seconds: 0.5 s is none", withFallback(denyAll, 500*time.Millisecond), []step{
			{0, assignment(tenant, denyAll, secs(1)), 1, 0},
			{time.Second, nil, 2, 2},
		}},
		{"no fallback: back to no-assignment", Config{}, []step{
			{0, assignment(tenant, denyAll, secs(1)), 1, 0},
			{time.Second, nil, 2, 2},
		}},
		{"the same token bucket as fallback keeps its limiter", withFallback(tb(4, 1, 1000*time.Second), 60*time.Second), []step{
			{0, assignment(tenant, tb(4, 1, 1000*time.Second), secs(1)), 3, 3},
			{time.Second, nil, 3, 1},
		}},
		{"another token bucket as fallback keeps the fill fraction", withFallback(tb(8, 1, 1000*time.Second), 60*time.Second), []step{
			{0, assignment(tenant, tb(4, 1, 1000*time.Second), secs(1)), 2, 2},
			{time.Second, nil, 9, 4},
		}},
		{"a token bucket fallback after a blanket assignment starts full", withFallback(tb(3, 1, 1000*time.Second), 60*time.Second), []step{
			{0, assignment(tenant, denyAll, secs(1)), 1, 0},
			{time.Second, nil, 5, 3},
		}},
		{"an assignment during the fallback replaces it and its timeout", withFallback(denyAll, 3*time.Second), []step{
			{0, assignment(tenant, allowAll, secs(1)), 1, 1},
			{time.Second, assignment(tenant, denyAll, secs(10)), 1, 0},
			{5 * time.Second, nil, 1, 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runSteps(t, tc.cfg, tc.steps)
		})
	}
}

func TestAbandonErasesTheBucket(t *testing.T) {
	t.Parallel()
	e := start(t, Config{NoAssignment: denyAll}, false)
	s := e.first(tenant)
	e.respond(s, assignment(tenant, tb(2, 1, 1000*time.Second), secs(3600)))
	if got := e.allowN(tenant, 3); got != 2 {
		t.Fatalf("admitted %d of 3, want 2", got)
	}
	e.respond(s, abandon(tenant))
	e.tick()
	if r := e.report(); len(r.BucketQuotaUsages) != 0 || r.Domain != "edge" {
		t.Errorf("report after abandon = %v, want an empty one with the domain", r)
	}
	// A later request recreates it: no-assignment again, a new initial report,
	// and a token bucket that starts full.
	if e.m.Allow(tenant) {
		t.Error("recreated bucket admitted under DENY_ALL no-assignment")
	}
	if r := e.report(); len(r.BucketQuotaUsages) != 1 || r.BucketQuotaUsages[0].NumRequestsDenied != 1 {
		t.Errorf("initial report of the recreated bucket = %v", r)
	}
	e.respond(s, assignment(tenant, tb(2, 1, 1000*time.Second), secs(3600)))
	if got := e.allowN(tenant, 3); got != 2 {
		t.Errorf("recreated limiter admitted %d of 3, want 2 (full)", got)
	}
}

// TestConcurrentAllowAdmitsExactlyTheBucket: many goroutines on one token
// bucket, with the clock frozen, admit exactly max_tokens.
func TestConcurrentAllowAdmitsExactlyTheBucket(t *testing.T) {
	t.Parallel()
	e := start(t, Config{}, false)
	s := e.first(tenant)
	e.respond(s, assignment(tenant, tb(500, 1, 1000*time.Second), secs(3600)))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { e.allowN(tenant, 200) })
	}
	wg.Wait()
	if a, d := e.m.Totals(); a != 1+500 || d != 1600-500 {
		t.Errorf("Totals = %d allowed, %d denied; want 501, 1100", a, d)
	}
	slots := e.m.Admitted()
	if most, _ := slots.MaxWindow(10); most != 501 {
		t.Errorf("admitted in the busiest second = %d, want 501 (%+v)", most, slots)
	}
}
