package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// binEnv names the variable that points the tests at another daemon binary:
// $SHARELIMIT_E2E_BIN, when set, is the daemon instead of this tree's
// (another build, say an older commit's, to see a scenario fail on it); it
// must serve /rlconfig/admitted.
const binEnv = "SHARELIMIT_E2E_BIN"

// sharelimitBin is the daemon under test, built once for the package without
// the race detector: the daemons are the system under test, not the test.
func sharelimitBin(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv(binEnv); bin != "" {
		abs, err := filepath.Abs(bin)
		if err != nil {
			t.Fatalf("$%s: %v", binEnv, err)
		}
		return abs
	}
	return testutil.Build(t, "github.com/sharelimit/sharelimit/cmd/sharelimit")
}

// xdsserverBin is the test-only xDS management server (internal/xdstest),
// run as a process of its own beside the daemon.
func xdsserverBin(t testing.TB) string {
	t.Helper()
	return testutil.Build(t, "github.com/sharelimit/sharelimit/internal/xdstest/cmd/xdsserver")
}

func TestMain(m *testing.M) {
	if bin := os.Getenv(binEnv); bin != "" {
		fmt.Fprintf(os.Stderr, "e2e: the daemon under test is $%s=%s\n", binEnv, bin)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		testutil.RemoveBuilds()
		os.Exit(code)
	}))
}
