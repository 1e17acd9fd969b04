package membership

import (
	"context"
	"testing"
)

// TestDNSDualStackCountsEachAddress: in a dual-stack network (a Kubernetes
// headless Service with ipFamilyPolicy PreferDualStack or RequireDualStack,
// a compose network with enable_ipv6) every replica has an A and an AAAA
// record, and each distinct address counts as one replica: three pods count
// six, and each enforces 1/6 of every limit. That is tighter, never looser
// (the cluster admits half its limits), and documented. Merging a
// replica's addresses is not: nothing in an answer says which A and which
// AAAA record are one replica's, and even merging this host's own
// addresses would undercount replicas that share a host but not an
// address.
func TestDNSDualStackCountsEachAddress(t *testing.T) {
	t.Parallel()
	s := newTestDNS(t, newFakeClock(), 0, &logBuffer{})
	s.observe(context.Background(), addrs("10.1.0.5", "fd00:10:1::5", "10.1.0.6", "fd00:10:1::6", "10.1.0.7", "fd00:10:1::7"), nil)
	if v := s.View(); !counts(6, 1)(v) {
		t.Fatalf("three dual-stack replicas: view %+v; want each address counted, 6 replicas at weight 1/6 (tighter than 1/3)", v)
	}
}
