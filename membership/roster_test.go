package membership

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// inst is one instance in a test catalog: node, service ID, passing.
type inst struct {
	node, id string
	passing  bool
}

func catalog(is ...inst) []*api.ServiceEntry {
	out := make([]*api.ServiceEntry, len(is))
	for i, x := range is {
		status := api.HealthCritical
		if x.passing {
			status = api.HealthPassing
		}
		out[i] = &api.ServiceEntry{
			Node:    &api.Node{Node: x.node},
			Service: &api.AgentService{ID: x.id, Service: "web"},
			Checks:  api.HealthChecks{{Status: status}},
		}
	}
	return out
}

// serving lists n instances web-1..web-n on node-1..node-n, passing or not.
func serving(from, to int, passing bool) []inst {
	var out []inst
	for i := from; i <= to; i++ {
		out = append(out, inst{fmt.Sprintf("node-%d", i), fmt.Sprintf("web-%d", i), passing})
	}
	return out
}

// shares is the weight each of the serving replicas 1..n takes when every
// one of them has watched the same answers through a roster of its own.
func shares(t *testing.T, rosters []*roster, answer []*api.ServiceEntry, now time.Time) []float64 {
	t.Helper()
	out := make([]float64, len(rosters))
	for i, r := range rosters {
		tl := r.observe(answer, fmt.Sprintf("node-%d", i+1), now, nil)
		w, err := Weight(tl.local, tl.total)
		if err != nil {
			t.Fatalf("replica %d: %+v: %v", i+1, tl, err)
		}
		out[i] = w
	}
	return out
}

func sum(ws []float64) float64 {
	s := 0.0
	for _, w := range ws {
		s += w
	}
	return s
}

func newRosters(n int, grace time.Duration) []*roster {
	rs := make([]*roster, n)
	for i := range rs {
		rs[i] = &roster{grace: grace}
	}
	return rs
}

// TestRosterKeepsTheCapThroughFaults replays, at the level of what each
// replica counts, the faults that opened the cap when only instances listed
// passing counted. Each step's answer is what every replica reads; the
// weights of the replicas that serve must sum to at most 1.
func TestRosterKeepsTheCapThroughFaults(t *testing.T) {
	const grace = 30 * time.Second
	t0 := time.Unix(1_000_000, 0)
	type step struct {
		at     time.Duration
		answer []inst
		// want is each serving replica's weight (AbsentWeight: not counted).
		want []float64
	}
	q := AbsentWeight
	cases := []struct {
		name    string
		serving int
		steps   []step
	}{
		{"newcomers serve before their checks pass (2 -> 6)", 6, []step{
			{0, append(serving(1, 2, true), serving(3, 6, false)...), []float64{1. / 6, 1. / 6, 1. / 6, 1. / 6, 1. / 6, 1. / 6}},
			{4 * time.Second, serving(1, 6, true), []float64{1. / 6, 1. / 6, 1. / 6, 1. / 6, 1. / 6, 1. / 6}},
		}},
		{"a check that flaps slower than the hold (critical 2.6 s, passing 0.4 s)", 2, []step{
			{0, serving(1, 2, true), []float64{.5, .5}},
			{400 * time.Millisecond, []inst{{"node-1", "web-1", true}, {"node-2", "web-2", false}}, []float64{.5, .5}},
			{3 * time.Second, serving(1, 2, true), []float64{.5, .5}},
			{3400 * time.Millisecond, []inst{{"node-1", "web-1", true}, {"node-2", "web-2", false}}, []float64{.5, .5}},
			{6 * time.Second, serving(1, 2, true), []float64{.5, .5}},
		}},
		{"Consul restarted empty, one node back 6 s before the others", 4, []step{
			{0, serving(1, 4, true), []float64{.25, .25, .25, .25}},
			{time.Second, serving(1, 1, true), []float64{.25, .25, .25, .25}},
			{7 * time.Second, serving(1, 4, true), []float64{.25, .25, .25, .25}},
		}},
		{"a catalog that lost most of its instances holds past the grace", 4, []step{
			{0, serving(1, 4, true), []float64{.25, .25, .25, .25}},
			{time.Second, serving(1, 1, true), []float64{.25, .25, .25, .25}},
			{2 * grace, serving(1, 1, true), []float64{.25, .25, .25, .25}},
			// Half of what is remembered listed passing: believable again,
			// and the two that are gone expire.
			{2*grace + time.Second, serving(1, 2, true), []float64{.5, .5, q, q}},
		}},
		{"a real scale-down by more than half is believed after panicGraces graces", 4, []step{
			{0, serving(1, 4, true), []float64{.25, .25, .25, .25}},
			{time.Second, serving(1, 1, true), []float64{.25, .25, .25, .25}},
			// They passed until the answer at 1 s that no longer listed them.
			{time.Second + panicGraces*grace - time.Millisecond, serving(1, 1, true), []float64{.25, .25, .25, .25}},
			{time.Second + panicGraces*grace, serving(1, 1, true), []float64{1, q, q, q}},
		}},
		{"a replica that died is taken over after the grace", 3, []step{
			{0, serving(1, 3, true), []float64{1. / 3, 1. / 3, 1. / 3}},
			{time.Second, append(serving(1, 2, true), serving(3, 3, false)...), []float64{1. / 3, 1. / 3, 1. / 3}},
			// It passed until the answer at 1 s that lists it failing.
			{time.Second + grace - time.Millisecond, append(serving(1, 2, true), serving(3, 3, false)...), []float64{1. / 3, 1. / 3, 1. / 3}},
			{time.Second + grace, append(serving(1, 2, true), serving(3, 3, false)...), []float64{.5, .5, q}},
		}},
		{"deregistered while it serves: counted for the grace, then no room", 3, []step{
			{0, serving(1, 3, true), []float64{1. / 3, 1. / 3, 1. / 3}},
			{time.Second, serving(1, 2, true), []float64{1. / 3, 1. / 3, 1. / 3}},
			{grace + time.Second, serving(1, 2, true), []float64{.5, .5, q}},
		}},
	}
	for _, k := range cases {
		t.Run(k.name, func(t *testing.T) {
			rs := newRosters(k.serving, grace)
			for i, s := range k.steps {
				got := shares(t, rs, catalog(s.answer...), t0.Add(s.at))
				for j := range got {
					if diff := got[j] - s.want[j]; diff > 1e-12 || diff < -1e-12 {
						t.Fatalf("step %d (%s): replica %d weight %v, want %v (all: %v)", i, s.at, j+1, got[j], s.want[j], got)
					}
				}
				if total := sum(got); total > 1+float64(k.serving)*AbsentWeight {
					t.Fatalf("step %d: the serving replicas' weights sum to %v", i, total)
				}
			}
		})
	}
}

// TestRosterWithoutGraceCountsWhatPasses: a grace of 0 counts the instances
// listed passing, and nothing else.
func TestRosterWithoutGraceCountsWhatPasses(t *testing.T) {
	var r roster
	t0 := time.Unix(1_000_000, 0)
	tl := r.observe(catalog(append(serving(1, 2, true), serving(3, 4, false)...)...), "node-3", t0, nil)
	if tl.total != 2 || tl.local != 0 {
		t.Fatalf("%+v; want 2 counted, none local", tl)
	}
}

// TestRosterNextExpiry: the watch must wake when an instance stops counting,
// though nothing in the catalog changes then.
func TestRosterNextExpiry(t *testing.T) {
	r := roster{grace: 10 * time.Second}
	t0 := time.Unix(1_000_000, 0)
	r.observe(catalog(serving(1, 2, true)...), "node-1", t0, nil)
	if d := r.nextExpiry(t0); d != 0 {
		t.Fatalf("all passing: next expiry in %s, want none", d)
	}
	r.observe(catalog(serving(1, 1, true)...), "node-1", t0.Add(3*time.Second), nil)
	// It passed until the answer that no longer lists it.
	if d := r.nextExpiry(t0.Add(4 * time.Second)); d != 9*time.Second {
		t.Fatalf("node-2 gone at 3 s: next expiry in %s, want 9s", d)
	}
	tl := r.observe(catalog(serving(1, 1, true)...), "node-1", t0.Add(13*time.Second), nil)
	if tl.total != 1 {
		t.Fatalf("at the expiry: %+v, want node-2 no longer counted", tl)
	}
}

// TestRosterNamelessEntriesCountOnlyWhileListed: entries without a service
// ID cannot be told apart across answers, so none is remembered.
func TestRosterNamelessEntriesCountOnlyWhileListed(t *testing.T) {
	r := roster{grace: time.Minute}
	t0 := time.Unix(1_000_000, 0)
	nameless := []*api.ServiceEntry{{Node: &api.Node{Node: "n"}}, {Node: &api.Node{Node: "n"}}, {Node: &api.Node{Node: "n"}}}
	if tl := r.observe(nameless, "n", t0, nil); tl.total != 3 || tl.local != 3 {
		t.Fatalf("%+v, want 3 of 3", tl)
	}
	if tl := r.observe(nameless[:1], "n", t0.Add(time.Second), nil); tl.total != 1 {
		t.Fatalf("%+v, want only the one listed", tl)
	}
}

// TestFakeFirstAnswerBelowTheExpectedCountIsSuspect: a replica that starts
// has no memory of the catalog. If its first answers list it among fewer
// instances than the view its state file saved, a catalog still partial (a
// Consul restarted empty, re-registering) would be its first view: alone in
// it, it would take the whole limit while its peers, remembering the others,
// keep a quarter each. Such answers are a fault until the catalog lists what
// was saved.
func TestFakeFirstAnswerBelowTheExpectedCountIsSuspect(t *testing.T) {
	t.Parallel()
	var full atomic.Bool
	f := newFake(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if full.Load() {
			reply(w, uint64(20+n), entries("node-a", "node-b", "node-c", "node-d"))
			return
		}
		reply(w, uint64(10+n), entries("node-a"))
	})
	saved := &View{Source: "consul", Total: 4, Local: 1, TotalWeight: 4, LocalWeight: 1, Weight: 0.25}
	c := watch(t, fast(ConsulConfig{Replicas: 1, Initial: saved, Grace: time.Minute}), newClient(t, f.addr(), ""))
	v := waitView(t, c, func(v View) bool { return v.Errors >= 2 }, "the partial answers reported")
	if v.Weight != 0.25 || v.Fault != FaultSuspect || !v.ObservedAt.IsZero() {
		t.Fatalf("first answers list 1 of the 4 saved: view %+v, want the saved view to stand, fault suspect", v)
	}
	full.Store(true)
	waitView(t, c, counts(4, 1), "the catalog complete")
}
