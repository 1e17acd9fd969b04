package server

import (
	"runtime"
	"testing"
)

// TestStreamWorkersCoverRequestsInFlight: the pool covers a busy node's
// requests in flight (a new goroutine per stream past it costs its stack
// growth), and never falls below a worker per P. Not parallel: it changes
// GOMAXPROCS.
func TestStreamWorkersCoverRequestsInFlight(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, tc := range []struct{ procs, want int }{{1, 256}, {16, 256}, {512, 512}} {
		runtime.GOMAXPROCS(tc.procs)
		if got := streamWorkers(); got != uint32(tc.want) {
			t.Errorf("GOMAXPROCS %d: %d stream workers, want %d", tc.procs, got, tc.want)
		}
	}
}
