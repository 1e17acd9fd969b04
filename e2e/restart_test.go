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
// the same ports, rejoins, and takes traffic again.
func TestGracefulRestart(t *testing.T) {
	const k = 4
	p := configParams{Limit: limit, Quota: 40}
	c := newCluster(t, k, p)
	c.register(0, 1, 2, 3)
	c.startAll(k)

	l := startLoad(t, c, loadOpts{rate: 2 * limit, max: 12 * time.Second, weights: []float64{1, 1, 1, 1}})
	l.sleepUntil(2 * time.Second)
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
	err := victim.waitExit(t, drain+15*time.Second)
	exited := time.Since(termed)
	if err != nil {
		t.Errorf("%s after SIGTERM: %v, want exit status 0", victim.node, err)
	}
	if exited < drain {
		t.Errorf("%s exited %s after SIGTERM, before its %s drain was over", victim.node, exited, drain)
	}
	draining := window{tTerm.Truncate(binWidth) + binWidth, tOut.Truncate(binWidth)}
	dOK, dOver, dErrs := l.count(draining, 3)

	// Back on the same ports, as the node's Envoy expects it.
	d := c.restart(3, k)
	c.awaitViews(time.Now(), startTimeout, view{total: k, weight: 0.25}, d)
	tBack := l.elapsed()
	l.setTarget(3, d, 1)
	l.sleepUntil(tBack + 3*time.Second)
	l.stop()
	l.checkClean(t)
	back := window{tBack.Truncate(binWidth) + binWidth, tBack.Truncate(binWidth) + 3*time.Second}
	bOK, bOver, bErrs := l.count(back, 3)

	tb := newTable(fmt.Sprintf("graceful restart of %s under 2L offered (drain %s), SIGTERM at %.2fs", victim.node, drain, tTerm.Seconds()),
		"event", "after SIGTERM", "requests to node4", "admitted", "over", "errors")
	tb.add("gRPC health NOT_SERVING", grpcDown, "", "", "", "")
	tb.add("/healthcheck 503", httpDown, "", "", "", "")
	tb.add("answered while draining "+draining.String(), "", dOK+dOver+dErrs, dOK, dOver, dErrs)
	tb.add("taken out of the load balancer", tOut-tTerm, "", "", "", "")
	tb.add("exited (status 0)", exited, "", "", "", "")
	tb.add("restarted, serving "+back.String(), tBack-tTerm, bOK+bOver+bErrs, bOK, bOver, bErrs)
	tb.log(t)
	t.Logf("the restarted daemon admitted %d in its first %s back (its share is %.0f/s; a restarted replica starts with full buckets, %.0f tokens); load: %s",
		bOK, back.to-back.from, float64(limit)/k, p.burst()/k, l.lateness())

	if dOK+dOver == 0 {
		t.Errorf("%s answered no request while draining: nothing was tested", victim.node)
	}
	if dErrs > 0 {
		t.Errorf("%s: %d requests failed while it drained", victim.node, dErrs)
	}
	if bOK+bOver == 0 || bErrs > 0 {
		t.Errorf("restarted %s answered %d requests, %d failed", d.node, bOK+bOver, bErrs)
	}
}
