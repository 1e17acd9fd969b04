package h2_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"

	"github.com/sharelimit/sharelimit/server/h2"
)

// rawClient is a hand-driven HTTP/2 client connection: frames written and
// read one by one, for what a gRPC client never sends.
type rawClient struct {
	t   testing.TB
	nc  net.Conn
	fr  *http2.Framer
	enc *hpack.Encoder
	hb  bytes.Buffer
}

// dialRaw connects to addr and sends the preface and settings.
func dialRaw(t testing.TB, addr string, settings ...http2.Setting) *rawClient {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	return newRaw(t, nc, settings...)
}

// newRaw sends the preface and settings on nc.
func newRaw(t testing.TB, nc net.Conn, settings ...http2.Setting) *rawClient {
	t.Helper()
	c := &rawClient{t: t, nc: nc}
	c.fr = http2.NewFramer(nc, nc)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.enc = hpack.NewEncoder(&c.hb)
	if _, err := nc.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteSettings(settings...); err != nil {
		t.Fatal(err)
	}
	return c
}

// block encodes a gRPC request's header fields for path, then extra
// (name, value, ...).
func (c *rawClient) block(path string, extra ...string) []byte {
	c.hb.Reset()
	f := []string{":method", "POST", ":scheme", "http", ":path", path, ":authority", "x", "content-type", "application/grpc", "te", "trailers"}
	f = append(f, extra...)
	for i := 0; i < len(f); i += 2 {
		c.enc.WriteField(hpack.HeaderField{Name: f[i], Value: f[i+1]})
	}
	return append([]byte(nil), c.hb.Bytes()...)
}

// headers opens stream id on path.
func (c *rawClient) headers(id uint32, path string, end bool, extra ...string) {
	c.t.Helper()
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.block(path, extra...), EndHeaders: true, EndStream: end}); err != nil {
		c.t.Fatal(err)
	}
}

// grpcMsg frames a gRPC message.
func grpcMsg(b []byte) []byte {
	out := []byte{0, byte(len(b) >> 24), byte(len(b) >> 16), byte(len(b) >> 8), byte(len(b))}
	return append(out, b...)
}

// call opens stream id with a ShouldRateLimit request, with extra header
// fields (name, value, ...).
func (c *rawClient) call(id uint32, req *rlsv3.RateLimitRequest, extra ...string) {
	c.t.Helper()
	c.headers(id, h2.Path, false, extra...)
	b, _ := proto.Marshal(req)
	if err := c.fr.WriteData(id, true, grpcMsg(b)); err != nil {
		c.t.Fatal(err)
	}
}

func headerValue(f *http2.MetaHeadersFrame, name string) string {
	for _, hf := range f.Fields {
		if hf.Name == name {
			return hf.Value
		}
	}
	return ""
}

// selfSigned returns a TLS server config and a client pool trusting it.
func selfSigned(t testing.TB) (*tls.Config, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12}, pool
}

// outcome reads frames until stream id ends and sums up its :status,
// grpc-status, grpc-message and DATA.
func (c *rawClient) outcome(id uint32, timeout time.Duration) string {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(timeout))
	defer c.nc.SetReadDeadline(time.Time{})
	var parts []string
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return strings.Join(append(parts, "err: "+err.Error()), " ")
		}
		if f.Header().StreamID != id {
			continue
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			for _, hf := range f.Fields {
				if hf.Name == ":status" || hf.Name == "grpc-status" || (hf.Name == "grpc-message" && hf.Value != "") {
					parts = append(parts, hf.Name+"="+hf.Value)
				}
			}
			if f.StreamEnded() {
				return strings.Join(parts, " ")
			}
		case *http2.DataFrame:
			parts = append(parts, fmt.Sprintf("data(%d)", len(f.Data())))
			if f.StreamEnded() {
				return strings.Join(parts, " ")
			}
		case *http2.RSTStreamFrame:
			return strings.Join(append(parts, "RST "+f.ErrCode.String()), " ")
		}
	}
}
