package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sharelimit/sharelimit/descriptors"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/internal/monotime"
	"github.com/sharelimit/sharelimit/source"
)

// TestUpstreamLabels: the labels upstream's statsd mapping gives a stats key,
// after upstream's SanitizeStatName.
func TestUpstreamLabels(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		key  string
		want []string // nil: no series
	}{
		{"edge.generic_key_api", []string{"edge", "generic_key_api"}},
		{"edge.header_match_login.remote_address", []string{"edge", "header_match_login", "remote_address"}},
		// Past key2, the regex rule drops the rest.
		{"edge.a_1.b_2.c_3.d_4", []string{"edge", "a_1", "b_2"}},
		// An IPv4 address keeps its place; any other dot splits.
		{"edge.remote_address_192.0.2.10", []string{"edge", "remote_address_192_0_2_10"}},
		{"edge.remote_address_192.0.2.10.path_/x", []string{"edge", "remote_address_192_0_2_10", "path_/x"}},
		{"edge.host_api.example.com", []string{"edge", "host_api", "example"}},
		{"edge.k_a:b|c", []string{"edge", "k_a_b_c"}},
		{"edge.user_\xff", []string{"edge", "user_\uFFFD"}},
		{"edge", nil},
	} {
		got, ok := upstreamLabels(tc.key)
		if ok != (tc.want != nil) || !slices.Equal(got, tc.want) {
			t.Errorf("upstreamLabels(%q) = %q %v, want %q", tc.key, got, ok, tc.want)
		}
	}
}

// TestUpstreamHitsOf: hits as upstream adds them to a stat.
func TestUpstreamHitsOf(t *testing.T) {
	t.Parallel()
	d := func(hits *wrapperspb.UInt64Value, negative bool) *commonv3.RateLimitDescriptor {
		return &commonv3.RateLimitDescriptor{HitsAddend: hits, IsNegativeHits: negative}
	}
	for _, tc := range []struct {
		d       *commonv3.RateLimitDescriptor
		reqHits uint32
		want    uint64
	}{
		{d(nil, false), 0, 1},
		{d(nil, false), 4, 4},
		{d(wrapperspb.UInt64(3), false), 4, 3},
		{d(wrapperspb.UInt64(0), false), 4, 0}, // check only
		{d(wrapperspb.UInt64(3), true), 0, 0},  // a give-back is no hit
		{nil, 2, 2},
	} {
		if got := hitsOf(tc.d, tc.reqHits); got != tc.want {
			t.Errorf("hitsOf(%v, %d) = %d, want %d", tc.d, tc.reqHits, got, tc.want)
		}
	}
}

// TestUpstreamNearMatchesUpstreamWindow: from a full bucket, draws within the
// limit count near_limit exactly as upstream's fixed window counts them from
// an empty counter, whatever the burst, ratio and hits: a property over
// random sequences.
func TestUpstreamNearMatchesUpstreamWindow(t *testing.T) {
	t.Parallel()
	const maxBurst = 40
	var yml strings.Builder
	yml.WriteString("domain: d\ndescriptors:\n")
	for b := 1; b <= maxBurst; b++ {
		fmt.Fprintf(&yml, "  - key: k%d\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", b, b)
	}
	set := parseSet(t, yml.String())
	rng := rand.New(rand.NewPCG(1, 2))
	for _, ratio := range []float64{0, 0.1, 0.25, 0.5, 0.7, 0.8, 0.9, 0.95, 1} {
		u := &upstreamCounting{nearRatio: ratio}
		for b := uint64(1); b <= maxBurst; b++ {
			lim := rule(t, set, fmt.Sprintf("d.k%d", b)).Limit()
			if lim.Burst() != b {
				t.Fatalf("k%d: burst %d", b, lim.Burst())
			}
			// Upstream: floor(float32(limit) × float32(ratio)).
			threshold := uint64(math.Floor(float64(float32(b) * float32(ratio))))
			for range 20 {
				var used, ours, theirs uint64
				for used < b {
					h := 1 + rng.Uint64N(min(b-used, 4))
					before, after := used, used+h
					if after > threshold {
						if before >= threshold {
							theirs += h
						} else {
							theirs += after - threshold
						}
					}
					used = after
					ours += u.near(&engine.Status{Limit: lim, Remaining: uint32(b - used)}, h)
				}
				if ours != theirs {
					t.Fatalf("burst %d ratio %v: near %d, upstream's window %d", b, ratio, ours, theirs)
				}
			}
		}
	}
}

// upstreamSample reads the collector: series text -> value.
func upstreamSample(t testing.TB, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			var ls []string
			for _, l := range s.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			v := s.GetCounter().GetValue()
			if s.GetHistogram() != nil {
				v = float64(s.GetHistogram().GetSampleCount())
			}
			out[mf.GetName()+"{"+strings.Join(ls, ",")+"}"] = v
		}
	}
	return out
}

// TestUpstreamSeriesNeverDecrease counts random decisions (within, over,
// shadow, several hits, check-only) on every core while scraping: no series
// may ever go down between scrapes (Prometheus would read a reset), and at
// the end each equals what the workers counted.
func TestUpstreamSeriesNeverDecrease(t *testing.T) {
	t.Parallel()
	set := parseSet(t, `
domain: d
descriptors:
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: canary
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: user
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 100}
`)
	m := newTestMetrics()
	m.CountUpstream(0.8)
	m.Bind(set)
	c := newUpstreamCollector(m, UpstreamOptions{})
	rules := []*descriptors.Rule{rule(t, set, "d.plain"), rule(t, set, "d.canary"), rule(t, set, "d.user")}
	keys := []string{"key1=plain", "key1=canary", "key1=user_a"}

	type totals struct{ within, over, shadow [3]uint64 }
	const workers, perWorker = 4, 3000
	results := make(chan totals, workers)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var tot totals
			for range perWorker {
				i := rng.IntN(3)
				r := rules[i]
				h := rng.Uint64N(4) // 0 is check-only
				st := engine.Status{Rule: r, Limit: r.Limit(), Code: engine.OK, Remaining: uint32(rng.IntN(101))}
				switch rng.IntN(3) {
				case 1:
					if r.ShadowMode() {
						st.Shadowed = true
						tot.shadow[i] += h
					}
					st.Code = engine.OverLimit
					if st.Shadowed {
						st.Code = engine.OK
					}
					tot.over[i] += h
				default:
					tot.within[i] += h
				}
				d := desc(r.Key(), "a")
				d[0].HitsAddend = wrapperspb.UInt64(h)
				m.count(set, "d", d, []engine.Status{st}, 0, 0)
			}
			results <- tot
		}()
	}
	go func() { wg.Wait(); close(stop) }()
	last := map[string]float64{}
	scrapes := 0
	for done := false; !done; {
		select {
		case <-stop:
			done = true
		default:
		}
		for k, v := range upstreamSample(t, c) {
			if v < last[k] {
				t.Fatalf("scrape %d: %s went down from %v to %v", scrapes, k, last[k], v)
			}
			last[k] = v
		}
		scrapes++
	}
	var sum totals
	for range workers {
		tot := <-results
		for i := range 3 {
			sum.within[i] += tot.within[i]
			sum.over[i] += tot.over[i]
			sum.shadow[i] += tot.shadow[i]
		}
	}
	final := upstreamSample(t, c)
	for i, key := range keys {
		for name, want := range map[string]uint64{
			"total_hits": sum.within[i] + sum.over[i], "within_limit": sum.within[i],
			"over_limit": sum.over[i], "shadow_mode": sum.shadow[i],
		} {
			k := "ratelimit_service_rate_limit_" + name + "{domain=d," + key + "}"
			if got := final[k]; got != float64(want) {
				t.Errorf("%s = %v, want %d", k, got, want)
			}
		}
	}
	if scrapes < 3 {
		t.Logf("only %d scrapes overlapped the counting", scrapes)
	}
}

// TestUpstreamGlobalShadowMode: a request over its limit that --shadow-mode
// answers OK counts in ratelimit_service_global_shadow_mode, as upstream's
// global_shadow_mode; the hits still count over_limit.
func TestUpstreamGlobalShadowMode(t *testing.T) {
	t.Parallel()
	set, err := source.Load("testdata/bench.yaml")
	if err != nil {
		t.Fatal(err)
	}
	store := bucket.NewStore(100)
	m := NewMetrics(store)
	m.CountUpstream(0.8)
	m.Bind(set)
	svc := NewService(newEngine(t, set, store, engine.Options{}), monotime.New(), m, Options{ShadowMode: true}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	req := &rlsv3.RateLimitRequest{Domain: "test", HitsAddend: 1, Descriptors: []*commonv3.RateLimitDescriptor{d("fixed=one")}}
	for range 3 { // 2 a second: the third is over, and answered OK
		if resp, err := svc.ShouldRateLimit(context.Background(), req); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("global shadow mode: %v %v", resp, err)
		}
	}
	got := upstreamSample(t, newUpstreamCollector(m, UpstreamOptions{}))
	for k, want := range map[string]float64{
		"ratelimit_service_global_shadow_mode{}":                                1,
		"ratelimit_service_rate_limit_over_limit{domain=test,key1=fixed_one}":   1,
		"ratelimit_service_rate_limit_within_limit{domain=test,key1=fixed_one}": 2,
		"ratelimit_service_total_requests{grpc_method=ShouldRateLimit}":         3,
		"ratelimit_service_response_time_seconds{grpc_method=ShouldRateLimit}":  3,
	} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v", k, got[k], want)
		}
	}
}
