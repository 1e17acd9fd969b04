package server

import (
	"io"
	"log/slog"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/descriptors/engine"
)

// TestAnswerIndependentOfMetricsBinding: a rule's answer is built by the
// service from the set. It is the same, in bytes and in allocations, whether
// or not the metrics binding has series for the set, and its current_limit is
// the one message the service built for the rule, not one per request.
func TestAnswerIndependentOfMetricsBinding(t *testing.T) {
	const rules = `
domain: md
descriptors:
  - key: a
    metadata: {team: payments, tags: {tier: gold}}
    rate_limit: {unit: hour, requests_per_unit: 1000000}
  - key: detailed
    detailed_metric: true
    metadata: {kind: detailed}
    rate_limit: {unit: minute, requests_per_unit: 1000000}
`
	set := parseSet(t, rules)
	service := func(bind bool) *Service {
		store := bucket.NewStore(0)
		e := newEngine(t, set, store, engine.Options{})
		m := NewMetrics(store)
		if bind {
			m.Bind(set)
		}
		return NewService(e, func() int64 { return 0 }, m, Options{DynamicMetadata: true}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	req := &rlsv3.RateLimitRequest{Domain: "md", Descriptors: []*commonv3.RateLimitDescriptor{d("a=1"), d("detailed=2")}}
	bound, unbound := service(true), service(false)
	answer := func(s *Service) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, _, err := s.Answer(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	wire := func(r *rlsv3.RateLimitResponse) string {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	a, b := answer(bound), answer(unbound)
	if a.Statuses[0].CurrentLimit == nil || a.DynamicMetadata.Fields["metadata"] == nil {
		t.Fatalf("fixture decided no limit or no metadata: %v", a)
	}
	if wire(a) != wire(b) {
		t.Fatalf("answers differ with the binding:\n bound:   %v\n unbound: %v", a, b)
	}
	for _, s := range []*Service{bound, unbound} {
		if x, y := answer(s), answer(s); x.Statuses[0].CurrentLimit != y.Statuses[0].CurrentLimit {
			t.Errorf("current_limit built per request (binding present: %v), not once per rule of the set", s == bound)
		}
	}
	ab := testing.AllocsPerRun(100, func() { answer(bound) })
	au := testing.AllocsPerRun(100, func() { answer(unbound) })
	if ab != au {
		t.Errorf("allocations per answer depend on the metrics binding: %v bound, %v unbound", ab, au)
	}
	// A set the metrics never saw, installed by a swap: the same again.
	unbound.engine.Swap(parseSet(t, rules))
	x, y := answer(unbound), answer(unbound)
	if x.Statuses[1].CurrentLimit != y.Statuses[1].CurrentLimit || !proto.Equal(x.Statuses[1].CurrentLimit, a.Statuses[1].CurrentLimit) ||
		!proto.Equal(x.DynamicMetadata, a.DynamicMetadata) {
		t.Errorf("after a swap to a set the metrics never bound: %v", x)
	}
}
