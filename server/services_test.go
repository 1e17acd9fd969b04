package server

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/engine"
)

// servicesAdmin serves the admin pages of an engine with two domains: a in
// the default view (static, 4 replicas) and b in service "payments" (2 of
// weight 4 in total, 1 here, a grow held). a also has a share: replica guard.
func servicesAdmin(t *testing.T) *httptest.Server {
	t.Helper()
	set, err := descriptors.Compile(
		descriptors.File{Name: "a.yaml", Data: []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100}\n" +
			"  - key: guard\n    rate_limit: {unit: second, requests_per_unit: 10, share: replica}\n")},
		descriptors.File{Name: "b.yaml", Data: []byte("domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100}\n")},
	)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixtureEngine(t, Options{}, engine.Options{Weight: 0.25, Groups: []engine.Group{{Domains: []string{"b"}, Weight: 0.25}}}, set)
	at := time.Date(2026, 12, 3, 12, 0, 2, 0, time.UTC)
	views := []View{
		{Source: "static", Total: 4, Local: 1, TotalWeight: 4, LocalWeight: 1, Weight: 0.25},
		{Source: "consul", Service: "payments", Domains: []string{"b"}, Total: 2, Local: 1, TotalWeight: 4, LocalWeight: 1, Weight: 0.25,
			ObservedAt: at.Add(-2 * time.Second), Pending: &Pending{Total: 1, Local: 1, Weight: 1, At: at, InSecs: 1.5}},
	}
	a := NewAdmin(f.svc, f.engine, f.metrics, func() []View { return views }, func() ReloadStatus { return ReloadStatus{} })
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	return srv
}

func TestRLConfigShowsEveryService(t *testing.T) {
	srv := servicesAdmin(t)
	_, text := get(t, srv.URL+"/rlconfig")
	for _, want := range []string{
		"membership: source=static total=4 local=1 weight=0.25 (25%): static, --replicas 4\n",
		"membership[payments]: source=consul service=payments domains=b total=2 local=1 total_weight=4 local_weight=1 weight=0.25 (25%), confirmed ",
		"pending: weight=1 total=1 local=1 at=2026-12-03T12:00:02Z (in 1 s, if it holds)",
		"a.guard: 10 per second, per replica; cluster 10 per second burst 10; local share 10 per second burst 10 (share: replica, not divided)",
		"a.k: 100 per second; cluster 100 per second burst 100; local share 25 per second burst 25 (",
		"b.k: 100 per second; cluster 100 per second burst 100; local share 25 per second burst 25 (weight 0.25 of service payments)",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/rlconfig lacks %q:\n%s", want, text)
		}
	}
	_, body := get(t, srv.URL+"/rlconfig?format=json")
	var c RLConfig
	if err := json.Unmarshal([]byte(body), &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Services) != 1 || c.Services[0].Service != "payments" || c.Services[0].Pending == nil || c.Services[0].Pending.Weight != 1 || c.Membership.Service != "" {
		t.Fatalf("views: %+v %+v", c.Membership, c.Services)
	}
	byRule := map[string]RuleInfo{}
	for _, r := range c.Rules {
		byRule[r.Rule] = r
	}
	if r := byRule["a.guard"]; r.Share != "replica" || r.Weight != 1 || r.LocalRate != 10 {
		t.Errorf("a.guard: %+v", r)
	}
	if r := byRule["b.k"]; r.Share != "cluster" || r.Service != "payments" || r.Weight != 0.25 {
		t.Errorf("b.k: %+v", r)
	}
}

func TestStatusPageShowsEveryService(t *testing.T) {
	srv := servicesAdmin(t)
	_, page := get(t, srv.URL+"/")
	for _, want := range []string{
		`<table id="membership">`,
		`<h3>Consul service payments: domains b</h3>`,
		`<table id="membership-1">`,
		`<tr><th>Consul weights (this node / all)</th><td class="num">1 / 4</td></tr>`,
		`weight 1 (1 replicas, 1 here) takes effect in 1 s, if it holds`,
		`<td id="source">static: --replicas 4</td>`,
		`per replica (not divided)`,
		`service payments`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("status page lacks %q", want)
		}
	}
}
