package h2

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Answerer decides a rate-limit request without blocking: the answer, or an
// error that is a gRPC status, and how long to hold the answer back.
type Answerer interface {
	Answer(req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, time.Duration, error)
}

// Path is the one method this package serves itself.
const Path = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// Settings this server sends and keeps to.
const (
	// MaxConcurrentStreams is what a connection may have open at once, as
	// grpc-go was configured before.
	MaxConcurrentStreams = 1024
	// maxRecvMsg caps one request message, as grpc.MaxRecvMsgSize did.
	maxRecvMsg = 1 << 20
	// streamWindow is each stream's receive window: a whole request fits,
	// and it bounds what one stream may have buffered (a connection, at
	// most MaxConcurrentStreams of them, as with grpc-go).
	streamWindow = 1<<20 + 5
	// connWindow is the connection's receive window. It is given back as
	// DATA arrives, so it paces a client but never holds one up: a
	// connection's buffers are bounded by its streams' windows.
	connWindow = 4 << 20
	// maxHeaderList bounds a request's decoded header fields: a call over
	// it is refused alone (RESOURCE_EXHAUSTED), and the connection goes on.
	maxHeaderList = 64 << 10
	// maxHeaderDecode bounds what is decoded of one header block to refuse
	// that call alone, keeping the connection's HPACK state in step. A block
	// larger still ends the connection: x/net's Framer stops reading it,
	// its defence against floods of CONTINUATION frames.
	maxHeaderDecode = 1 << 20
	// handshakeTimeout bounds the TLS handshake and the client preface.
	handshakeTimeout = 10 * time.Second
	// pingInterval and maxPingStrikes are grpc-go's ping enforcement, as the
	// daemon configured it: more than two PINGs less than 10 s apart with
	// no new stream between them end the connection (ENHANCE_YOUR_CALM).
	pingInterval   = 10 * time.Second
	maxPingStrikes = 2
	// KeepaliveTime and KeepaliveTimeout are grpc-go's server keepalive
	// as the daemon configured it: a PING after 2 minutes with nothing
	// from the peer, and the connection closed 20 s later if still nothing.
	KeepaliveTime    = 2 * time.Minute
	KeepaliveTimeout = 20 * time.Second
)

// Server serves gRPC over HTTP/2: ShouldRateLimit here, every other method
// through grpc-go. Safe for concurrent use.
type Server struct {
	rls   Answerer
	inner *grpc.Server
	// keepaliveTime and keepaliveTimeout are KeepaliveTime and
	// KeepaliveTimeout; tests shorten them.
	keepaliveTime, keepaliveTimeout time.Duration
	tls                             *tls.Config
	log                             *slog.Logger

	innerCC  *grpc.ClientConn // nil until the first Serve; set with mu held
	innerRun sync.WaitGroup

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	draining  bool
	stopped   bool
	connsGone *sync.Cond // signalled as conns empties
}

// New returns a server deciding ShouldRateLimit with rls and relaying every
// other call to inner. It starts nothing: the first Serve starts inner, on an
// in-process listener, and Stop or GracefulStop stops it, started or not.
// With tlsConfig, connections are TLS with ALPN "h2".
func New(rls Answerer, inner *grpc.Server, tlsConfig *tls.Config, log *slog.Logger) *Server {
	s := &Server{
		rls: rls, inner: inner, log: log,
		keepaliveTime: KeepaliveTime, keepaliveTimeout: KeepaliveTimeout,
		listeners: map[net.Listener]struct{}{},
		conns:     map[*conn]struct{}{},
	}
	s.connsGone = sync.NewCond(&s.mu)
	if tlsConfig != nil {
		s.tls = tlsConfig.Clone()
		s.tls.NextProtos = []string{"h2"}
	}
	return s
}

// startInner starts, once, the grpc-go server the relayed calls go to, on an
// in-process listener, and the client connection they take to it. Called
// with mu held, before the first connection is served.
func (s *Server) startInner() error {
	if s.innerCC != nil {
		return nil
	}
	lis := newPipeListener()
	cc, err := grpc.NewClient("passthrough:///sharelimit-inner",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.dial(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)),
	)
	if err != nil {
		return fmt.Errorf("h2: connect to the in-process gRPC server: %w", err)
	}
	s.innerCC = cc
	s.innerRun.Add(1)
	go func() {
		defer s.innerRun.Done()
		s.inner.Serve(lis)
	}()
	return nil
}

// ErrServerStopped is what Serve returns once the server has stopped.
var ErrServerStopped = grpc.ErrServerStopped

// Serve accepts connections on lis until the server stops, and returns nil
// then. It closes lis.
func (s *Server) Serve(lis net.Listener) error {
	s.mu.Lock()
	if s.stopped || s.draining {
		s.mu.Unlock()
		lis.Close()
		return ErrServerStopped
	}
	if err := s.startInner(); err != nil {
		s.mu.Unlock()
		lis.Close()
		return err
	}
	s.listeners[lis] = struct{}{}
	s.mu.Unlock()
	defer lis.Close()
	var delay time.Duration
	for {
		nc, err := lis.Accept()
		if err != nil {
			s.mu.Lock()
			done := s.stopped || s.draining
			s.mu.Unlock()
			if done {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				// Out of file descriptors, say: back off as net/http does.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		if !s.track(nc) {
			nc.Close()
			return nil
		}
	}
}

// track starts serving nc, unless the server is stopping.
func (s *Server) track(nc net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped || s.draining {
		return false
	}
	c := newConn(s, nc)
	s.conns[c] = struct{}{}
	go c.serve()
	return true
}

// forget drops c once it has ended.
func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	if len(s.conns) == 0 {
		s.connsGone.Broadcast()
	}
	s.mu.Unlock()
}

// GracefulStop stops accepting, tells every client to open no new stream
// (GOAWAY), waits for the calls in flight, then stops the grpc-go server the
// other calls go to.
func (s *Server) GracefulStop() { s.stop(true) }

// Stop closes every listener and connection at once; calls in flight fail.
// It returns once every connection's goroutines have ended.
func (s *Server) Stop() { s.stop(false) }

// stop closes the listeners, then sends every connection a GOAWAY (graceful)
// or closes it, waits for all of them to end, and stops grpc-go likewise.
func (s *Server) stop(graceful bool) {
	s.mu.Lock()
	if graceful {
		s.draining = true
	} else {
		s.stopped = true
	}
	for l := range s.listeners {
		l.Close()
	}
	for c := range s.conns {
		if graceful {
			c.goAway()
		} else {
			c.raw.Close()
		}
	}
	for len(s.conns) > 0 {
		s.connsGone.Wait()
	}
	cc := s.innerCC // no Serve starts it from here on
	s.mu.Unlock()
	if graceful {
		s.inner.GracefulStop()
	} else {
		s.inner.Stop()
	}
	if cc != nil {
		cc.Close()
	}
	s.innerRun.Wait()
}
