package server

import (
	"runtime"
	"testing"
)

func TestGCPercentFollowsTheLiveHeap(t *testing.T) {
	cases := []struct {
		live uint64
		want int
	}{
		{0, 400},
		{5 << 20, 400},   // a small heap: collect rarely
		{16 << 20, 400},  // 64 MiB of headroom is exactly 4x
		{32 << 20, 200},  // half the headroom factor
		{64 << 20, 100},  // Go's default from here on
		{200 << 20, 100}, // never below the default: memory stays ~2x live
	}
	for _, tc := range cases {
		if got := gcPercentFor(tc.live); got != tc.want {
			t.Errorf("live %d MiB: GOGC %d, want %d", tc.live>>20, got, tc.want)
		}
	}
}

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
