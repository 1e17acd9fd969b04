package demand

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestHottest(t *testing.T) {
	yes := func(ids ...uint64) map[uint64]bool {
		m := map[uint64]bool{}
		for _, id := range ids {
			m[id] = true
		}
		return m
	}
	for _, tc := range []struct {
		name      string
		total     map[uint64]float64
		qualifies map[uint64]bool
		hot       map[uint64]bool
		k         int
		want      []uint64
	}{
		{"top k by demand, sorted by ID", map[uint64]float64{1: 10, 2: 30, 3: 20, 4: 5}, yes(1, 2, 3, 4), nil, 2, []uint64{2, 3}},
		{"only values that qualify", map[uint64]float64{1: 10, 2: 30, 3: 20}, yes(1, 3), nil, 2, []uint64{1, 3}},
		{"a hot value keeps its place against a little more", map[uint64]float64{1: 100, 2: 110}, yes(1, 2), yes(1), 1, []uint64{1}},
		{"but not against much more", map[uint64]float64{1: 100, 2: 130}, yes(1, 2), yes(1), 1, []uint64{2}},
		{"ties by the lower ID", map[uint64]float64{9: 5, 4: 5, 7: 5}, yes(9, 4, 7), nil, 2, []uint64{4, 7}},
		{"k 0", map[uint64]float64{1: 5}, yes(1), nil, 0, []uint64{}},
		{"garbage demand ranks last", map[uint64]float64{1: -1, 2: 1}, yes(1, 2), nil, 1, []uint64{2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Hottest(tc.total, tc.qualifies, tc.hot, tc.k); !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// Candidates stay within Cap under a flood of distinct values, keep the
// value that carries most of the traffic with about its true rate, and
// forget values that went quiet.
func TestCandidatesBoundedAndAccurate(t *testing.T) {
	c := Candidates{Cap: 16}
	now := time.Unix(0, 0)
	rng := rand.New(rand.NewPCG(1, 2))
	const heavy = uint64(1 << 40)
	for tick := range 100 {
		counts := map[uint64]uint64{heavy: 100} // 100 sampled tokens per 100 ms
		for range 200 {
			counts[rng.Uint64()] += 1
		}
		now = now.Add(100 * time.Millisecond)
		c.Observe(counts, 16, now, 250*time.Millisecond)
		if c.Len() > 16 {
			t.Fatalf("tick %d: %d candidates, cap 16", tick, c.Len())
		}
	}
	top := c.Top(1)
	// 100 sampled tokens × 16 per 0.1 s = 16,000/s.
	if len(top) != 1 || top[0].ID != heavy || top[0].Offered < 15000 || top[0].Offered > 17000 {
		t.Fatalf("top %+v, want value %d at about 16000/s", top, heavy)
	}
	for range 50 {
		now = now.Add(100 * time.Millisecond)
		c.Observe(nil, 16, now, 250*time.Millisecond)
	}
	if c.Len() != 0 {
		t.Fatalf("%d candidates after 5 s of silence", c.Len())
	}
}
