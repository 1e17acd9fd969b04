package server

import (
	"context"
	"sync/atomic"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// BenchmarkHandler calls ShouldRateLimit directly, on every core: allocs/op is
// what the server adds around the engine (the engine itself allocates nothing
// on an existing bucket), excluding grpc-go's own. The over-limit case keeps
// its one bucket exhausted, so the refusal path is what it measures.
func BenchmarkHandler(b *testing.B) {
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
			svc := directServiceFrom(b, "testdata/bench.yaml")
			svc.opts.ResponseHeaders = false
			req := tc.req()
			resp, err := svc.ShouldRateLimit(context.Background(), req)
			if err != nil || resp.Statuses[0].CurrentLimit == nil {
				b.Fatalf("fixture matched nothing: %v %v", resp, err)
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
