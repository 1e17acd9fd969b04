package consultest

import (
	"fmt"
	"testing"
	"time"
)

// waitFor polls cond for up to 10 s; the catalog is eventually consistent
// with writes only by a few milliseconds, but a loaded machine is slow.
func waitFor(t *testing.T, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", fmt.Sprintf(format, args...))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
