package membership

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// TestDNSCountAddrs: each distinct address is one replica. A server that
// lists one address twice, or an IPv4 address beside its IPv4-mapped IPv6
// form, lists one replica (Consul's DNS never does; a resolver that merges
// answers from several servers can).
func TestDNSCountAddrs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		addrs []netip.Addr
		want  int
	}{
		{"none", nil, 0},
		{"one", addrs("10.0.0.1"), 1},
		{"A and AAAA", addrs("10.0.0.1", "10.0.0.2", "fd00::3"), 3},
		{"a duplicate", addrs("10.0.0.1", "10.0.0.2", "10.0.0.1"), 2},
		{"IPv4 and its mapped form", addrs("10.0.0.1", "::ffff:10.0.0.1"), 1},
		{"a zone", addrs("fe80::1%eth0", "fe80::1%eth1", "fe80::1"), 1},
		{"an invalid address", []netip.Addr{{}, netip.MustParseAddr("10.0.0.1")}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := countAddrs(tc.addrs); got != tc.want {
				t.Fatalf("countAddrs(%v) = %d, want %d", tc.addrs, got, tc.want)
			}
		})
	}
}

// newTestDNS is a DNS source on a fake clock, with its random draws fixed at
// r, logging into logs, with no grace and none of the answers' addresses its
// host's. Nothing runs.
func newTestDNS(t *testing.T, clk *fakeClock, r float64, logs *logBuffer) *DNS {
	t.Helper()
	s, err := NewDNS(DNSConfig{Name: "rl.service.consul.", Replicas: 3, Interval: 5 * time.Second, Grace: -1, Clock: clk.Now, Logger: logs.logger()})
	if err != nil {
		t.Fatal(err)
	}
	s.random = func() float64 { return r }
	s.localAddrs = noLocalAddrs
	return s
}

// TestDNSLastCountStands drives the source's logic with what resolutions
// give, on a fake clock: the --replicas view until the first answer, the
// count of every answer, and on every failure (an error, NXDOMAIN, an empty
// answer) the last count standing, never 0, with the error counted and the
// fault named, and a warning only when a fault begins. The wait before the
// next resolution is the interval after an answer and a back-off, reset by
// the next answer, after a failure.
func TestDNSLastCountStands(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	var logs logBuffer
	s := newTestDNS(t, clk, 0, &logs)
	ctx := context.Background()
	nxdomain := &net.DNSError{Err: "no such host", Name: "rl.service.consul.", IsNotFound: true}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}

	v := s.View()
	if v.Source != "dns" || v.Name != "rl.service.consul." || v.Total != 3 || v.Local != 1 || v.Weight != 1.0/3 || !v.ObservedAt.IsZero() || v.Fault != "" {
		t.Fatalf("initial view %+v; want the --replicas view (3), unconfirmed", v)
	}
	steps := []struct {
		name   string
		addrs  []netip.Addr
		err    error
		total  int
		fault  string
		errors uint64
		wait   time.Duration // with random draws of 0: half the ceiling
		warn   bool          // a warning is logged
	}{
		{"NXDOMAIN before any answer: --replicas stands", nil, nxdomain, 3, FaultNonePassing, 1, 500 * time.Millisecond, true},
		{"and again: no new warning, a longer wait", nil, nxdomain, 3, FaultNonePassing, 2, time.Second, false},
		{"the first answer", addrs("10.0.0.1", "10.0.0.2"), nil, 2, "", 2, 5 * time.Second, false},
		{"a scale-up", addrs("10.0.0.1", "10.0.0.2", "10.0.0.3", "fd00::4"), nil, 4, "", 2, 5 * time.Second, false},
		{"an empty answer: the count stands, never 0", nil, nil, 4, FaultNonePassing, 3, 500 * time.Millisecond, true},
		{"NXDOMAIN", nil, nxdomain, 4, FaultNonePassing, 4, time.Second, false},
		{"the server refuses: a new fault", nil, refused, 4, FaultError, 5, 2 * time.Second, true},
		{"still", nil, refused, 4, FaultError, 6, 4 * time.Second, false},
		{"a timeout", nil, context.DeadlineExceeded, 4, FaultError, 7, 8 * time.Second, false},
		{"answers again: the back-off resets", addrs("10.0.0.1", "10.0.0.2", "10.0.0.3"), nil, 3, "", 7, 5 * time.Second, false},
		{"a failure waits the base again", nil, refused, 3, FaultError, 8, 500 * time.Millisecond, true},
	}
	var confirmed time.Time
	for _, st := range steps {
		clk.Advance(time.Second)
		before := strings.Count(logs.String(), "level=WARN")
		wait := s.observe(ctx, st.addrs, st.err)
		v := s.View()
		if v.Total != st.total || v.Local != 1 || v.TotalWeight != st.total || v.LocalWeight != 1 || v.Weight != 1/float64(st.total) {
			t.Fatalf("%s: view %+v; want %d replicas at weight 1/%d", st.name, v, st.total, st.total)
		}
		if v.Fault != st.fault || v.Errors != st.errors || (v.LastError == "") != (st.err == nil && st.addrs != nil) {
			t.Fatalf("%s: fault %q, errors %d, last error %q; want fault %q, errors %d", st.name, v.Fault, v.Errors, v.LastError, st.fault, st.errors)
		}
		if st.err == nil && st.addrs != nil {
			confirmed = clk.Now()
		}
		if !v.ObservedAt.Equal(confirmed) {
			t.Fatalf("%s: observed at %v, want %v (the last answer's time)", st.name, v.ObservedAt, confirmed)
		}
		if wait != st.wait {
			t.Fatalf("%s: next resolution in %s, want %s", st.name, wait, st.wait)
		}
		if warned := strings.Count(logs.String(), "level=WARN") > before; warned != st.warn {
			t.Fatalf("%s: warned %v, want %v; logs:\n%s", st.name, warned, st.warn, logs.String())
		}
	}
	for _, want := range []string{`error="no A or AAAA record: lookup rl.service.consul.: no such host"`, `error="no A or AAAA record"`,
		"connection refused", "previous_total=2", "the name resolves again"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs do not say %q:\n%s", want, logs.String())
		}
	}
}

// TestDNSBackoffBounds: the wait after the n-th failure in a row is in
// [c/2, c), c = min(max, base·2^(n-1)): never 0, so failures never spin,
// and capped.
func TestDNSBackoffBounds(t *testing.T) {
	t.Parallel()
	for _, r := range []float64{0, 0.5, 0.999999} {
		var logs logBuffer
		s := newTestDNS(t, newFakeClock(), r, &logs)
		c := time.Second
		for n := range 12 {
			got := s.observe(context.Background(), nil, errors.New("refused"))
			if got < c/2 || got >= c {
				t.Fatalf("r=%v: wait after failure %d = %s; want within [%s, %s)", r, n+1, got, c/2, c)
			}
			c = min(2*c, DefaultDNSBackoffMax)
		}
	}
}

// TestDNSRunRefused runs the loop against a server that refuses every
// connection (a real fault: a closed port) and one that accepts and never
// answers, with the waits recorded instead of slept: the loop backs off,
// exponentially and capped, and the --replicas view stands with the fault.
func TestDNSRunRefused(t *testing.T) {
	t.Parallel()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusing := closed.Addr().String()
	closed.Close()
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held sync.WaitGroup
	held.Go(func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // read nothing, answer nothing
		}
	})
	t.Cleanup(func() { silent.Close(); held.Wait() })

	for _, tc := range []struct{ name, server, says string }{
		{"refused", refusing, "connection refused"},
		{"never answers", silent.Addr().String(), "timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := NewDNS(DNSConfig{Name: "rl.service.consul.", Server: tc.server, Replicas: 4, Timeout: 100 * time.Millisecond,
				BackoffBase: 100 * time.Millisecond, BackoffMax: 800 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			const tries = 6
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var waits []time.Duration
			s.wait = func(ctx context.Context, d time.Duration) bool {
				waits = append(waits, d)
				if len(waits) == tries {
					cancel()
					return false
				}
				return true
			}
			if err := s.Run(ctx); err != nil {
				t.Fatalf("Run = %v, want nil", err)
			}
			if err := s.Run(ctx); !errors.Is(err, ErrDNSRunning) {
				t.Fatalf("second Run = %v, want ErrDNSRunning", err)
			}
			c := 100 * time.Millisecond
			for i, w := range waits {
				if w < c/2 || w >= c {
					t.Errorf("wait %d = %s, want within [%s, %s)", i+1, w, c/2, c)
				}
				c = min(2*c, 800*time.Millisecond)
			}
			v := s.View()
			if v.Total != 4 || v.Weight != 0.25 || v.Errors != tries || v.Fault != FaultError || !v.ObservedAt.IsZero() || !strings.Contains(v.LastError, tc.says) {
				t.Fatalf("view %+v; want the --replicas view (4) with %d errors, fault %q and an error saying %q", v, tries, FaultError, tc.says)
			}
		})
	}
}

func TestNewDNSValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  DNSConfig
		want string
	}{
		{"no name", DNSConfig{}, "dns name is empty"},
		{"only a dot", DNSConfig{Name: "."}, "dns name is empty"},
		{"server without port", DNSConfig{Name: "rl", Server: "10.0.0.1"}, `dns server "10.0.0.1" is not host:port`},
		{"negative interval", DNSConfig{Name: "rl", Interval: -time.Second}, "interval -1s or timeout 0s is negative"},
		{"back-off below its base", DNSConfig{Name: "rl", BackoffBase: time.Minute, BackoffMax: time.Second}, "back-off max 1s is below its base 1m0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := NewDNS(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewDNS = %v, want an error saying %q", err, tc.want)
			}
		})
	}
	s, err := NewDNS(DNSConfig{Name: "rl"})
	if err != nil {
		t.Fatal(err)
	}
	if s.cfg.Interval != DefaultDNSInterval || s.cfg.Timeout != DefaultDNSTimeout || s.cfg.BackoffBase != DefaultDNSBackoffBase || s.cfg.BackoffMax != DefaultDNSBackoffMax {
		t.Fatalf("defaults %+v", s.cfg)
	}
	if v := s.View(); v.Total != 1 || v.Weight != 1 || v.Source != "dns" {
		t.Fatalf("view with Replicas 0: %+v, want one replica", v)
	}
}
