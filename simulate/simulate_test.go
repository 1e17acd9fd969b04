package simulate

import (
	"testing"
	"time"
)

func base(k int, shape string, demandOn bool) Config {
	return Config{Replicas: k, Limit: 400, Offered: 800, Shape: shape, Duration: 30 * time.Second, Demand: demandOn,
		Interval: time.Second, MaxWrites: 100, Hold: 2 * time.Second}
}

// mean is the cluster's admitted rate ÷ L over bins [from, to).
func mean(r *Result, from, to int) float64 {
	var s float64
	for _, b := range r.Bins[from:to] {
		s += b.Admitted
	}
	return s / float64(to-from) / r.Config.Limit
}

func TestSimulateHot(t *testing.T) {
	for _, k := range []int{4, 10, 100} {
		eq, err := Run(base(k, Hot, false))
		if err != nil {
			t.Fatal(err)
		}
		dm, err := Run(base(k, Hot, true))
		if err != nil {
			t.Fatal(err)
		}
		e, d := mean(eq, 5, 30), mean(dm, 5, 30)
		t.Logf("K=%d hot: equal %.3f of L, demand %.3f of L; writes %.1f/s; max share sum %.6f", k, e, d, dm.WritesPerSecond, dm.MaxShareSum)
		if d < 0.95 || d > 1.0001 {
			t.Errorf("K=%d: demand shares admitted %.3f of L", k, d)
		}
		if e > 0.8 {
			t.Errorf("K=%d: equal shares admitted %.3f of L under 80%% to one replica", k, e)
		}
		if dm.MaxShareSum > 1+1e-6 {
			t.Errorf("K=%d: shares summed to %.6f of L", k, dm.MaxShareSum)
		}
	}
}

// TestSimulateSharesNeverSumPastL: over every shape, with replicas joining
// and leaving, the shares in force never sum past L; and away from changes
// (the start, a join or a leave, a move of the hot spot, a step of the
// load), the cluster never admits more than L in a second. Right after a
// change, replicas whose traffic grew spend the tokens their buckets saved
// while it was low (at most B between them): a token bucket's burst.
func TestSimulateSharesNeverSumPastL(t *testing.T) {
	for _, shape := range Shapes {
		for _, k := range []int{2, 7, 50} {
			c := base(k, shape, true)
			c.Limit = 1000 // B = L ≥ 10 K: no bucket at the one-token floor
			c.Offered = 1500
			c.Events = []Event{{At: 8 * time.Second, Delta: 3}, {At: 16 * time.Second, Delta: -2}}
			r, err := Run(c)
			if err != nil {
				t.Fatal(err)
			}
			if r.MaxShareSum > 1+1e-9 {
				t.Errorf("%s K=%d: shares summed to %.9f of L", shape, k, r.MaxShareSum)
			}
			if shape == Steps {
				continue
			}
			quiet := func(sec int) bool {
				for _, change := range []int{0, 8, 16, 10, 20} { // starts, events, moves (a third of 30 s)
					if sec >= change && sec < change+5 {
						return false
					}
				}
				return true
			}
			for i, b := range r.Bins {
				if quiet(i) && b.Admitted > c.Limit*1.001 {
					t.Errorf("%s K=%d: %.1f admitted in the second from %v, above L", shape, k, b.Admitted, b.T)
				}
			}
		}
	}
}

// TestSimulateMovingConverges: after the hot spot moves, demand shares are
// back above 95% of L within 3 s at K = 10 and 100 (write interval 1 s).
func TestSimulateMovingConverges(t *testing.T) {
	for _, k := range []int{10, 100} {
		c := base(k, Moving, true)
		c.Limit, c.Offered, c.Duration = 1000, 2000, 60*time.Second
		r, err := Run(c)
		if err != nil {
			t.Fatal(err)
		}
		for _, move := range []int{20, 40} {
			back := -1
			for i := move; i < move+10; i++ {
				if r.Bins[i].Admitted >= 0.95*c.Limit {
					back = i - move
					break
				}
			}
			t.Logf("K=%d: back above 95%% of L %d s after the move at %d s", k, back, move)
			if back < 0 || back > 3 {
				t.Errorf("K=%d: %d s to recover after the move at %d s", k, back, move)
			}
		}
	}
}

func TestSimulateValidate(t *testing.T) {
	for _, c := range []Config{
		{},
		func() Config { c := base(4, Hot, true); c.Events = []Event{{At: time.Second, Delta: -4}}; return c }(),
		func() Config { c := base(4, "square", true); return c }(),
		func() Config { c := base(4, Hot, true); c.Interval = time.Millisecond; return c }(),
	} {
		if _, err := Run(c); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}
