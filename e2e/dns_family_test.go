package e2e

// The cap under faults of --peers-dns membership, with real daemons counting
// their replicas through a real Consul agent's DNS, over TCP, under an
// offered 2L, measured by the daemons' own accounting (measure_test.go):
// one address family failing.

import (
	"encoding/binary"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/sharelimit/sharelimit/internal/consultest"
)

// aaaaProxy relays DNS over TCP to upstream, answering every AAAA query
// SERVFAIL itself while servfail is set, as a middlebox or a resolver that
// mishandles AAAA does.
type aaaaProxy struct {
	ln       net.Listener
	upstream string
	servfail atomic.Bool
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

func startAAAAProxy(t *testing.T, upstream string) *aaaaProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &aaaaProxy{ln: ln, upstream: upstream}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			p.wg.Go(func() { p.serve(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func readDNSMsg(c net.Conn) ([]byte, error) {
	var n [2]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint16(n[:]))
	_, err := io.ReadFull(c, b)
	return b, err
}

func writeDNSMsg(c net.Conn, b []byte) error {
	_, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...))
	return err
}

func (p *aaaaProxy) serve(c net.Conn) {
	defer c.Close()
	for {
		q, err := readDNSMsg(c)
		if err != nil {
			return
		}
		var parser dnsmessage.Parser
		h, err := parser.Start(q)
		if err != nil {
			return
		}
		question, err := parser.Question()
		if err != nil {
			return
		}
		if question.Type == dnsmessage.TypeAAAA && p.servfail.Load() {
			resp := dnsmessage.Message{
				Header:    dnsmessage.Header{ID: h.ID, Response: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true, RCode: dnsmessage.RCodeServerFailure},
				Questions: []dnsmessage.Question{question},
			}
			b, err := resp.Pack()
			if err != nil || writeDNSMsg(c, b) != nil {
				return
			}
			continue
		}
		up, err := net.DialTimeout("tcp", p.upstream, 2*time.Second)
		if err != nil {
			return
		}
		err = writeDNSMsg(up, q)
		var r []byte
		if err == nil {
			r, err = readDNSMsg(up)
		}
		up.Close()
		if err != nil || writeDNSMsg(c, r) != nil {
			return
		}
	}
}

// countingDNS matches a daemon whose view counts n replicas over DNS,
// confirmed, at weight 1/n.
func countingDNS(n int) func(memberView) bool {
	return func(m memberView) bool {
		return m.Source == "dns" && !m.ObservedAt.IsZero() && m.Total == n && sameWeight(m.Weight, 1/float64(n))
	}
}

// TestDNSFailedAddressFamilyKeepsCap: four daemons share L under an offered
// 2L, each counting four over DNS (two instances listed by IPv4 service
// addresses, two by IPv6 ones); then the AAAA queries start failing
// (SERVFAIL) while the A queries answer. A resolution with a failed family
// is a failed resolution: every daemon keeps counting four, with fault
// "error", and no one-second window admits more than L + 5%. (Go's resolver
// without StrictErrors returned the A records alone: every daemon counted
// two with no fault, and after --membership-hold the cluster admitted 2 L.)
// --membership-grace is 0, so that no grace keeps the IPv6 addresses
// counted in its stead.
func TestDNSFailedAddressFamilyKeepsCap(t *testing.T) {
	const k = 4
	p := mfParams()
	p.Burst = dnsBurst
	c := newCluster(t, k, p, consultest.WithDNS())
	proxy := startAAAAProxy(t, c.consul.DNSAddr())
	c.peersDNS = service + ".service.consul."
	// The last --peers-dns-server wins: the proxy, not the agent.
	c.args = []string{"--membership-hold", "1s", "--membership-grace", "0", "--peers-dns-server", proxy.ln.Addr().String()}
	addrs := []string{"192.0.2.1", "192.0.2.2", "2001:db8::3", "2001:db8::4"}
	for i := range k {
		c.consul.RegisterAt(nodeName(i), serviceID(i), service, addrs[i], true)
	}
	for i := range k {
		c.start(i, k)
	}
	c.awaitMember("counting 4 over DNS", time.Now(), startTimeout, countingDNS(k), c.daemons...)

	l := startLoad(t, c, loadOpts{rate: 2 * mfLimit, max: 30 * time.Second, weights: []float64{1, 1, 1, 1}})
	l.sleepUntil(4 * time.Second)
	t0 := l.elapsed()
	proxy.servfail.Store(true)
	// Each daemon has resolved through the failing proxy once it reports
	// the fault, or counts otherwise than four.
	c.awaitMember("resolving with the AAAA query failing", time.Now(), 30*time.Second, func(m memberView) bool {
		return m.Fault != "" || m.Total != k
	}, c.daemons...)
	t1 := l.elapsed()
	// Past the hold, and many resolutions.
	l.sleepUntil(t1 + 5*time.Second)
	for _, d := range c.daemons {
		m, err := c.memberViewOf(d)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s with AAAA failing: %v last_error=%q errors=%d", d.node, m, m.LastError, m.Errors)
		if !countingDNS(k)(m) || m.Fault != "error" || !strings.Contains(m.LastError, "AAAA") {
			t.Errorf("%s: %v with the AAAA query failing; want 4 replicas standing, with fault error and a last error naming the AAAA query", d.node, m)
		}
	}
	l.stop()
	l.checkClean(t)
	end := l.lastAnswered()
	before := l.window(mfFrom, t0)
	during := l.window(t1+time.Second, end)
	t.Logf("admitted/s by the cluster: %.0f before (%.1f%% of L), %.0f with the AAAA query failing (%.1f%% of L)",
		l.admitted(before), 100*l.admitted(before)/mfLimit, l.admitted(during), 100*l.admitted(during)/mfLimit)
	l.capped(t, "AAAA failing, A answering: every one-second window at most L", mfFrom, end, mfLimit, tolerance)
	l.near(t, "AAAA failing, A answering: the last view stands", during, mfLimit, tolerance)
}
