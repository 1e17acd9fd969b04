package h2_test

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/sharelimit/sharelimit/server"
)

// TestGracefulStopDuringTLSHandshake: a client has connected but not
// yet sent its ClientHello when a graceful stop begins. The server must not
// write HTTP/2 frames into the socket in plain text; the client's TLS
// handshake should either succeed or see the connection closed, never
// garbage where a TLS record should be.
func TestGracefulStopDuringTLSHandshake(t *testing.T) {
	cfg, pool := selfSigned(t)
	d := startWith(t, true, server.Options{}, cfg)
	nc, err := net.Dial("tcp", d.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	time.Sleep(100 * time.Millisecond) // accepted, waiting in tc.Handshake
	stopped := make(chan struct{})
	go func() { d.gs.GracefulStop(); close(stopped) }()
	time.Sleep(100 * time.Millisecond)
	// What is in the socket before the client speaks TLS?
	nc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
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
}

// TestGracefulStopBeforePreface: plaintext; a client connected but has
// not sent its preface when a graceful stop begins. Whatever the server
// writes, its first frame must be SETTINGS (RFC 9113 3.4), or it may close.
func TestGracefulStopBeforePreface(t *testing.T) {
	for _, direct := range []bool{false, true} {
		d := start(t, direct, server.Options{})
		nc, err := net.Dial("tcp", d.addr)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		stopped := make(chan struct{})
		go func() { d.gs.GracefulStop(); close(stopped) }()
		time.Sleep(100 * time.Millisecond)
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
	}
}
