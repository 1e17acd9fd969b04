package membership

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/sharelimit/sharelimit/internal/consultest"
	"github.com/sharelimit/sharelimit/internal/testutil"
)

// weighed matches a view's counts, summed weights and share.
func weighed(total, local, totalWeight, localWeight int, weight float64) func(View) bool {
	return func(v View) bool {
		return v.Total == total && v.Local == local && v.TotalWeight == totalWeight &&
			v.LocalWeight == localWeight && math.Abs(v.Weight-weight) < 1e-12
	}
}

// registerWeighted registers an instance on an external node with the
// given Weights.Passing, through the agent's catalog API.
func registerWeighted(t *testing.T, a *consultest.Agent, node, id string, weight int, passing bool) {
	t.Helper()
	status := api.HealthCritical
	if passing {
		status = api.HealthPassing
	}
	_, err := a.Client().Catalog().Register(&api.CatalogRegistration{
		Node: node, Address: "127.0.0.1",
		Service: &api.AgentService{ID: id, Service: "web", Weights: api.AgentWeights{Passing: weight, Warning: 1}},
		Check: &api.AgentCheck{
			Node: node, CheckID: "service:" + id, Name: "weights " + id, Status: status, ServiceID: id,
		},
	}, nil)
	if err != nil {
		t.Fatalf("register %s/%s with weight %d: %v", node, id, weight, err)
	}
}

// TestAgentWeights runs one watch per point of view against a catalog whose
// instances carry Consul service weights: node-a's instance weighs 1 and
// node-b's 3, so their shares are 1/4 and 3/4, not 1/2 each.
func TestAgentWeights(t *testing.T) {
	t.Parallel()
	a := consultest.Start(t)
	registerWeighted(t, a, "node-a", "web-a", 1, true)
	registerWeighted(t, a, "node-b", "web-b", 3, true)

	type step struct {
		total, local, totalWeight, localWeight int
		weight                                 float64
	}
	watchers := []struct {
		name          string
		node          string
		ignoreWeights bool
		want          []step // one per phase below
	}{
		{"weight 1 of 4", "node-a", false, []step{{2, 1, 4, 1, 0.25}, {3, 1, 5, 1, 0.2}, {2, 1, 2, 1, 0.5}}},
		{"weight 3 of 4", "node-b", false, []step{{2, 1, 4, 3, 0.75}, {3, 1, 5, 3, 0.6}, {2, 0, 2, 0, AbsentWeight}}},
		// Not listed: its peers leave it no room, so it takes next to
		// nothing.
		{"absent node takes no room", "node-z", false, []step{{2, 0, 4, 0, AbsentWeight}, {3, 0, 5, 0, AbsentWeight}, {2, 0, 2, 0, AbsentWeight}}},
		{"weights off", "node-b", true, []step{{2, 1, 2, 1, 0.5}, {3, 1, 3, 1, 1.0 / 3}, {2, 0, 2, 0, AbsentWeight}}},
	}
	cs := make([]*Consul, len(watchers))
	for i, w := range watchers {
		// Grace -1: a failing check drops its instance at once, the
		// weights being what is under test here.
		cs[i] = watch(t, ConsulConfig{Service: "web", Node: w.node, IgnoreWeights: w.ignoreWeights, Grace: -1}, newClient(t, a.Addr(), ""))
	}
	phases := []struct {
		name   string
		change func()
	}{
		{"weights 1 and 3", func() {}},
		// A real agent stores a weight of 0 as 1: no catalog answer carries
		// one, which is why the 0 and negative cases run against a fake.
		{"a third instance registered with weight 0", func() { registerWeighted(t, a, "node-c", "web-c", 0, true) }},
		{"node-b's instance fails its check", func() { registerWeighted(t, a, "node-b", "web-b", 3, false) }},
	}
	for p, ph := range phases {
		ph.change()
		for i, w := range watchers {
			s := w.want[p]
			v := waitView(t, cs[i], weighed(s.total, s.local, s.totalWeight, s.localWeight, s.weight),
				"%s, %s: %+v", ph.name, w.name, s)
			t.Logf("%-42s %-34s total %d (weight %d) local %d (weight %d): share %.4f", ph.name, w.name,
				v.Total, v.TotalWeight, v.Local, v.LocalWeight, v.Weight)
		}
	}
}

// weightedEntries renders a health answer: one passing instance per
// "node/id=weight" item; "node/id" alone has no Weights at all, as an
// answer from a Consul without weights would.
func weightedEntries(items ...string) []byte {
	type entry struct {
		Node    struct{ Node string }
		Service map[string]any
		Checks  []struct{ Status string }
	}
	out := make([]entry, len(items))
	for i, it := range items {
		name, weight, hasWeight := strings.Cut(it, "=")
		node, id, _ := strings.Cut(name, "/")
		out[i].Node.Node = node
		out[i].Service = map[string]any{"ID": id, "Service": "web"}
		if hasWeight {
			var w int
			fmt.Sscan(weight, &w)
			out[i].Service["Weights"] = map[string]int{"Passing": w, "Warning": 1}
		}
		out[i].Checks = []struct{ Status string }{{"passing"}}
	}
	b, err := json.Marshal(out)
	if err != nil {
		panic(err)
	}
	return b
}

// TestFakeInvalidWeights feeds weights a real agent never stores (it turns
// 0 and negatives into 1): each counts as 1, with one warning per instance
// however many answers repeat it, and never a division by zero or a looser
// share. A sum too large to hold exactly is a fault: the last view stands.
func TestFakeInvalidWeights(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		body     []byte
		want     func(View) bool
		warnings []string // instances warned about, once each
		wantErr  string
	}{
		{
			name: "peers with weight 0 and negative count 1",
			body: weightedEntries("node-a/web-a=2", "node-b/web-b=0", "node-c/web-c=-4"),
			want: weighed(3, 1, 4, 2, 0.5), warnings: []string{"web-b", "web-c"},
		},
		{
			name: "a local weight of 0 counts 1, not 0",
			body: weightedEntries("node-a/web-a=0", "node-b/web-b=3"),
			want: weighed(2, 1, 4, 1, 0.25), warnings: []string{"web-a"},
		},
		{
			name: "every weight 0: no division by zero",
			body: weightedEntries("node-a/web-a=0", "node-b/web-b=0"),
			want: weighed(2, 1, 2, 1, 0.5), warnings: []string{"web-a", "web-b"},
		},
		{
			name: "no Weights at all counts 1",
			body: weightedEntries("node-a/web-a", "node-b/web-b=1"),
			want: weighed(2, 1, 2, 1, 0.5), warnings: []string{"web-a"},
		},
		{
			name: "a sum past 2^53",
			body: weightedEntries("node-a/web-a=1", fmt.Sprintf("node-b/web-b=%d", int64(1)<<53)),
			want: func(v View) bool { return v.Errors >= 2 }, wantErr: "weight",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if n == 0 {
					reply(w, 10, weightedEntries("node-a/web-a=1", "node-b/web-b=1", "node-c/web-c=1", "node-d/web-d=1"))
					return
				}
				// A new index every time: a changing catalog, so every answer
				// is read and counted again.
				hold(r, 5*time.Millisecond)
				reply(w, uint64(10+n), tc.body)
			})
			var logs logBuffer
			c := watch(t, fast(ConsulConfig{Logger: logs.logger()}), newClient(t, f.addr(), ""))
			first := waitView(t, c, weighed(4, 1, 4, 1, 0.25), "the first answer")
			v := waitView(t, c, tc.want, "the answer under test")
			testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return f.count() >= 8 }, "several more answers"))
			out := logs.String()
			if tc.wantErr != "" {
				if !strings.Contains(v.LastError, tc.wantErr) || v.Weight != first.Weight || !v.ObservedAt.Equal(first.ObservedAt) {
					t.Fatalf("view = %+v; want the first view to stand with an error about the %s", v, tc.wantErr)
				}
				return
			}
			if !tc.want(c.View()) {
				t.Fatalf("view drifted to %+v", c.View())
			}
			warns := strings.Count(out, "level=WARN")
			if warns != len(tc.warnings) {
				t.Errorf("%d warnings after %d answers, want %d (one per instance):\n%s", warns, f.count(), len(tc.warnings), out)
			}
			for _, id := range tc.warnings {
				if !strings.Contains(out, "service_id="+id) {
					t.Errorf("no warning names %s:\n%s", id, out)
				}
			}
		})
	}
}

// TestWeighProperties builds random weighted catalogs, some weights below 1,
// and checks the path from entries to shares: every node's share lies in
// (0, 1], the shares of the nodes listed add up to one whole limit (never
// more, or the cluster admits more than the cap), a node not listed counts
// itself in at weight 1, and with weights off the shares are the counted
// ones.
func TestWeighProperties(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	byWeight := func(e *api.ServiceEntry) int { w, _ := passingWeight(e); return w }
	const eps = 1e-9
	for range 2000 {
		nodes := 1 + rng.IntN(12)
		var entries []*api.ServiceEntry
		for i := range 1 + rng.IntN(40) {
			status := api.HealthPassing
			if rng.IntN(5) == 0 {
				status = api.HealthCritical
			}
			entries = append(entries, &api.ServiceEntry{
				Node:    &api.Node{Node: fmt.Sprintf("node-%d", rng.IntN(nodes))},
				Service: &api.AgentService{ID: fmt.Sprintf("web-%d", i), Weights: api.AgentWeights{Passing: rng.IntN(12) - 2}},
				Checks:  api.HealthChecks{{Status: status}},
			})
		}
		sum, listed := 0.0, 0
		var total tally
		for n := range nodes {
			tl := countListed(entries, fmt.Sprintf("node-%d", n), byWeight)
			total = tl
			if tl.total == 0 {
				break
			}
			w, err := weigh(tl)
			if err != nil || w <= 0 || w > 1 {
				t.Fatalf("weigh(%+v) = %v, %v; want a share in (0, 1]", tl, w, err)
			}
			counted, _ := Weight(tl.local, tl.total)
			if plain := countListed(entries, fmt.Sprintf("node-%d", n), nil); plain.totalWeight != plain.total {
				t.Fatalf("weights off: %+v", plain)
			} else if w2, _ := weigh(plain); w2 != counted {
				t.Fatalf("weights off: share %v, want the counted %v", w2, counted)
			}
			if tl.local > 0 {
				sum += w
				listed++
			} else if w != AbsentWeight {
				t.Fatalf("node-%d not listed: share %v, want AbsentWeight: its peers leave it no room", n, w)
			}
		}
		if total.total > 0 && math.Abs(sum-1) > eps {
			t.Fatalf("%d listed nodes' shares sum to %v, want 1 (%+v)", listed, sum, total)
		}
	}
}

// TestWeightsOfServingReplicasSumToAtMostOne is the invariant that decides
// every other case: over all replicas that serve, the weights in force sum
// to at most 1, whichever of them the catalog lists. Every listed replica
// takes its part of the listed weight; every replica the catalog does not
// list (it serves all the same) takes AbsentWeight, so the sum exceeds 1 by
// at most AbsentWeight per unlisted replica, far under one request.
func TestWeightsOfServingReplicasSumToAtMostOne(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	for range 20_000 {
		serving := 1 + rng.IntN(50)
		weights := make([]int, serving)
		listedWeight, unlisted := 0, 0
		for i := range weights {
			if rng.IntN(3) == 0 {
				unlisted++
				continue
			}
			weights[i] = 1 + rng.IntN(100)
			listedWeight += weights[i]
		}
		if listedWeight == 0 {
			continue
		}
		sum := 0.0
		for _, w := range weights {
			share, err := Weight(w, listedWeight)
			if err != nil {
				t.Fatal(err)
			}
			sum += share
		}
		if sum > 1+float64(unlisted)*AbsentWeight+1e-12 {
			t.Fatalf("%d serving, %d unlisted, weights %v: shares sum to %v", serving, unlisted, weights, sum)
		}
	}
}
