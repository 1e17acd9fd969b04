package daemon

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/internal/consultest"
	"github.com/sharelimit/sharelimit/internal/testutil"
	"github.com/sharelimit/sharelimit/membership"
	"github.com/sharelimit/sharelimit/state"
)

// TestDNSRestartKeepsSavedView: --state-file saves the DNS view, under a
// key of its own ("dns:" and the name), and a replica restarted while the
// name does not resolve starts from it, not from --replicas. With the
// migration guide's settings (swap the image, add SHARELIMIT_PEERS_DNS;
// --replicas stays 1) a replica restarted so used to enforce every limit
// whole beside peers that enforce 1/4 each: up to 1.75 L. Once the DNS
// server answers again, empty and re-registering, a first answer short of
// the saved view is suspect and the view stands.
func TestDNSRestartKeepsSavedView(t *testing.T) {
	a := consultest.Start(t, consultest.WithDNS())
	for i, addr := range []string{"192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4"} {
		a.RegisterAt("node-"+string(rune('1'+i)), "web-"+string(rune('1'+i)), "web", addr, true)
	}
	const name = "web.service.consul."
	stateFile := filepath.Join(t.TempDir(), "state")
	rules := t.TempDir()
	if err := os.WriteFile(filepath.Join(rules, "r.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 400}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mkcfg := func() *config.Config {
		cfg := testConfig(t)
		cfg.ConfigDir = rules
		cfg.PeersDNS, cfg.PeersDNSServer, cfg.PeersDNSInterval = name, a.DNSAddr(), 100*time.Millisecond
		cfg.StateFile, cfg.MembershipHold = stateFile, 10*time.Minute
		cfg.Replicas = 1                      // the default: the migration guide adds only --peers-dns
		cfg.ShutdownTimeout = 5 * time.Second // time for the state file's write at the stop
		cfg.JoinRamp = 0                      // a fresh key admits its whole local bucket
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	runUntil := func(d *Daemon) (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx, nil) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}
	// What a fresh key admits at once: the local bucket, B·w.
	burst := func(d *Daemon, value string) int {
		var dec engine.Decision
		desc := []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "k", Value: value}}}}
		n := 0
		for ; n < 1000; n++ {
			if err := d.engine.Decide(&dec, "d", desc, 1, d.clock()); err != nil {
				t.Fatal(err)
			}
			if dec.Code != engine.OK {
				break
			}
		}
		return n
	}
	weight := func(d *Daemon) float64 { return d.engine.GroupWeight(d.views[0].group).W }

	d1, err := New(mkcfg(), quietLog(), "test")
	if err != nil {
		t.Fatal(err)
	}
	stop1 := runUntil(d1)
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return weight(d1) == 0.25 }, "the first daemon counting 4"))
	t.Logf("before the restart: weight %v, a fresh key admits %d at once", weight(d1), burst(d1, "before"))
	stop1() // writes the state file, the view of 4 included

	s, err := state.ReadFile(stateFile, state.MaxSize(1000))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Views) != 1 || s.Views[0].Service != "dns:"+name || s.Views[0].Total != 4 || s.Views[0].Weight != 0.25 {
		t.Errorf("saved views %+v; want one, keyed dns:%s, of 4", s.Views, name)
	}

	a.Stop() // the name no longer resolves

	d2, err := New(mkcfg(), quietLog(), "test")
	if err != nil {
		t.Fatal(err)
	}
	stop2 := runUntil(d2)
	defer stop2()
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return d2.views[0].cur.Load().Errors > 0 }, "a failed resolution"))
	v := d2.views[0].cur.Load()
	t.Logf("after the restart, DNS down: view total=%d weight=%v fault=%q errors=%d; a fresh key admits %d at once", v.Total, weight(d2), v.Fault, v.Errors, burst(d2, "after"))
	if w := weight(d2); w != 0.25 || v.Total != 4 || v.Fault != membership.FaultError {
		t.Errorf("restarted with a state file that saved 4 replicas, while DNS is down: weight %v, view %+v; want the saved 0.25 with fault %q (at weight %v the cluster admits up to %.2f L with its 3 peers at 1/4)",
			w, v, membership.FaultError, w, 0.75+w)
	}

	// The DNS server back, empty, re-registering: two of four listed.
	a.Restart()
	a.RegisterAt("node-1", "web-1", "web", "192.0.2.1", true)
	a.RegisterAt("node-3", "web-3", "web", "192.0.2.3", true)
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return d2.views[0].cur.Load().Fault == membership.FaultSuspect }, "a suspect first answer"))
	if w, v := weight(d2), d2.views[0].cur.Load(); w != 0.25 || v.Total != 4 {
		t.Errorf("a first answer of 2 after a restart that saved 4: weight %v, view %+v; want the saved 0.25 standing", w, v)
	}
}
