package loadgen

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestBucketBounds(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	values := []uint64{0, 1, 255, 256, 257, 511, 512, 513, 1 << 20, 1<<20 - 1, math.MaxInt64, math.MaxUint64}
	for range 10000 {
		values = append(values, rng.Uint64()>>rng.IntN(64))
	}
	for _, v := range values {
		i := bucketIndex(v)
		low, width := bucketBounds(i)
		if v < low || v-low >= width {
			t.Fatalf("value %d: bucket %d is [%d, %d+%d)", v, i, low, low, width)
		}
		if i >= subCount && float64(width)/float64(low) > 1.0/halfCount {
			t.Fatalf("value %d: bucket %d is %d wide at %d, wider than 1/%d", v, i, width, low, halfCount)
		}
	}
	for i := 1; i < bucketIndex(math.MaxUint64); i++ {
		prevLow, prevWidth := bucketBounds(i - 1)
		low, _ := bucketBounds(i)
		if prevLow+prevWidth != low {
			t.Fatalf("bucket %d starts at %d, but bucket %d ends at %d", i, low, i-1, prevLow+prevWidth)
		}
	}
}

// exactQuantile is the order statistic Histogram.Quantile approximates.
func exactQuantile(sorted []time.Duration, q float64) time.Duration {
	rank := int(math.Ceil(q * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

func TestHistogramQuantiles(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	gen := func(n int, f func(i int) time.Duration) []time.Duration {
		v := make([]time.Duration, n)
		for i := range v {
			v[i] = f(i)
		}
		return v
	}
	tests := []struct {
		name   string
		values []time.Duration
	}{
		{"single", []time.Duration{42 * time.Microsecond}},
		{"small exact values", gen(1000, func(i int) time.Duration { return time.Duration(i % 200) })},
		{"uniform 1ns..100µs", gen(100000, func(i int) time.Duration { return time.Duration(i + 1) })},
		{"exponential mean 200µs", gen(50000, func(int) time.Duration {
			return time.Duration(rng.ExpFloat64() * float64(200*time.Microsecond))
		})},
		{"bimodal with 10s tail", gen(20000, func(i int) time.Duration {
			if i%100 == 0 {
				return 10*time.Second + time.Duration(rng.IntN(1e9))
			}
			return 50*time.Microsecond + time.Duration(rng.IntN(20000))
		})},
		{"constant", gen(777, func(int) time.Duration { return 123456 * time.Nanosecond })},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var h Histogram
			for _, v := range tc.values {
				h.Record(v)
			}
			sorted := slices.Clone(tc.values)
			slices.Sort(sorted)
			if h.Count() != uint64(len(sorted)) {
				t.Fatalf("Count = %d, want %d", h.Count(), len(sorted))
			}
			if h.Min() != sorted[0] || h.Max() != sorted[len(sorted)-1] {
				t.Fatalf("Min, Max = %v, %v, want %v, %v exactly", h.Min(), h.Max(), sorted[0], sorted[len(sorted)-1])
			}
			for _, q := range []float64{0, 0.01, 0.5, 0.9, 0.99, 0.999, 0.9999, 1} {
				want := exactQuantile(sorted, q)
				got := h.Quantile(q)
				if diff := math.Abs(float64(got - want)); diff > HistogramRelativeError*float64(want) {
					t.Errorf("Quantile(%v) = %v, want %v within %.2f%%", q, got, want, 100*HistogramRelativeError)
				}
			}
			if h.Quantile(1) != h.Max() {
				t.Errorf("Quantile(1) = %v, want Max %v", h.Quantile(1), h.Max())
			}
			var sum float64
			for _, v := range tc.values {
				sum += float64(v)
			}
			if mean := sum / float64(len(tc.values)); math.Abs(float64(h.Mean())-mean) > 1 {
				t.Errorf("Mean = %v, want %v", h.Mean(), time.Duration(mean))
			}
		})
	}
}

func TestHistogramMerge(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	var all Histogram
	parts := make([]Histogram, 4)
	for i := range 30000 {
		// Each part gets a different range, so merging must grow the receiver.
		p := i % len(parts)
		v := time.Duration(rng.IntN(1000*(p+1)*(p+1)*(p+1))) * time.Microsecond
		all.Record(v)
		parts[p].Record(v)
	}
	var merged Histogram
	merged.Merge(&Histogram{}) // merging an empty histogram changes nothing
	for i := range parts {
		merged.Merge(&parts[i])
	}
	if merged.Count() != all.Count() || merged.Min() != all.Min() || merged.Max() != all.Max() || merged.Mean() != all.Mean() {
		t.Fatalf("merged count/min/max/mean = %d/%v/%v/%v, want %d/%v/%v/%v",
			merged.Count(), merged.Min(), merged.Max(), merged.Mean(), all.Count(), all.Min(), all.Max(), all.Mean())
	}
	for _, q := range []float64{0.1, 0.5, 0.9, 0.99, 0.999} {
		if merged.Quantile(q) != all.Quantile(q) {
			t.Errorf("Quantile(%v): merged %v, recorded together %v", q, merged.Quantile(q), all.Quantile(q))
		}
	}
}

func TestHistogramEmptyNegativeReset(t *testing.T) {
	t.Parallel()
	var h Histogram
	if h.Quantile(0.5) != 0 || h.Max() != 0 || h.Min() != 0 || h.Mean() != 0 || h.Count() != 0 {
		t.Fatal("empty histogram reports non-zero figures")
	}
	h.Record(-5 * time.Second)
	if h.Max() != 0 || h.Count() != 1 {
		t.Fatalf("negative value: Max = %v, Count = %d; want 0, 1", h.Max(), h.Count())
	}
	h.Record(time.Millisecond)
	h.Reset()
	if h.Count() != 0 || h.Quantile(0.99) != 0 {
		t.Fatal("Reset left values behind")
	}
	h.Record(3 * time.Millisecond)
	if h.Min() != 3*time.Millisecond {
		t.Fatalf("after Reset, Min = %v, want 3ms", h.Min())
	}
}

func BenchmarkHistogramRecord(b *testing.B) {
	b.ReportAllocs()
	var h Histogram
	for i := range b.N {
		h.Record(time.Duration(20000 + i%200000))
	}
	if h.Count() != uint64(b.N) {
		b.Fatalf("recorded %d of %d", h.Count(), b.N)
	}
}
