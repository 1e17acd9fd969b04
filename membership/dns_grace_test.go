package membership

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// newFakeDNS is a DNS source for cfg (its Name, Replicas, Clock and Logger
// filled in when unset) on clk, whose host has the addresses own. Nothing
// runs: the tests feed it with observe.
func newFakeDNS(t *testing.T, clk *fakeClock, logs *logBuffer, cfg DNSConfig, own ...string) *DNS {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "rl.service.consul."
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 3
	}
	cfg.Clock, cfg.Logger = clk.Now, logs.logger()
	s, err := NewDNS(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.random = func() float64 { return 0 }
	s.localAddrs = func() ([]netip.Addr, error) { return addrs(own...), nil }
	return s
}

// step is one resolution fed to a source and the view it must publish.
type step struct {
	name         string
	after        time.Duration // on the fake clock, since the previous step
	addrs        []netip.Addr  // the answer; nil is NXDOMAIN
	total, local int
	fault        string
	warn         bool // a warning is logged
}

func (st step) run(t *testing.T, s *DNS, clk *fakeClock, logs *logBuffer) View {
	t.Helper()
	clk.Advance(st.after)
	var err error
	if st.addrs == nil {
		err = ErrNoRecords
	}
	before := strings.Count(logs.String(), "level=WARN")
	s.observe(context.Background(), st.addrs, err)
	v := s.View()
	if !counts(st.total, st.local)(v) || v.TotalWeight != st.total || v.LocalWeight != st.local || v.Fault != st.fault {
		t.Fatalf("%s: view %+v; want %d replicas, %d local, fault %q", st.name, v, st.total, st.local, st.fault)
	}
	if warned := strings.Count(logs.String(), "level=WARN") > before; warned != st.warn {
		t.Fatalf("%s: warned %v, want %v; logs:\n%s", st.name, warned, st.warn, logs.String())
	}
	return v
}

// TestDNSGraceKeepsAddressCounted: an address counts until --membership-grace
// after the last answer that listed it, as the Consul watch counts an
// instance until the grace after it last passed. Consul's DNS drops an
// instance the moment its check turns critical, and a Kubernetes headless
// Service a pod the moment it is not ready; the replica behind it may go on
// serving (a check that flaps, a probe timing out under load), and its
// peers keep its place. An address listed again counts again at once. An
// answer listing fewer than half of the addresses remembered (a Consul
// restarted empty, re-registering) keeps them counted for ten graces.
func TestDNSGraceKeepsAddressCounted(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	var logs logBuffer
	s := newFakeDNS(t, clk, &logs, DNSConfig{Grace: 30 * time.Second})
	for _, st := range []step{
		{name: "three listed", addrs: addrs("10.0.0.1", "10.0.0.2", "10.0.0.3"), total: 3, local: 1},
		{name: "one dropped: still counted", after: 10 * time.Second, addrs: addrs("10.0.0.1", "10.0.0.2"), total: 3, local: 1},
		{name: "NXDOMAIN: the view stands", after: 10 * time.Second, total: 3, local: 1, fault: FaultNonePassing, warn: true},
		{name: "29 s after it was last listed", after: 9 * time.Second, addrs: addrs("10.0.0.1", "10.0.0.2"), total: 3, local: 1},
		{name: "the grace over", after: time.Second, addrs: addrs("10.0.0.1", "10.0.0.2"), total: 2, local: 1},
		{name: "listed again: counted at once", after: 5 * time.Second, addrs: addrs("10.0.0.1", "10.0.0.2", "10.0.0.3"), total: 3, local: 1},
		{name: "a fourth", after: 5 * time.Second, addrs: addrs("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"), total: 4, local: 1},
		{name: "one of four listed: suspect, all counted", after: 5 * time.Second, addrs: addrs("10.0.0.1"), total: 4, local: 1},
		{name: "past one grace: still all", after: time.Minute, addrs: addrs("10.0.0.1"), total: 4, local: 1},
		{name: "ten graces after they were last listed", after: 235 * time.Second, addrs: addrs("10.0.0.1"), total: 1, local: 1},
	} {
		st.run(t, s, clk, &logs)
	}
}

// TestDNSGraceOff: a negative grace (--membership-grace 0) counts only the
// addresses of the last answer, as the source did before the grace; 0 is
// the default grace.
func TestDNSGraceOff(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	var logs logBuffer
	s := newFakeDNS(t, clk, &logs, DNSConfig{Grace: -1})
	(step{name: "two", addrs: addrs("10.0.0.1", "10.0.0.2"), total: 2, local: 1}).run(t, s, clk, &logs)
	(step{name: "one", after: time.Second, addrs: addrs("10.0.0.1"), total: 1, local: 1}).run(t, s, clk, &logs)
	if d := newFakeDNS(t, clk, &logs, DNSConfig{}); d.cfg.Grace != DefaultGrace {
		t.Errorf("grace 0 means %s, want DefaultGrace (%s)", d.cfg.Grace, DefaultGrace)
	}
}

// TestDNSSelfListedThenDelistedIsAbsent: a replica whose own address (one
// of its host's) an answer has listed knows it is listed; an answer that
// no longer lists it, once the grace is over, leaves it absent, as the
// Consul watch leaves a replica whose node has no counted instance: its
// peers no longer count it, so it takes AbsentWeight with fault "absent"
// and a warning. Listed again, it counts itself again at once.
func TestDNSSelfListedThenDelistedIsAbsent(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	var logs logBuffer
	s := newFakeDNS(t, clk, &logs, DNSConfig{Grace: 30 * time.Second}, "10.0.0.1", "fd00::1", "127.0.0.1")
	for _, st := range []step{
		{name: "listed with a peer", addrs: addrs("10.0.0.1", "10.0.0.2"), total: 2, local: 1},
		{name: "delisted, within the grace", after: 10 * time.Second, addrs: addrs("10.0.0.2"), total: 2, local: 1},
		{name: "delisted past the grace: absent", after: 25 * time.Second, addrs: addrs("10.0.0.2"), total: 1, local: 0, fault: FaultAbsent, warn: true},
		{name: "still absent: no second warning", after: 5 * time.Second, addrs: addrs("10.0.0.2", "10.0.0.3"), total: 2, local: 0, fault: FaultAbsent},
		{name: "listed again", after: 5 * time.Second, addrs: addrs("10.0.0.1", "10.0.0.2", "10.0.0.3"), total: 3, local: 1},
	} {
		v := st.run(t, s, clk, &logs)
		if st.local == 0 && v.Weight != AbsentWeight {
			t.Fatalf("%s: weight %v, want AbsentWeight", st.name, v.Weight)
		}
	}
	for _, want := range []string{"this host's address is listed", "no longer lists this host's address"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs do not say %q:\n%s", want, logs.String())
		}
	}
}

// TestDNSSelfNeverListedIsAssumed: a replica that has never seen one of
// its host's addresses in an answer (its listed address is not one of its
// interfaces', as a Consul service address on another interface or a NATed
// one; or it is not listed yet) cannot tell whether it is listed: it
// assumes it is, and says so once.
func TestDNSSelfNeverListedIsAssumed(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	var logs logBuffer
	s := newFakeDNS(t, clk, &logs, DNSConfig{Grace: 30 * time.Second}, "10.9.9.9")
	for _, st := range []step{
		{name: "two, neither this host's", addrs: addrs("10.0.0.1", "10.0.0.2"), total: 2, local: 1},
		{name: "one, past the grace", after: time.Minute, addrs: addrs("10.0.0.2"), total: 1, local: 1},
		{name: "again", after: 5 * time.Second, addrs: addrs("10.0.0.2"), total: 1, local: 1},
	} {
		st.run(t, s, clk, &logs)
	}
	if n := strings.Count(logs.String(), "assumes it is listed"); n != 1 {
		t.Errorf("said %d times that it assumes it is listed, want once:\n%s", n, logs.String())
	}
}
