package e2e

// The cap under faults of --peers-dns membership, with real daemons counting
// their replicas through a real Consul agent's DNS, over TCP, under an
// offered 2L, measured by the daemons' own accounting (measure_test.go):
// one address family failing.

import (
	"strings"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/internal/consultest"
)

// countingDNS matches a daemon whose view counts n replicas over DNS,
// confirmed, at weight 1/n.
func countingDNS(n int) func(memberView) bool {
	return func(m memberView) bool {
		return m.Source == "dns" && !m.ObservedAt.IsZero() && m.Total == n && sameWeight(m.Weight, 1/float64(n))
	}
}

// TestDNSFailedAddressFamilyKeepsCap: four daemons share L under an offered
// 2L, each counting four over DNS (two instances listed by IPv4 service
// addresses, two by IPv6 ones); then the AAAA queries start failing
// (SERVFAIL) while the A queries answer. A resolution with a failed family
// is a failed resolution: every daemon keeps counting four, with fault
// "error", and no one-second window admits more than L + 5%. (Go's resolver
// without StrictErrors returned the A records alone: every daemon counted
// two with no fault, and after --membership-hold the cluster admitted 2 L.)
// --membership-grace is 0, so that no grace keeps the IPv6 addresses
// counted in its stead.
func TestDNSFailedAddressFamilyKeepsCap(t *testing.T) {
	const k = 4
	p := mfParams()
	p.Burst = dnsBurst
	c := newCluster(t, k, p, consultest.WithDNS())
	proxy := consultest.StartAAAAProxy(t, c.consul.DNSAddr())
	c.peersDNS = service + ".service.consul."
	// The last --peers-dns-server wins: the proxy, not the agent.
	c.args = []string{"--membership-hold", "1s", "--membership-grace", "0", "--peers-dns-server", proxy.Addr()}
	addrs := []string{"192.0.2.1", "192.0.2.2", "2001:db8::3", "2001:db8::4"}
	for i := range k {
		c.consul.RegisterAt(nodeName(i), serviceID(i), service, addrs[i], true)
	}
	for i := range k {
		c.start(i, k)
	}
	c.awaitMember("counting 4 over DNS", time.Now(), startTimeout, countingDNS(k), c.daemons...)

	l := startLoad(t, c, loadOpts{rate: 2 * mfLimit, max: 30 * time.Second, weights: []float64{1, 1, 1, 1}})
	l.sleepUntil(4 * time.Second)
	t0 := l.elapsed()
	proxy.SetMode(consultest.AAAAServfail)
	// Each daemon has resolved through the failing proxy once it reports
	// the fault, or counts otherwise than four.
	c.awaitMember("resolving with the AAAA query failing", time.Now(), 30*time.Second, func(m memberView) bool {
		return m.Fault != "" || m.Total != k
	}, c.daemons...)
	t1 := l.elapsed()
	// Past the hold, and many resolutions.
	l.sleepUntil(t1 + 5*time.Second)
	for _, d := range c.daemons {
		m, err := c.memberViewOf(d)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s with AAAA failing: %v last_error=%q errors=%d", d.node, m, m.LastError, m.Errors)
		if !countingDNS(k)(m) || m.Fault != "error" || !strings.Contains(m.LastError, "AAAA") {
			t.Errorf("%s: %v with the AAAA query failing; want 4 replicas standing, with fault error and a last error naming the AAAA query", d.node, m)
		}
	}
	l.stop()
	l.checkClean(t)
	end := l.lastAnswered()
	before := l.window(mfFrom, t0)
	during := l.window(t1+time.Second, end)
	t.Logf("admitted/s by the cluster: %.0f before (%.1f%% of L), %.0f with the AAAA query failing (%.1f%% of L)",
		l.admitted(before), 100*l.admitted(before)/mfLimit, l.admitted(during), 100*l.admitted(during)/mfLimit)
	l.capped(t, "AAAA failing, A answering: every one-second window at most L", mfFrom, end, mfLimit, tolerance)
	l.near(t, "AAAA failing, A answering: the last view stands", during, mfLimit, tolerance)
}
