package loadgen

import (
	"math"
	"math/bits"
	"time"
)

// The histogram is log-linear, in the manner of HdrHistogram: values below
// 2^subBits nanoseconds each get a bucket of their own, and every power of two
// above that is split into halfCount equal buckets. A bucket is then never wider
// than 1/halfCount of its lower bound, and reporting its midpoint is off by at most
// half of that.
const (
	subBits   = 8
	subCount  = 1 << subBits
	halfCount = subCount / 2
)

// HistogramRelativeError bounds how far a Quantile can be from the exact order
// statistic of the recorded values, as a fraction of that value.
const HistogramRelativeError = 1.0 / (2 * halfCount)

// Histogram records durations with bounded relative error, HdrHistogram style.
// Min, Max, Count and Mean are exact.
//
// The zero value is an empty histogram ready for use. It grows only as far as the
// largest value recorded, so a worker's histogram of sub-millisecond latencies stays
// around 15 KiB. A Histogram is not safe for concurrent use: give each goroutine its
// own and Merge them afterwards.
type Histogram struct {
	counts []uint64
	n      uint64
	min    int64
	max    int64
	sum    float64
}

// bucketIndex maps a value to its bucket.
func bucketIndex(v uint64) int {
	if v < subCount {
		return int(v)
	}
	shift := bits.Len64(v) - subBits // >= 1; v>>shift is in [halfCount, subCount)
	return subCount + (shift-1)*halfCount + int(v>>shift) - halfCount
}

// bucketBounds returns the lowest value of bucket i and its width.
func bucketBounds(i int) (low, width uint64) {
	if i < subCount {
		return uint64(i), 1
	}
	j := i - subCount
	shift := uint(j/halfCount + 1)
	return uint64(j%halfCount+halfCount) << shift, 1 << shift
}

// Record adds one value. Negative durations count as zero.
func (h *Histogram) Record(d time.Duration) {
	v := int64(d)
	if v < 0 {
		v = 0
	}
	i := bucketIndex(uint64(v))
	if i >= len(h.counts) {
		h.grow(i)
	}
	h.counts[i]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.n++
	h.sum += float64(v)
}

// grow makes bucket i addressable, with headroom so that a slowly rising tail does
// not reallocate on every new bucket.
func (h *Histogram) grow(i int) {
	n := i + 1 + halfCount
	c := make([]uint64, n)
	copy(c, h.counts)
	h.counts = c
}

// Merge adds every value recorded in o to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	if len(o.counts) > len(h.counts) {
		h.grow(len(o.counts) - 1)
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.n += o.n
	h.sum += o.sum
}

// Reset empties the histogram and keeps its memory.
func (h *Histogram) Reset() {
	clear(h.counts)
	h.n, h.min, h.max, h.sum = 0, 0, 0, 0
}

// Count returns how many values were recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Min returns the smallest value recorded, or 0 when empty.
func (h *Histogram) Min() time.Duration { return time.Duration(h.min) }

// Max returns the largest value recorded, or 0 when empty.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Mean returns the arithmetic mean, or 0 when empty.
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// Quantile returns the value at quantile q in [0, 1]: the midpoint of the bucket
// holding the ceil(q·Count)-th smallest value, kept within [Min, Max]. Quantile(1)
// is exactly Max. An empty histogram returns 0.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	if q >= 1 || math.IsNaN(q) {
		return time.Duration(h.max)
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	if rank < 1 {
		rank = 1
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen < rank {
			continue
		}
		low, width := bucketBounds(i)
		v := int64(low + (width-1)/2)
		return time.Duration(min(max(v, h.min), h.max))
	}
	return time.Duration(h.max) // not reached: the counts add up to n
}
