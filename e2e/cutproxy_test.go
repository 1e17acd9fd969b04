package e2e

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
)

// cutProxy forwards TCP connections to one address, and can cut them: cut
// closes every open connection and closes each new one as soon as it is
// accepted, until mend. It is how a test disconnects one Envoy from its
// daemon while the daemon and the other Envoys go on.
type cutProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// startCutProxy listens on a loopback port and forwards to target until the
// test ends.
func startCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		ln.Close()
		p.sever(false)
		p.wg.Wait()
	})
	return p
}

// Addr is where a client dials to reach the target through the proxy.
func (p *cutProxy) Addr() string { return p.ln.Addr().String() }

func (p *cutProxy) accept() {
	for {
		in, err := p.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		p.wg.Go(func() { p.forward(in) })
	}
}

// forward joins in to a new connection to the target, unless the proxy is
// cut.
func (p *cutProxy) forward(in net.Conn) {
	if !p.track(in) {
		in.Close()
		return
	}
	defer p.untrack(in)
	out, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	if !p.track(out) {
		out.Close()
		return
	}
	defer p.untrack(out)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done // one side ended: end both
}

func (p *cutProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *cutProxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
	c.Close()
}

// Cut closes every forwarded connection and refuses new ones.
func (p *cutProxy) Cut() { p.sever(true) }

// Mend forwards new connections again.
func (p *cutProxy) Mend() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

func (p *cutProxy) sever(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	for c := range p.conns {
		c.Close()
	}
}
