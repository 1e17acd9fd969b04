package h2

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
)

// keepaliveClient serves stubRLS with keepalive shortened to d and d/2, and
// connects to it: the preface and empty SETTINGS are sent.
func keepaliveClient(t *testing.T, d time.Duration) (net.Conn, *http2.Framer) {
	t.Helper()
	s := New(stubRLS{}, grpc.NewServer(), nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	s.keepaliveTime, s.keepaliveTimeout = d, d/2
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		s.Serve(lis)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-served
	})
	nc, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.Write([]byte(http2.ClientPreface))
	fr := http2.NewFramer(nc, nc)
	fr.WriteSettings()
	return nc, fr
}

// TestKeepaliveClosesASilentPeer: a client that reads but never answers gets
// a PING after the keepalive time and is closed after the timeout, as
// grpc-go's server keepalive did.
func TestKeepaliveClosesASilentPeer(t *testing.T) {
	nc, fr := keepaliveClient(t, 100*time.Millisecond)
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	pinged := false
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("a silent peer's connection is still open after 5 s")
			}
			if !pinged {
				t.Fatalf("closed without a keepalive PING first: %v", err)
			}
			return
		}
		if p, ok := f.(*http2.PingFrame); ok && !p.IsAck() {
			pinged = true
		}
	}
}

// TestKeepaliveKeepsALivePeer: a client that answers PINGs, and sends nothing
// else, keeps its connection over many keepalive periods.
func TestKeepaliveKeepsALivePeer(t *testing.T) {
	nc, fr := keepaliveClient(t, 50*time.Millisecond)
	until := time.Now().Add(time.Second) // 20 periods
	nc.SetReadDeadline(until)
	pings := 0
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				break
			}
			t.Fatalf("connection ended after %d keepalive PINGs: %v", pings, err)
		}
		if p, ok := f.(*http2.PingFrame); ok && !p.IsAck() {
			pings++
			fr.WritePing(true, p.Data)
		}
	}
	if pings < 5 {
		t.Fatalf("%d keepalive PINGs in 20 periods", pings)
	}
}
