package server

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sharelimit/sharelimit/descriptors"
)

// TestReloadsUnderTrafficNeverFail: a tight loop of swaps between two sets
// whose rule IDs differ, while requests flow through real gRPC, must never
// answer anything but a decision. A request decided with one set and counted
// against another indexed the wrong set's counters and panicked.
func TestReloadsUnderTrafficNeverFail(t *testing.T) {
	f := newFixture(t, Options{}, 1)
	// Set a puts the requested rule at a high ID; set b holds it alone, at ID 0.
	var big strings.Builder
	big.WriteString("domain: test\ndescriptors:\n")
	for i := range 50 {
		fmt.Fprintf(&big, "  - key: pad%d\n    rate_limit: {unit: second, requests_per_unit: 5}\n", i)
	}
	hot := "  - key: hot\n    detailed_metric: true\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n"
	big.WriteString(hot)
	sets := []*descriptors.Set{
		parseSet(t, big.String()),
		parseSet(t, "domain: test\ndescriptors:\n"+hot),
	}
	const reloads = 20_000
	const clients = 4
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var failures atomic.Int64
	var firstErr atomic.Value
	var calls atomic.Int64
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{d("hot=x"), d("pad49=y")}}
			for ctx.Err() == nil {
				_, err := f.client.ShouldRateLimit(ctx, req)
				if err != nil && ctx.Err() == nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, status.Convert(err).Code().String()+": "+status.Convert(err).Message())
				}
				calls.Add(1)
			}
		}()
	}
	for i := range reloads {
		next := sets[i%2]
		f.metrics.Bind(next)
		if old := f.engine.Swap(next); old != nil {
			f.metrics.Unbind(old)
		}
	}
	cancel()
	wg.Wait()
	if n := failures.Load(); n != 0 {
		t.Fatalf("%d of %d requests failed during %d reloads; first: %v", n, calls.Load(), reloads, firstErr.Load())
	}
	if calls.Load() < clients {
		t.Fatalf("only %d requests ran during the reloads", calls.Load())
	}
	t.Logf("%d requests during %d reloads, none failed", calls.Load(), reloads)
}

// TestHeadersDescribeTheOverLimitDescriptor: when a request is refused, the
// RateLimit headers describe the descriptor that refused it, even when another
// descriptor is as close to its limit.
func TestHeadersDescribeTheOverLimitDescriptor(t *testing.T) {
	f := newFixture(t, Options{ResponseHeaders: true}, 1)
	f.call(d("ip=a"))
	f.call(d("ip=a"))
	f.call(d("fixed=one"))
	f.call(d("fixed=one"))
	r := f.call(d("ip=a"), d("fixed=one")) // ip: OK with 0 left; fixed: OVER_LIMIT
	if got := codesOf(r); got != "X:OX" {
		t.Fatalf("codes %s", got)
	}
	h := map[string]string{}
	for _, hv := range r.ResponseHeadersToAdd {
		h[hv.Key] = hv.Value
	}
	if h["RateLimit-Limit"] != "2" || h["RateLimit-Remaining"] != "0" {
		t.Fatalf("headers %v, want those of fixed=one (limit 2)", h)
	}
}

// TestCurrentLimitCarriesTheLimit: current_limit is the limit as configured,
// unit_multiplier included. The server builds each rule's message once per
// reload and shares it between responses (grpc-go only reads it); none is
// reachable from the rules, so a caller that changes a response it received
// changes nothing that decides.
func TestCurrentLimitCarriesTheLimit(t *testing.T) {
	f := newFixture(t, Options{}, 1)
	ov := &commonv3.RateLimitDescriptor{Entries: d("fixed=one").Entries,
		Limit: &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_MINUTE, UnitMultiplier: wrapperspb.UInt32(5)}}
	first := f.call(ov, d("ip=a"))
	got := first.Statuses[0].CurrentLimit
	if got.GetRequestsPerUnit() != 7 || got.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || got.GetUnitMultiplier().GetValue() != 5 {
		t.Fatalf("override current_limit %v", got)
	}
	if ip := first.Statuses[1].CurrentLimit; ip.GetRequestsPerUnit() != 3 || ip.GetUnitMultiplier() != nil {
		t.Fatalf("rule current_limit %v", ip)
	}
	resp, err := f.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{d("ip=b")}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Statuses[0].CurrentLimit.RequestsPerUnit = 999
	// ip=b has drawn 1 of its 3 a minute: 2 more pass, then it is over.
	if got := codesOf(f.call(d("ip=b"), d("ip=b"), d("ip=b"))); got != "X:OOX" {
		t.Fatalf("after a caller changed a response: %s, want the limit of 3 to hold", got)
	}
	for _, r := range f.engine.Set().Rules() {
		if r.Path() == "test.ip" && r.Limit().RequestsPerUnit() != 3 {
			t.Fatalf("rule's limit is now %d", r.Limit().RequestsPerUnit())
		}
	}
}
