package chart

import "testing"

func TestNiceStep(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		span float64
		n    int
		want float64
	}{
		{9.8, 10, 1}, {660, 6, 200}, {1100, 6, 200}, {45, 6, 10}, {4.5, 10, 0.5}, {0, 5, 1},
	} {
		if got := niceStep(tc.span, tc.n); got != tc.want {
			t.Errorf("niceStep(%v, %d) = %v, want %v", tc.span, tc.n, got, tc.want)
		}
	}
}
