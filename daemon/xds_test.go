package daemon

import (
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/internal/testutil"
	"github.com/sharelimit/sharelimit/internal/xdstest"
)

func xdsConfig(domain string, rpu uint32) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: domain, Domain: domain, Descriptors: []*rlsconfv3.RateLimitDescriptor{{
		Key: "k", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: rpu}}}}
}

// TestXDSRules: with --config-type GRPC_XDS_SOTW the daemon waits for the
// management server's first update before serving gRPC (health says not
// serving meanwhile), installs each update, NACKs a bad one keeping the rules
// and their buckets, shows the source, version and NACK on /rlconfig, and
// keeps its rules while the server is down, reconnecting when it is back.
func TestXDSRules(t *testing.T) {
	srv, err := xdstest.Start("127.0.0.1:0", "node-a")
	if err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr()
	defer func() { srv.Stop() }()

	cfg := testConfig(t)
	cfg.ConfigType, cfg.XDSServerURL, cfg.XDSNodeID = config.ConfigXDS, addr, "node-a"
	cfg.XDSBackoffInitial, cfg.XDSBackoffMax = 50*time.Millisecond, 200*time.Millisecond
	r := start(t, cfg)
	if code, _ := r.get(t, r.d.httpLis.Addr().String(), "/healthcheck"); code == 200 {
		t.Fatal("/healthcheck says OK before the first xDS update")
	}

	if err := srv.Set("v1", xdsConfig("d", 2)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool {
		code, _ := r.get(t, r.d.httpLis.Addr().String(), "/healthcheck")
		return code == 200
	}, "serving after the first update"))
	if g, _ := r.serving(t); !g {
		t.Fatal("gRPC health not SERVING after the first update")
	}
	if got := codesOf(t, r, 3); got != "OOX" {
		t.Fatalf("v1 (2 per hour): %s, want OOX", got)
	}

	// A bad update (unit UNKNOWN) is NACKed; v1's rule and its spent bucket stay.
	bad := xdsConfig("d", 5)
	bad.Descriptors[0].RateLimit.Unit = rlsconfv3.RateLimitUnit_UNKNOWN
	if err := srv.Set("v2", bad); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return len(srv.Nacks()) > 0 }, "the NACK"))
	if got := codesOf(t, r, 1); got != "X" {
		t.Fatalf("after the NACK: %s, want X (v1's bucket is spent)", got)
	}
	_, body := r.get(t, r.d.httpLis.Addr().String(), "/rlconfig")
	for _, want := range []string{"source=xds " + addr, `version="v1"`, `last_nack_version="v2"`, "invalid rate limit unit"} {
		if !strings.Contains(body, want) {
			t.Errorf("/rlconfig lacks %q:\n%s", want, body)
		}
	}

	if code, page := r.get(t, r.d.httpLis.Addr().String(), "/"); code != 200 || !strings.Contains(page, `id="xds-version">v1`) || !strings.Contains(page, "version v2, ") {
		t.Errorf("status page: %d, lacks the xDS version or the NACK:\n%s", code, page)
	}

	// The server goes away: the rules stand.
	srv.Stop()
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return !r.d.xds.Status().Connected }, "disconnected"))
	if got := codesOf(t, r, 1); got != "X" {
		t.Fatalf("server down: %s, want X (v1 stands)", got)
	}

	// Back on the same address with v3: the daemon reconnects and installs it.
	if srv, err = xdstest.Start(addr, "node-a"); err != nil {
		t.Fatal(err)
	}
	if err := srv.Set("v3", xdsConfig("d", 2), xdsConfig("e", 1)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return r.d.xds.Status().Version == "v3" }, "v3 installed"))
	// d's rule is unchanged, so its spent bucket is kept; e is new.
	if got := codesOf(t, r, 1); got != "X" {
		t.Fatalf("v3, d: %s, want X (the unchanged rule keeps its bucket)", got)
	}
	resp := r.call(t, "e", "k=1")
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 {
		t.Fatalf("v3, e: %v", resp)
	}
}

// TestXDSForceStart: with the server unreachable, force-start serves at once
// with no rules; without it, gRPC waits (TestXDSRules).
func TestXDSForceStart(t *testing.T) {
	cfg := testConfig(t)
	cfg.ConfigType, cfg.XDSServerURL = config.ConfigXDS, "127.0.0.1:1"
	cfg.XDSBackoffInitial, cfg.XDSBackoffMax = 50*time.Millisecond, 200*time.Millisecond
	cfg.ForceStart = true
	r := start(t, cfg)
	if g, h := r.serving(t); !g || h != 200 {
		t.Fatalf("force-start: health %v %d, want serving", g, h)
	}
	if resp := r.call(t, "d", "k=1"); resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
		t.Fatalf("with no rules: %v", resp)
	}
}

func codesOf(t *testing.T, r *running, n int) string {
	t.Helper()
	var b strings.Builder
	for range n {
		if r.call(t, "d", "k=1").OverallCode == rlsv3.RateLimitResponse_OK {
			b.WriteByte('O')
		} else {
			b.WriteByte('X')
		}
	}
	return b.String()
}

// TestXDSMergeDomains: with --merge-domain-config, resources naming one domain
// are merged, as upstream merges them; without it, the update is NACKed.
func TestXDSMergeDomains(t *testing.T) {
	for _, merge := range []bool{true, false} {
		srv, err := xdstest.Start("127.0.0.1:0", "node-a")
		if err != nil {
			t.Fatal(err)
		}
		cfg := testConfig(t)
		cfg.ConfigType, cfg.XDSServerURL, cfg.XDSNodeID = config.ConfigXDS, srv.Addr(), "node-a"
		cfg.XDSBackoffInitial, cfg.XDSBackoffMax = 50*time.Millisecond, 200*time.Millisecond
		cfg.MergeDomainConfig, cfg.ForceStart = merge, true
		r := start(t, cfg)
		other := xdsConfig("d", 1)
		other.Name = "d-part-2"
		other.Descriptors[0].Key = "j"
		if err := srv.Set("v1", xdsConfig("d", 2), other); err != nil {
			t.Fatal(err)
		}
		if merge {
			testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return r.d.xds.Status().Version == "v1" }, "the merged update"))
			if lim := r.call(t, "d", "j=1").Statuses[0].CurrentLimit.GetRequestsPerUnit(); lim != 1 {
				t.Fatalf("merged: j's limit %d, want 1", lim)
			}
		} else {
			testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return len(srv.Nacks()) > 0 }, "the NACK"))
			if n := srv.Nacks()[0]; !strings.Contains(n.Error, "duplicate domain 'd'") {
				t.Fatalf("NACK %q, want a duplicate domain", n.Error)
			}
		}
		srv.Stop()
	}
}
