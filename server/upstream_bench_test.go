package server

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/internal/monotime"
	"github.com/sharelimit/sharelimit/source"
)

// BenchmarkHandlerUpstream is BenchmarkHandler with upstream's series on
// (--metrics-addr, USE_PROMETHEUS): what counting hits and near_limit adds
// to each decision. Compare it with BenchmarkHandler, same cases.
func BenchmarkHandlerUpstream(b *testing.B) {
	cases := []struct {
		name string
		req  func() *rlsv3.RateLimitRequest
		over bool
	}{
		{"1-descriptor", func() *rlsv3.RateLimitRequest {
			return &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{d("bench=x")}}
		}, false},
		{"10-descriptors", func() *rlsv3.RateLimitRequest {
			req := &rlsv3.RateLimitRequest{Domain: "test"}
			for i := range 10 {
				req.Descriptors = append(req.Descriptors, d("bench=10.0.0."+string(rune('a'+i))))
			}
			return req
		}, false},
		{"over-limit", func() *rlsv3.RateLimitRequest {
			return &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{d("fixed=one")}}
		}, true},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			set, err := source.Load("testdata/bench.yaml")
			if err != nil {
				b.Fatal(err)
			}
			store := bucket.NewStore(10_000)
			m := NewMetrics(store)
			m.CountUpstream(0.8)
			m.Bind(set)
			svc := NewService(newEngine(b, set, store, engine.Options{Weight: 0.5}), monotime.New(), m, Options{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			req := tc.req()
			resp, err := svc.ShouldRateLimit(context.Background(), req)
			if err != nil || resp.Statuses[0].CurrentLimit == nil {
				b.Fatalf("fixture matched nothing: %v %v", resp, err)
			}
			c := newUpstreamCollector(m, UpstreamOptions{})
			if got := upstreamSample(b, c)["ratelimit_service_rate_limit_total_hits{domain=test,key1=bench}"] + upstreamSample(b, c)["ratelimit_service_rate_limit_total_hits{domain=test,key1=fixed_one}"]; got != float64(len(req.Descriptors)) {
				b.Fatalf("upstream's series counted %v hits of the fixture's %d: the benchmark would measure nothing", got, len(req.Descriptors))
			}
			var over atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if r, _ := svc.ShouldRateLimit(context.Background(), req); r.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
						over.Add(1)
					}
				}
			})
			b.StopTimer()
			if n := over.Load(); tc.over != (n > int64(b.N)/2) && b.N > 100 {
				b.Fatalf("%d of %d answers OVER_LIMIT; this case expects over=%v", n, b.N, tc.over)
			}
		})
	}
}
