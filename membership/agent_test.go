package membership

// Tests against a real Consul agent (internal/consultest): the catalog, the
// blocking queries and the errors are Consul's own.

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/sharelimit/sharelimit/internal/consultest"
)

// TestAgentViewFollowsCatalog walks the catalog through registrations,
// deregistrations and check flips, and measures how long each change takes to
// reach the published view. The source runs with its production defaults
// (QueryRate 2/s, burst 3), so once the burst is spent a change may wait up
// to 500 ms for its query.
func TestAgentViewFollowsCatalog(t *testing.T) {
	t.Parallel()
	a := consultest.Start(t)
	var logs logBuffer
	// Grace -1 counts what is listed passing, step by step; the roster's
	// grace has TestAgentRosterGrace.
	c := watch(t, ConsulConfig{Service: "web", Node: "node-a", Stale: true, Replicas: 5, Logger: logs.logger(), Grace: -1},
		newClient(t, a.Addr(), ""))

	steps := []struct {
		name         string
		change       func()
		total, local int
	}{
		{"first instance, on this node", func() { a.RegisterInstance("node-a", "web-a1", "web", true) }, 1, 1},
		{"two more nodes: 1/N", func() {
			a.RegisterInstance("node-b", "web-b1", "web", true)
			a.RegisterInstance("node-c", "web-c1", "web", true)
		}, 3, 1},
		{"a second instance on this node", func() { a.RegisterInstance("node-a", "web-a2", "web", true) }, 4, 2},
		{"deregistered: this node holds 2 of 3", func() { a.Deregister("node-c", "web-c1") }, 3, 2},
		{"a local check fails", func() { a.SetCheck("node-a", "web-a1", false) }, 2, 1},
		{"and passes again", func() { a.SetCheck("node-a", "web-a1", true) }, 3, 2},
		{"a critical instance does not count", func() {
			a.RegisterInstance("node-d", "web-d1", "web", false)
			a.Deregister("node-b", "web-b1")
		}, 2, 2},
		{"until its check passes", func() { a.SetCheck("node-d", "web-d1", true) }, 3, 2},
		{"another service changes nothing", func() {
			a.RegisterInstance("node-a", "db-a1", "db", true)
			a.RegisterInstance("node-e", "web-e1", "web", true)
		}, 4, 2},
		{"this node leaves: it takes no room", func() {
			a.Deregister("node-a", "web-a1")
			a.Deregister("node-a", "web-a2")
		}, 2, 0},
	}
	// An empty catalog is not a view: the --replicas view stands, reported.
	v := waitView(t, c, func(v View) bool { return v.Errors >= 1 }, "the empty catalog reported")
	if v.Total != 5 || v.Weight != 0.2 || !strings.Contains(v.LastError, "none passing") || !v.ObservedAt.IsZero() {
		t.Fatalf("empty catalog: view = %+v; want the --replicas view (5, weight 1/5) to stand", v)
	}
	var latencies []time.Duration
	for i, s := range steps {
		start := time.Now()
		s.change()
		v := waitView(t, c, counts(s.total, s.local), "step %d (%s): total %d, local %d", i, s.name, s.total, s.local)
		took := time.Since(start)
		latencies = append(latencies, took)
		t.Logf("step %2d %-62s total %d local %d weight %.4f after %s", i, s.name, v.Total, v.Local, v.Weight, took.Round(100*time.Microsecond))
		if v.Source != "consul" || v.Node != "node-a" || v.ObservedAt.IsZero() || v.LastError != "" {
			t.Fatalf("step %d: view = %+v; want a confirmed consul view without errors", i, v)
		}
	}
	slices.Sort(latencies)
	t.Logf("catalog change → view latency over %d changes: median %s, max %s (target 1 s; QueryRate %v/s, burst %d)",
		len(latencies), latencies[len(latencies)/2].Round(100*time.Microsecond), latencies[len(latencies)-1].Round(100*time.Microsecond),
		DefaultQueryRate, DefaultQueryBurst)

	// After a quiet spell the token bucket is full again and a change costs
	// only the blocking query's return.
	time.Sleep(time.Duration(float64(DefaultQueryBurst) / DefaultQueryRate * float64(time.Second)))
	start := time.Now()
	a.RegisterInstance("node-f", "web-f1", "web", true)
	waitView(t, c, counts(3, 0), "one more instance after a quiet spell")
	t.Logf("catalog change → view latency after a quiet spell: %s", time.Since(start).Round(100*time.Microsecond))

	// One info line per observed change, never one per poll: the steps make
	// 11 to 15 changes to web's instances (a step with two writes may be seen
	// as one change or two).
	out := logs.String()
	if n := strings.Count(out, "level=INFO msg=\"consul membership: view changed\""); n < 11 || n > 15 {
		t.Errorf("%d view-change lines at info:\n%s", n, out)
	}
}

// TestAgentOutage stops the agent under a running watch: the last view must
// stand, with the error reported, and a fresh agent on the same address must
// bring the view back.
func TestAgentOutage(t *testing.T) {
	t.Parallel()
	a := consultest.Start(t)
	cfg := ConsulConfig{
		Service: "web", Node: "node-a", Stale: true,
		BackoffBase: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond,
	}
	c := watch(t, cfg, newClient(t, a.Addr(), ""))
	a.RegisterInstance("node-a", "web-a1", "web", true)
	a.RegisterInstance("node-b", "web-b1", "web", true)
	good := waitView(t, c, counts(2, 1), "two instances")

	a.Stop()
	down := waitView(t, c, func(v View) bool { return v.Errors >= 3 }, "three failed requests against the stopped agent")
	if down.Total != 2 || down.Local != 1 || down.Weight != 0.5 || !down.ObservedAt.Equal(good.ObservedAt) || down.LastError == "" {
		t.Fatalf("view with the agent down = %+v; want the last good view (%+v) with LastError set", down, good)
	}
	t.Logf("agent down: %s", down.LastError)
	later := waitView(t, c, func(v View) bool { return v.Errors > down.Errors }, "errors to keep counting")
	if later.Total != 2 || !later.ObservedAt.Equal(good.ObservedAt) {
		t.Fatalf("view drifted while the agent was down: %+v", later)
	}

	a.Restart()
	start := time.Now()
	a.RegisterInstance("node-a", "web-a1", "web", true)
	a.RegisterInstance("node-b", "web-b1", "web", true)
	a.RegisterInstance("node-c", "web-c1", "web", true)
	back := waitView(t, c, counts(3, 1), "three instances on the fresh agent")
	t.Logf("recovered %s after the fresh agent's registrations (back-off cap %s)", time.Since(start).Round(time.Millisecond), cfg.BackoffMax)
	if back.LastError != "" || !back.ObservedAt.After(good.ObservedAt) || back.Errors < later.Errors {
		t.Fatalf("view after recovery = %+v; want no LastError, a newer ObservedAt, the errors still counted", back)
	}
}

// TestAgentNodeFromAgentSelf leaves Node empty: the agent's own node name is
// the local node.
func TestAgentNodeFromAgentSelf(t *testing.T) {
	t.Parallel()
	a := consultest.Start(t)
	own := a.NodeName()
	a.RegisterInstance(own, "web-1", "web", true)
	a.RegisterInstance("node-b", "web-2", "web", true)
	c := watch(t, ConsulConfig{Service: "web", Grace: time.Second}, newClient(t, a.Addr(), ""))
	v := waitView(t, c, counts(2, 1), "one of two instances on the agent's node")
	if v.Node != own {
		t.Fatalf("view node = %q, want the agent's %q", v.Node, own)
	}
	a.SetCheck(own, "web-1", false)
	// Counted for its grace, then not: the watch sees the expiry when it
	// falls due, though the catalog does not change again.
	waitView(t, c, counts(1, 0), "the local instance failing, past its grace")
}

// TestAgentQueryOptions runs the options Consul itself must interpret: a
// filter, a datacenter that does not exist, a filter it cannot parse.
func TestAgentQueryOptions(t *testing.T) {
	t.Parallel()
	a := consultest.Start(t)
	for _, r := range []struct {
		node, id string
		tags     []string
	}{
		{"node-a", "web-1", []string{"canary"}},
		{"node-b", "web-2", []string{"canary"}},
		{"node-c", "web-3", nil},
	} {
		_, err := a.Client().Catalog().Register(&api.CatalogRegistration{
			Node: r.node, Address: "127.0.0.1",
			Service: &api.AgentService{ID: r.id, Service: "web", Tags: r.tags},
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name    string
		cfg     ConsulConfig
		want    func(View) bool
		wantErr string
	}{
		{name: "no filter", cfg: ConsulConfig{}, want: counts(3, 1)},
		{name: "filter on a tag", cfg: ConsulConfig{Filter: `Service.Tags contains "canary"`}, want: counts(2, 1)},
		{name: "filter matching nothing", cfg: ConsulConfig{Filter: `Node.Node == "node-z"`}, wantErr: "none passing"},
		{name: "stale read", cfg: ConsulConfig{Stale: true}, want: counts(3, 1)},
		{name: "the agent's own datacenter", cfg: ConsulConfig{Datacenter: "dc1"}, want: counts(3, 1)},
		{name: "wrong datacenter", cfg: ConsulConfig{Datacenter: "nope"}, wantErr: "No path to datacenter"},
		// The agent words a filter it cannot parse two ways, by the path
		// that served the query ("Failed to create boolean expression: ..."
		// or the parser's own "1:16 (15): no match found, ..."); both end
		// in the parser's words.
		{name: "unparsable filter", cfg: ConsulConfig{Filter: "Service.Tags =="}, wantErr: "no match found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := tc.cfg
			// No grace: a first answer listing fewer instances than
			// --replicas would be suspect (FaultSuspect) for ten graces,
			// and a filter lists fewer; the query options are under test.
			cfg.Service, cfg.Node, cfg.Replicas, cfg.Grace = "web", "node-a", 4, -1
			cfg.BackoffBase, cfg.BackoffMax = 20*time.Millisecond, 100*time.Millisecond
			c := watch(t, cfg, newClient(t, a.Addr(), ""))
			if tc.wantErr == "" {
				waitView(t, c, tc.want, "the filtered count")
				return
			}
			v := waitView(t, c, func(v View) bool { return v.Errors >= 2 }, "two errors")
			if !strings.Contains(v.LastError, tc.wantErr) || v.Total != 4 || !v.ObservedAt.IsZero() {
				t.Fatalf("view = %+v; want the --replicas view to stand and LastError to contain %q", v, tc.wantErr)
			}
		})
	}
}
