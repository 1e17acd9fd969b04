package testutil

import (
	"testing"
	"time"
)

// Within waits for ch, failing the test after a deadline far longer than any
// healthy run needs: it catches hangs, it does not measure speed.
func Within[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}
