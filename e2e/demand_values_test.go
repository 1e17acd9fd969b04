package e2e

import (
	"fmt"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// tenantsYAML is a per-tenant limit (a bucket per value) shared by demand.
const tenantsYAML = `domain: tenants
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 400, share: demand}
`

const tenantRule = "tenants.tenant"

func tenantRequest(tenant func(seq uint64) string) func(uint64) *rlsv3.RateLimitRequest {
	return func(seq uint64) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "tenants", HitsAddend: 1, Descriptors: []*commonv3.RateLimitDescriptor{
			{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: tenant(seq)}}},
		}}
	}
}

// TestDemandPerValue: a per-tenant limit of L = 400/s per tenant, shared by
// demand. Tenant t1 is offered 2L, 80% of it on node1, then on node2; a
// hundred other tenants, 2/s each, spread evenly, stay far under their
// equal shares. With --demand-top-keys 0 (per-value rules at equal shares)
// t1 gets about 65% of L; with the default, t1 becomes a hot value, divided
// by demand, and gets at least 95% of L once converged, no one-second
// window above L + 5% while the hot spot stays, and back at 95% within the
// convergence time after it moves. The cold tenants are never refused.
func TestDemandPerValue(t *testing.T) {
	const k = 4
	const phase = 8 * time.Second
	type result struct {
		converged, moved float64
		back             time.Duration
	}
	var res [2]result
	for m, top := range []string{"0", "64"} {
		t.Run("top-keys="+top, func(t *testing.T) {
			c := newCluster(t, k, configParams{Limit: demandLimit, Quota: 40})
			c.writeFile("tenants.yaml", tenantsYAML)
			c.args = []string{"--demand-interval", demandInterval.String(), "--demand-top-keys", top}
			for i := range k {
				c.register(i)
			}
			c.startAll(k)
			hot := startLoad(t, c, loadOpts{rate: 2 * demandLimit, max: 2 * phase, weights: skewed(k, 0),
				request: tenantRequest(func(uint64) string { return "t1" })})
			cold := startLoad(t, c, loadOpts{rate: 200, max: 2 * phase, weights: []float64{1, 1, 1, 1},
				request: tenantRequest(func(seq uint64) string { return fmt.Sprint("c", seq%100) })})
			hot.sleepUntil(phase)
			hot.setWeights(skewed(k, 1)...)
			hot.wait()
			cold.wait()
			hot.checkClean(t)
			cold.checkClean(t)
			end := hot.lastAnswered()

			w1 := hot.stable(t, converge, phase)
			w2 := hot.stable(t, phase+converge, end)
			res[m].converged, res[m].moved = hot.admitted(w1), hot.admitted(w2)
			cw := cold.stable(t, time.Second, cold.lastAnswered())
			if off, adm := cold.offered(cw), cold.admitted(cw); adm < off*0.999 {
				t.Errorf("cold tenants: %.1f/s admitted of %.1f/s offered in %v; they are far under their shares", adm, off, cw)
			}
			res[m].back = -1
			for at := phase + time.Second; at <= end; at += binWidth {
				if hot.admitted(window{at - time.Second, at}) >= demandFloor*demandLimit {
					res[m].back = at - phase
					break
				}
			}
			if top == "0" {
				return
			}
			worst, ww := hot.worstWindow(t, 1500*time.Millisecond, phase)
			t.Logf("worst one-second window before the move: %.1f/s in %v (%s of L)", worst, ww, dev(worst, demandLimit))
			if worst > demandLimit*(1+tolerance) {
				t.Errorf("a one-second window admitted %.1f/s for t1 in %v, above L + %.0f%%", worst, ww, 100*tolerance)
			}
			for _, x := range []struct {
				name string
				rate float64
				w    window
			}{{"hot node1", res[m].converged, w1}, {"hot node2", res[m].moved, w2}} {
				if x.rate < demandFloor*demandLimit {
					t.Errorf("%s: t1 admitted %.1f/s in %v, %.1f%% of L; want at least %.0f%%", x.name, x.rate, x.w, 100*x.rate/demandLimit, 100*demandFloor)
				}
			}
			moveWorst, mw := hot.worstWindow(t, phase-time.Second+binWidth, phase+converge+time.Second)
			t.Logf("worst one-second window around the move: %.1f/s in %v (%s of L)", moveWorst, mw, dev(moveWorst, demandLimit))
			if res[m].back < 0 || res[m].back > converge+time.Second {
				t.Errorf("after the move t1 took %v to be back at %.0f%% of L, want at most %v", res[m].back, 100*demandFloor, converge+time.Second)
			}
			// Every replica holds t1 hot, and only t1; node2, hot now, shows
			// its share of it; the leader shows t1's division.
			var shares float64
			leaders := 0
			for i, d := range c.daemons {
				hotValues := c.metrics(d)[fmt.Sprintf(`sharelimit_demand_hot_values{rule=%q,service=%q}`, tenantRule, service)]
				if hotValues != 1 {
					t.Errorf("%s: %v hot values, want 1 (t1)", d.node, hotValues)
				}
				dm := c.mustRlconfig(d).Membership.Demand
				if dm == nil {
					t.Fatalf("%s: no demand section in /rlconfig", d.node)
				}
				for _, x := range dm.Rules {
					if x.Rule == tenantRule && x.Value == "tenant=t1" {
						shares += x.Share
						if i == 1 && x.Share <= 0.25 {
							t.Errorf("node2, hot for t1: share %v, want more than the equal 0.25", x.Share)
						}
					}
				}
				if dm.Leading {
					leaders++
					var rows int
					for _, x := range dm.Division {
						if x.Rule == tenantRule && x.Value == "tenant=t1" {
							rows++
						}
					}
					if rows != k {
						t.Errorf("the leader %s lists %d replicas in t1's division, want %d", d.node, rows, k)
					}
				}
			}
			if leaders != 1 {
				t.Errorf("%d leaders", leaders)
			}
			if shares > 1+1e-9 || shares < 0.9 {
				t.Errorf("t1's shares in force sum to %.6f of L at the end, want at most 1 (and close to it)", shares)
			}
		})
	}
	tb := newTable(fmt.Sprintf("per-value demand shares: K=4, tenant t1 with L=%d/s offered 2L, 80%% to node1, then (at %v) to node2; 100 cold tenants", demandLimit, phase),
		"--demand-top-keys", "t1 hot on node1", "t1 hot on node2", "back at 95% after the move")
	for m, top := range []string{"0 (equal shares)", "64 (default)"} {
		back := res[m].back.String()
		if res[m].back < 0 {
			back = "never"
		}
		tb.add(top, fmt.Sprintf("%.1f/s (%.1f%%)", res[m].converged, 100*res[m].converged/demandLimit),
			fmt.Sprintf("%.1f/s (%.1f%%)", res[m].moved, 100*res[m].moved/demandLimit), back)
	}
	tb.log(t)
	if res[0].converged > 0.75*demandLimit {
		t.Errorf("equal shares admitted %.1f%% of L for t1: the scenario no longer shows what demand sharing is for", 100*res[0].converged/demandLimit)
	}
}
