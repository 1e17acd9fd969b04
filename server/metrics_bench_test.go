package server

import (
	"fmt"
	"sync/atomic"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors/engine"
)

// BenchmarkCountDetailed counts decisions of a detailed_metric rule for values
// already admitted to its series: the steady state of a rule keyed by, say,
// API key. allocs/op is what metrics add to every such decision.
func BenchmarkCountDetailed(b *testing.B) {
	set := parseSet(b, `
domain: api
descriptors:
  - key: api_key
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1000}
`)
	m := newTestMetrics()
	m.Bind(set)
	r := rule(b, set, "api.api_key")
	const keys = 64
	descs := make([][]*commonv3.RateLimitDescriptor, keys)
	for i := range descs {
		descs[i] = desc("api_key", fmt.Sprintf("key-%08x", uint32(i)*2654435761))
	}
	sts := []engine.Status{{Rule: r, Limit: r.Limit(), Code: engine.OK}}
	for _, d := range descs {
		m.count(set, "api", d, sts, 0, 0)
	}
	// The fixture must hit the per-value series, not _other_ or nothing.
	if got := matching(series(b, m), "sharelimit_decisions_detailed_total", `key="api.api_key_key-`); len(got) != keys || sum(got) != keys {
		b.Fatalf("fixture counted %v, want %d values once each", got, keys)
	}
	var worker atomic.Uint32
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(worker.Add(1)) * 17
		for pb.Next() {
			m.count(set, "api", descs[i%keys], sts, 0, 0)
			i++
		}
	})
}
