package e2e

// The cap under faults of --peers-dns membership, as dns_family_test.go:
// an instance dropped from the answers while its daemon serves.

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/internal/consultest"
	"github.com/sharelimit/sharelimit/internal/testutil"
)

// lookupA asks server over TCP for name's A records.
func lookupA(t *testing.T, server, name string) int {
	t.Helper()
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", server)
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	addrs, err := r.LookupNetIP(ctx, "ip4", name)
	if err != nil {
		return 0
	}
	return len(addrs)
}

// TestDNSCheckCriticalWhileServingKeepsCap: two daemons count their
// replicas through Consul's DNS. One instance's check turns critical (a
// check that flaps, a probe timing out under load) while its daemon keeps
// serving. Consul's DNS drops the instance at once; both daemons keep
// counting it for --membership-grace (30 s by default) after the last
// answer that listed it, as the Consul watch keeps an instance for the
// grace after it last passed, so neither grows into a share the other
// still takes, and no one-second window admits more than L + 5%. (Without
// the grace, the daemon behind it counted 1 at once and its peer after the
// 2 s hold: both took weight 1 and the cluster admitted 2 L.)
func TestDNSCheckCriticalWhileServingKeepsCap(t *testing.T) {
	const k = 2
	p := mfParams()
	p.Burst = dnsBurst
	c := newCluster(t, k, p, consultest.WithDNS())
	c.peersDNS = service + ".service.consul."
	c.register(0, 1)
	c.start(0, k)
	c.start(1, k)
	c.awaitMember("counting 2 over DNS", time.Now(), startTimeout, countingDNS(k), c.daemons...)
	l := startLoad(t, c, loadOpts{rate: 2 * mfLimit, max: 30 * time.Second, weights: []float64{1, 1}})
	l.sleepUntil(4 * time.Second)
	t0 := l.elapsed()
	c.consul.SetCheck(nodeName(0), serviceID(0), false)
	name := service + ".service.consul."
	testutil.Eventually(t, 30*time.Second, func() error {
		if n := lookupA(t, c.consul.DNSAddr(), name); n != 1 {
			return fmt.Errorf("Consul's DNS still lists %d instances, %s's among them, after its check turned critical", n, nodeName(0))
		}
		return nil
	})
	t1 := l.elapsed()
	// Past the 2 s hold, with the daemons resolving every 250 ms.
	l.sleepUntil(t1 + mfHold + 3*time.Second)
	t2 := l.elapsed()
	for _, d := range c.daemons {
		m, err := c.memberViewOf(d)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s with %s's check critical: %v", d.node, nodeName(0), m)
		if !countingDNS(k)(m) || m.Fault != "" {
			t.Errorf("%s: %v with one instance critical for less than the grace; want 2 replicas counted, no fault", d.node, m)
		}
	}
	c.consul.SetCheck(nodeName(0), serviceID(0), true)
	l.sleepUntil(t2 + time.Second)
	l.stop()
	l.checkClean(t)
	end := l.lastAnswered()
	during := l.window(t1+time.Second, t2)
	t.Logf("check critical at %.2fs, out of Consul's DNS by %.2fs, passing again at %.2fs", t0.Seconds(), t1.Seconds(), t2.Seconds())
	t.Logf("admitted/s: %.0f before (%.1f%% of L), %.0f while the check was critical (%.1f%% of L)",
		l.admitted(l.window(mfFrom, t0)), 100*l.admitted(l.window(mfFrom, t0))/mfLimit,
		l.admitted(during), 100*l.admitted(during)/mfLimit)
	l.capped(t, "a check critical for a few seconds while its daemon serves: every one-second window at most L", mfFrom, end, mfLimit, tolerance)
	l.near(t, "a check critical for a few seconds while its daemon serves: both keep their shares", during, mfLimit, tolerance)
}
