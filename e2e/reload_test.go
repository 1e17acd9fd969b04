package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// clusterRule is the config path of the global limit under test.
const clusterRule = "edge.generic_key_cluster"

// TestReloadUnderLoad: the global limit is halved in the YAML, edited in
// place, while 2L is offered. Within 2 s every daemon has loaded the new
// config and answers with the new limit, the aggregate follows it, and no
// request fails. A rule the edit did not touch keeps its buckets: an hourly
// quota drained before the reload is still drained after it.
func TestReloadUnderLoad(t *testing.T) {
	const k = 4
	const reloadWithin = 2 * time.Second
	p := configParams{Limit: limit, Quota: 40}
	c := newCluster(t, k, p)
	c.register(0, 1, 2, 3)
	c.startAll(k)

	// Each daemon holds 40/4 = 10 of the quota; spend them all.
	const localQuota = 10
	for _, d := range c.daemons {
		admitted := 0
		for range localQuota + 2 {
			if quota(t, d).OverallCode == rlsv3.RateLimitResponse_OK {
				admitted++
			}
		}
		if admitted != localQuota {
			t.Fatalf("%s admitted %d quota requests of 12, want its share, %d", d.node, admitted, localQuota)
		}
	}
	gen := c.mustRlconfig(c.daemons[0]).Reload.Generation

	const run = 9 * time.Second
	l := startLoad(t, c, loadOpts{rate: 2 * limit, max: run, weights: []float64{1, 1, 1, 1}})
	l.sleepUntil(3 * time.Second)
	changed := time.Now()
	t0 := l.elapsed()
	newLimit := limit / 2
	p.Limit = newLimit
	c.writeConfig(p)
	loaded := c.awaitRule(changed, 10*time.Second, gen, clusterRule, float64(newLimit))
	l.wait()
	l.checkClean(t)
	end := l.lastAnswered()

	before := l.window(time.Second, t0)
	after := l.window(t0+reloadWithin, end)
	rBefore, rAfter := l.admitted(before), l.admitted(after)
	tb := newTable(fmt.Sprintf("reload under 2L offered: L %d → %d/s written at %.2fs", limit, newLimit, t0.Seconds()),
		"replica", "generation", "loaded after", "last old-limit answer", "first new-limit answer", "admitted/s before", "after", "quota after reload")
	for i, d := range c.daemons {
		r := c.mustRlconfig(d)
		if r.Reload.LastError != "" {
			t.Errorf("%s: reload error %q", d.node, r.Reload.LastError)
		}
		spans := l.limitSpans(i)
		oldSpan, newSpan := spans[uint32(limit)], spans[uint32(newLimit)]
		if len(spans) != 2 {
			t.Errorf("%s answered with limits %v, want only %d and %d", d.node, spans, limit, newLimit)
		}
		if oldSpan.last > t0+reloadWithin {
			t.Errorf("%s still answered with the old limit %s after the file was written", d.node, oldSpan.last-t0)
		}
		// The untouched hourly rule: still drained, so the reload kept its
		// bucket (a new bucket would start full and admit this request).
		q := quota(t, d)
		st := q.Statuses[0]
		if q.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || st.LimitRemaining != 0 {
			t.Errorf("%s: quota after the reload = %v, remaining %d; want OVER_LIMIT, 0: its bucket was not kept", d.node, q.OverallCode, st.LimitRemaining)
		}
		tb.add(d.node, r.Reload.Generation, loaded[i], fmt.Sprintf("+%s", (oldSpan.last-t0).Round(time.Millisecond)),
			fmt.Sprintf("+%s", (newSpan.first-t0).Round(time.Millisecond)), l.admitted(before, i), l.admitted(after, i),
			fmt.Sprintf("%s, remaining %d", q.OverallCode, st.LimitRemaining))
	}
	tb.add("cluster", "", "", "", "", rBefore, rAfter, "")
	tb.add("expected", "", "", "", "", float64(limit), float64(newLimit), "")
	tb.add("deviation", "", "", "", "", dev(rBefore, limit), dev(rAfter, float64(newLimit)), "")
	tb.log(t)

	for i, d := range c.daemons {
		if loaded[i] > reloadWithin {
			t.Errorf("%s loaded the new limit %s after the write, want within %s", d.node, loaded[i], reloadWithin)
		}
	}
	t.Logf("before the reload: %v", l.near(t, "before the reload", before, limit, tolerance))
	t.Logf("from %s after the reload: %v", reloadWithin, l.near(t, fmt.Sprintf("from %s after the reload", reloadWithin), after, float64(newLimit), tolerance))
}

// quota sends one request for the hourly quota to d.
func quota(t *testing.T, d *daemon) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	resp, err := d.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain:     "edge",
		HitsAddend: 1,
		Descriptors: []*commonv3.RateLimitDescriptor{
			{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "quota"}}},
		},
	})
	if err != nil {
		t.Fatalf("%s: quota request: %v", d.node, err)
	}
	return resp
}

// awaitRule polls every daemon's /rlconfig until it reports a config
// generation newer than gen with rule at the cluster-wide rate, and returns,
// per daemon, how long after since that was first seen.
func (c *cluster) awaitRule(since time.Time, timeout time.Duration, gen int, rule string, rate float64) []time.Duration {
	c.t.Helper()
	out := make([]time.Duration, len(c.daemons))
	done := make([]bool, len(c.daemons))
	pending := len(c.daemons)
	deadline := time.Now().Add(timeout)
	for {
		for i, d := range c.daemons {
			if done[i] {
				continue
			}
			r, err := c.rlconfig(d)
			at := time.Since(since)
			if err != nil {
				continue
			}
			if got, _, ok := r.rule(rule); ok && r.Reload.Generation > gen && got == rate {
				done[i], out[i] = true, at
				pending--
			}
		}
		if pending == 0 {
			return out
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("not every daemon loaded a generation after %d with %s at %v/s within %s (loaded: %v)", gen, rule, rate, timeout, done)
		}
		time.Sleep(pollInterval(since))
	}
}
