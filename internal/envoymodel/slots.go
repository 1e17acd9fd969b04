package envoymodel

import "time"

// SlotWidth is the width of the slots in which a model counts what it
// admitted: a one-second window is ten consecutive slots.
const SlotWidth = 100 * time.Millisecond

// maxSlots bounds the history a model keeps: an hour of slots; older ones are
// dropped.
const maxSlots = int(time.Hour / SlotWidth)

// Slots is a run of admission counts: Counts[i] is what was admitted in slot
// First+i, the slot covering [(First+i)·SlotWidth, (First+i+1)·SlotWidth) on
// the model's clock. Models that share a clock have aligned slots, so Add
// sums several of them into the cluster's admissions.
type Slots struct {
	First  int64
	Counts []uint64
}

// Add returns the slot-by-slot sum of s and o.
func (s Slots) Add(o Slots) Slots {
	switch {
	case len(o.Counts) == 0:
		return s.clone()
	case len(s.Counts) == 0:
		return o.clone()
	}
	first := min(s.First, o.First)
	last := max(s.First+int64(len(s.Counts)), o.First+int64(len(o.Counts)))
	sum := Slots{First: first, Counts: make([]uint64, last-first)}
	for _, x := range []Slots{s, o} {
		for i, c := range x.Counts {
			sum.Counts[x.First-first+int64(i)] += c
		}
	}
	return sum
}

// Window returns the slots from first up to but not including end, those
// outside s counting 0.
func (s Slots) Window(first, end int64) Slots {
	w := Slots{First: first, Counts: make([]uint64, max(end-first, 0))}
	for i := range w.Counts {
		if j := first + int64(i) - s.First; j >= 0 && j < int64(len(s.Counts)) {
			w.Counts[i] = s.Counts[j]
		}
	}
	return w
}

func (s Slots) clone() Slots {
	return Slots{First: s.First, Counts: append([]uint64(nil), s.Counts...)}
}

// Mean is what s admitted a second on average over its whole run; 0 for an
// empty one.
func (s Slots) Mean() float64 {
	if len(s.Counts) == 0 {
		return 0
	}
	var sum uint64
	for _, c := range s.Counts {
		sum += c
	}
	return float64(sum) / (float64(len(s.Counts)) * SlotWidth.Seconds())
}

// MaxWindow is the most admitted in any n consecutive slots (n = 10: any
// one-second window aligned to slots), with the first slot index of that
// window. A run shorter than n is one window.
func (s Slots) MaxWindow(n int) (most uint64, at int64) {
	var sum uint64
	at = s.First
	for i, c := range s.Counts {
		sum += c
		if i >= n {
			sum -= s.Counts[i-n]
		}
		if sum > most {
			most, at = sum, s.First+int64(max(i-n+1, 0))
		}
	}
	return most, at
}

// slotCounter counts admissions by slot. It is not safe for concurrent use;
// the model holds its lock.
type slotCounter struct {
	first  int64
	counts []uint64
}

func (c *slotCounter) add(now int64) {
	slot := now / int64(SlotWidth)
	if len(c.counts) == 0 {
		c.first = slot
	}
	idx := int(max(slot-c.first, 0))
	if idx >= maxSlots {
		drop := idx - maxSlots + 1
		if drop >= len(c.counts) {
			c.counts, c.first = c.counts[:0], slot
		} else {
			c.counts, c.first = c.counts[drop:], c.first+int64(drop)
		}
		idx = int(slot - c.first)
	}
	for len(c.counts) <= idx {
		c.counts = append(c.counts, 0)
	}
	c.counts[idx]++
}

func (c *slotCounter) snapshot() Slots {
	return Slots{First: c.first, Counts: append([]uint64(nil), c.counts...)}
}
