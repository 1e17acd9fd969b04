package daemon

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/internal/consultest"
	"github.com/sharelimit/sharelimit/internal/testutil"
	"github.com/sharelimit/sharelimit/server"
)

// runDNSDaemon runs a daemon counting web.service.consul. through a's DNS
// until the test ends, with cfg adjusted by adjust.
func runDNSDaemon(t *testing.T, a *consultest.Agent, adjust func(*config.Config)) *Daemon {
	t.Helper()
	cfg := testConfig(t)
	cfg.PeersDNS, cfg.PeersDNSServer, cfg.PeersDNSInterval = "web.service.consul.", a.DNSAddr(), 100*time.Millisecond
	adjust(cfg)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
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
	return d
}

// TestDNSMembership runs the daemon with --peers-dns against Consul's DNS:
// the view divides the limits, a scale-up shrinks the share at once though
// the hold is ten minutes, a deregistration is held, and the view shows as
// source dns with its name on /rlconfig (JSON and text), the status page
// and /metrics, its fault too when Consul stops.
func TestDNSMembership(t *testing.T) {
	a := consultest.Start(t, consultest.WithDNS())
	a.RegisterAt("node-1", "web-1", "web", "192.0.2.1", true)
	a.RegisterAt("node-2", "web-2", "web", "192.0.2.2", true)
	d := runDNSDaemon(t, a, func(cfg *config.Config) {
		cfg.Replicas, cfg.MembershipHold, cfg.JoinRamp = 3, 10*time.Minute, 0
		cfg.MembershipGrace = 0 // the hold alone holds the deregistration (TestDNSCheckCriticalWhileServingKeepsCap has the grace)
	})
	base := "http://" + d.httpLis.Addr().String()
	weight := func() float64 { return d.engine.GroupWeight(d.views[0].group).W }
	near := func(w float64) func() bool { return func() bool { return math.Abs(weight()-w) < 1e-12 } }

	testutil.Eventually(t, 30*time.Second, testutil.Cond(near(0.5), "the first answer, 2 replicas, in force"))
	a.RegisterAt("node-3", "web-3", "web", "192.0.2.3", true)
	a.RegisterAt("node-4", "web-4", "web", "192.0.2.4", true)
	testutil.Eventually(t, 30*time.Second, testutil.Cond(near(0.25), "the scale-up to 4, in force at once, within the hold"))
	a.Deregister("node-4", "web-4")
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return d.views[0].dns.View().Total == 3 }, "the source to count 3"))
	if w := weight(); w != 0.25 {
		t.Fatalf("weight %v after a deregistration, within the ten minutes of its hold; want 0.25", w)
	}

	var rl server.RLConfig
	getJSON(t, base+"/rlconfig?format=json", &rl)
	m := rl.Membership
	if m.Source != "dns" || m.Name != "web.service.consul." || m.Service != "" || m.Total != 4 || m.Local != 1 || m.Pending == nil || m.Pending.Total != 3 {
		t.Fatalf("/rlconfig membership %+v (pending %+v); want dns, web.service.consul., 4 in force and 3 pending", m, m.Pending)
	}
	if text := testutil.GetText(t, base+"/rlconfig"); !strings.Contains(text, "membership: source=dns name=web.service.consul. total=4 local=1 weight=0.25 ") ||
		!strings.Contains(text, "pending: weight=0.333333 total=3") {
		t.Errorf("/rlconfig text:\n%s", text)
	}
	if page := testutil.GetText(t, base+"/"); !strings.Contains(page, "dns: the addresses of web.service.consul. (--peers-dns)") {
		t.Errorf("the status page does not name the source and the name")
	}
	metrics := testutil.GetText(t, base+"/metrics")
	for _, line := range []string{
		`sharelimit_membership_info{name="web.service.consul.",service="",source="dns"} 1`,
		`sharelimit_membership_total{service=""} 4`,
		`sharelimit_membership_weight{service=""} 0.25`,
		`sharelimit_membership_pending_weight{service=""} 0.3333333333333333`,
	} {
		if !strings.Contains(metrics, line+"\n") {
			t.Errorf("/metrics lacks %s", line)
		}
	}

	a.Stop()
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool {
		return strings.Contains(testutil.GetText(t, base+"/metrics"), `sharelimit_membership_fault{cause="error",service=""} 1`+"\n")
	}, "the fault of Consul stopped"))
	if w := weight(); w != 0.25 {
		t.Fatalf("weight %v with Consul stopped; want the last, 0.25", w)
	}
}

// TestDNSJoinRampEndsAlone: a ramp started on the --replicas guess (3) ends
// when the name's first answer shows the replica alone, as it does when
// Consul's first answer does: its buckets start full again.
func TestDNSJoinRampEndsAlone(t *testing.T) {
	a := consultest.Start(t, consultest.WithDNS())
	d := runDNSDaemon(t, a, func(cfg *config.Config) { cfg.Replicas = 3 })
	if d.engine.Store().Ramp(d.clock()) == nil {
		t.Fatal("no join ramp on the --replicas guess of 3")
	}
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return d.views[0].cur.Load().Errors > 0 }, "an answer (NXDOMAIN) from Consul"))
	if d.engine.Store().Ramp(d.clock()) == nil {
		t.Fatal("the join ramp ended before the name had any address")
	}
	a.RegisterAt("node-1", "web-1", "web", "192.0.2.1", true)
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return d.views[0].cur.Load().Total == 1 }, "the first answer: 1 replica"))
	if r := d.engine.Store().Ramp(d.clock()); r != nil {
		t.Fatalf("join ramp %+v still set with the replica alone", r)
	}
}
