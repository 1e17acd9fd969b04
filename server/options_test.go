package server

import (
	"runtime"
	"testing"
)

// TestStreamWorkersFollowGOMAXPROCS: the worker pool was once fixed at the core
// count of the machine it was tuned on. Not parallel: it changes GOMAXPROCS.
func TestStreamWorkersFollowGOMAXPROCS(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, n := range []int{1, 3, 16} {
		runtime.GOMAXPROCS(n)
		if got := streamWorkers(); got != uint32(n) {
			t.Errorf("GOMAXPROCS %d: %d stream workers, want %d", n, got, n)
		}
	}
}
