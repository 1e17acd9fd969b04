package membership

// Tests of the DNS source against Consul's own DNS interface, on a real
// agent (internal/consultest): the answers, the NXDOMAIN and the outage are
// Consul's.

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/sharelimit/sharelimit/internal/consultest"
)

// TestDNSAgentFollowsCatalog counts web.service.consul through the agent's
// DNS over TCP while instances register (2, then 4, one of them IPv6), one
// fails its TTL check, one deregisters, the agent is stopped, and a fresh
// empty agent answers NXDOMAIN. With no grace (TestDNSGraceKeepsAddressCounted
// has it), so that an address the answer drops is no longer counted. A Damper on a fake clock stands between the
// source and the view in force, with a one-hour hold: a count that grows
// (a share that shrinks) applies at once, one that falls waits the hold
// (the test moves the clock), and through the outage and the NXDOMAIN the
// last count stands, never 0, with the fault.
func TestDNSAgentFollowsCatalog(t *testing.T) {
	t.Parallel()
	a := consultest.Start(t, consultest.WithDNS())
	own := a.NodeName()
	const hold = time.Hour
	clk := newFakeClock()
	var sub subscriber
	var logs logBuffer
	var d *Damper
	s, err := NewDNS(DNSConfig{Name: "web.service.consul.", Server: a.DNSAddr(), Replicas: 3, Interval: 50 * time.Millisecond,
		BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, Grace: -1, Logger: logs.logger(),
		OnUpdate: func(v View) { d.Update(v) }})
	if err != nil {
		t.Fatal(err)
	}
	s.localAddrs = noLocalAddrs
	d = newFakeDamper(t, clk, s.View(), hold, &sub)
	run(t, s)
	inForce := func(total int) func(View) bool {
		return func(v View) bool { return v.Total == total && v.Weight == 1/float64(total) && v.Source == "dns" }
	}

	// Nothing registered: Consul answers NXDOMAIN; --replicas stands.
	v := waitView(t, s, func(v View) bool { return v.Errors >= 2 }, "two NXDOMAIN answers")
	if v.Total != 3 || v.Fault != FaultNonePassing || !v.ObservedAt.IsZero() {
		t.Fatalf("before any instance: view %+v; want the --replicas view (3) with fault %q", v, FaultNonePassing)
	}
	// The error names the server asked, not the system's nameserver.
	if want := "lookup web.service.consul. on " + a.DNSAddr() + ": no such host"; !strings.Contains(v.LastError, want) {
		t.Errorf("before any instance: last error %q; want it to say %q", v.LastError, want)
	}
	t.Logf("before any instance: %s", v.LastError)

	a.RegisterAt(own, "web-1", "web", "192.0.2.1", true)
	a.RegisterAt("node-b", "web-2", "web", "192.0.2.2", true)
	waitView(t, s, inForce(2), "two instances")
	waitView(t, d, inForce(2), "the first answer in force at once")

	// Scale-up: the share shrinks, at once.
	a.RegisterAt("node-c", "web-3", "web", "192.0.2.3", true)
	a.RegisterAt("node-d", "web-4", "web", "2001:db8::4", true)
	waitView(t, s, inForce(4), "four instances, one of them AAAA")
	waitView(t, d, inForce(4), "the scale-up in force without the hold")

	// A failing TTL check drops the instance from the answer at once; the
	// share it frees waits the hold.
	a.SetCheck(own, "web-1", false)
	v = waitView(t, s, inForce(3), "the failing instance out of the answer")
	if v.Fault != "" || v.LastError != "" {
		t.Fatalf("view %+v after a check failed; want no fault", v)
	}
	if p, _, ok := d.Pending(); !ok || p.Total != 3 {
		t.Fatalf("pending %+v (%v); want 3 replicas held", p, ok)
	}
	if v := d.View(); v.Total != 4 {
		t.Fatalf("in force %+v during the hold; want 4 replicas", v)
	}
	clk.Advance(hold)
	waitView(t, d, inForce(3), "three replicas after the hold")

	a.Deregister("node-c", "web-3")
	waitView(t, s, inForce(2), "a deregistered instance out of the answer")
	if v := d.View(); v.Total != 3 {
		t.Fatalf("in force %+v during the hold; want 3 replicas", v)
	}
	clk.Advance(hold)
	good := waitView(t, d, inForce(2), "two replicas after the hold")

	// Consul stopped: the last count stands, with the fault.
	a.Stop()
	down := waitView(t, s, func(v View) bool { return v.Errors >= good.Errors+3 }, "three failed resolutions")
	if down.Total != 2 || down.Weight != 0.5 || down.Fault != FaultError || down.LastError == "" || !down.ObservedAt.Equal(good.ObservedAt) {
		t.Fatalf("with Consul down: view %+v; want the last count (2) standing, with fault %q", down, FaultError)
	}
	if v := d.View(); v.Total != 2 || v.Fault != FaultError {
		t.Fatalf("in force with Consul down: %+v; want 2 replicas with the fault", v)
	}
	t.Logf("Consul down: %s", down.LastError)

	// A fresh agent, empty: NXDOMAIN is a fault too, never a count of 0.
	a.Restart()
	empty := waitView(t, s, func(v View) bool { return v.Fault == FaultNonePassing }, "NXDOMAIN from the empty agent")
	if empty.Total != 2 || empty.Weight != 0.5 {
		t.Fatalf("NXDOMAIN after a count: view %+v; want the last count (2) standing", empty)
	}
	a.RegisterAt("node-b", "web-2", "web", "192.0.2.2", true)
	a.RegisterAt("node-c", "web-3", "web", "192.0.2.3", true)
	a.RegisterAt("node-d", "web-4", "web", "2001:db8::4", true)
	back := waitView(t, s, inForce(3), "three instances on the fresh agent")
	if back.Fault != "" || back.LastError != "" || !back.ObservedAt.After(good.ObservedAt) {
		t.Fatalf("view after recovery: %+v; want no fault and a newer observation", back)
	}
	waitView(t, d, func(v View) bool { return v.Total == 3 && v.Fault == "" }, "the recovery in force at once")
}

// TestDNSAgentUDPAnswerLimit checks the reason --peers-dns-server asks over
// TCP. With Consul's defaults (dns_config.udp_answer_limit 3,
// enable_truncate off), a UDP query without EDNS0 (as glibc's resolver
// sends by default) gets 3 of 6 instances, and the truncated bit is not
// set, so the client cannot tell; with EDNS0 (as Go's resolver sends) it
// gets as many as fit in the advertised size. Over TCP the source counts
// all 6.
func TestDNSAgentUDPAnswerLimit(t *testing.T) {
	t.Parallel()
	a := consultest.Start(t, consultest.WithDNS())
	for i := range 6 {
		addr := netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)}).String()
		a.RegisterAt("node-"+addr, "web-"+addr, "web", addr, true)
	}
	s, err := NewDNS(DNSConfig{Name: "web.service.consul.", Server: a.DNSAddr(), Interval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	run(t, s)
	waitView(t, s, counts(6, 1), "six instances over TCP")

	for _, tc := range []struct {
		name string
		edns bool
		want int
	}{
		{"UDP without EDNS0", false, 3},
		{"UDP with EDNS0", true, 6},
	} {
		n, truncated := udpQuery(t, a.DNSAddr(), "web.service.consul.", tc.edns)
		t.Logf("%s: %d A records, truncated bit %v", tc.name, n, truncated)
		if n != tc.want || truncated {
			t.Errorf("%s: %d A records, truncated bit %v; want %d, not truncated", tc.name, n, truncated, tc.want)
		}
	}
}

// udpQuery asks server for the A records of name over UDP, with or without
// an EDNS0 record advertising 1232 bytes, and returns how many came and
// whether the truncated bit was set.
func udpQuery(t *testing.T, server, name string, edns bool) (int, bool) {
	t.Helper()
	msg := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: 1, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}},
	}
	if edns {
		var opt dnsmessage.ResourceHeader
		if err := opt.SetEDNS0(1232, dnsmessage.RCodeSuccess, false); err != nil {
			t.Fatal(err)
		}
		msg.Additionals = []dnsmessage.Resource{{Header: opt, Body: &dnsmessage.OPTResource{}}}
	}
	q, err := msg.Pack()
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("udp", server)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 65535)
	for try := 0; ; try++ {
		if _, err := c.Write(q); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, err := c.Read(buf)
		if err != nil {
			if try < 5 {
				continue // a datagram lost on a busy machine
			}
			t.Fatalf("query %s over UDP: %v", name, err)
		}
		var p dnsmessage.Parser
		h, err := p.Start(buf[:n])
		if err != nil {
			t.Fatal(err)
		}
		if err := p.SkipAllQuestions(); err != nil {
			t.Fatal(err)
		}
		answers, err := p.AllAnswers()
		if err != nil {
			t.Fatal(err)
		}
		count := 0
		for _, r := range answers {
			if r.Header.Type == dnsmessage.TypeA {
				count++
			}
		}
		return count, h.Truncated
	}
}
