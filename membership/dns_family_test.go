package membership

// A resolution in which one address family fails while the other answers is
// a failed resolution: the last view stands, with the fault. Go's resolver,
// asked for "ip" without StrictErrors, returns the family that answered and
// drops the other's error, so a SERVFAIL'd AAAA query made four replicas
// (two listed by IPv4 addresses, two by IPv6 ones) count two, with no
// fault: four replicas at 1/2 each admit 2 L. These tests run against a
// real Consul agent's DNS, through a TCP proxy that mishandles AAAA
// queries as some middleboxes and resolvers do.

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/internal/consultest"
)

// noLocalAddrs stands for a host none of whose addresses any test answer
// lists: the tests' addresses (192.0.2.0/24, 2001:db8::/32) may be the test
// machine's own.
func noLocalAddrs() ([]netip.Addr, error) { return nil, nil }

// TestDNSFailedFamilyFailsResolution: four instances of web in Consul, two
// listed by IPv4 service addresses and two by IPv6 ones. While the AAAA
// query fails (SERVFAIL, REFUSED, or no answer within the timeout) and the
// A query answers, every resolution fails: the view of four stands, with
// fault "error" and a last error naming the AAAA query, and no view of
// fewer than four is ever published, so no Damper applies one after its
// hold. With no grace, so that nothing else keeps the IPv6 addresses
// counted. When the AAAA query answers again, so does the source.
func TestDNSFailedFamilyFailsResolution(t *testing.T) {
	t.Parallel()
	a := consultest.Start(t, consultest.WithDNS())
	a.RegisterAt(a.NodeName(), "web-1", "web", "192.0.2.1", true)
	a.RegisterAt("node-b", "web-2", "web", "192.0.2.2", true)
	a.RegisterAt("node-c", "web-3", "web", "2001:db8::3", true)
	a.RegisterAt("node-d", "web-4", "web", "2001:db8::4", true)

	for _, tc := range []struct{ mode, says string }{
		{"servfail", "server misbehaving"},
		{"refused", "server misbehaving"},
		{"silent", "timeout"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			p := consultest.StartAAAAProxy(t, a.DNSAddr())
			var d *Damper
			var logs logBuffer
			var mu sync.Mutex
			var published []View
			s, err := NewDNS(DNSConfig{Name: "web.service.consul.", Server: p.Addr(), Replicas: 4, Interval: 50 * time.Millisecond,
				Timeout: 500 * time.Millisecond, BackoffBase: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Grace: -1,
				Logger: logs.logger(), OnUpdate: func(v View) {
					mu.Lock()
					published = append(published, v)
					mu.Unlock()
					d.Update(v)
				}})
			if err != nil {
				t.Fatal(err)
			}
			s.localAddrs = noLocalAddrs
			d, err = NewDamper(s.View(), DamperConfig{Hold: 100 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			run(t, d)
			run(t, s)

			waitView(t, d, func(v View) bool { return counts(4, 1)(v) && !v.ObservedAt.IsZero() }, "four replicas, confirmed, in force")
			p.SetMode(tc.mode)
			v := waitView(t, s, func(v View) bool { return v.Fault == FaultError && v.Errors >= 3 }, "three failed resolutions")
			t.Logf("AAAA %s: view total=%d weight=%v fault=%q errors=%d last_error=%q", tc.mode, v.Total, v.Weight, v.Fault, v.Errors, v.LastError)
			if !counts(4, 1)(v) || !strings.Contains(v.LastError, "AAAA") || !strings.Contains(v.LastError, tc.says) {
				t.Errorf("AAAA %s: view %+v; want the four standing, with a last error naming the AAAA query and saying %q", tc.mode, v, tc.says)
			}
			if !strings.Contains(logs.String(), "level=WARN") {
				t.Errorf("AAAA %s: no warning:\n%s", tc.mode, logs.String())
			}
			mu.Lock()
			for _, pv := range published {
				if pv.Total != 4 && !pv.ObservedAt.IsZero() {
					t.Errorf("AAAA %s: published a view of %d replicas (fault %q): %+v", tc.mode, pv.Total, pv.Fault, pv)
				}
			}
			mu.Unlock()
			if dv := d.View(); dv.Weight != 0.25 || dv.Fault != FaultError {
				t.Errorf("AAAA %s: in force %+v; want weight 0.25 with the fault", tc.mode, dv)
			}

			p.SetMode(consultest.AAAARelay)
			waitView(t, s, func(v View) bool { return counts(4, 1)(v) && v.Fault == "" && v.LastError == "" }, "the source answering again")
		})
	}
}

// TestDNSLookupNotFoundFamilyIsEmpty: a family with no record (NODATA, or
// NXDOMAIN for that type) is empty, not a failure: a name with only A
// records counts them, as one with only AAAA records does; only when both
// are empty is the answer ErrNoRecords' fault. An IP address given as the
// name is its one address, asked of no server.
func TestDNSLookupNotFoundFamilyIsEmpty(t *testing.T) {
	t.Parallel()
	a := consultest.Start(t, consultest.WithDNS())
	a.RegisterAt("node-a", "v4-1", "v4", "192.0.2.1", true)
	a.RegisterAt("node-b", "v4-2", "v4", "192.0.2.2", true)
	a.RegisterAt("node-c", "v6-1", "v6", "2001:db8::3", true)
	ctx := context.Background()
	r := resolver(a.DNSAddr())
	for _, tc := range []struct {
		name string
		want int
	}{
		{"v4.service.consul.", 2},
		{"v6.service.consul.", 1},
		{"10.96.0.10", 1},
	} {
		got, err := r.lookup(ctx, tc.name)
		if err != nil || countAddrs(got) != tc.want {
			t.Errorf("lookup %s = %v, %v; want %d addresses", tc.name, got, err, tc.want)
		}
	}
	if got, err := r.lookup(ctx, "none.service.consul."); err == nil || len(got) != 0 {
		t.Errorf("lookup of a service with no instance = %v, %v; want not found", got, err)
	} else if de := (*net.DNSError)(nil); !errors.As(err, &de) || !de.IsNotFound || de.Server != a.DNSAddr() {
		t.Errorf("lookup of a service with no instance: %v; want a not-found DNS error naming the server asked", err)
	}
}
