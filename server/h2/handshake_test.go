package h2_test

import (
	"crypto/tls"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/sharelimit/sharelimit/internal/testutil"
	"github.com/sharelimit/sharelimit/server"
)

// hookedListener lets a test see two moments it could otherwise only sleep
// through: an accepted connection's first read (the server waits for the
// client to speak, in the TLS handshake or for the preface), and the
// server closing the listener (a stop has begun, and reaches every
// connection in the same step).
type hookedListener struct {
	net.Listener
	reading, closed  chan struct{}
	readOnce, closeO sync.Once
}

type hookedConn struct {
	net.Conn
	l *hookedListener
}

func (c *hookedConn) Read(p []byte) (int, error) {
	c.l.readOnce.Do(func() { close(c.l.reading) })
	return c.Conn.Read(p)
}

func (l *hookedListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &hookedConn{Conn: nc, l: l}, nil
}

func (l *hookedListener) Close() error {
	l.closeO.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// serveHooked has d's server serve one more listener, hooked, and dials it.
// The returned func waits for that Serve to return.
func serveHooked(t *testing.T, d *daemon) (*hookedListener, net.Conn, func()) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hl := &hookedListener{Listener: lis, reading: make(chan struct{}), closed: make(chan struct{})}
	served := make(chan struct{})
	go func() { defer close(served); d.gs.Serve(hl) }()
	nc, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	return hl, nc, func() { testutil.Within(t, served, "Serve to return") }
}

// TestGracefulStopDuringTLSHandshake: a client has connected but not
// yet sent its ClientHello when a graceful stop begins. The server must not
// write HTTP/2 frames into the socket in plain text; the client's TLS
// handshake should either succeed or see the connection closed, never
// garbage where a TLS record should be.
func TestGracefulStopDuringTLSHandshake(t *testing.T) {
	cfg, pool := selfSigned(t)
	d := startWith(t, true, server.Options{}, cfg)
	hl, nc, served := serveHooked(t, d)
	defer nc.Close()
	testutil.Within(t, hl.reading, "the server to wait in the TLS handshake")
	stopped := make(chan struct{})
	go func() { d.gs.GracefulStop(); close(stopped) }()
	testutil.Within(t, hl.closed, "the stop to begin")
	// What is in the socket before the client speaks TLS? Nothing, then
	// either the close or, much later, nothing still.
	nc.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64)
	n, _ := nc.Read(buf)
	if n > 0 {
		t.Errorf("before any ClientHello, the server wrote %d plaintext bytes: % x", n, buf[:n])
	}
	nc.SetReadDeadline(time.Time{})
	tc := tls.Client(nc, &tls.Config{RootCAs: pool, ServerName: "localhost", NextProtos: []string{"h2"}})
	tc.SetDeadline(time.Now().Add(2 * time.Second))
	if err := tc.Handshake(); err != nil {
		t.Logf("client handshake: %v", err)
	}
	<-stopped
	served()
}

// TestGracefulStopBeforePreface: plaintext; a client connected but has
// not sent its preface when a graceful stop begins. Whatever the server
// writes, its first frame must be SETTINGS (RFC 9113 3.4), or it may close.
func TestGracefulStopBeforePreface(t *testing.T) {
	for _, direct := range []bool{false, true} {
		d := start(t, direct, server.Options{})
		hl, nc, served := serveHooked(t, d)
		testutil.Within(t, hl.reading, "the server to wait for the preface")
		stopped := make(chan struct{})
		go func() { d.gs.GracefulStop(); close(stopped) }()
		testutil.Within(t, hl.closed, "the stop to begin")
		nc.Write([]byte(http2.ClientPreface))
		fr := http2.NewFramer(nc, nc)
		fr.WriteSettings()
		nc.SetReadDeadline(time.Now().Add(2 * time.Second))
		f, err := fr.ReadFrame()
		if err == nil {
			if _, ok := f.(*http2.SettingsFrame); !ok {
				t.Errorf("direct=%v: first frame from the server is %v, not SETTINGS", direct, f.Header())
			}
		}
		nc.Close()
		<-stopped
		served()
	}
}
