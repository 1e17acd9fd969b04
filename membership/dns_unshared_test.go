package membership

import (
	"strings"
	"testing"
	"time"
)

// TestDNSOneForeignAddressIsUnshared: in envoyproxy/ratelimit's deployment
// (UpstreamBy set), a name that resolves to one address that is not this
// host's is most likely a Kubernetes ClusterIP Service, a swarm VIP or a
// load balancer, named instead of a headless Service (tasks.<service> in
// swarm): every replica counts 1 and enforces every limit whole. The view
// stands as answered, with fault "unshared" and a warning naming the likely
// mistake. One address that is this host's is a replica alone, and more
// than one address is no VIP; outside upstream's deployment nothing is
// said.
func TestDNSOneForeignAddressIsUnshared(t *testing.T) {
	t.Parallel()
	upstream := []string{"REDIS_URL", "RUNTIME_ROOT"}
	clk := newFakeClock()
	var logs logBuffer
	s := newFakeDNS(t, clk, &logs, DNSConfig{Grace: -1, UpstreamBy: upstream}, "10.1.0.5")
	for _, st := range []step{
		{name: "one address, not this host's", addrs: addrs("10.96.0.10"), total: 1, local: 1, fault: FaultUnshared, warn: true},
		{name: "again: no second warning", after: 5 * time.Second, addrs: addrs("10.96.0.10"), total: 1, local: 1, fault: FaultUnshared},
		{name: "a dual-stack ClusterIP: two addresses, neither this host's", after: 5 * time.Second, addrs: addrs("10.96.0.10", "fd00:96::10"), total: 2, local: 1, fault: FaultUnshared},
		{name: "the pods' addresses", after: 5 * time.Second, addrs: addrs("10.1.0.5", "10.1.0.6"), total: 2, local: 1},
		{name: "this host's address alone", after: 5 * time.Second, addrs: addrs("10.1.0.5"), total: 1, local: 1},
	} {
		st.run(t, s, clk, &logs)
	}
	// Once this replica has seen its own address listed, a later answer
	// without it is absence (FaultAbsent, after the grace), not a VIP.
	for _, want := range []string{"ClusterIP", "headless", "tasks.", "every limit whole", "REDIS_URL"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs do not say %q:\n%s", want, logs.String())
		}
	}

	var quiet logBuffer
	s = newFakeDNS(t, clk, &quiet, DNSConfig{Grace: -1}, "10.1.0.5")
	(step{name: "outside upstream's deployment", addrs: addrs("10.96.0.10"), total: 1, local: 1}).run(t, s, clk, &quiet)
}
