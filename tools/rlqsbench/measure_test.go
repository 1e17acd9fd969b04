package main

import (
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/internal/envoymodel"
)

// statLine is a /proc/PID/stat line with comm as field 2 and utime, stime
// as fields 14 and 15.
func statLine(comm, utime, stime string) []byte {
	return []byte("4242 (" + comm + ") S 1 4242 4242 0 -1 4194560 100 0 0 0 " + utime + " " + stime + " 0 0 20 0 9 0 12345 1000 200\n")
}

func TestParseStat(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		line []byte
		tick time.Duration
		want time.Duration
		err  error
	}{
		{"plain", statLine("sharelimit", "150", "25"), 10 * time.Millisecond, 1750 * time.Millisecond, nil},
		{"a name with spaces and parentheses", statLine("a) b (c", "3", "4"), 10 * time.Millisecond, 70 * time.Millisecond, nil},
		{"another tick", statLine("x", "1000", "0"), time.Millisecond, time.Second, nil},
		{"zero", statLine("x", "0", "0"), 10 * time.Millisecond, 0, nil},
		{"no name", []byte("4242 S 1 2 3"), 10 * time.Millisecond, 0, errStat},
		{"too few fields", []byte("4242 (x) S 1 2 3 4 5"), 10 * time.Millisecond, 0, errStat},
		{"utime not a number", statLine("x", "1e3", "0"), 10 * time.Millisecond, 0, errStat},
		{"stime negative", statLine("x", "1", "-1"), 10 * time.Millisecond, 0, errStat},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseStat(tc.line, tc.tick)
			if !errors.Is(err, tc.err) || got != tc.want {
				t.Fatalf("parseStat = %v, %v; want %v, %v", got, err, tc.want, tc.err)
			}
		})
	}
}

func TestAuxValue(t *testing.T) {
	t.Parallel()
	vec := func(pairs ...uint64) []byte {
		var b []byte
		for _, p := range pairs {
			b = binary.NativeEndian.AppendUint64(b, p)
		}
		return b
	}
	cases := []struct {
		name string
		b    []byte
		want uint64
	}{
		{"found", vec(6, 4096, 17, 100, 0, 0), 100},
		{"after the end marker", vec(6, 4096, 0, 0, 17, 100), 0},
		{"absent", vec(6, 4096, 0, 0), 0},
		{"truncated", vec(6, 4096, 17)[:20], 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := auxValue(tc.b, 17); got != tc.want {
				t.Fatalf("auxValue = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestSampleArithmetic(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name                       string
		s                          sample
		cpuPerSec, perSec, nsPerOK float64
	}{
		{"rls-like", sample{cpu: 8 * time.Second, elapsed: 20 * time.Second, offered: 2_300_000, admitted: 2_000_000}, 0.4, 115_000, 4000},
		{"rlqs-like", sample{cpu: 120 * time.Millisecond, elapsed: 20 * time.Second, offered: 2_300_000, admitted: 2_000_000}, 0.006, 115_000, 60},
		{"nothing admitted", sample{cpu: 50 * time.Millisecond, elapsed: 10 * time.Second}, 0.005, 0, math.NaN()},
		{"empty window", sample{cpu: time.Second, offered: 5, admitted: 5}, 0, 0, 2e8},
	}
	near := func(a, b float64) bool { return a == b || math.Abs(a-b) <= 1e-9*math.Abs(b) || (a != a && b != b) }
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.s.cpuPerSecond(); !near(got, tc.cpuPerSec) {
				t.Errorf("cpuPerSecond = %v, want %v", got, tc.cpuPerSec)
			}
			if got := tc.s.perSecond(float64(tc.s.offered)); !near(got, tc.perSec) {
				t.Errorf("offered per second = %v, want %v", got, tc.perSec)
			}
			if got := tc.s.nsPerAdmitted(); !near(got, tc.nsPerOK) {
				t.Errorf("nsPerAdmitted = %v, want %v", got, tc.nsPerOK)
			}
		})
	}
}

func TestMedian(t *testing.T) {
	t.Parallel()
	cases := []struct {
		v    []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{4, 1}, 2.5},
		{[]float64{5, 1, 3}, 3},
		{[]float64{9, 1, 3, 5}, 4},
	}
	for _, tc := range cases {
		in := slices.Clone(tc.v)
		if got := median(tc.v); got != tc.want || !slices.Equal(in, tc.v) {
			t.Errorf("median(%v) = %v, want %v, input unchanged", in, got, tc.want)
		}
	}
	if got := median(nil); got == got {
		t.Errorf("median(nil) = %v, want NaN", got)
	}
}

func TestAccuracyOf(t *testing.T) {
	t.Parallel()
	ten := func(n uint64) []uint64 {
		c := make([]uint64, 10)
		for i := range c {
			c[i] = n
		}
		return c
	}
	cases := []struct {
		name     string
		s        envoymodel.Slots
		from, to int64
		busiest  uint64
		at       time.Duration
		mean     float64
	}{
		{"steady", envoymodel.Slots{First: 100, Counts: slices.Concat(ten(30), ten(30))}, 100, 120, 300, 0, 300},
		{"a burst inside", envoymodel.Slots{First: 100, Counts: slices.Concat(ten(30), []uint64{30, 90}, ten(30)[2:], ten(30))}, 100, 130, 360, 200 * time.Millisecond, 320},
		{"slots outside the window are not counted", envoymodel.Slots{First: 90, Counts: slices.Concat(ten(500), ten(20), ten(20))}, 100, 120, 200, 0, 200},
		{"a window past the slots counts zeros", envoymodel.Slots{First: 100, Counts: ten(30)}, 100, 120, 300, 0, 150},
		{"an empty window", envoymodel.Slots{First: 100, Counts: ten(30)}, 100, 100, 0, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := accuracyOf(tc.s, tc.from, tc.to, 300)
			if a.busiest != tc.busiest || a.at != tc.at || math.Abs(a.mean-tc.mean) > 1e-9 {
				t.Fatalf("accuracyOf = busiest %d at %s, mean %v; want %d at %s, mean %v", a.busiest, a.at, a.mean, tc.busiest, tc.at, tc.mean)
			}
			if got, want := a.meanPct(), 100*tc.mean/300; math.Abs(got-want) > 1e-9 {
				t.Fatalf("meanPct = %v, want %v", got, want)
			}
		})
	}
}

func TestSlots(t *testing.T) {
	t.Parallel()
	var c slots
	w := int64(envoymodel.SlotWidth)
	for _, at := range []int64{5*w + 1, 5 * w, 7*w + w - 1, 4 * w, 9 * w} {
		c.add(at)
	}
	got := c.snapshot()
	want := envoymodel.Slots{First: 5, Counts: []uint64{3, 0, 1, 0, 1}}
	if got.First != want.First || !slices.Equal(got.Counts, want.Counts) {
		t.Fatalf("slots = %+v, want %+v (a reading before the first slot counts in it)", got, want)
	}
}

func TestSkewed(t *testing.T) {
	t.Parallel()
	got := skewed(4, 300)
	want := []float64{480, 40, 40, 40}
	for i := range want {
		if math.Abs(got[i]-want[i]) > 1e-9 {
			t.Fatalf("skewed(4, 300) = %v, want %v", got, want)
		}
	}
}
