package descriptors

import (
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// decide is Decide in the shape most tests want: the statuses and the overall
// code.
func decide(e *Engine, domain string, descs []*commonv3.RateLimitDescriptor, hits uint32, now int64, out []Status) ([]Status, rlsv3.RateLimitResponse_Code, error) {
	d := Decision{Statuses: out}
	err := e.Decide(&d, domain, descs, hits, now)
	return d.Statuses, d.Code, err
}
