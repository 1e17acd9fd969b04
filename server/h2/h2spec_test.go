package h2_test

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/sharelimit/sharelimit/server"
)

// h2specVersion is the HTTP/2 conformance suite the transport is held to.
const h2specVersion = "v2.2.1+incompatible"

// h2spec returns the suite's binary, built once from the Go module proxy
// into the same cache as the tests' Consul agent.
func h2spec(t *testing.T) string {
	t.Helper()
	cache := os.Getenv("SHARELIMIT_CACHE")
	if cache == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			t.Fatal(err)
		}
		cache = filepath.Join(dir, "sharelimit")
	}
	bin := filepath.Join(cache, "h2spec-"+h2specVersion, "h2spec")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	cmd := exec.Command("go", "install", "github.com/summerwind/h2spec/cmd/h2spec@"+h2specVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+filepath.Dir(bin), "GOFLAGS=", "GOTOOLCHAIN=local")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go install h2spec: %v\n%s", err, out)
	}
	return bin
}

// TestH2Spec runs every case of h2spec, the HTTP/2 conformance suite, against
// the direct transport: frames, streams, flow control, HPACK and the HTTP
// rules for requests. Requests that are not gRPC get 405 or 415 with a body,
// which is what the suite needs to test flow control on.
func TestH2Spec(t *testing.T) {
	d := start(t, true, server.Options{})
	host, port, err := net.SplitHostPort(d.addr)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(h2spec(t), "-h", host, "-p", port, "-o", "2").CombinedOutput()
	m := regexp.MustCompile(`(\d+) tests, (\d+) passed, (\d+) skipped, (\d+) failed`).FindSubmatch(out)
	if err != nil || m == nil || string(m[4]) != "0" || string(m[3]) != "0" || string(m[1]) != string(m[2]) {
		t.Fatalf("h2spec: %v\n%s", err, out)
	}
	t.Logf("h2spec: %s", m[0])
}
