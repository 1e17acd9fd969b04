package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/internal/envoymodel"
	"github.com/sharelimit/sharelimit/internal/monotime"
)

// rlqsMark is one moment of a fault scenario, from the start of the load.
type rlqsMark struct {
	at   time.Duration
	what string
	do   func()
}

// rlqsFloor is a window, from the start of the load, in which the cluster
// must admit at least 90% of L: the end of a phase, once it has settled.
type rlqsFloor struct {
	from, to time.Duration
	after    string
}

// TestRLQSFaults runs TestRLQSSkewed's cluster and load (3 daemons sharing L
// by demand, each with two model Envoys, 2L offered, 80% of it on one Envoy)
// through four faults in turn:
//   - the busy Envoy's connection is cut for 12 s, longer than a report
//     interval, and then comes back;
//   - the busy node's daemon is SIGKILLed and started again 3 s later with
//     nothing restored; its Envoys go on enforcing what they hold;
//   - a fourth replica joins with two Envoys of its own, and the light load
//     spreads over seven Envoys;
//   - the busy node's daemon is SIGKILLed for good and its instance leaves
//     the catalog; the load balancer sends new load to another node at
//     once, while the dead node's Envoys go on serving what they have for
//     10 s, enforcing their last assignments.
//
// From the settle time on, no one-second window may admit more than L + 5%,
// through every fault; at the end of each phase the cluster admits at least
// 90% of L again. Admissions are counted by the model Envoys, on one clock.
func TestRLQSFaults(t *testing.T) {
	const k = 3
	c := newCluster(t, k+1, configParams{Limit: rlqsLimit, Quota: 40})
	// A deregistered instance counts for --membership-grace before its
	// share passes on; the death is what is under test, so it is 1 s.
	c.args = []string{"--rlqs", "--share-mode", "demand", "--demand-interval", demandInterval.String(),
		"--membership-grace", "1s"}
	for i := range k {
		c.register(i)
	}
	c.startAll(k)
	c.awaitLeader("30 s after start", 30*time.Second)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clock := monotime.New()
	start := clock()
	id := map[string]string{"generic_key": "cluster"}
	// The busy Envoy reaches its daemon through a proxy that can cut it off.
	proxy := startCutProxy(t, c.daemons[0].grpcAddr)
	envoys := make([][]*rlqsEnvoy, k+1)
	envoys[0] = []*rlqsEnvoy{newRLQSEnvoy(t, ctx, proxy.Addr(), clock), newRLQSEnvoy(t, ctx, c.daemons[0].grpcAddr, clock)}
	for i := 1; i < k; i++ {
		envoys[i] = []*rlqsEnvoy{newRLQSEnvoy(t, ctx, c.daemons[i].grpcAddr, clock), newRLQSEnvoy(t, ctx, c.daemons[i].grpcAddr, clock)}
	}
	offered := 2.0 * rlqsLimit
	spread := func() { // the light fifth of the load, evenly over every Envoy but the busy one
		var light []*rlqsEnvoy
		for _, node := range envoys {
			for _, e := range node {
				if e != envoys[0][0] {
					light = append(light, e)
				}
			}
		}
		for _, e := range light {
			e.setRate(0.2 * offered / float64(len(light)))
		}
	}
	envoys[0][0].setRate(0.8 * offered)
	spread()
	wg := offer(ctx, envoys, id)

	marks := []rlqsMark{
		{25 * time.Second, "the busy Envoy's connection is cut", proxy.Cut},
		{37 * time.Second, "the busy Envoy's connection is back", proxy.Mend},
		{60 * time.Second, "node1's daemon is killed", func() { c.daemons[0].kill() }},
		{63 * time.Second, "node1's daemon is started again", func() { c.restart(0, k) }},
		{90 * time.Second, "node4 joins with two Envoys", func() {
			c.register(k)
			d := c.start(k, k+1)
			envoys[k] = []*rlqsEnvoy{newRLQSEnvoy(t, ctx, d.grpcAddr, clock), newRLQSEnvoy(t, ctx, d.grpcAddr, clock)}
			spread()
			offer(ctx, envoys[k:], id) // ends with ctx, as wg's do
		}},
		{115 * time.Second, "node1's daemon is killed, node1 leaves the catalog, and new load goes to node2", func() {
			c.daemons[0].kill()
			c.deregister(0)
			envoys[1][0].setRate(envoys[1][0].getRate() + envoys[0][0].getRate())
		}},
		{125 * time.Second, "node1's Envoys have served their last requests", func() {
			envoys[1][1].setRate(envoys[1][1].getRate() + envoys[0][1].getRate())
			envoys[0][0].setRate(0)
			envoys[0][1].setRate(0)
		}},
	}
	floors := []rlqsFloor{
		{50 * time.Second, 60 * time.Second, "the cut"},
		{80 * time.Second, 90 * time.Second, "the restart"},
		{105 * time.Second, 115 * time.Second, "the join"},
		{145 * time.Second, 155 * time.Second, "the death"},
	}
	const run = 155 * time.Second
	for _, m := range marks {
		time.Sleep(time.Duration(start + int64(m.at) - clock()))
		t.Logf("%v: %s", time.Duration(clock()-start).Round(time.Millisecond), m.what)
		m.do()
	}
	time.Sleep(time.Duration(start + int64(run) - clock()))
	for _, d := range c.daemons[1:] {
		t.Logf("%s /rlconfig:\n%s", d.node, rlqsSection(c, d))
	}
	cancel()
	wg.Wait()

	s := admitted(envoys)
	slot := func(d time.Duration) int64 { return (start + int64(d)) / int64(envoymodel.SlotWidth) }
	t.Logf("cluster admitted by second: %v", perSecond(s.Window(slot(0), slot(run))))
	for i, node := range envoys {
		for j, e := range node {
			a, d := e.m.Totals()
			t.Logf("node%d envoy%d: allowed %d, denied %d; admitted by second: %v", i+1, j+1, a, d,
				perSecond(e.m.Admitted().Window(slot(0), slot(run))))
		}
	}
	checked := s.Window(slot(rlqsSettle), slot(run))
	most, at := checked.MaxWindow(10)
	tb := newTable(fmt.Sprintf("RLQS through faults: L=%d/s, offered 2L, 80%% on one Envoy", rlqsLimit), "window", "admitted/s", "% of L")
	tb.add(fmt.Sprintf("busiest 1 s, at %v", time.Duration(at-slot(0))*envoymodel.SlotWidth), float64(most), 100*float64(most)/rlqsLimit)
	var low []string
	for _, f := range floors {
		avg := s.Window(slot(f.from), slot(f.to)).Mean()
		tb.add(fmt.Sprintf("%v–%v, after %s", f.from, f.to, f.after), avg, 100*avg/rlqsLimit)
		if avg < 0.9*rlqsLimit {
			low = append(low, fmt.Sprintf("%.1f/s from %v to %v, after %s", avg, f.from, f.to, f.after))
		}
	}
	tb.log(t)
	if float64(most) > 1.05*rlqsLimit {
		t.Errorf("the one-second window from %v admitted %d, more than L + 5%% (%.0f)",
			time.Duration(at-slot(0))*envoymodel.SlotWidth, most, 1.05*rlqsLimit)
	}
	for _, l := range low {
		t.Errorf("admitted %s: less than 90%% of L (%.0f)", l, 0.9*rlqsLimit)
	}
}
