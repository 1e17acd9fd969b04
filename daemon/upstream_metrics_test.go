package daemon

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/internal/testutil"
)

// upstreamRules exercise every shape of upstream's stats key: one level, two
// levels (key2), a shadow rule, detailed rules (one value an IPv4 address,
// whose dots upstream's stat names turn into underscores), hits_addend, and
// an unlimited rule, which upstream counts nowhere.
const upstreamRules = `domain: edge
descriptors:
  - key: generic_key
    value: api
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: header_match
    value: login
    descriptors:
      - key: remote_address
        rate_limit: {unit: minute, requests_per_unit: 3}
  - key: bulk
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: canary
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: client_ip
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: open
    rate_limit: {unlimited: true}
`

// scrape reads one exposition from url with expfmt, as Prometheus would.
func scrape(t *testing.T, url string) (int, map[string]*dto.MetricFamily) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("scrape %s: %v\n%s", url, err, body)
	}
	return resp.StatusCode, fams
}

// sample is the value of the series of family name whose labels are exactly
// labels ("k=v" each); ok false when there is none.
func sample(fams map[string]*dto.MetricFamily, name string, labels ...string) (m *dto.Metric, ok bool) {
	want := slices.Clone(labels)
	slices.Sort(want)
	for _, s := range fams[name].GetMetric() {
		var got []string
		for _, l := range s.GetLabel() {
			got = append(got, l.GetName()+"="+l.GetValue())
		}
		slices.Sort(got)
		if slices.Equal(got, want) {
			return s, true
		}
	}
	return nil, false
}

// TestUpstreamPrometheus runs the daemon as upstream's environment asks for
// Prometheus (USE_PROMETHEUS, PROMETHEUS_ADDR, PROMETHEUS_PATH,
// NEAR_LIMIT_RATIO), sends decisions through real gRPC, and reads upstream's
// series where an upstream dashboard's Prometheus would: the names, types,
// labels and values upstream's statsd mapping gives them.
func TestUpstreamPrometheus(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", upstreamRules)
	promAddr := testutil.FreeAddr(t)
	cfg, err := config.ParseEnviron("serve", nil, []string{
		"USE_PROMETHEUS=true", "PROMETHEUS_ADDR=" + promAddr, "PROMETHEUS_PATH=/stats", "NEAR_LIMIT_RATIO=0.5",
		"SHARELIMIT_CONFIG_DIR=" + dir, "SHARELIMIT_RELOAD_DEBOUNCE=10ms",
		"SHARELIMIT_GRPC_ADDR=127.0.0.1:0", "SHARELIMIT_HTTP_ADDR=127.0.0.1:0", "SHARELIMIT_DEBUG_ADDR=127.0.0.1:0",
		"SHARELIMIT_DRAIN=0", "SHARELIMIT_SHUTDOWN_TIMEOUT=0",
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r := start(t, cfg)

	ctx := context.Background()
	calls := 0
	decide := func(domain string, hits *wrapperspb.UInt64Value, kv ...string) *rlsv3.RateLimitResponse {
		t.Helper()
		d := &commonv3.RateLimitDescriptor{HitsAddend: hits}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		calls++
		resp, err := r.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*commonv3.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	answers := func(n int, domain string, hits *wrapperspb.UInt64Value, kv ...string) string {
		var out []string
		for range n {
			out = append(out, decide(domain, hits, kv...).GetOverallCode().String())
		}
		return strings.Join(out, " ")
	}
	// What each rule answered is what the series below count: check it, so
	// a change of the limiter cannot pass for one of the series.
	for _, c := range []struct{ got, want string }{
		{answers(7, "edge", nil, "generic_key", "api"), "OK OK OK OK OK OVER_LIMIT OVER_LIMIT"},
		{answers(4, "edge", nil, "header_match", "login", "remote_address", "192.0.2.10"), "OK OK OK OVER_LIMIT"},
		{answers(2, "edge", wrapperspb.UInt64(3), "bulk", "b"), "OK OK"},
		{answers(1, "edge", wrapperspb.UInt64(5), "bulk", "b"), "OVER_LIMIT"},
		{answers(2, "edge", nil, "canary", "c"), "OK OK"}, // the second in shadow mode
		{answers(3, "edge", nil, "user", "alice"), "OK OK OVER_LIMIT"},
		{answers(1, "edge", nil, "user", "bob"), "OK"},
		{answers(1, "edge", nil, "client_ip", "192.0.2.10"), "OK"},
		{answers(2, "edge", nil, "open", "x"), "OK OK"},
		{answers(1, "nope", nil, "generic_key", "api"), "OK"},
	} {
		if c.got != c.want {
			t.Fatalf("answers %s, want %s", c.got, c.want)
		}
	}
	calls++
	if _, err := r.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: ""}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("an empty domain: %v, want InvalidArgument", err)
	}

	url := "http://" + promAddr + "/stats"
	code, fams := scrape(t, url)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d", url, code)
	}
	counter := func(name string, want float64, labels ...string) {
		t.Helper()
		if fams[name].GetType() != dto.MetricType_COUNTER {
			t.Errorf("%s: type %v, want counter", name, fams[name].GetType())
			return
		}
		m, ok := sample(fams, name, labels...)
		if !ok {
			var have []string
			for _, s := range fams[name].GetMetric() {
				have = append(have, s.String())
			}
			t.Errorf("%s{%s}: no such series; have %v", name, strings.Join(labels, ","), have)
			return
		}
		if got := m.GetCounter().GetValue(); got != want {
			t.Errorf("%s{%s} = %v, want %v", name, strings.Join(labels, ","), got, want)
		}
	}
	const rl = "ratelimit_service_rate_limit_"
	for _, c := range []struct {
		labels                                  []string
		total, within, over, near, shadowCounts float64
	}{
		// NEAR_LIMIT_RATIO 0.5: a hit is near the limit once it leaves less
		// than half the bucket, as upstream's counter passes half the limit.
		{[]string{"domain=edge", "key1=generic_key_api"}, 7, 5, 2, 3, 0},
		{[]string{"domain=edge", "key1=header_match_login", "key2=remote_address"}, 4, 3, 1, 2, 0},
		// hits_addend 3, 3, then 5 refused: hits, not requests.
		{[]string{"domain=edge", "key1=bulk"}, 11, 6, 5, 1, 0},
		{[]string{"domain=edge", "key1=canary"}, 2, 1, 1, 1, 1},
		{[]string{"domain=edge", "key1=user_alice"}, 3, 2, 1, 1, 0},
		{[]string{"domain=edge", "key1=user_bob"}, 1, 1, 0, 0, 0},
		{[]string{"domain=edge", "key1=client_ip_192_0_2_10"}, 1, 1, 0, 0, 0},
	} {
		counter(rl+"total_hits", c.total, c.labels...)
		counter(rl+"within_limit", c.within, c.labels...)
		counter(rl+"over_limit", c.over, c.labels...)
		counter(rl+"near_limit", c.near, c.labels...)
		counter(rl+"shadow_mode", c.shadowCounts, c.labels...)
	}
	for _, s := range fams[rl+"total_hits"].GetMetric() {
		for _, l := range s.GetLabel() {
			if v := l.GetValue(); strings.Contains(v, "open") || strings.Contains(v, "nope") {
				t.Errorf("total_hits has %s: an unlimited rule and an unknown domain count nowhere, as upstream", s)
			}
		}
	}
	counter("ratelimit_service_should_rate_limit_error", 1, "err_type=service_error")
	counter("ratelimit_service_total_requests", float64(calls), "grpc_method=ShouldRateLimit")
	counter("ratelimit_service_config_load_success", 1)
	counter("ratelimit_service_config_load_error", 0)
	h, ok := sample(fams, "ratelimit_service_response_time_seconds", "grpc_method=ShouldRateLimit")
	if fams["ratelimit_service_response_time_seconds"].GetType() != dto.MetricType_HISTOGRAM || !ok {
		t.Errorf("ratelimit_service_response_time_seconds{grpc_method=ShouldRateLimit}: want a histogram, have %v", fams["ratelimit_service_response_time_seconds"])
	} else if got := h.GetHistogram().GetSampleCount(); got != uint64(calls-1) {
		t.Errorf("response time: %d samples, want %d (every request decided)", got, calls-1)
	}
	// The same scrape carries sharelimit's own series: one scrape job
	// serves both dashboards.
	if _, ok := fams["sharelimit_decisions_total"]; !ok {
		t.Error("no sharelimit_decisions_total on the metrics listener")
	}
	if code, _ := scrape(t, "http://"+promAddr+"/metrics"); code != http.StatusNotFound {
		t.Errorf("GET /metrics with PROMETHEUS_PATH=/stats: %d, want 404", code)
	}

	// A config that does not load counts as upstream's config_load_error.
	writeRules(t, dir, "broken.yaml", "domain: other\ndescriptors:\n  - key: \n")
	testutil.Eventually(t, 30*time.Second, func() error {
		_, fams = scrape(t, url)
		if m, ok := sample(fams, "ratelimit_service_config_load_error"); !ok || m.GetCounter().GetValue() != 1 {
			return fmt.Errorf("config_load_error never counted the broken file: %v", m)
		}
		return nil
	})
}

// TestUpstreamPrometheusBeyondLoopbackWarns: upstream's default
// PROMETHEUS_ADDR, :9090, is every interface; a metrics listener beyond
// loopback is logged at WARN, as every such listener is.
func TestUpstreamPrometheusBeyondLoopbackWarns(t *testing.T) {
	cfg := testConfig(t)
	cfg.MetricsAddr = "0.0.0.0:0"
	var logs testutil.Buffer
	d, err := New(cfg, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})), "test")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := d.Run(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "listener=metrics") && strings.Contains(line, "addr=0.0.0.0:0") {
			return
		}
	}
	t.Fatalf("no WARN for the metrics listener beyond loopback:\n%s", logs.String())
}
