package server

import (
	"context"
	"math"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/source"
)

// TestReplacesKeepsUnlimitedOnTheWire: an unlimited rule named in another
// matched rule's replaces answers as upstream's service does, OK with
// limit_remaining MaxUint32 and no current_limit, and under global quota mode
// it is no quota descriptor, so a blocked rule beside it refuses the request.
// The rules are the descriptors package's fixture.
func TestReplacesKeepsUnlimitedOnTheWire(t *testing.T) {
	set, err := source.Load("../descriptors/testdata/valid/replaces_unlimited.yaml")
	if err != nil {
		t.Fatal(err)
	}
	call := func(f *fixture, descs ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "replaces_unlimited", Descriptors: descs})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	unlimited := func(st *rlsv3.RateLimitResponse_DescriptorStatus) bool {
		return st.Code == rlsv3.RateLimitResponse_OK && st.LimitRemaining == math.MaxUint32 && st.CurrentLimit == nil
	}

	f := newFixtureSet(t, Options{}, 1, set)
	r := call(f, d("a=x"), d("b=y"))
	if r.OverallCode != rlsv3.RateLimitResponse_OK || !unlimited(r.Statuses[0]) ||
		r.Statuses[1].CurrentLimit.GetRequestsPerUnit() != 5 || r.Statuses[1].LimitRemaining != 4 {
		t.Fatalf("[a=x] [b=y]: %v", r)
	}

	q := newFixtureEngine(t, Options{}, engine.Options{QuotaMode: true}, set)
	r = call(q, d("a=x"), d("blocked=y"))
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || !unlimited(r.Statuses[0]) ||
		r.Statuses[1].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("global quota mode, [a=x] [blocked=y]: %v", r)
	}
}
