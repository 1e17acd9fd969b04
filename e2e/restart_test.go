package e2e

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestGracefulRestart: one of four daemons gets SIGTERM under load. Both its
// health endpoints (gRPC health for "ratelimit" and /healthcheck) turn to not
// serving at once, while it keeps answering: every request sent to it during
// the drain is answered, none fails. The load balancer then takes the node
// out; the daemon stops after the drain and exits 0. It is started again on
// the same ports with the state file it wrote on shutdown (--state-file),
// rejoins, and takes traffic again with the buckets it left: no fresh burst.
// The burst is 4L (4 s of refill), so a fresh bucket would stand out against
// what the downtime refilled: the restarted daemon admits its share's refill
// plus what its share refilled while it was out of the load balancer (r·d,
// the downtime refill a token bucket credits), within 5%, and so does the
// cluster in every one-second window.
func TestGracefulRestart(t *testing.T) {
	const k = 4
	p := configParams{Limit: limit, Burst: 4 * limit, Quota: 40}
	c := newCluster(t, k, p)
	c.state = true
	c.register(0, 1, 2, 3)
	c.startAll(k)

	// Each replica's bucket (B/k = L/k·4 s) is spent by 4 s under 2L offered:
	// the SIGTERM comes after, so what the restarted daemon has is what its
	// share refilled while it was out of the load balancer.
	l := startLoad(t, c, loadOpts{rate: 2 * limit, max: 15 * time.Second, weights: []float64{1, 1, 1, 1}})
	l.sleepUntil(5 * time.Second)
	victim := c.daemons[3]
	if st, err := victim.grpcHealth(); err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("%s before SIGTERM: gRPC health %v, %v; want SERVING", victim.node, st, err)
	}
	termed := time.Now()
	tTerm := l.elapsed()
	victim.sigterm(t)

	// Watch both health endpoints until each says not serving.
	grpcDown, httpDown := time.Duration(-1), time.Duration(-1)
	for grpcDown < 0 || httpDown < 0 {
		if grpcDown < 0 {
			if st, err := victim.grpcHealth(); err == nil && st == healthpb.HealthCheckResponse_NOT_SERVING {
				grpcDown = time.Since(termed)
			}
		}
		if httpDown < 0 {
			if code, err := c.healthcheck(victim); err == nil && code == http.StatusServiceUnavailable {
				httpDown = time.Since(termed)
			}
		}
		if time.Since(termed) > drain {
			t.Fatalf("%s: health still serving %s after SIGTERM (gRPC after %v, /healthcheck after %v)", victim.node, drain, grpcDown, httpDown)
		}
		time.Sleep(2 * time.Millisecond)
	}

	// The load balancer's health check takes the node out; here it keeps
	// sending for half the drain first, so that requests reach the daemon
	// while it drains.
	time.Sleep(time.Until(termed.Add(drain / 2)))
	tOut := l.elapsed()
	l.setWeights(1, 1, 1, 0)
	l.retire(3) // its last slots, before it exits
	err := victim.waitExit(t, drain+15*time.Second)
	exited := time.Since(termed)
	if err != nil {
		t.Errorf("%s after SIGTERM: %v, want exit status 0", victim.node, err)
	}
	if exited < drain {
		t.Errorf("%s exited %s after SIGTERM, before its %s drain was over", victim.node, exited, drain)
	}

	// Back on the same ports, as the node's Envoy expects it.
	d := c.restart(3, k)
	c.awaitViews(time.Now(), startTimeout, view{total: k, weight: 0.25}, d)
	tBack := l.elapsed()
	l.setTarget(3, d, 1)
	l.sleepUntil(tBack + 3*time.Second)
	l.stop()
	l.checkClean(t)
	dOK, dOver, dErrs := l.answers(tTerm, tOut, 3)
	back := l.window(tBack, tBack+3*time.Second)
	bOK, bOver, bErrs := l.answers(back.from, back.to, 3)

	tb := newTable(fmt.Sprintf("graceful restart of %s under 2L offered (drain %s), SIGTERM at %.2fs", victim.node, drain, tTerm.Seconds()),
		"event", "after SIGTERM", "requests to node4", "admitted", "over", "errors")
	tb.add("gRPC health NOT_SERVING", grpcDown, "", "", "", "")
	tb.add("/healthcheck 503", httpDown, "", "", "", "")
	tb.add(fmt.Sprintf("answered while draining [%.2fs, %.2fs)", tTerm.Seconds(), tOut.Seconds()), "", dOK+dOver+dErrs, dOK, dOver, dErrs)
	tb.add("taken out of the load balancer", tOut-tTerm, "", "", "", "")
	tb.add("exited (status 0)", exited, "", "", "", "")
	tb.add("restarted, serving "+back.String(), tBack-tTerm, bOK+bOver+bErrs, bOK, bOver, bErrs)
	tb.log(t)

	if dOK+dOver == 0 {
		t.Errorf("%s answered no request while draining: nothing was tested", victim.node)
	}
	if dErrs > 0 {
		t.Errorf("%s: %d requests failed while it drained", victim.node, dErrs)
	}
	if bOK+bOver == 0 || bErrs > 0 {
		t.Errorf("restarted %s answered %d requests, %d failed", d.node, bOK+bOver, bErrs)
	}
	// Its first seconds back, by its own accounting: its share refills at
	// L/k, from the buckets it saved (spent, under 2L offered) plus what its
	// share refilled while it was out of the load balancer: r·d, at most its
	// share of the burst (and two tokens for the bucket's rounding).
	r := float64(limit) / k
	idle := (tBack - tOut).Seconds()
	refilled := min(r*idle, p.burst()/k)
	most := r*back.seconds() + refilled + 2
	got := l.atMost(t, fmt.Sprintf("restarted %s in its first %v back, against its share's refill and the downtime refill (a fresh burst?)", d.node, back.to-back.from),
		back, most/back.seconds(), tolerance, 3)
	t.Logf("restarted %s admitted %v; its share's refill and what %.2fs out of the load balancer refilled come to %.0f; a fresh bucket would add %.0f more",
		d.node, got, idle, most, p.burst()/k-refilled)
	// Every one-second window after the restart: L, plus the downtime
	// refill.
	l.capped(t, fmt.Sprintf("after the restart (L plus the downtime refill of %.0f tokens)", refilled), tBack, tBack+3*time.Second, float64(limit)+refilled, tolerance)
}
