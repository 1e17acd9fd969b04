package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/internal/consultest"
	"github.com/sharelimit/sharelimit/internal/testutil"
	"github.com/sharelimit/sharelimit/server"
)

// servicesRules: one per-value limit of 400 per minute in each of three
// domains, so a fresh key's bucket is the share in force: 400 × weight.
const servicesRules = `domain: %s
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 400}
`

// TestTwoServicesOnTheSameNodes runs the daemon against a real Consul agent
// with two services on the same nodes: svc-a on 4 nodes and svc-b on 2 of
// them. Domain a follows svc-a (1/4), domain b follows svc-b (1/2), and
// domain c, unmapped with no --consul-service, follows the static
// --replicas 5 (1/5). When svc-b loses a replica, domain b's share grows to
// 1 and domains a and c keep theirs, to the bucket. /rlconfig and /metrics
// show each service's view under its name.
func TestTwoServicesOnTheSameNodes(t *testing.T) {
	a := consultest.Start(t)
	for _, n := range []string{"node-1", "node-2", "node-3", "node-4"} {
		a.RegisterInstance(n, "a-"+n, "svc-a", true)
	}
	for _, n := range []string{"node-1", "node-2"} {
		a.RegisterInstance(n, "b-"+n, "svc-b", true)
	}
	t.Setenv("CONSUL_HTTP_ADDR", a.Addr())

	cfg := testConfig(t)
	for _, dom := range []string{"a", "b", "c"} {
		if err := os.WriteFile(filepath.Join(cfg.ConfigDir, dom+".yaml"), []byte(fmt.Sprintf(servicesRules, dom)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// No hold and no grace: a deregistered instance drops out at once.
	cfg.Replicas, cfg.Node, cfg.MembershipHold, cfg.MembershipGrace = 5, "node-1", 0, 0
	cfg.JoinRamp = 0 // the test reads fresh buckets: no join ramp
	cfg.DomainServices = []config.DomainService{{Domain: "a", Service: "svc-a"}, {Domain: "b", Service: "svc-b"}}
	d, err := New(cfg, quietLog(), "test")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	base := "http://" + d.httpLis.Addr().String()

	// fits reports whether a fresh key of domain dom admits hits at once:
	// true exactly when the bucket in force holds at least hits tokens.
	keys := 0
	fits := func(dom string, hits uint32) bool {
		keys++
		var dec engine.Decision
		descs := []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "k", Value: fmt.Sprint("key-", keys)}}}}
		if err := d.engine.Decide(&dec, dom, descs, hits, d.clock()); err != nil {
			t.Fatal(err)
		}
		return dec.Code == engine.OK
	}
	// buckets checks each domain's bucket size: it admits its share, and
	// not one more.
	buckets := func(when string, want map[string]uint32) {
		t.Helper()
		for dom, size := range want {
			if !fits(dom, size) || fits(dom, size+1) {
				t.Errorf("%s: domain %s's fresh bucket is not %d", when, dom, size)
			}
		}
	}
	// weights waits for the views in force.
	weights := func(when string, want map[string]float64) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, func() error {
			got := map[string]float64{}
			for _, dom := range []string{"a", "b", "c"} {
				got[dom] = d.engine.GroupWeight(d.engine.DomainGroup(dom)).W
			}
			for dom, w := range want {
				if math.Abs(got[dom]-w) >= 1e-12 {
					return fmt.Errorf("%s: weights %v, want %v", when, got, want)
				}
			}
			return nil
		})
	}

	weights("start", map[string]float64{"a": 0.25, "b": 0.5, "c": 0.2})
	buckets("start", map[string]uint32{"a": 100, "b": 200, "c": 80})

	var rl server.RLConfig
	getJSON(t, base+"/rlconfig?format=json", &rl)
	if rl.Membership.Service != "" || rl.Membership.Source != "static" || rl.Membership.Total != 5 || len(rl.Services) != 2 {
		t.Fatalf("/rlconfig views: default %+v, services %+v", rl.Membership, rl.Services)
	}
	for i, want := range []struct {
		service string
		total   int
	}{{"svc-a", 4}, {"svc-b", 2}} {
		v := rl.Services[i]
		if v.Service != want.service || v.Total != want.total || v.Local != 1 || len(v.Domains) != 1 || v.Source != "consul" {
			t.Errorf("/rlconfig service %d: %+v, want %s with %d replicas", i, v, want.service, want.total)
		}
	}
	for _, r := range rl.Rules {
		if want := map[string]string{"a": "svc-a", "b": "svc-b", "c": ""}[r.Domain]; r.Service != want {
			t.Errorf("/rlconfig rule %s.%s: service %q, want %q", r.Domain, r.Rule, r.Service, want)
		}
	}
	metrics := testutil.GetText(t, base+"/metrics")
	for _, line := range []string{
		`sharelimit_membership_weight{service="svc-a"} 0.25`,
		`sharelimit_membership_weight{service="svc-b"} 0.5`,
		`sharelimit_membership_weight{service=""} 0.2`,
		`sharelimit_membership_total{service="svc-a"} 4`,
		`sharelimit_membership_total{service="svc-b"} 2`,
	} {
		if !strings.Contains(metrics, line+"\n") {
			t.Errorf("/metrics lacks %s", line)
		}
	}

	// svc-b loses node-2: domain b's share grows to the whole limit; svc-a's
	// and the static view's do not move.
	a.Deregister("node-2", "b-node-2")
	weights("svc-b down to 1", map[string]float64{"a": 0.25, "b": 1, "c": 0.2})
	buckets("svc-b down to 1", map[string]uint32{"a": 100, "b": 400, "c": 80})

	// svc-a gains a fifth: domain a's share shrinks; b's stays whole.
	a.RegisterInstance("node-5", "a-node-5", "svc-a", true)
	weights("svc-a up to 5", map[string]float64{"a": 0.2, "b": 1, "c": 0.2})
	buckets("svc-a up to 5", map[string]uint32{"a": 80, "b": 400, "c": 80})
}

func getJSON(t *testing.T, url string, out any) {
	t.Helper()
	if err := json.Unmarshal([]byte(testutil.GetText(t, url)), out); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
}
