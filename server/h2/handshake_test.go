package h2_test

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/server"
	"github.com/sharelimit/sharelimit/source"
)

func startTLS(t *testing.T) (server.GRPC, string, *x509.CertPool, chan struct{}) {
	t.Helper()
	set, err := source.Load("../testdata/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	store := bucket.NewStore(0)
	engine := descriptors.NewEngine(nil, 1, store)
	metrics := server.NewMetrics(store)
	metrics.Bind(set)
	engine.Swap(set)
	now := int64(time.Hour)
	svc := server.NewService(engine, func() int64 { return now }, metrics, server.Options{}, quiet)
	cfg, pool := selfSigned(t)
	gs, err := server.NewGRPC(svc, server.NewHealth(), cfg, true, quiet)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); gs.Serve(lis) }()
	return gs, lis.Addr().String(), pool, served
}

// TestGracefulStopDuringTLSHandshake: a client has connected but not
// yet sent its ClientHello when a graceful stop begins. The server must not
// write HTTP/2 frames into the socket in plain text; the client's TLS
// handshake should either succeed or see the connection closed, never
// garbage where a TLS record should be.
func TestGracefulStopDuringTLSHandshake(t *testing.T) {
	gs, addr, pool, served := startTLS(t)
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	time.Sleep(100 * time.Millisecond) // accepted, waiting in tc.Handshake
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
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
	<-served
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
