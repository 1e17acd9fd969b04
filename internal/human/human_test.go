package human

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// TestGoldenRates writes every case as "input -> output" to a golden file, so
// a change of format shows as a diff a reviewer reads (-update rewrites it).
func TestGoldenRates(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	perUnit := []float64{0, 0.0001, 0.001, 0.05, 0.5, 1, 1.666666, 5, 9.996, 16.6667, 99.95, 100, 999.4, 999.5, 1000, 1234.5, 50000, 4294967295}
	for _, unit := range []string{"second", "minute", "hour", "day", "week", "month", "year", "DAY", "fortnight"} {
		secs := units[unitIndex(unit)].secs
		for _, v := range perUnit {
			fmt.Fprintf(&b, "Rate(%g per %s) = %s\n", v, unit, Rate(v/secs, unit))
		}
	}
	// The figures: 5 a day over 1 and 3 replicas, 100 a day over 3.
	for _, c := range []struct {
		perSecond float64
		unit      string
	}{
		{5.78704e-05, "day"}, {0.000385802, "day"}, {16.6667, "second"}, {1e-9, "second"}, {1e-12, "second"},
		{0.000001, "minute"}, {4294967295, "second"}, {math.NaN(), "second"}, {math.Inf(1), "second"}, {-1, "hour"},
	} {
		fmt.Fprintf(&b, "Rate(%g/s in %s) = %s\n", c.perSecond, c.unit, Rate(c.perSecond, c.unit))
	}
	testutil.Golden(t, "testdata/rates.golden", b.String())
}

func TestGoldenNumbers(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	for _, v := range []float64{0, 0.0004, 0.001, 0.00123456, 0.0166666, 0.1, 0.99999, 1, 1.005, 9.9999, 12.345, 123.45, 999.49, 999.5, 12345.6, 1e15, math.NaN(), -3} {
		fmt.Fprintf(&b, "Number(%g) = %s\n", v, Number(v))
	}
	for _, n := range []uint64{0, 7, 999, 1000, 1234567, math.MaxUint64} {
		fmt.Fprintf(&b, "Count(%d) = %s\n", n, Count(n))
	}
	for _, w := range []float64{0, 1, 1.0 / 3, 0.25, 5.78704e-07, 0.00001, -1} {
		fmt.Fprintf(&b, "Share(%g) = %s\n", w, Share(w))
	}
	testutil.Golden(t, "testdata/numbers.golden", b.String())
}

func TestGoldenAges(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 4, 3, 0, 0, 0, time.UTC)
	var b strings.Builder
	for _, d := range []time.Duration{-time.Second, 0, 400 * time.Millisecond, time.Second, 3 * time.Second, 9500 * time.Millisecond,
		10 * time.Second, 59 * time.Second, time.Minute, 125 * time.Second, time.Hour, 200 * time.Minute, 47 * time.Hour, 98 * time.Hour, 400 * 24 * time.Hour} {
		fmt.Fprintf(&b, "Ago(now-%v) = %s\n", d, Ago(now.Add(-d), now))
		fmt.Fprintf(&b, "Duration(%v) = %s\n", d, Duration(d))
	}
	fmt.Fprintf(&b, "Ago(zero) = %s\n", Ago(time.Time{}, now))
	fmt.Fprintf(&b, "AgoSeconds(3.2) = %s\n", AgoSeconds(3.2, false))
	fmt.Fprintf(&b, "AgoSeconds(0, never) = %s\n", AgoSeconds(0, true))
	testutil.Golden(t, "testdata/ages.golden", b.String())
}

// Every figure Number writes parses back to within half a unit of its last
// digit: three significant digits are kept, never more lost.
func TestNumberKeepsThreeDigits(t *testing.T) {
	t.Parallel()
	for v := 0.001; v < 1e6; v *= 1.0137 {
		s := strings.ReplaceAll(Number(v), ",", "")
		var got float64
		if _, err := fmt.Sscan(s, &got); err != nil {
			t.Fatalf("Number(%g) = %q: %v", v, s, err)
		}
		if rel := math.Abs(got-v) / v; rel > 0.005 {
			t.Fatalf("Number(%g) = %q: off by %.3f%%", v, s, rel*100)
		}
	}
}
