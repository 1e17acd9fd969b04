package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/server"
)

// explain --admin divides by the weight of the domain's own view in the
// running daemon: the service --domain-service maps it to, else the default.
func TestExplainAdminUsesTheDomainsView(t *testing.T) {
	cfg := server.RLConfig{
		Membership: server.View{Source: "consul", Service: "edge", Total: 4, Local: 1, TotalWeight: 4, LocalWeight: 1, Weight: 0.25},
		Services: []server.View{{Source: "consul", Service: "payments", Domains: []string{"backend"}, Total: 2, Local: 1,
			TotalWeight: 4, LocalWeight: 1, Weight: 0.25, Pending: &server.Pending{Total: 1, Local: 1, Weight: 1, At: time.Now(), InSecs: 1.5}}},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/rlconfig" || r.URL.Query().Get("format") != "json" {
			http.NotFound(w, r)
			return
		}
		json.NewEncoder(w).Encode(cfg)
	}))
	defer srv.Close()
	code, out := runCLI("explain", "--config-dir", "../../descriptors/testdata/valid/share.yaml", "--domain", "backend", "--admin", srv.URL, "api=x")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{
		"membership: Consul service payments (consul), 2 replicas, 1 on this node, weights 1 of 4: weight 0.25 (25%) in force, confirmed never; held: weight 1 takes effect in 1 s if it holds\n",
		`domain "backend", weight 0.25`,
		"local share: 250 per second, bucket of 250",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("lacks %q:\n%s", want, out)
		}
	}
	// A domain mapped to no service takes the default view.
	cfg.Membership.Weight = 0.5
	if code, out = runCLI("explain", "--config-dir", "../../examples/config", "--domain", "edge", "--admin", srv.URL, "remote_address=10.0.0.1"); code != 0 ||
		!strings.Contains(out, "membership: Consul service edge (consul), 4 replicas, 1 on this node: weight 0.5 (50%) in force, confirmed never\n") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	// A join ramp in progress is said.
	cfg.JoinRamp = &server.JoinRamp{ElapsedSeconds: 0.4, EndsInSeconds: 9.6}
	if code, out = runCLI("explain", "--config-dir", "../../examples/config", "--domain", "edge", "--admin", srv.URL, "remote_address=10.0.0.1"); code != 0 ||
		!strings.Contains(out, "join ramp in progress (0.4 s in, over in 9 s)") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	cfg.JoinRamp = nil
	// A daemon that cannot be read is an error, not a guess.
	cfg.Membership.Weight = 0
	if code, out = runCLI("explain", "--config-dir", "../../examples/config", "--domain", "edge", "--admin", srv.URL, "remote_address=10.0.0.1"); code != 1 || !strings.Contains(out, "not a share") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if code, out = runCLI("explain", "--config-dir", "../../examples/config", "--domain", "edge", "--admin", srv.URL+"/nowhere", "remote_address=10.0.0.1"); code != 1 || !strings.Contains(out, "404") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if code, _ = runCLI("explain", "--config-dir", "../../examples/config", "--domain", "edge", "--admin", srv.URL, "--weight", "0.5", "a=b"); code != 2 {
		t.Fatalf("--admin with --weight: exit %d", code)
	}
}
