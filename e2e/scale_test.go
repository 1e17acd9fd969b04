package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/membership"
)

// settle is how long after a catalog change the aggregate must be back
// within tolerance of L: the time for every daemon to see the change and for
// the buckets of the new replicas, which start full, to be spent.
const settle = 2 * time.Second

// TestScaleUp: two replicas share L under an offered load of 2L; two more
// nodes join while traffic flows. Every daemon's weight becomes 1/4, and two
// seconds after the catalog change the aggregate is back at L. It runs with
// the join ramp off and with it (--join-ramp auto, the default outside
// these tests): without it the new replicas' full buckets push the cluster
// over L in the 2 s after the change; with it, no more than L + 5%.
//
// The new nodes boot their daemons before their app instances register, as
// a node would: until then those daemons see two replicas, not themselves,
// and count themselves in (weight 1/3), but get no traffic. The registration
// is the catalog change; the load balancer starts sending the new nodes
// their part of the traffic at the same moment.
func TestScaleUp(t *testing.T) {
	var transient [2]float64
	for i, ramp := range []string{"0", "auto"} {
		t.Run("join-ramp="+ramp, func(t *testing.T) { transient[i] = scaleUp(t, ramp) })
	}
	tb := newTable(fmt.Sprintf("scale up 2 → 4 under 2L offered, L=%d/s: the 2 s after the catalog change", limit), "--join-ramp", "cluster admitted/s", "of L")
	for i, ramp := range []string{"0", "auto"} {
		tb.add(ramp, transient[i], dev(transient[i], limit))
	}
	tb.log(t)
}

// scaleUp runs the scale-up with --join-ramp ramp and returns the cluster's
// admitted rate in the 2 s after the catalog change.
func scaleUp(t *testing.T, ramp string) float64 {
	const k = 4
	p := configParams{Limit: limit, Quota: 40}
	c := newCluster(t, k, p)
	c.args = []string{"--join-ramp", ramp}
	c.register(0, 1)
	c.start(0, 2)
	c.start(1, 2)
	c.awaitViews(time.Now(), startTimeout, view{total: 2, weight: 0.5}, c.daemons[0], c.daemons[1])
	c.start(2, 2)
	c.start(3, 2)
	// Not registered yet: counted by none of their peers, they take next
	// to nothing (AbsentWeight) until they are.
	c.awaitViews(time.Now(), startTimeout, view{total: 2, weight: membership.AbsentWeight}, c.daemons[2], c.daemons[3])

	const run = 10 * time.Second
	l := startLoad(t, c, loadOpts{rate: 2 * limit, max: run, weights: []float64{1, 1, 0, 0}})
	l.sleepUntil(4 * time.Second)
	changed := time.Now()
	t0 := l.elapsed()
	c.register(2, 3)
	l.setWeights(1, 1, 1, 1)
	traces := c.awaitViews(changed, 5*time.Second, view{total: 4, weight: 0.25}, c.daemons...)
	l.wait()
	l.checkClean(t)
	end := l.lastAnswered()

	before := l.window(time.Second, t0)
	after := l.window(t0+settle, end)
	transient := l.window(t0-slotWidth+1, t0+settle) // from the slot of the change
	rBefore, rAfter, rTransient := l.admitted(before), l.admitted(after), l.admitted(transient)
	var slowest time.Duration
	tb := newTable(fmt.Sprintf("scale up 2 → 4 under 2L offered: L=%d/s, catalog change at %.2fs", limit, t0.Seconds()),
		"replica", "weight after", "seen after", "views on the way", "admitted/s before", "admitted/s from +2s", "share/s")
	for i, d := range c.daemons {
		c.checkShare(d, view{total: 4, weight: 0.25})
		r := c.mustRlconfig(d)
		slowest = max(slowest, traces[i].after)
		tb.add(d.node, fmt.Sprintf("%.4g", r.Membership.Weight), traces[i].after, fmt.Sprint(traces[i].seen),
			l.admitted(before, i), l.admitted(after, i), float64(limit)/k)
	}
	tb.add("cluster", "", slowest, "", rBefore, rAfter, float64(limit))
	tb.add("deviation from L", "", "", "", dev(rBefore, limit), dev(rAfter, limit), "")
	tb.log(t)
	t.Logf("windows: before %v, after %v; in %v, about the 2 s after the change, the cluster admitted %.1f/s (%s of L: the new replicas' full buckets and the %s until every daemon saw the change)",
		before, after, transient, rTransient, dev(rTransient, limit), slowest.Round(time.Millisecond))

	l.near(t, "before the change", before, limit, tolerance)
	l.near(t, fmt.Sprintf("from %s after the change", settle), after, limit, tolerance)

	ts := l.series(fmt.Sprintf("sharelimit: scale-up 2 → 4 replicas under load (L = %d/s, offered %d/s)", limit, 2*limit),
		200*time.Millisecond, end.Truncate(200*time.Millisecond), nodeNames(k), limit,
		[]step{{0, 2}, {t0, 4}},
		[]event{
			{T: t0.Seconds(), Label: "catalog: 2 → 4 instances"},
			{T: (t0 + slowest).Seconds(), Label: fmt.Sprintf("all at w=1/4 (+%d ms)", slowest.Milliseconds())},
		})
	ts.writeIfAsked(t)
	if ramp != "0" {
		l.atMost(t, "with the join ramp, the 2 s after the change", transient, limit, tolerance)
	}
	return rTransient
}

// TestScaleDown: four replicas share L; two nodes leave while traffic flows
// (their instances are deregistered, the load balancer stops sending them
// traffic, their daemons are stopped). The survivors' weights double to 1/2,
// and two seconds after the catalog change the aggregate is back at L.
func TestScaleDown(t *testing.T) {
	const k = 4
	p := configParams{Limit: limit, Quota: 40}
	c := newCluster(t, k, p)
	// A deregistered instance counts for --membership-grace (30 s by
	// default) before its peers take its share over; the re-division after
	// it is what is under test here, so there is no grace: the survivors
	// grow after --membership-hold, as the settle of 2 s allows.
	c.args = []string{"--membership-grace", "0"}
	c.register(0, 1, 2, 3)
	c.startAll(k)

	const run = 10 * time.Second
	l := startLoad(t, c, loadOpts{rate: 2 * limit, max: run, weights: []float64{1, 1, 1, 1}})
	l.sleepUntil(4 * time.Second)
	changed := time.Now()
	t0 := l.elapsed()
	c.deregister(2, 3)
	l.setWeights(1, 1, 0, 0)
	l.retire(2) // their last slots, before they stop
	l.retire(3)
	c.daemons[2].sigterm(t)
	c.daemons[3].sigterm(t)
	traces := c.awaitViews(changed, 5*time.Second, view{total: 2, weight: 0.5}, c.daemons[0], c.daemons[1])
	l.wait()
	l.checkClean(t)
	end := l.lastAnswered()
	for _, d := range c.daemons[2:] {
		if err := d.waitExit(t, drain+10*time.Second); err != nil {
			t.Errorf("%s after SIGTERM: %v, want exit status 0", d.node, err)
		}
	}

	before := l.window(time.Second, t0)
	after := l.window(t0+settle, end)
	transient := l.window(t0-slotWidth+1, t0+settle) // from the slot of the change
	rBefore, rAfter, rTransient := l.admitted(before), l.admitted(after), l.admitted(transient)
	var slowest time.Duration
	tb := newTable(fmt.Sprintf("scale down 4 → 2 under 2L offered: L=%d/s, catalog change at %.2fs", limit, t0.Seconds()),
		"replica", "weight after", "seen after", "views on the way", "admitted/s before", "admitted/s from +2s")
	for i, d := range c.daemons {
		w, seen, views := "stopped", "", ""
		if i < 2 {
			c.checkShare(d, view{total: 2, weight: 0.5})
			r := c.mustRlconfig(d)
			w, seen, views = fmt.Sprintf("%.4g", r.Membership.Weight), traces[i].after.Round(time.Millisecond).String(), fmt.Sprint(traces[i].seen)
			slowest = max(slowest, traces[i].after)
		}
		tb.add(d.node, w, seen, views, l.admitted(before, i), l.admitted(after, i))
	}
	tb.add("cluster", "", slowest, "", rBefore, rAfter)
	tb.add("deviation from L", "", "", "", dev(rBefore, limit), dev(rAfter, limit))
	tb.log(t)
	t.Logf("windows: before %v, after %v; in %v, about the 2 s after the change, the cluster admitted %.1f/s (%s of L: the survivors ran at 1/4 for %s)",
		before, after, transient, rTransient, dev(rTransient, limit), slowest.Round(time.Millisecond))

	l.near(t, "before the change", before, limit, tolerance)
	l.near(t, fmt.Sprintf("from %s after the change", settle), after, limit, tolerance)
}

func nodeNames(k int) []string {
	names := make([]string, k)
	for i := range names {
		names[i] = nodeName(i)
	}
	return names
}
