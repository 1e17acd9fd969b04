package membership

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"
)

// A cluster of DNS sources, each behind its own Damper built as the daemon
// builds it (PeersLag from the source), all on one fake clock, each resolving every Interval at its own phase, against
// one "truth" for what the DNS server lists. Each replica serves throughout
// (a delisted replica goes on serving: the case the grace exists for). The
// sum over replicas of the weight in force must never exceed 1.

const (
	clusterInterval = 5 * time.Second
	clusterGrace    = 30 * time.Second
	clusterHold     = 2 * time.Second
)

type clusterReplica struct {
	addr  string
	phase time.Duration // first resolution at start+phase, then every clusterInterval
	src   *DNS
	damp  *Damper
	next  time.Time
}

type dnsCluster struct {
	t     *testing.T
	clk   *fakeClock
	start time.Time
	reps  []*clusterReplica
	logs  logBuffer
}

func newDNSCluster(t *testing.T, n int, reps ...*clusterReplica) *dnsCluster {
	t.Helper()
	c := &dnsCluster{t: t, clk: newFakeClock()}
	c.start = c.clk.Now()
	for _, r := range reps {
		var sub subscriber
		r.src = newFakeDNS(t, c.clk, &c.logs, DNSConfig{Replicas: n, Interval: clusterInterval, Grace: clusterGrace,
			OnUpdate: func(v View) { r.damp.Update(v) }}, r.addr)
		d, err := NewDamper(r.src.View(), DamperConfig{Hold: clusterHold, PeersLag: r.src.PeersLag(), Clock: c.clk.Now, AfterFunc: c.clk.AfterFunc, OnUpdate: sub.update})
		if err != nil {
			t.Fatal(err)
		}
		runDamper(t, d)
		r.damp = d
		r.next = c.start.Add(r.phase)
		c.reps = append(c.reps, r)
	}
	return c
}

// run steps the clock by 50 ms until end (since start), resolving as due
// against listed(t since start), and returns the largest sum of weights in
// force, how long the sum was above 1, and when it first was.
func (c *dnsCluster) run(end time.Duration, listed func(time.Duration) []string) (maxSum float64, over time.Duration, first time.Duration, detail string) {
	const step = 50 * time.Millisecond
	for now := time.Duration(0); now <= end; now += step {
		c.clk.AdvanceTo(c.start.Add(now))
		for _, r := range c.reps {
			if !c.clk.Now().Before(r.next) {
				r.src.observe(context.Background(), addrs(listed(now)...), nil)
				r.next = r.next.Add(clusterInterval)
			}
		}
		sum := 0.0
		var parts []string
		for _, r := range c.reps {
			v := r.damp.View()
			sum += v.Weight
			parts = append(parts, fmt.Sprintf("%s: total=%d local=%d w=%.3g fault=%q", r.addr, v.Total, v.Local, v.Weight, v.Fault))
		}
		if sum > 1+1e-9 {
			if over == 0 {
				first = now
			}
			over += step
		}
		if sum > maxSum+1e-9 {
			maxSum = sum
			sort.Strings(parts)
			detail = fmt.Sprintf("t=%.2fs %v", now.Seconds(), parts)
		}
	}
	return maxSum, over, first, detail
}

// TestDNSDelistedReplicaAbsentBeforePeersGrow: a replica delisted while it
// serves (its check critical, a pod not ready) goes absent at ITS first
// resolution a grace after ITS last answer listing it; a peer drops it at
// the PEER's first resolution a grace after the PEER's last answer listing
// it. The two differ by up to one --peers-dns-interval, so the peer's grow
// must wait that beyond --membership-hold (DNS.PeersLag): with the hold
// alone, the two enforced 1/1 and 1/2 for Interval - Hold.
func TestDNSDelistedReplicaAbsentBeforePeersGrow(t *testing.T) {
	p := &clusterReplica{addr: "10.0.0.1", phase: 100 * time.Millisecond}
	x := &clusterReplica{addr: "10.0.0.2", phase: 4900 * time.Millisecond}
	c := newDNSCluster(t, 2, p, x)
	maxSum, over, first, detail := c.run(200*time.Second, func(now time.Duration) []string {
		if now < 100*time.Second {
			return []string{"10.0.0.1", "10.0.0.2"}
		}
		return []string{"10.0.0.1"} // 10.0.0.2 delisted at 100 s, still serving
	})
	t.Logf("max sum of weights in force %.3f; above 1 for %s from t=%.2fs; worst: %s", maxSum, over, first.Seconds(), detail)
	if maxSum > 1+1e-9 {
		t.Errorf("the cluster's weights in force sum to %.3f (%.0f%% of L) for %s: a share got looser than 1/N", maxSum, 100*maxSum, over)
	}
}

// TestDNSRelistedReplicaWaitsForPeers: a replica that knew it was absent
// and is listed again must not take 1/N before its peers, who count it only
// at their next resolution, up to one Interval later, shrink to leave it
// that share. The Damper's "counted again" rule, right for Consul, applied
// it at once.
func TestDNSRelistedReplicaWaitsForPeers(t *testing.T) {
	p := &clusterReplica{addr: "10.0.0.1", phase: 0}
	x := &clusterReplica{addr: "10.0.0.2", phase: 100 * time.Millisecond}
	c := newDNSCluster(t, 2, p, x)
	maxSum, over, first, detail := c.run(200*time.Second, func(now time.Duration) []string {
		if now > 100*time.Second && now < 160*time.Second+50*time.Millisecond {
			return []string{"10.0.0.1"} // 10.0.0.2 delisted for 60 s
		}
		return []string{"10.0.0.1", "10.0.0.2"}
	})
	t.Logf("max sum of weights in force %.3f; above 1 for %s from t=%.2fs; worst: %s", maxSum, over, first.Seconds(), detail)
	if maxSum > 1+1e-9 {
		t.Errorf("the cluster's weights in force sum to %.3f (%.0f%% of L) for %s: a share got looser than 1/N", maxSum, 100*maxSum, over)
	}
}

// TestDNSOwnAddressNeverGetsTenGraces: the ten-graces rule is decided by
// each replica on its own memory (2*listed < remembered). After a real
// scale-down (5 -> 3), a replica delisted while its memory still holds the
// two removed addresses enters the ten graces, while a peer whose memory
// already let them go (an earlier phase here; a restart without a state
// file does it as well) is not in panic, drops the delisted replica after
// one grace and grows to 1/2. The delisted replica must not extend its own
// address by the ten graces: it used to count itself in for minutes.
func TestDNSOwnAddressNeverGetsTenGraces(t *testing.T) {
	p := &clusterReplica{addr: "10.0.0.1", phase: 200 * time.Millisecond}
	q := &clusterReplica{addr: "10.0.0.3", phase: 200 * time.Millisecond}
	x := &clusterReplica{addr: "10.0.0.2", phase: 0}
	c := newDNSCluster(t, 5, p, q, x)
	maxSum, over, first, detail := c.run(400*time.Second, func(now time.Duration) []string {
		switch {
		case now <= 50*time.Second:
			return []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"}
		case now <= 76*time.Second:
			return []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} // scaled down: .4 and .5 gone (and not serving)
		default:
			return []string{"10.0.0.1", "10.0.0.3"} // .2 delisted at 76 s, still serving
		}
	})
	t.Logf("max sum of weights in force %.3f; above 1 for %s from t=%.2fs; worst: %s", maxSum, over, first.Seconds(), detail)
	if maxSum > 1+1e-9 {
		t.Errorf("the cluster's weights in force sum to %.3f (%.0f%% of L) for %s: a share got looser than 1/N", maxSum, 100*maxSum, over)
	}
}

// TestDNSRestoredAbsentViewStaysAbsent: a replica that knew it was absent
// (its address delisted past the grace while it serves: a readiness probe
// failing) saves Local 0 in --state-file. Restarted (a liveness probe
// restarting the container in place: same pod IP, same emptyDir), it starts
// from the saved absent view, and its first answer, still without its
// address, must keep it absent: it used to be taken under the assumption
// that it is listed, 1/N beside peers that do not count it.
func TestDNSRestoredAbsentViewStaysAbsent(t *testing.T) {
	clk := newFakeClock()
	var logs logBuffer
	saved := View{Total: 2, Local: 0, TotalWeight: 2, LocalWeight: 0, Weight: AbsentWeight}
	s := newFakeDNS(t, clk, &logs, DNSConfig{Replicas: 1, Initial: &saved, Grace: clusterGrace}, "10.0.0.2")
	v0 := s.View()
	t.Logf("restored: total=%d local=%d weight=%g", v0.Total, v0.Local, v0.Weight)
	s.observe(context.Background(), addrs("10.0.0.1", "10.0.0.3"), nil) // the two peers; 10.0.0.2 still delisted
	v := s.View()
	t.Logf("first answer (peers only, this host's 10.0.0.2 not listed): total=%d local=%d weight=%g fault=%q", v.Total, v.Local, v.Weight, v.Fault)
	if v.Local != 0 {
		t.Errorf("known absent before the restart, still not listed after it: weight %g; its 2 peers enforce 1/2 each, so the cluster admits %.0f%% of L", v.Weight, 100*(1+v.Weight))
	}
}
