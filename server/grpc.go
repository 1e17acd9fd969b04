package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"os"
	"strings"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/sharelimit/sharelimit/server/h2"
)

// HealthServices are the names the gRPC health service answers for: the whole
// server, upstream's name, and the RLS service's full name.
func HealthServices() []string {
	return []string{"", "ratelimit", rlsv3.RateLimitService_ServiceDesc.ServiceName}
}

// NewHealth returns a health server reporting SERVING for HealthServices.
func NewHealth() *health.Server {
	h := health.NewServer()
	for _, name := range HealthServices() {
		h.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	return h
}

// NewGRPCServer builds the gRPC server on grpc-go's transport: the
// rate-limit service, health and reflection, on GRPCOptions, with TLS when
// tlsConfig is not nil. extra comes last: a StreamCloser's ServerOption, for
// one.
func NewGRPCServer(svc rlsv3.RateLimitServiceServer, h *health.Server, tlsConfig *tls.Config, extra ...grpc.ServerOption) *grpc.Server {
	opts := GRPCOptions()
	if tlsConfig != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsConfig)))
	}
	gs := grpc.NewServer(append(opts, extra...)...)
	rlsv3.RegisterRateLimitServiceServer(gs, svc)
	for _, o := range extra {
		if r, ok := o.(alsoServe); ok {
			r.register(gs)
		}
	}
	healthpb.RegisterHealthServer(gs, h)
	reflection.Register(gs)
	return gs
}

// GRPC serves the gRPC listener: a *grpc.Server (NewGRPCServer), or an
// *h2.Server in front of one (NewDirectServer).
type GRPC interface {
	Serve(net.Listener) error
	GracefulStop()
	Stop()
}

var (
	_ GRPC = (*grpc.Server)(nil)
	_ GRPC = (*h2.Server)(nil)
)

// NewDirectServer builds what serves the gRPC listener on package h2's
// transport: ShouldRateLimit is answered there, and every other call
// (health, reflection) is relayed to a grpc-go server built by
// NewGRPCServer, which the first Serve starts. extra is as for
// NewGRPCServer.
func NewDirectServer(svc *Service, h *health.Server, tlsConfig *tls.Config, log *slog.Logger, extra ...grpc.ServerOption) *h2.Server {
	// The grpc-go server is reached in-process only: TLS, when asked for,
	// is on the connections h2 accepts. Every client connection's relayed
	// calls share its one in-process connection, so the stream limit is
	// h2's, per client connection, and none is set here.
	inner := append(extra[:len(extra):len(extra)], grpc.MaxConcurrentStreams(math.MaxUint32))
	return h2.New(svc, NewGRPCServer(svc, h, nil, inner...), tlsConfig, log)
}

// StreamCloser ends the streams clients hold open indefinitely, so that a
// graceful stop does not wait for them until its deadline. grpc-go's
// GracefulStop waits for every RPC, and a health Watch (kubelet's or Envoy's
// gRPC health checks) or a reflection stream (grpcurl) ends only when its
// client hangs up; grpc-go has no way to end one service's streams. Unary
// calls, the in-flight requests a graceful stop exists for, are untouched.
//
// Install it with ServerOption. After Close, every stream, open or opened
// later, ends with Unavailable. Safe for concurrent use; the zero value is not
// ready: use NewStreamCloser.
type StreamCloser struct {
	closing context.Context // ends on Close
	close   context.CancelFunc
}

// NewStreamCloser returns an open StreamCloser.
func NewStreamCloser() *StreamCloser {
	ctx, cancel := context.WithCancel(context.Background())
	return &StreamCloser{closing: ctx, close: cancel}
}

// ServerOption installs c on a server.
func (c *StreamCloser) ServerOption() grpc.ServerOption {
	return grpc.ChainStreamInterceptor(c.intercept)
}

// Close ends every stream. It does not wait for their handlers to return:
// GracefulStop does.
func (c *StreamCloser) Close() { c.close() }

var errStopping = status.Error(codes.Unavailable, "server is stopping")

// intercept gives the handler a context that also ends on Close: a handler that
// waits on its context, as health Watch does, returns. A handler blocked in
// RecvMsg, as reflection is between requests, is freed by closableStream.
func (c *StreamCloser) intercept(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if c.closing.Err() != nil {
		return errStopping // AfterFunc below would cancel it, but not before the handler starts
	}
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	defer context.AfterFunc(c.closing, cancel)()
	err := handler(srv, &closableStream{ServerStream: ss, ctx: ctx, interruptRecv: info.IsClientStream})
	if err != nil && c.closing.Err() != nil && ss.Context().Err() == nil {
		// We ended it, not the client: Unavailable says to come back (to another
		// replica, or to this one restarted), as a GOAWAY does.
		return errStopping
	}
	return err
}

// closableStream is a server stream whose Context ends on Close, and whose
// RecvMsg, on client-streaming RPCs, returns then too.
type closableStream struct {
	grpc.ServerStream
	ctx           context.Context
	interruptRecv bool
}

func (s *closableStream) Context() context.Context { return s.ctx }

// RecvMsg cannot cancel a receive in progress: grpc-go unblocks one only when
// a message arrives or the stream itself ends, and the stream ends only after
// the handler returns. So a receive runs on its own goroutine, and on Close the
// handler is told the stream is over without waiting for it. That goroutine
// ends, moments later, when grpc-go finishes the stream; it may still write to
// m, which the handler, having had an error, does not read. A handler calling
// RecvMsg again after an error gets the error again, so two receives never run
// at once.
func (s *closableStream) RecvMsg(m any) error {
	if !s.interruptRecv {
		// Not a client stream: a gRPC client sends the one request with the
		// call, so this receive does not wait on the client.
		return s.ServerStream.RecvMsg(m)
	}
	if s.ctx.Err() != nil {
		return status.FromContextError(s.ctx.Err()).Err()
	}
	got := make(chan error, 1)
	go func() { got <- s.ServerStream.RecvMsg(m) }()
	select {
	case err := <-got:
		return err
	case <-s.ctx.Done():
		return status.FromContextError(s.ctx.Err()).Err()
	}
}

// TLSConfig loads the server certificate and, when clientCA is set, requires
// client certificates signed by it (mTLS). clientSAN, when set (it needs
// clientCA), also requires the client certificate to name it among its
// subject alternative names, as upstream's GRPC_CLIENT_TLS_SAN.
func TLSConfig(certFile, keyFile, clientCA, clientSAN string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load gRPC TLS key pair: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCA != "" {
		pem, err := os.ReadFile(clientCA)
		if err != nil {
			return nil, fmt.Errorf("read gRPC client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("read gRPC client CA %s: no PEM certificates", clientCA)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	if clientSAN != "" {
		if clientCA == "" {
			return nil, fmt.Errorf("a client SAN to check needs a client CA")
		}
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("client sent no certificate")
			}
			if err := cs.PeerCertificates[0].VerifyHostname(clientSAN); err != nil {
				return fmt.Errorf("client certificate does not name %q: %w", clientSAN, err)
			}
			return nil
		}
	}
	return cfg, nil
}

// Listen opens addr: host:port for TCP, or unix:/path for a Unix socket, which
// is created with mode 0660 (owner and group: Envoy's user shares the group).
// A stale socket file left by a crashed daemon is removed first; any other file
// at that path is an error, never deleted.
func Listen(addr string) (net.Listener, error) {
	path, ok := strings.CutPrefix(addr, "unix:")
	if !ok {
		return net.Listen("tcp", addr)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("listen %s: exists and is not a socket", addr)
		}
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("listen %s: another process is serving on it", addr)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("listen %s: remove stale socket: %w", addr, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o660); err != nil {
		l.Close()
		return nil, fmt.Errorf("listen %s: chmod: %w", addr, err)
	}
	return l, nil
}

// AlsoServe is a server option that registers more services on the grpc-go
// server NewGRPCServer builds (for NewDirectServer, the one it relays to):
// RLQS beside RLS. grpc-go itself ignores it.
func AlsoServe(register func(grpc.ServiceRegistrar)) grpc.ServerOption {
	return alsoServe{register: register}
}

type alsoServe struct {
	grpc.EmptyServerOption
	register func(grpc.ServiceRegistrar)
}
