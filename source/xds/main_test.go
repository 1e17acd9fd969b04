package xds

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		testutil.RemoveBuilds()
		os.Exit(code)
	}))
}
