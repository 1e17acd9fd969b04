package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// pki writes a CA, a server certificate for 127.0.0.1 and a client certificate,
// all generated for the test, and returns their paths.
type pki struct{ dir, caCert, srvCert, srvKey, cliCert, cliKey string }

func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	p := pki{dir: dir}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
		return path
	}
	p.caCert = write("ca.pem", "CERTIFICATE", caDER)
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
			NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{name + ".test"}, KeyUsage: x509.KeyUsageDigitalSignature}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, _ := x509.MarshalECPrivateKey(key)
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", kb)
	}
	p.srvCert, p.srvKey = leaf("server", 2, x509.ExtKeyUsageServerAuth)
	p.cliCert, p.cliKey = leaf("client", 3, x509.ExtKeyUsageClientAuth)
	return p
}

// transports runs test on both gRPC transports.
func transports(t *testing.T, test func(t *testing.T, direct bool)) {
	for _, direct := range []bool{true, false} {
		name := map[bool]string{true: "direct", false: "grpc-go"}[direct]
		t.Run(name, func(t *testing.T) { test(t, direct) })
	}
}

// newGRPC builds the gRPC server on the transport asked for.
func newGRPC(t *testing.T, svc *Service, cfg *tls.Config, direct bool) GRPC {
	t.Helper()
	if direct {
		return NewDirectServer(svc, NewHealth(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	return NewGRPCServer(svc, NewHealth(), cfg)
}

func TestMutualTLS(t *testing.T) { transports(t, testMutualTLS) }

func testMutualTLS(t *testing.T, direct bool) {
	p := newPKI(t)
	cfg, err := TLSConfig(p.srvCert, p.srvKey, p.caCert, "")
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, Options{}, 1)
	gs := newGRPC(t, f.svc, cfg, direct)
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	go gs.Serve(lis)
	defer gs.Stop()

	roots := x509.NewCertPool()
	caPEM, _ := os.ReadFile(p.caCert)
	roots.AppendCertsFromPEM(caPEM)
	clientCert, _ := tls.LoadX509KeyPair(p.cliCert, p.cliKey)
	req := &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{d("free=x")}}
	call := func(creds credentials.TransportCredentials) error {
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(creds))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
		return err
	}
	if err := call(credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{clientCert}})); err != nil {
		t.Fatalf("client with a certificate: %v", err)
	}
	if err := call(credentials.NewTLS(&tls.Config{RootCAs: roots})); err == nil {
		t.Fatal("client without a certificate was served")
	}
	if err := call(insecure.NewCredentials()); err == nil {
		t.Fatal("plaintext client was served")
	}
	if _, err := TLSConfig(p.srvCert, p.srvKey, filepath.Join(p.dir, "missing.pem"), ""); err == nil {
		t.Fatal("missing CA accepted")
	}
}

// TestClientSAN: with a client SAN to check, as upstream's
// GRPC_CLIENT_TLS_SAN, a client certificate from the right CA is served only
// when it names that SAN.
func TestClientSAN(t *testing.T) { transports(t, testClientSAN) }

func testClientSAN(t *testing.T, direct bool) {
	p := newPKI(t)
	roots := x509.NewCertPool()
	caPEM, _ := os.ReadFile(p.caCert)
	roots.AppendCertsFromPEM(caPEM)
	clientCert, _ := tls.LoadX509KeyPair(p.cliCert, p.cliKey)
	req := &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{d("free=x")}}
	f := newFixture(t, Options{}, 1)
	for _, tc := range []struct {
		san    string
		served bool
	}{{"client.test", true}, {"envoy.test", false}} {
		cfg, err := TLSConfig(p.srvCert, p.srvKey, p.caCert, tc.san)
		if err != nil {
			t.Fatal(err)
		}
		gs := newGRPC(t, f.svc, cfg, direct)
		lis, _ := net.Listen("tcp", "127.0.0.1:0")
		go gs.Serve(lis)
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{clientCert}})))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
		cancel()
		conn.Close()
		gs.Stop()
		if served := err == nil; served != tc.served {
			t.Errorf("SAN %q: served %v (%v), want %v", tc.san, served, err, tc.served)
		}
	}
	if _, err := TLSConfig(p.srvCert, p.srvKey, "", "client.test"); err == nil {
		t.Error("a SAN without a client CA was accepted")
	}
}

func TestUnixSocket(t *testing.T) { transports(t, testUnixSocket) }

func testUnixSocket(t *testing.T, direct bool) {
	path := filepath.Join(t.TempDir(), "rls.sock")
	lis, err := Listen("unix:" + path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode %v %v", fi.Mode(), err)
	}
	f := newFixture(t, Options{}, 1)
	gs := newGRPC(t, f.svc, nil, direct)
	go gs.Serve(lis)
	conn, err := grpc.NewClient("unix:"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{d("free=x")}})
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	// A second daemon on the same live socket is refused; after the first
	// stops, a stale socket file is replaced.
	if _, err := Listen("unix:" + path); err == nil {
		t.Fatal("listened on a socket another server is serving")
	}
	gs.Stop()
	if l, err := Listen("unix:" + path); err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	} else {
		l.Close()
	}
	// A regular file is never deleted.
	file := filepath.Join(t.TempDir(), "not-a-socket")
	os.WriteFile(file, []byte("x"), 0o644)
	if _, err := Listen("unix:" + file); err == nil {
		t.Fatal("listened over a regular file")
	}
}
