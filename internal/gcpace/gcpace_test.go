package gcpace

import "testing"

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
