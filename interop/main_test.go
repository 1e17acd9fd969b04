package interop

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// binEnv names the variable that points the suite at another build of the
// daemon (an older commit's, say) instead of this tree's.
const binEnv = "SHARELIMIT_INTEROP_BIN"

// daemonBinary is the daemon under test: $SHARELIMIT_INTEROP_BIN when set,
// else this tree's, built once for the package without the race detector
// (the daemon is the system under test, not the test).
func daemonBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv(binEnv); bin != "" {
		return bin
	}
	return testutil.Build(t, "github.com/sharelimit/sharelimit/cmd/sharelimit")
}

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.RemoveBuilds()
	os.Exit(code)
}

// pythonBin is Debian's python3, which has python3-grpcio (gRPC C-core). A
// python3 earlier on PATH (pyenv, a virtualenv) is not asked.
const pythonBin = "/usr/bin/python3"

// The clients, each checked once, by what a test runs.
const (
	cCore  = "c-core"  // /usr/bin/python3 with grpc (python3-grpcio)
	grpcJS = "grpc-js" // node, with @grpc/grpc-js under interop/node_modules
	h2load = "h2load"  // nghttp2-client
	nghttp = "nghttp"  // nghttp2-client
	curl   = "curl"    // with HTTP/2
)

var toolChecks sync.Map // name -> *toolCheck

type toolCheck struct {
	once sync.Once
	err  error
}

// need fails t unless every named client is installed. A missing client is
// a failure, not a skip: the suite is the evidence that the daemon works with
// them, and a skipped run is no evidence.
func need(t *testing.T, names ...string) {
	t.Helper()
	for _, name := range names {
		v, _ := toolChecks.LoadOrStore(name, &toolCheck{})
		c := v.(*toolCheck)
		c.once.Do(func() { c.err = checkTool(name) })
		if c.err != nil {
			t.Fatalf("interop client %s is missing: %v\nrun `make deps` (as root) to install the interop clients", name, c.err)
		}
	}
}

func checkTool(name string) error {
	switch name {
	case cCore:
		out, err := exec.Command(pythonBin, "-c", "import grpc; print(grpc.__version__)").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s cannot import grpc (Debian package python3-grpcio): %v: %s", pythonBin, err, strings.TrimSpace(string(out)))
		}
	case grpcJS:
		if _, err := exec.LookPath("node"); err != nil {
			return fmt.Errorf("node (Debian package nodejs): %w", err)
		}
		if _, err := os.Stat("node_modules/@grpc/grpc-js/package.json"); err != nil {
			return fmt.Errorf("@grpc/grpc-js is not installed under interop/node_modules (npm ci): %w", err)
		}
	case h2load, nghttp:
		if _, err := exec.LookPath(name); err != nil {
			return fmt.Errorf("%s (Debian package nghttp2-client): %w", name, err)
		}
	case curl:
		out, err := exec.Command("curl", "--version").Output()
		if err != nil {
			return fmt.Errorf("curl: %w", err)
		}
		if !strings.Contains(string(out), "HTTP2") {
			return fmt.Errorf("curl has no HTTP/2 support:\n%s", out)
		}
	default:
		return fmt.Errorf("unknown client %q", name)
	}
	return nil
}
