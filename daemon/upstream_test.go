package daemon

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/internal/testutil"
)

// running is a daemon serving on loopback, stopped at the end of the test.
type running struct {
	d      *Daemon
	rls    rlsv3.RateLimitServiceClient
	health healthpb.HealthClient
}

func start(t *testing.T, cfg *config.Config) *running {
	t.Helper()
	d, err := New(cfg, quietLog(), "test")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx, nil) }()
	conn, err := grpc.NewClient(d.grpcLis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return &running{d: d, rls: rlsv3.NewRateLimitServiceClient(conn), health: healthpb.NewHealthClient(conn)}
}

func (r *running) get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (r *running) call(t *testing.T, domain string, kvs ...string) *rlsv3.RateLimitResponse {
	t.Helper()
	var descs []*commonv3.RateLimitDescriptor
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		descs = append(descs, &commonv3.RateLimitDescriptor{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}})
	}
	resp, err := r.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: descs})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func (r *running) serving(t *testing.T) (grpcOK bool, httpCode int) {
	t.Helper()
	h, err := r.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "ratelimit"})
	if err != nil {
		t.Fatal(err)
	}
	code, _ := r.get(t, r.d.httpLis.Addr().String(), "/healthcheck")
	return h.Status == healthpb.HealthCheckResponse_SERVING, code
}

func writeRules(t *testing.T, dir, name, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestSettingsReachTheRequestPath: quota mode, response dynamic metadata and
// merged domains, set as settings, change what a real gRPC answer says.
func TestSettingsReachTheRequestPath(t *testing.T) {
	cfg := testConfig(t)
	writeRules(t, cfg.ConfigDir, "r.yaml", "domain: d\ndescriptors:\n  - key: k\n    metadata: {team: a}\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	writeRules(t, cfg.ConfigDir, "s.yaml", "domain: d\ndescriptors:\n  - key: j\n    rate_limit: {unit: hour, requests_per_unit: 5}\n")
	cfg.QuotaMode, cfg.ResponseDynamicMetadata, cfg.MergeDomainConfig = true, true, true
	r := start(t, cfg)
	r.call(t, "d", "k=1")
	resp := r.call(t, "d", "k=1", "j=1")
	// Global quota mode: k is over, j passes, so the request is OK.
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("quota mode: overall %v, k %v; want OK with k OVER_LIMIT", resp.OverallCode, resp.Statuses[0].Code)
	}
	if got := resp.GetDynamicMetadata().GetFields()["domain"].GetStringValue(); got != "d" {
		t.Fatalf("dynamic metadata domain = %q, want d", got)
	}
	if md := r.call(t, "d", "k=2").GetDynamicMetadata().GetFields()["metadata"].GetStructValue().GetFields()["team"].GetStringValue(); md != "a" {
		t.Fatalf("dynamic metadata team = %q, want a", md)
	}
}

// TestForceStartServesWithNoRules: with --force-start-without-initial-config
// a bad first config serves with no rules (every request OK) and loads the
// directory once it is valid; without it, New fails (TestInvalidConfigIsErrConfig).
func TestForceStartServesWithNoRules(t *testing.T) {
	cfg := testConfig(t)
	cfg.ReloadDebounce = 10 * time.Millisecond
	writeRules(t, cfg.ConfigDir, "r.yaml", "domain: d\ndescriptors:\n  - key: \n")
	cfg.ForceStart = true
	r := start(t, cfg)
	if resp := r.call(t, "d", "k=1"); resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
		t.Fatalf("with no rules: %v", resp)
	}
	if _, body := r.get(t, r.d.httpLis.Addr().String(), "/rlconfig"); !strings.Contains(body, "last_reload_failed") {
		t.Fatalf("/rlconfig does not show the failed load:\n%s", body)
	}
	writeRules(t, cfg.ConfigDir, "r.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 0}\n")
	testutil.Eventually(t, 30*time.Second, func() error {
		if c := r.call(t, "d", "k=1").OverallCode; c != rlsv3.RateLimitResponse_OVER_LIMIT {
			return fmt.Errorf("the fixed config never loaded: %v", c)
		}
		return nil
	})
}

// TestHealthyWithAtLeastOneConfig: with the setting, both health endpoints
// say NOT_SERVING while no domain is loaded, SERVING once one is, and
// NOT_SERVING again when the last domain goes.
func TestHealthyWithAtLeastOneConfig(t *testing.T) {
	cfg := testConfig(t)
	cfg.ReloadDebounce = 10 * time.Millisecond
	os.Remove(filepath.Join(cfg.ConfigDir, "r.yaml"))
	cfg.HealthyWithConfig = true
	r := start(t, cfg)
	await := func(want bool) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, func() error {
			if g, h := r.serving(t); g != want || (h == http.StatusOK) != want {
				return fmt.Errorf("health gRPC serving=%v /healthcheck=%d, want serving=%v", g, h, want)
			}
			return nil
		})
	}
	await(false)
	writeRules(t, cfg.ConfigDir, "r.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	await(true)
	os.Remove(filepath.Join(cfg.ConfigDir, "r.yaml"))
	await(false)
}

// TestDebugListener: --debug-addr serves upstream's debug listener (its
// DEBUG_PORT): /rlconfig in upstream's own text, pprof, and an index; the
// admin listener keeps sharelimit's /rlconfig. In upstream's deployment at
// --replicas 1 both say that each replica enforces every limit whole.
func TestDebugListener(t *testing.T) {
	for _, upstream := range []bool{false, true} {
		t.Run(fmt.Sprint("upstream=", upstream), func(t *testing.T) {
			cfg := testConfig(t)
			writeRules(t, cfg.ConfigDir, "r.yaml", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 7}\n"+
				"    descriptors:\n      - key: n\n        rate_limit: {unlimited: true}\n  - key: q\n    quota_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
			cfg.DebugAddr = "127.0.0.1:0"
			if upstream {
				cfg.UpstreamBy = []string{"REDIS_URL"}
			}
			r := start(t, cfg)
			if r.d.debugLis == nil {
				t.Fatal("no debug listener")
			}
			addr := r.d.debugLis.Addr().String()
			want := "d.k_v: unit=MINUTE requests_per_unit=7, shadow_mode: true, quota_mode: false\n" +
				"d.k_v.n: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false\n" +
				"d.q: unit=HOUR requests_per_unit=1, shadow_mode: false, quota_mode: true\n"
			fault := "# sharelimit: membership fault=unshared"
			code, body := r.get(t, addr, "/rlconfig")
			if code != 200 || !strings.HasPrefix(body, want) {
				t.Fatalf("/rlconfig on the debug listener: %d\n%s\nwant upstream's text:\n%s", code, body, want)
			}
			if rest := strings.TrimPrefix(body, want); upstream != strings.HasPrefix(rest, fault) || !upstream && rest != "" {
				t.Errorf("/rlconfig on the debug listener, after the rules (upstream=%v):\n%s", upstream, rest)
			}
			if code, _ := r.get(t, addr, "/debug/pprof/"); code != 200 {
				t.Fatalf("/debug/pprof/ on the debug listener: %d", code)
			}
			if code, body := r.get(t, addr, "/"); code != 200 || !strings.Contains(body, "/rlconfig: ") || !strings.Contains(body, "/debug/pprof/: ") {
				t.Fatalf("index of the debug listener: %d\n%s", code, body)
			}
			code, body = r.get(t, r.d.httpLis.Addr().String(), "/rlconfig")
			if code != 200 || !strings.Contains(body, "membership: source=static") || upstream != strings.Contains(body, "fault=unshared") {
				t.Fatalf("/rlconfig on the admin listener (upstream=%v): %d\n%s", upstream, code, body)
			}
			code, body = r.get(t, r.d.httpLis.Addr().String(), "/")
			if code != 200 || upstream != strings.Contains(body, "unshared: upstream's deployment") {
				t.Fatalf("status page (upstream=%v): %d\n%s", upstream, code, body)
			}
			code, body = r.get(t, r.d.httpLis.Addr().String(), "/metrics")
			if code != 200 || upstream != strings.Contains(body, `sharelimit_membership_fault{cause="unshared",service=""} 1`) {
				t.Fatalf("metrics (upstream=%v): %d", upstream, code)
			}
		})
	}
}
