package membership

import (
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

func TestWeight(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		local, total int
		want         float64
	}{
		{"alone", 1, 1, 1},
		{"one of three nodes", 1, 3, 1.0 / 3},
		{"one of a hundred", 1, 100, 0.01},
		{"node holding 2 of 3", 2, 3, 2.0 / 3},
		{"node holding all", 4, 4, 1},
		// Its peers leave it no room: it takes next to nothing.
		{"node absent", 0, 3, AbsentWeight},
		{"node absent, one other", 0, 1, AbsentWeight},
		{"absurd count", 1, 100_000, 1e-5},
		{"absent from the largest count", 0, math.MaxInt, AbsentWeight},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := Weight(tc.local, tc.total)
			if err != nil {
				t.Fatalf("Weight(%d, %d) = %v", tc.local, tc.total, err)
			}
			if math.Abs(got-tc.want) > 1e-12 {
				t.Fatalf("Weight(%d, %d) = %v, want %v", tc.local, tc.total, got, tc.want)
			}
			if got <= 0 || got > 1 {
				t.Fatalf("Weight(%d, %d) = %v, outside (0, 1]", tc.local, tc.total, got)
			}
		})
	}
}

// TestWeightImpossible pins that a count no catalog can produce is an error,
// never a share: the old answer, 1, made every replica enforce each limit
// whole.
func TestWeightImpossible(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		local, total int
	}{
		{"nothing passing", 0, 0},
		{"local but no total", 1, 0},
		{"negative total", 0, -5},
		{"negative total and local", -1, -1},
		{"negative local", -1, 2},
		{"local above total", 3, 2},
		{"local far above total", math.MaxInt, 1},
		{"most negative local", math.MinInt, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w, err := Weight(tc.local, tc.total)
			if !errors.Is(err, ErrImpossibleCount) {
				t.Fatalf("Weight(%d, %d) = %v, %v; want ErrImpossibleCount", tc.local, tc.total, w, err)
			}
			if w != 0 {
				t.Fatalf("Weight(%d, %d) = %v with an error; want 0, so a careless caller gets no share", tc.local, tc.total, w)
			}
		})
	}
}

// TestWeightProperties checks, over random counts, that a weight exists
// exactly for the counts a catalog can hold, that it lies in (0, 1], and that
// however the instances are spread over nodes the nodes' shares add up to one
// whole limit: never more, or the cluster admits more than the cap.
func TestWeightProperties(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	const eps = 1e-9
	for range 20_000 {
		local, total := rng.IntN(40)-5, rng.IntN(40)-5
		if rng.IntN(10) == 0 {
			local, total = int(rng.Int64()), int(rng.Int64())
		}
		w, err := Weight(local, total)
		possible := local >= 0 && total > 0 && local <= total
		if (err == nil) != possible {
			t.Fatalf("Weight(%d, %d) = %v, %v; want an error exactly when the count is impossible", local, total, w, err)
		}
		if err == nil && (w <= 0 || w > 1) {
			t.Fatalf("Weight(%d, %d) = %v, outside (0, 1]", local, total, w)
		}
		if err == nil && local == 0 && w != AbsentWeight {
			t.Fatalf("Weight(0, %d) = %v, want AbsentWeight", total, w)
		}
	}
	for range 5_000 {
		// Spread total instances over nodes, each holding at least one.
		total := 1 + rng.IntN(500)
		var locals []int
		for left := total; left > 0; {
			n := 1 + rng.IntN(min(left, 1+rng.IntN(20)))
			locals = append(locals, n)
			left -= n
		}
		sum := 0.0
		for _, l := range locals {
			w, err := Weight(l, total)
			if err != nil {
				t.Fatalf("Weight(%d, %d) = %v", l, total, err)
			}
			sum += w
		}
		if sum > 1+eps || sum < 1-eps {
			t.Fatalf("nodes holding %v of %d instances have shares summing to %v, want 1", locals, total, sum)
		}
	}
}

func TestStatic(t *testing.T) {
	t.Parallel()
	tests := []struct {
		replicas  int
		wantTotal int
		want      float64
	}{
		{replicas: 1, wantTotal: 1, want: 1},
		{replicas: 4, wantTotal: 4, want: 0.25},
		{replicas: 0, wantTotal: 1, want: 1},
		{replicas: -3, wantTotal: 1, want: 1},
	}
	for _, tc := range tests {
		v := NewStatic(tc.replicas).View()
		if v.Source != "static" || v.Total != tc.wantTotal || v.Local != 1 || v.Weight != tc.want {
			t.Errorf("NewStatic(%d).View() = %+v, want static total %d local 1 weight %v", tc.replicas, v, tc.wantTotal, tc.want)
		}
		if !v.ObservedAt.IsZero() || v.LastError != "" || v.Errors != 0 {
			t.Errorf("NewStatic(%d).View() = %+v, want no observation and no error", tc.replicas, v)
		}
	}
}

func TestTokenBucket(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type step struct {
		at   time.Time
		want time.Duration
	}
	tests := []struct {
		name  string
		rate  float64
		burst int
		steps []step
	}{
		{
			name: "burst then one per interval", rate: 2, burst: 3,
			steps: []step{{at(0), 0}, {at(0), 0}, {at(0), 0}, {at(0), 500 * time.Millisecond}, {at(0), time.Second}},
		},
		{
			name: "refills with time but never above burst", rate: 10, burst: 2,
			steps: []step{{at(0), 0}, {at(0), 0}, {at(10_000), 0}, {at(10_000), 0}, {at(10_000), 100 * time.Millisecond}},
		},
		{
			name: "partial refill shortens the wait", rate: 1, burst: 1,
			steps: []step{{at(0), 0}, {at(400), 600 * time.Millisecond}},
		},
		{
			name: "a clock stepping back adds nothing", rate: 1, burst: 1,
			steps: []step{{at(5_000), 0}, {at(0), time.Second}, {at(4_000), 2 * time.Second}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newTokenBucket(tc.rate, tc.burst)
			for i, s := range tc.steps {
				if got := b.reserve(s.at); (got - s.want).Abs() > time.Microsecond {
					t.Fatalf("step %d: reserve = %v, want %v", i, got, s.want)
				}
			}
		})
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	base, ceiling := 500*time.Millisecond, 30*time.Second
	tests := []struct {
		attempt int
		r       float64
		want    time.Duration
	}{
		{0, 0, 0},
		{0, 0.5, 250 * time.Millisecond},
		{0, 0.999, 499500 * time.Microsecond},
		{1, 0.5, 500 * time.Millisecond},
		{3, 0.5, 2 * time.Second},
		{6, 0.5, 15 * time.Second}, // 32 s capped at 30 s
		{1000, 0.5, 15 * time.Second},
		{1000, 0.999, 29970 * time.Millisecond},
	}
	for _, tc := range tests {
		if got := backoff(tc.attempt, base, ceiling, tc.r); (got - tc.want).Abs() > time.Microsecond {
			t.Errorf("backoff(%d, r=%v) = %v, want %v", tc.attempt, tc.r, got, tc.want)
		}
	}
}

func TestNextIndex(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name            string
		prev, got, want uint64
	}{
		{"first answer", 0, 42, 42},
		{"unchanged after a wait", 42, 42, 42},
		{"moved on", 42, 50, 50},
		{"went backwards resets", 42, 7, 0},
		{"zero is never blocked on", 42, 0, 0},
		{"zero from the start", 0, 0, 0},
	}
	for _, tc := range tests {
		if got := nextIndex(tc.prev, tc.got); got != tc.want {
			t.Errorf("%s: nextIndex(%d, %d) = %d, want %d", tc.name, tc.prev, tc.got, got, tc.want)
		}
	}
}

// TestCountPassing pins the counting and weighing of recorded and hand-made
// answers, as the api client decodes them: counts, then summed weights (each
// instance at its Weights.Passing, or 1 where it has none).
func TestCountPassing(t *testing.T) {
	t.Parallel()
	tests := []struct {
		file                     string
		node                     string
		total, local             int
		totalWeight, localWeight int
		decodeErr                bool
	}{
		{file: "consul-1.14-three-passing.json", node: "node-a", total: 3, local: 2, totalWeight: 3, localWeight: 2},
		{file: "consul-1.14-three-passing.json", node: "node-b", total: 3, local: 1, totalWeight: 3, localWeight: 1},
		{file: "consul-1.14-three-passing.json", node: "node-z", total: 3, local: 0, totalWeight: 3, localWeight: 0},
		{file: "consul-1.14-three-passing.json", node: "", total: 3, local: 0, totalWeight: 3, localWeight: 0},
		// Without ?passing, the critical instance must still not count.
		{file: "consul-1.14-with-critical.json", node: "node-c", total: 3, local: 0, totalWeight: 3, localWeight: 0},
		// Weights 1 and 2 on node-a, 3 on node-b, 5 on node-c (critical).
		{file: "consul-1.14-weighted.json", node: "node-a", total: 3, local: 2, totalWeight: 6, localWeight: 3},
		{file: "consul-1.14-weighted.json", node: "node-b", total: 3, local: 1, totalWeight: 6, localWeight: 3},
		{file: "consul-1.14-weighted.json", node: "node-c", total: 3, local: 0, totalWeight: 6, localWeight: 0},
		{file: "consul-1.14-empty.json", node: "node-a"},
		{file: "null.json", node: "node-a"},
		{file: "null-entry-and-node.json", node: "node-a", total: 1, local: 0, totalWeight: 1, localWeight: 0},
		{file: "case-and-aggregate.json", node: "node-a", total: 1, local: 1, totalWeight: 1, localWeight: 1},
		{file: "truncated.json", decodeErr: true},
		{file: "proxy-error.html", decodeErr: true},
		{file: "object-not-array.json", decodeErr: true},
		{file: "wrong-element-types.json", decodeErr: true},
	}
	byWeight := func(e *api.ServiceEntry) int { w, _ := passingWeight(e); return w }
	for _, tc := range tests {
		t.Run(tc.file+"/"+tc.node, func(t *testing.T) {
			t.Parallel()
			body, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			var entries []*api.ServiceEntry
			err = json.Unmarshal(body, &entries)
			if tc.decodeErr {
				if err == nil {
					t.Fatalf("decoding %s succeeded; the fixture is meant to be undecodable", tc.file)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			counted := countListed(entries, tc.node, nil)
			if want := (tally{tc.total, tc.local, tc.total, tc.local}); counted != want {
				t.Fatalf("countListed(%s, %q, nil) = %+v; want %+v", tc.file, tc.node, counted, want)
			}
			weighed := countListed(entries, tc.node, byWeight)
			if want := (tally{tc.total, tc.local, tc.totalWeight, tc.localWeight}); weighed != want {
				t.Fatalf("countListed(%s, %q, by weight) = %+v; want %+v", tc.file, tc.node, weighed, want)
			}
		})
	}
}

func TestScrub(t *testing.T) {
	t.Parallel()
	c := &Consul{cfg: ConsulConfig{Token: "s3cr3t"}}
	if got := c.scrub("403: token s3cr3t denied (s3cr3t)"); got != "403: token [redacted] denied ([redacted])" {
		t.Errorf("scrub = %q", got)
	}
	long := c.scrub(strings.Repeat("é", 1000) + "s3cr3t")
	if strings.Contains(long, "s3cr3t") || len(long) > maxErrorLen+len("…(truncated)") || !strings.HasSuffix(long, "…(truncated)") {
		t.Errorf("scrub of a long message = %q (%d bytes)", long, len(long))
	}
	if !strings.HasPrefix(long, "é") || strings.ContainsRune(long, '\uFFFD') {
		t.Errorf("scrub cut a rune in half: %q", long[:10])
	}
	if got := (&Consul{}).scrub("no token configured"); got != "no token configured" {
		t.Errorf("scrub without a token = %q", got)
	}
}

func TestNewConsulValidation(t *testing.T) {
	t.Parallel()
	client := newClient(t, "127.0.0.1:1", "")
	tests := []struct {
		name    string
		cfg     ConsulConfig
		client  *api.Client
		wantErr string
	}{
		{name: "no service", cfg: ConsulConfig{}, client: client, wantErr: "service name is empty"},
		{name: "nil client", cfg: ConsulConfig{Service: "web"}, wantErr: "nil client"},
		{name: "negative rate", cfg: ConsulConfig{Service: "web", QueryRate: -1}, client: client, wantErr: "query rate"},
		{name: "infinite rate", cfg: ConsulConfig{Service: "web", QueryRate: math.Inf(1)}, client: client, wantErr: "query rate"},
		{name: "NaN rate", cfg: ConsulConfig{Service: "web", QueryRate: math.NaN()}, client: client, wantErr: "query rate"},
		{name: "negative burst", cfg: ConsulConfig{Service: "web", QueryBurst: -1}, client: client, wantErr: "query burst"},
		{name: "wait above Consul's cap", cfg: ConsulConfig{Service: "web", WaitTime: 11 * time.Minute}, client: client, wantErr: "wait time"},
		{name: "timeout inside the wait", cfg: ConsulConfig{Service: "web", WaitTime: time.Second, RequestTimeout: time.Second}, client: client, wantErr: "does not exceed"},
		{name: "back-off max below base", cfg: ConsulConfig{Service: "web", BackoffBase: time.Second, BackoffMax: time.Millisecond}, client: client, wantErr: "below its base"},
		{name: "negative max instances", cfg: ConsulConfig{Service: "web", MaxInstances: -1}, client: client, wantErr: "max instances"},
		{name: "every problem at once", cfg: ConsulConfig{QueryRate: -1, QueryBurst: -1}, client: client, wantErr: "service name is empty\nquery rate -1 is not a finite positive number\nquery burst -1 is negative"},
		{name: "zero values take defaults", cfg: ConsulConfig{Service: "web"}, client: client},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := NewConsul(tc.cfg, tc.client)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("NewConsul = %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := c.cfg
			want := ConsulConfig{
				Service: "web", QueryRate: DefaultQueryRate, QueryBurst: DefaultQueryBurst,
				WaitTime: DefaultWaitTime, RequestTimeout: DefaultWaitTime + DefaultWaitTime/16 + requestSlack,
				BackoffBase: DefaultBackoffBase, BackoffMax: DefaultBackoffMax, MaxInstances: DefaultMaxInstances,
			}
			if got.QueryRate != want.QueryRate || got.QueryBurst != want.QueryBurst || got.WaitTime != want.WaitTime ||
				got.RequestTimeout != want.RequestTimeout || got.BackoffBase != want.BackoffBase ||
				got.BackoffMax != want.BackoffMax || got.MaxInstances != want.MaxInstances {
				t.Fatalf("defaults = %+v, want %+v", got, want)
			}
		})
	}
}

func TestInitialViewIsReplicas(t *testing.T) {
	t.Parallel()
	c, err := NewConsul(ConsulConfig{Service: "web", Replicas: 4, Node: "n1"}, newClient(t, "127.0.0.1:1", ""))
	if err != nil {
		t.Fatal(err)
	}
	v := c.View()
	if v.Source != "consul" || v.Total != 4 || v.Local != 1 || v.Weight != 0.25 || !v.ObservedAt.IsZero() || v.Node != "n1" {
		t.Fatalf("initial view = %+v; want consul, 4 replicas, weight 1/4, never observed", v)
	}
}

func TestRunTwice(t *testing.T) {
	t.Parallel()
	c := watch(t, ConsulConfig{Service: "web", Node: "n1", BackoffBase: time.Hour}, newClient(t, "127.0.0.1:1", ""))
	// The first Run owns the source; give it a moment to claim it.
	testutil.Eventually(t, 30*time.Second, testutil.Cond(c.running.Load, "the first Run to start"))
	if err := c.Run(t.Context()); !errors.Is(err, ErrRunning) {
		t.Fatalf("second Run = %v, want ErrRunning", err)
	}
}
