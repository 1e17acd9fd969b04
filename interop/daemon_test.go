package interop

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// transports are the values of --grpc-transport; every scenario runs on each.
var transports = []string{"direct", "grpc-go"}

// config is the daemon's one descriptor file. Limits are per day (or
// unlimited) wherever a test reads limit_remaining, so that no token comes
// back during a test and every figure is exact.
var config = `domain: interop
descriptors:
  # a bucket per value, 10 a day
  - key: user
    rate_limit: {unit: day, requests_per_unit: 10}
  # a limit of 0 blocks every value
  - key: blocked
    rate_limit: {unit: day, requests_per_unit: 0}
  - key: open
    rate_limit: {unlimited: true}
  # one token a second, and a call that finds none is held until one exists
  # (up to 10 s): a call the daemon keeps in flight for a second or so
  - key: held
    rate_limit: {unit: second, requests_per_unit: 1, policy: wait, max_wait: 10s}
  # one token a minute, and a call that finds none is held for a minute or
  # more: a call in flight until the client cancels it or its deadline comes,
  # however slow the machine
  - key: stuck
    rate_limit: {unit: minute, requests_per_unit: 1, policy: wait, max_wait: 10m}
  # a long rule name makes every status carry it: large answers
  - key: wide
    rate_limit: {name: ` + wideName + `, unit: day, requests_per_unit: 1000000}
`

// wideName is the wide rule's name, 200 bytes.
var wideName = strings.Repeat("w", 200)

// daemon is one sharelimit serve process.
type daemon struct {
	t         *testing.T
	transport string
	grpcAddr  string
	httpAddr  string
	bin       string
	args      []string // the whole serve command line, to restart it
	log       string
	cmd       *exec.Cmd
	done      chan struct{} // closed when the process has exited
	err       error         // cmd.Wait's result, set before done closes
	tls       *tlsFiles
}

type daemonOpt func(*daemon)

// withTLS serves gRPC over TLS with a fresh self-signed certificate.
func withTLS() daemonOpt {
	return func(d *daemon) {
		d.tls = newTLSFiles(d.t)
		d.args = append(d.args, "--grpc-tls-cert", d.tls.cert, "--grpc-tls-key", d.tls.key)
	}
}

// withArgs adds serve flags.
func withArgs(args ...string) daemonOpt {
	return func(d *daemon) { d.args = append(d.args, args...) }
}

// startDaemon runs sharelimit on transport, on fresh loopback ports, and
// waits until it answers. The process is stopped when t ends.
func startDaemon(t *testing.T, transport string, opts ...daemonOpt) *daemon {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "interop.yaml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, transport: transport, log: filepath.Join(dir, "sharelimit.log")}
	d.args = []string{"serve",
		"--config-dir", dir,
		"--grpc-transport", transport,
		"--replicas", "1",
		"--drain", "0s",
		"--shutdown-timeout", "5s",
		"--join-ramp", "0",
	}
	for _, o := range opts {
		o(d)
	}
	d.bin = daemonBinary(t)
	var errs []string
	for range 3 {
		d.grpcAddr, d.httpAddr = testutil.FreeAddr(t), testutil.FreeAddr(t)
		err := d.launch()
		if err == nil {
			t.Cleanup(d.kill)
			return d
		}
		errs = append(errs, err.Error()) // most likely a port taken in the meantime
	}
	t.Fatalf("start sharelimit (%s): %s", transport, strings.Join(errs, "\n"))
	return nil
}

func (d *daemon) launch() error {
	logf, err := os.OpenFile(d.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own descriptor
	args := append(append([]string(nil), d.args...), "--grpc-addr", d.grpcAddr, "--http-addr", d.httpAddr)
	cmd := exec.Command(d.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = daemonEnv()
	configureProcess(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run %s: %w", d.bin, err)
	}
	d.cmd, d.done, d.err = cmd, make(chan struct{}), nil
	done := d.done
	go func() {
		d.err = cmd.Wait()
		close(done)
	}()
	// Ready: the admin listener says healthy, and the gRPC port accepts.
	err = testutil.Poll(30*time.Second, func() error {
		if d.exited() {
			return nil // said below
		}
		if !d.healthy() {
			return errors.New("/healthcheck not OK")
		}
		c, err := net.DialTimeout("tcp", d.grpcAddr, time.Second)
		if err != nil {
			return err
		}
		c.Close()
		return nil
	})
	switch {
	case d.exited():
		return fmt.Errorf("sharelimit exited during start-up (%v):\n%s", d.err, d.tail())
	case err != nil:
		d.kill()
		return fmt.Errorf("sharelimit not ready: %w\n%s", err, d.tail())
	}
	return nil
}

func (d *daemon) healthy() bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + d.httpAddr + "/healthcheck")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// kill ends the process if it still runs.
func (d *daemon) kill() {
	if d.cmd == nil {
		return
	}
	if !d.exited() {
		_ = d.cmd.Process.Kill()
	}
	<-d.done
}

// stop sends SIGTERM and waits for the process to exit; it returns the exit
// error (nil for status 0).
func (d *daemon) stop(timeout time.Duration) error {
	d.t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		d.t.Fatalf("SIGTERM sharelimit: %v", err)
	}
	select {
	case <-d.done:
		return d.err
	case <-time.After(timeout):
		d.t.Fatalf("sharelimit (%s) still running %s after SIGTERM:\n%s", d.transport, timeout, d.tail())
		return nil
	}
}

// restart runs the daemon again on the same ports, as an Envoy bootstrap
// names a fixed address. The previous process must have exited.
func (d *daemon) restart() {
	d.t.Helper()
	if !d.exited() {
		d.t.Fatal("restart: the previous process still runs")
	}
	if err := d.launch(); err != nil {
		d.t.Fatalf("restart sharelimit on %s: %v", d.grpcAddr, err)
	}
}

// url is the ShouldRateLimit URL for a raw HTTP/2 client.
func (d *daemon) url() string { return "http://" + d.grpcAddr + rlsPath }

// decided is how many ShouldRateLimit requests the daemon has decided (its
// request-duration histogram counts every decision).
func (d *daemon) decided() int {
	d.t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + d.httpAddr + "/metrics")
	if err != nil {
		d.t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "sharelimit_request_duration_seconds_count "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				d.t.Fatalf("metrics: %q: %v", sc.Text(), err)
			}
			return int(n)
		}
	}
	d.t.Fatalf("metrics: no sharelimit_request_duration_seconds_count (%v)", sc.Err())
	return 0
}

// tail is the end of the daemon's log, for failure messages.
func (d *daemon) tail() string {
	b, err := os.ReadFile(d.log)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > 4000 {
		return "…" + string(b[len(b)-4000:])
	}
	return string(b)
}

// daemonEnv is the test's environment without SHARELIMIT_*, CONSUL_* and
// RUNTIME_* variables (which set serve's flags) and without GRPC_* ones.
func daemonEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		switch {
		case strings.HasPrefix(kv, "SHARELIMIT_"), strings.HasPrefix(kv, "CONSUL_"),
			strings.HasPrefix(kv, "RUNTIME_"), strings.HasPrefix(kv, "GRPC_"):
		default:
			env = append(env, kv)
		}
	}
	return env
}

// forEachTransport runs f in a subtest per transport, each with its own
// daemon started with opts.
func forEachTransport(t *testing.T, f func(t *testing.T, d *daemon), opts ...daemonOpt) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) { f(t, startDaemon(t, tr, opts...)) })
	}
}

// tlsFiles is a self-signed certificate for localhost and 127.0.0.1, which
// is also the clients' CA.
type tlsFiles struct{ cert, key string }

func newTLSFiles(t *testing.T) *tlsFiles {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "localhost"},
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	f := &tlsFiles{cert: filepath.Join(dir, "cert.pem"), key: filepath.Join(dir, "key.pem")}
	if err := os.WriteFile(f.cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}
