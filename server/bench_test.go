package server

import (
	"context"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// BenchmarkHandler calls ShouldRateLimit directly: allocs/op is what the server
// adds around the engine (the engine itself allocates nothing on an existing
// bucket), excluding grpc-go's own.
func BenchmarkHandler(b *testing.B) {
	for _, n := range []int{1, 10} {
		b.Run(map[int]string{1: "1-descriptor", 10: "10-descriptors"}[n], func(b *testing.B) {
			svc := directService(b)
			req := &rlsv3.RateLimitRequest{Domain: "test"}
			for i := 0; i < n; i++ {
				req.Descriptors = append(req.Descriptors, d("ip=10.0.0."+string(rune('a'+i))))
			}
			req.Descriptors[0] = d("general=x")
			svc.opts.ResponseHeaders = false
			resp, err := svc.ShouldRateLimit(context.Background(), req)
			if err != nil || resp.Statuses[0].CurrentLimit == nil {
				b.Fatalf("fixture matched nothing: %v %v", resp, err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				svc.ShouldRateLimit(context.Background(), req)
			}
		})
	}
}
