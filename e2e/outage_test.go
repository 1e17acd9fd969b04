package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// TestConsulOutage: the Consul agent is killed while traffic flows. The
// daemons keep answering from memory with their last view (weight 1/4), so the
// client sees no error and the aggregate stays at L. A fresh agent then comes
// up on the same address with an empty catalog, and a different set of
// instances registers (the four nodes plus a fifth that runs no daemon here):
// every daemon converges to the new view, weight 1/5, and the four of them
// then admit 4/5 of L between them.
func TestConsulOutage(t *testing.T) {
	const k = 4
	p := configParams{Limit: limit, Quota: 40}
	c := newCluster(t, k, p)
	c.register(0, 1, 2, 3)
	c.startAll(k)

	// The load outlasts the slowest convergence the daemons' back-off allows;
	// it is stopped as soon as the last window is measured.
	l := startLoad(t, c, loadOpts{rate: 2 * limit, max: 60 * time.Second, weights: []float64{1, 1, 1, 1}})
	l.sleepUntil(4 * time.Second)
	t1 := l.elapsed()
	c.consul.Stop()
	killed := time.Now()

	// Every daemon notices (its blocking query fails) and keeps its view.
	outage := make([]*rlconfig, k)
	for _, d := range c.daemons {
		testutil.Eventually(t, 5*time.Second-time.Since(killed), func() error {
			if r := c.mustRlconfig(d); r.Membership.LastError == "" {
				return fmt.Errorf("%s: no watch error reported %s into the outage: %+v", d.node, 5*time.Second, r.Membership)
			}
			return nil
		})
	}
	l.sleepUntil(t1 + 4*time.Second)
	for i, d := range c.daemons {
		outage[i] = c.mustRlconfig(d)
		m := outage[i].Membership
		if m.Total != k || !sameWeight(m.Weight, 0.25) || m.Errors == 0 || m.AgeSeconds < 3 {
			t.Errorf("%s during the outage: total=%d weight=%v errors=%d age=%.1fs, want the last view (total 4, weight 0.25) standing, errors counted, aged ≥ 3 s",
				d.node, m.Total, m.Weight, m.Errors, m.AgeSeconds)
		}
		c.checkShare(d, view{total: k, weight: 0.25})
		met := c.metrics(d)
		if met[membershipSeries("errors_total")] < 1 || met[membershipSeries("age_seconds")] < 3 {
			t.Errorf("%s during the outage: sharelimit_membership_errors_total = %v, sharelimit_membership_age_seconds = %v; want ≥ 1 and ≥ 3",
				d.node, met[membershipSeries("errors_total")], met[membershipSeries("age_seconds")])
		}
	}
	t2 := l.elapsed()

	c.consul.Restart()
	restarted := time.Now()
	c.register(0, 1, 2, 3, 4)
	traces := c.awaitViews(restarted, 45*time.Second, view{total: k + 1, weight: 0.2}, c.daemons...)
	var slowest time.Duration
	for _, tr := range traces {
		slowest = max(slowest, tr.after)
	}
	tc := l.elapsed()
	for _, d := range c.daemons {
		c.checkShare(d, view{total: k + 1, weight: 0.2})
	}
	l.sleepUntil(tc + 4*time.Second)
	l.stop()
	l.checkClean(t)
	end := l.lastAnswered()

	before := l.window(time.Second, t1)
	during := l.window(t1, t2)
	after := l.window(tc, end)
	rBefore, rDuring, rAfter := l.admitted(before), l.admitted(during), l.admitted(after)
	wantAfter := float64(limit) * k / (k + 1)
	tb := newTable(fmt.Sprintf("Consul outage under 2L offered: L=%d/s, agent killed at %.2fs, restarted at %.2fs", limit, t1.Seconds(), t2.Seconds()),
		"replica", "view in outage", "watch errors", "last error", "new view after", "views on the way", "admitted/s before", "in outage", "after")
	for i, d := range c.daemons {
		m := outage[i].Membership
		tb.add(d.node, view{m.Total, m.Weight}, m.Errors, lastRunes(m.LastError, 30), traces[i].after, fmt.Sprint(traces[i].seen),
			l.admitted(before, i), l.admitted(during, i), l.admitted(after, i))
	}
	tb.add("cluster", "", "", "", slowest, "", rBefore, rDuring, rAfter)
	tb.add("expected", "", "", "", "", "", float64(limit), float64(limit), wantAfter)
	tb.add("deviation", "", "", "", "", "", dev(rBefore, limit), dev(rDuring, limit), dev(rAfter, wantAfter))
	tb.log(t)

	t.Logf("before the outage: %v", l.near(t, "before the outage", before, limit, tolerance))
	t.Logf("during the outage: %v", l.near(t, "during the outage", during, limit, tolerance))
	t.Logf("after converging to 5 instances: %v", l.near(t, "after converging to 5 instances, the 4 daemons", after, wantAfter, tolerance))
}

// lastRunes keeps the end of an error message, where its cause is.
func lastRunes(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return "…" + string(r[len(r)-n:])
}
