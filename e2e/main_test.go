package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

// sharelimitBin is the daemon under test, built once by TestMain without the
// race detector: the daemons are the system under test, not the test.
// xdsserverBin is the test-only xDS management server (internal/xdstest),
// run as a process of its own beside the daemon.
var sharelimitBin, xdsserverBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sharelimit-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: temp dir:", err)
		os.Exit(1)
	}
	sharelimitBin = filepath.Join(dir, "sharelimit")
	xdsserverBin = filepath.Join(dir, "xdsserver")
	for bin, pkg := range map[string]string{
		sharelimitBin: "github.com/sharelimit/sharelimit/cmd/sharelimit",
		xdsserverBin:  "github.com/sharelimit/sharelimit/internal/xdstest/cmd/xdsserver",
	} {
		build := exec.Command("go", "build", "-o", bin, pkg)
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: build %s: %v\n%s", pkg, err, out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		os.RemoveAll(dir)
		os.Exit(code)
	}))
}
