package e2e

import (
	"fmt"
	"testing"
	"time"
)

// The scenarios do not run in parallel: each measures rates against the wall
// clock, and on a small machine another scenario's processes would steal the
// CPU time the measurement depends on.

// TestSteadyState: four replicas share L under an even offered load of 2L.
// Over the run, the cluster admits L per second plus the buckets it started
// with, which hold B (the configured burst) between them.
//
// The burst is set to 2L, not left at its default of L: a replica's bucket then
// holds two seconds of its share, so the count over the whole run survives a
// stall of the client or a daemon shorter than that (the tokens wait in the
// bucket for the backlog), which a machine shared with other tests produces.
func TestSteadyState(t *testing.T) {
	const k = 4
	p := configParams{Limit: limit, Burst: 2 * limit, Quota: 40}
	c := newCluster(t, k, p)
	c.register(0, 1, 2, 3)
	c.startAll(k)

	l := startLoad(t, c, loadOpts{rate: 2 * limit, max: 7 * time.Second, weights: []float64{1, 1, 1, 1}})
	l.wait()
	l.checkClean(t)

	// A replica's bucket was created, full, at its first request, and no
	// decision was made after the last answer came: each admitted at most
	// B/k + L/k·t, with t between the two, and no less once its bucket is
	// empty at the end, as the offered 2L keeps it.
	b := p.burst()
	end := l.lastAnswered()
	tb := newTable(fmt.Sprintf("steady state: K=4, L=%d/s, B=%.0f, offered 2L evenly", limit, p.burst()),
		"replica", "answered", "t (s)", "admitted", "B/k + L/k·t", "deviation", "over", "errors", "daemon OK", "daemon OVER")
	var admitted int64
	var want float64
	for i, d := range c.daemons {
		ok, over, errs := l.totals(i)
		run := (end - l.firstSent(i)).Seconds()
		wantI := b/k + limit/k*run
		admitted += ok
		want += wantI
		// The daemon's own decision counters must agree with what the
		// client saw: no answer lost, none counted twice.
		m := c.metrics(d)
		mOK := int64(m[`sharelimit_decisions_total{code="OK",domain="edge",rule="edge.generic_key_cluster"}`])
		mOver := int64(m[`sharelimit_decisions_total{code="OVER_LIMIT",domain="edge",rule="edge.generic_key_cluster"}`])
		tb.add(d.node, ok+over+errs, fmt.Sprintf("%.3f", run), ok, wantI, dev(float64(ok), wantI), over, errs, mOK, mOver)
		if mOK != ok || mOver != over {
			t.Errorf("%s: daemon counted %d OK / %d OVER_LIMIT, the client saw %d / %d", d.node, mOK, mOver, ok, over)
		}
		c.checkShare(d, view{total: k, weight: 1.0 / k})
	}
	tb.add("cluster", l.sent.Load(), "", admitted, want, dev(float64(admitted), want), "", "", "", "")
	// Once the initial buckets are spent (B/k each, drawn down at L/k net):
	// the steady rate, by the daemons' own accounting.
	r := l.near(t, "steady admitted rate", l.window(2500*time.Millisecond, end), limit, tolerance)
	tb.add("rate in "+r.w.String(), "", "", r.lo, float64(limit), dev(r.lo, limit), "", "", "", "")
	tb.log(t)
	t.Logf("steady rate: %v", r)

	if !within(float64(admitted), want) {
		t.Errorf("cluster admitted %d, want %.0f ± %.0f%% (B + L·t)", admitted, want, 100*tolerance)
	}
}

// TestUnevenTraffic: 80% of the load reaches one replica. That replica is
// capped at its share while the others leave part of theirs unused, so the
// cluster admits less than L (tighter, never looser).
func TestUnevenTraffic(t *testing.T) {
	const k = 4
	p := configParams{Limit: limit, Quota: 40}
	c := newCluster(t, k, p)
	c.register(0, 1, 2, 3)
	c.startAll(k)

	weights := []float64{0.8, 0.2 / 3, 0.2 / 3, 0.2 / 3}
	l := startLoad(t, c, loadOpts{rate: 2 * limit, max: 5 * time.Second, weights: weights})
	l.wait()
	l.checkClean(t)

	// From 1 s on: the busy replica's initial bucket is long spent.
	w := l.window(time.Second, l.lastAnswered())
	tb := newTable(fmt.Sprintf("uneven traffic: K=4, L=%d/s, offered 2L, 80%% to node1", limit),
		"replica", "offered/s", "share/s", "admitted/s", "predicted/s", "deviation")
	share := float64(limit) / k
	var predicted float64
	for i, d := range c.daemons {
		offered, admitted := l.offered(w, i), l.admitted(w, i)
		pred := min(offered, share)
		predicted += pred
		tb.add(d.node, offered, share, admitted, pred, dev(admitted, pred))
	}
	rate := l.admitted(w)
	tb.add("cluster", l.offered(w), float64(limit), rate, predicted, dev(rate, predicted))
	tb.log(t)
	t.Logf("the cluster admitted %.1f%% of L (the sum of min(offered, share) predicts %.1f%%)", 100*rate/limit, 100*predicted/limit)

	l.atMost(t, "uneven traffic, against L", w, limit, tolerance)
	r := l.near(t, "uneven traffic, against each replica's min(offered, share)", w, predicted, tolerance)
	t.Logf("window %v", r)
}
