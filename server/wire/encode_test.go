package wire

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestAppendSizedRefusesALongerAnswer: an answer that grew after it was
// sized is refused with b as it was, not written past the front of its
// space (which panicked, and would end the process from inside grpc-go's
// codec).
func TestAppendSizedRefusesALongerAnswer(t *testing.T) {
	resp := &rlsv3.RateLimitResponse{OverallCode: 1, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: 1, LimitRemaining: 5}}}
	n := ResponseSize(resp)
	for _, sized := range []int{n - 1, n / 2, 0} {
		b, ok := appendSized([]byte("prefix"), resp, sized)
		if ok || string(b) != "prefix" {
			t.Errorf("sized %d of %d: ok %v, b %q; want refused, b as it was", sized, n, ok, b)
		}
	}
	if b, ok := appendSized([]byte("prefix"), resp, n+1); ok || string(b) != "prefix" {
		t.Errorf("sized %d of %d: ok %v, b %q; want refused, b as it was", n+1, n, ok, b)
	}
}
