package consultest

import (
	be "encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// The modes of an AAAAProxy.
const (
	AAAARelay    = ""         // relay every query
	AAAAServfail = "servfail" // answer every AAAA query SERVFAIL
	AAAARefused  = "refused"  // answer every AAAA query REFUSED
	AAAASilent   = "silent"   // never answer an AAAA query
)

// AAAAProxy relays DNS over TCP to an agent's DNS interface, and mishandles
// AAAA queries as some middleboxes and resolvers do, in the mode SetMode
// sets: a fault a real agent cannot produce on demand. A queries are
// always relayed.
type AAAAProxy struct {
	ln       net.Listener
	upstream string
	mode     atomic.Value // string
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

// StartAAAAProxy listens on a free loopback port and relays to upstream
// (DNSAddr) until the test ends.
func StartAAAAProxy(t testing.TB, upstream string) *AAAAProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &AAAAProxy{ln: ln, upstream: upstream}
	p.mode.Store(AAAARelay)
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

// Addr is the proxy's host:port, for --peers-dns-server.
func (p *AAAAProxy) Addr() string { return p.ln.Addr().String() }

// SetMode sets how AAAA queries are handled from now on: AAAARelay,
// AAAAServfail, AAAARefused or AAAASilent.
func (p *AAAAProxy) SetMode(mode string) { p.mode.Store(mode) }

func readDNSMsg(c net.Conn) ([]byte, error) {
	var n [2]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return nil, err
	}
	b := make([]byte, be.BigEndian.Uint16(n[:]))
	_, err := io.ReadFull(c, b)
	return b, err
}

func writeDNSMsg(c net.Conn, b []byte) error {
	_, err := c.Write(append(be.BigEndian.AppendUint16(nil, uint16(len(b))), b...))
	return err
}

func (p *AAAAProxy) serve(c net.Conn) {
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
		if question.Type == dnsmessage.TypeAAAA {
			rcode := dnsmessage.RCodeSuccess
			switch p.mode.Load().(string) {
			case AAAASilent:
				continue // read on, answer nothing
			case AAAAServfail:
				rcode = dnsmessage.RCodeServerFailure
			case AAAARefused:
				rcode = dnsmessage.RCodeRefused
			}
			if rcode != dnsmessage.RCodeSuccess {
				resp := dnsmessage.Message{
					Header:    dnsmessage.Header{ID: h.ID, Response: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true, RCode: rcode},
					Questions: []dnsmessage.Question{question},
				}
				b, err := resp.Pack()
				if err != nil || writeDNSMsg(c, b) != nil {
					return
				}
				continue
			}
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
