package demand

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestDivide is the rule as a table. Each row divides one snapshot and checks
// every replica's share as the replica computes it from the parameters.
func TestDivide(t *testing.T) {
	type row struct {
		name     string
		limit    float64
		units    uint32 // the leader's view
		headroom float64
		floor    float64
		wants    []Want
		want     []float64 // each replica's share
	}
	inf := math.Inf(1)
	rows := []row{
		{
			// Doorman's worked example: capacity 120, wants 1000, 50, 10.
			// The equal share is 40; the replica wanting 10 gets 10, and the
			// 30 it leaves goes to the other two in proportion to their
			// excess over 40 (960 and 10).
			name: "doorman example", limit: 120, units: 3,
			wants: []Want{{Units: 1, Offered: 1000}, {Units: 1, Offered: 50}, {Units: 1, Offered: 10}},
			want:  []float64{40 + 30*960.0/970, 40 + 30*10.0/970, 10},
		},
		{
			name: "doorman example with headroom and floor", limit: 120, units: 3, headroom: 0.1, floor: 0.1,
			wants: []Want{{Units: 1, Offered: 1000}, {Units: 1, Offered: 50}, {Units: 1, Offered: 10}},
			// The small replica gets 11; 29 is left for an excess of 970.
			want: []float64{40 + 29*960.0/970, 40 + 29*10.0/970, 11},
		},
		{
			name: "floor for an idle replica", limit: 100, units: 2, headroom: 0.1, floor: 0.1,
			wants: []Want{{Units: 1, Offered: 0}, {Units: 1, Offered: 500}},
			want:  []float64{5, 95},
		},
		{
			name: "everyone under: the rest is spread evenly", limit: 100, units: 4, headroom: 0, floor: 0,
			wants: []Want{{Units: 1, Offered: 10}, {Units: 1, Offered: 10}, {Units: 1, Offered: 10}, {Units: 1, Offered: 10}},
			// Each is given 10 and 60 is left: R = 0.6, so 10 + 0.6·25.
			want: []float64{25, 25, 25, 25},
		},
		{
			name: "over-wanters all satisfied, the rest spread", limit: 100, units: 2, headroom: 0, floor: 0,
			wants: []Want{{Units: 1, Offered: 10}, {Units: 1, Offered: 60}},
			// S = 40, X = 10: K = 1, 30 left, R = 0.3: 10+15 and 60+15.
			want: []float64{25, 75},
		},
		{
			name: "an absent replica keeps its equal share", limit: 120, units: 3, headroom: 0, floor: 0,
			wants: []Want{{Units: 1, Offered: 1000}, {Units: 1, Absent: true}, {Units: 1, Offered: 0}},
			want:  []float64{80, 40, 0},
		},
		{
			name: "a replica in the view without any report", limit: 120, units: 3, headroom: 0, floor: 0,
			wants: []Want{{Units: 1, Offered: 1000}, {Units: 1, Offered: 0}},
			// U = 3 from the view: the third replica's 40 is not handed out.
			want: []float64{80, 0},
		},
		{
			name: "more reporters than the view: divided among the reporters", limit: 90, units: 2, headroom: 0, floor: 0,
			wants: []Want{{Units: 1, Offered: 30}, {Units: 1, Offered: 30}, {Units: 1, Offered: 30}},
			want:  []float64{30, 30, 30},
		},
		{
			name: "weights: equal shares 1:3", limit: 100, units: 4, headroom: 0, floor: 0,
			wants: []Want{{Units: 1, Offered: 1000}, {Units: 3, Offered: 1000}},
			want:  []float64{25, 75},
		},
		{
			name: "weights: the light replica's spare goes to the heavy one", limit: 100, units: 4, headroom: 0, floor: 0,
			wants: []Want{{Units: 1, Offered: 5}, {Units: 3, Offered: 1000}},
			want:  []float64{5, 95},
		},
		{
			name: "garbage demand counts as none", limit: 100, units: 2, headroom: 0, floor: 0,
			wants: []Want{{Units: 1, Offered: inf}, {Units: 1, Offered: math.NaN()}},
			want:  []float64{50, 50},
		},
		{
			name: "a replica with no units gets nothing", limit: 100, units: 2, headroom: 0, floor: 0,
			wants: []Want{{Units: 0, Offered: 100}, {Units: 2, Offered: 1000}},
			want:  []float64{-1, 100}, // -1: Share refuses (no units)
		},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			p := Divide(r.limit, r.units, r.wants, r.headroom, r.floor)
			var sum float64
			for i, w := range r.wants {
				got, ok := Share(p, w.Units, w.Offered, w.Absent, r.units)
				if r.want[i] < 0 {
					if ok {
						t.Errorf("replica %d: share %v, want a refusal", i, got)
					}
					continue
				}
				if !ok {
					t.Fatalf("replica %d: Share refused %+v", i, p)
				}
				sum += got
				if math.Abs(got-r.want[i]) > 1e-6*r.limit {
					t.Errorf("replica %d (%+v): share %.6f, want %.6f (params %+v)", i, w, got, r.want[i], p)
				}
			}
			if sum > r.limit {
				t.Errorf("shares sum to %.12f, above L = %v", sum, r.limit)
			}
		})
	}
}

// TestShareNewcomer: a replica that counts more units in its own view than
// the division did scales its share down, so the newcomer's equal share fits.
func TestShareNewcomer(t *testing.T) {
	p := Divide(100, 2, []Want{{Units: 1, Offered: 1000}, {Units: 1, Offered: 0}}, 0, 0)
	hot, _ := Share(p, 1, 1000, false, 3)
	cold, _ := Share(p, 1, 0, false, 3)
	newcomer := Equal(100, 1, 3)
	if sum := hot + cold + newcomer; sum > 100+1e-9 {
		t.Errorf("hot %.3f + cold %.3f + newcomer %.3f = %.3f > 100", hot, cold, newcomer, sum)
	}
	if math.Abs(hot-100*2.0/3) > 1e-6 {
		t.Errorf("hot replica's share %.6f, want 200/3 (its 100 scaled by 2/3)", hot)
	}

	// With capacity left over (R > 0), the newcomer, absent from the
	// division, must not take R as well: none of it was set aside for it.
	p = Divide(100, 2, []Want{{Units: 1, Offered: 10}, {Units: 1, Offered: 10}}, 0, 0)
	if p.R < 0.5 {
		t.Fatalf("R = %v, want the 80 left over spread", p.R)
	}
	a, _ := Share(p, 1, 10, false, 3)
	b, _ := Share(p, 1, 10, false, 3)
	n, _ := Share(p, 1, 0, true, 3)
	if sum := a + b + n; sum > 100 {
		t.Errorf("two old replicas %.3f + %.3f and a newcomer %.3f = %.3f > 100", a, b, n, sum)
	}
}

// TestShareBadParams: parameters that cannot be evaluated are refused, and
// parameters out of range are clamped, never loosened.
func TestShareBadParams(t *testing.T) {
	for _, p := range []Rule{
		{},
		{Limit: math.NaN(), Units: 2},
		{Limit: math.Inf(1), Units: 2},
		{Limit: -1, Units: 2},
		{Limit: 100, Units: 0},
	} {
		if g, ok := Share(p, 1, 10, false, 1); ok {
			t.Errorf("Share(%+v) = %v, want a refusal", p, g)
		}
	}
	// K and R beyond their ranges are read as 0: equal or less.
	for _, p := range []Rule{
		{Limit: 100, Units: 2, K: 5, R: 7},
		{Limit: 100, Units: 2, K: math.NaN(), R: math.NaN()},
		{Limit: 100, Units: 2, K: -1, R: -1, Headroom: math.Inf(1), Floor: 7},
	} {
		for _, d := range []float64{0, 10, 50, 1e9} {
			g, ok := Share(p, 1, d, false, 2)
			if !ok || g > 50+1e-9 {
				t.Errorf("Share(%+v, demand %v) = %v (ok %v), want at most the equal share 50", p, d, g, ok)
			}
		}
	}
	if g, ok := Share(Rule{Limit: 100, Units: 2, K: 1}, 3, 10, false, 2); ok {
		t.Errorf("a replica with more units than the division = %v, want a refusal", g)
	}
}

// TestDivideSumsToAtMostL is the invariant as a property: over random
// snapshots (sizes, weights, demands from idle to absurd, absent replicas,
// views larger and smaller than the snapshot, random tuning), the shares the
// replicas compute for themselves sum to at most L; each replica under its
// equal share gets at least min(its demand, its equal share); and when demand
// exceeds L overall, the shares hand out all of L but for the slack.
func TestDivideSumsToAtMostL(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 20000 {
		n := 1 + rng.IntN(50)
		limit := []float64{1, 0.001, 400, 1e6, 1e12}[rng.IntN(5)] * (0.5 + rng.Float64())
		wants := make([]Want, n)
		var units uint32
		for i := range wants {
			w := Want{Units: uint32(1 + rng.IntN(4)), Absent: rng.IntN(10) == 0}
			switch rng.IntN(5) {
			case 0:
				w.Offered = 0
			case 1:
				w.Offered = limit * rng.Float64() / float64(n)
			case 2:
				w.Offered = limit * rng.Float64()
			case 3:
				w.Offered = limit * 100 * rng.Float64()
			default:
				w.Offered = rng.ExpFloat64() * limit / float64(n)
			}
			units += w.Units
			wants[i] = w
		}
		view := units
		switch rng.IntN(3) {
		case 0:
			view += uint32(rng.IntN(5))
		case 1:
			view = uint32(rng.IntN(int(units) + 1))
		}
		headroom, floor := rng.Float64()*0.5, rng.Float64()*0.5
		p := Divide(limit, view, wants, headroom, floor)
		var sum, demand float64
		for i, w := range wants {
			g, ok := Share(p, w.Units, w.Offered, w.Absent, max(view, units))
			if !ok {
				t.Fatalf("iter %d: replica %d refused: %+v", iter, i, p)
			}
			sum += g
			e := Equal(limit, w.Units, p.Units)
			if w.Absent {
				demand += e
			} else {
				demand += w.Offered
			}
			if !w.Absent && w.Offered <= e && g < min(w.Offered, e)*(1-1e-6) {
				t.Fatalf("iter %d: replica %d wants %v ≤ its equal share %v but gets %v", iter, i, w.Offered, e, g)
			}
		}
		if sum > limit {
			t.Fatalf("iter %d: shares sum to %v > L = %v (excess %g); params %+v, wants %+v", iter, sum, limit, sum-limit, p, wants)
		}
		if view <= units && demand > limit && sum < limit*(1-1e-6) {
			t.Fatalf("iter %d: demand %v exceeds L = %v but the shares hand out only %v", iter, demand, limit, sum)
		}
	}
}
