package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strings"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
)

// HealthServices are the names the gRPC health service answers for: the whole
// server, upstream's name, and the RLS service's full name.
var HealthServices = []string{"", "ratelimit", rlsv3.RateLimitService_ServiceDesc.ServiceName}

// NewHealth returns a health server reporting SERVING for HealthServices.
func NewHealth() *health.Server {
	h := health.NewServer()
	for _, name := range HealthServices {
		h.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	return h
}

// NewGRPCServer builds the gRPC server: the rate-limit service, health and
// reflection, on GRPCOptions, with TLS when tlsConfig is not nil.
func NewGRPCServer(svc rlsv3.RateLimitServiceServer, h *health.Server, tlsConfig *tls.Config) *grpc.Server {
	opts := GRPCOptions()
	if tlsConfig != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsConfig)))
	}
	gs := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(gs, svc)
	healthpb.RegisterHealthServer(gs, h)
	reflection.Register(gs)
	return gs
}

// TLSConfig loads the server certificate and, when clientCA is set, requires
// client certificates signed by it (mTLS).
func TLSConfig(certFile, keyFile, clientCA string) (*tls.Config, error) {
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
