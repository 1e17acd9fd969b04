package membership

import (
	"strings"
	"testing"
	"time"
)

// TestDNSInitialViewStands: a view saved by --state-file (Initial) stands
// until the name first resolves, through failures, instead of --replicas:
// a replica restarted while its DNS is down enforces the share it had, not
// every limit whole. A first answer that counts fewer replicas than it is
// suspect, as the Consul watch holds one (a DNS server restarted empty and
// re-registering, a replica that remembers nothing yet): the saved view
// stands with fault "suspect" for up to ten graces from the start, then the
// answer is believed. An answer counting as many or more applies at once.
func TestDNSInitialViewStands(t *testing.T) {
	t.Parallel()
	saved := &View{Total: 4, Local: 1, TotalWeight: 4, LocalWeight: 1, Weight: 0.25}

	t.Run("short first answers", func(t *testing.T) {
		t.Parallel()
		clk := newFakeClock()
		var logs logBuffer
		s := newFakeDNS(t, clk, &logs, DNSConfig{Grace: 30 * time.Second, Replicas: 1, Initial: saved})
		if v := s.View(); !counts(4, 1)(v) || v.Source != "dns" || v.Name != "rl.service.consul." || !v.ObservedAt.IsZero() || v.Fault != "" {
			t.Fatalf("initial view %+v; want the saved view of 4, unconfirmed", v)
		}
		for _, st := range []step{
			{name: "NXDOMAIN: the saved view stands", after: time.Second, total: 4, local: 1, fault: FaultNonePassing, warn: true},
			{name: "a first answer of 2: suspect", after: time.Second, addrs: addrs("10.0.0.1", "10.0.0.2"), total: 4, local: 1, fault: FaultSuspect, warn: true},
			{name: "of 3, near ten graces on", after: 297 * time.Second, addrs: addrs("10.0.0.1", "10.0.0.2", "10.0.0.3"), total: 4, local: 1, fault: FaultSuspect},
			{name: "ten graces on: believed", after: time.Second, addrs: addrs("10.0.0.1", "10.0.0.2", "10.0.0.3"), total: 3, local: 1},
			{name: "then a short answer is a scale-down, held by the grace", after: time.Second, addrs: addrs("10.0.0.1", "10.0.0.2"), total: 3, local: 1},
		} {
			st.run(t, s, clk, &logs)
		}
		if v := s.View(); v.ObservedAt.IsZero() {
			t.Fatalf("view %+v; want it confirmed", v)
		}
		if !strings.Contains(logs.String(), "fewer than the 4 replicas of the view the state file saved") {
			t.Errorf("logs do not say why the answer is suspect:\n%s", logs.String())
		}
	})

	t.Run("a first answer as large or larger", func(t *testing.T) {
		t.Parallel()
		for _, n := range []int{4, 5} {
			clk := newFakeClock()
			var logs logBuffer
			s := newFakeDNS(t, clk, &logs, DNSConfig{Grace: 30 * time.Second, Initial: saved})
			as := addrs("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5")[:n]
			(step{name: "the first answer", after: time.Second, addrs: as, total: n, local: 1}).run(t, s, clk, &logs)
		}
	})

	t.Run("no grace, no suspicion", func(t *testing.T) {
		t.Parallel()
		clk := newFakeClock()
		var logs logBuffer
		s := newFakeDNS(t, clk, &logs, DNSConfig{Grace: -1, Initial: saved})
		(step{name: "a first answer of 2", after: time.Second, addrs: addrs("10.0.0.1", "10.0.0.2"), total: 2, local: 1}).run(t, s, clk, &logs)
	})

	t.Run("not a possible view", func(t *testing.T) {
		t.Parallel()
		for _, bad := range []*View{
			{Total: 4, Local: 1, TotalWeight: 4, LocalWeight: 1, Weight: 0.5},
			{Total: 1, Local: 2, TotalWeight: 1, LocalWeight: 2, Weight: 2},
			{Total: 0, Local: 0, Weight: 1},
		} {
			var logs logBuffer
			s := newFakeDNS(t, newFakeClock(), &logs, DNSConfig{Replicas: 3, Initial: bad})
			if v := s.View(); !counts(3, 1)(v) {
				t.Errorf("initial %+v: view %+v; want the --replicas view (3)", bad, v)
			}
		}
	})
}
