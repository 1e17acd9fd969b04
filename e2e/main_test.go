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
// run as a process of its own beside the daemon. $SHARELIMIT_E2E_BIN, when
// set, is the daemon instead (another build, say an older commit's, to see a
// scenario fail on it); it must serve /rlconfig/admitted.
var sharelimitBin, xdsserverBin string

// binEnv names the variable that points the tests at another daemon binary.
const binEnv = "SHARELIMIT_E2E_BIN"

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sharelimit-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: temp dir:", err)
		os.Exit(1)
	}
	sharelimitBin = filepath.Join(dir, "sharelimit")
	xdsserverBin = filepath.Join(dir, "xdsserver")
	builds := map[string]string{
		sharelimitBin: "github.com/sharelimit/sharelimit/cmd/sharelimit",
		xdsserverBin:  "github.com/sharelimit/sharelimit/internal/xdstest/cmd/xdsserver",
	}
	if bin := os.Getenv(binEnv); bin != "" {
		delete(builds, sharelimitBin)
		if sharelimitBin, err = filepath.Abs(bin); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: $%s: %v\n", binEnv, err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "e2e: the daemon under test is $%s=%s\n", binEnv, sharelimitBin)
	}
	for bin, pkg := range builds {
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
