package h2

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
)

// TestNewStartsNothing: New starts no goroutine, Stop ends a server that was
// never served, and a Serve after Stop starts nothing either.
func TestNewStartsNothing(t *testing.T) {
	before := goleak.IgnoreCurrent()
	s := New(stubRLS{}, grpc.NewServer(), nil, slog.New(slog.DiscardHandler))
	goleak.VerifyNone(t, before)
	s.Stop()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(lis); !errors.Is(err, ErrServerStopped) {
		t.Fatalf("Serve after Stop: %v, want ErrServerStopped", err)
	}
	if s.innerCC != nil {
		t.Fatal("Serve after Stop connected to the grpc-go server")
	}
	goleak.VerifyNone(t, before)
}

// TestPipeListener: a dial reaches Accept as a connected pair; after Close,
// Accept and dial both fail, and a dial waiting for Accept is freed.
func TestPipeListener(t *testing.T) {
	l := newPipeListener()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			c = nil
		}
		accepted <- c
	}()
	client, err := l.dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	server := <-accepted
	if server == nil {
		t.Fatal("Accept failed")
	}
	go client.Write([]byte("ping"))
	buf := make([]byte, 4)
	if _, err := server.Read(buf); err != nil || string(buf) != "ping" {
		t.Fatalf("read %q, %v", buf, err)
	}
	client.Close()
	server.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := l.dial(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial with nobody accepting: %v", err)
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := l.dial(context.Background())
		waiting <- err
	}()
	l.Close()
	if err := <-waiting; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("dial waiting at Close: %v", err)
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
	if l.Addr().String() == "" {
		t.Fatal("no address")
	}
}
