package demand

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// Apportion's model test: over random budgets, consumers (units, demands
// from idle to absurd, garbage, absent ones) and floor rules, the shares
// keep every documented promise, and move the right way when one demand
// moves.

// consumers draws n random consumers for budget.
func consumers(rng *rand.Rand, n int, budget float64) []Want {
	wants := make([]Want, n)
	for i := range wants {
		w := Want{Units: uint32(rng.IntN(5)), Absent: rng.IntN(8) == 0}
		if rng.IntN(10) > 0 && w.Units == 0 {
			w.Units = 1 // mostly weighted consumers; now and then one with none
		}
		w.Offered = randomDemand(rng, n, budget)
		wants[i] = w
	}
	return wants
}

// randomDemand is a demand from idle to absurd, now and then garbage.
func randomDemand(rng *rand.Rand, n int, budget float64) float64 {
	switch rng.IntN(8) {
	case 0:
		return 0
	case 1:
		return budget * rng.Float64() / float64(n)
	case 2:
		return budget * rng.Float64()
	case 3:
		return budget * 100 * rng.Float64()
	case 4:
		return []float64{math.NaN(), math.Inf(1), -1, math.Inf(-1)}[rng.IntN(4)]
	default:
		return rng.ExpFloat64() * budget / float64(n)
	}
}

// randomCase is a random division: budget, the whole's units, consumers
// and floor rule.
func randomCase(rng *rand.Rand) (budget float64, units uint32, wants []Want, headroom, floor float64) {
	n := 1 + rng.IntN(40)
	budget = []float64{1, 0.001, 400, 1e6, 1e12}[rng.IntN(5)] * (0.5 + rng.Float64())
	wants = consumers(rng, n, budget)
	var sum uint32
	for _, w := range wants {
		sum += w.Units
	}
	switch rng.IntN(3) {
	case 0:
		units = sum + uint32(rng.IntN(5)) // consumers not heard from
	case 1:
		units = uint32(rng.IntN(int(sum) + 1)) // fewer than heard from: theirs count
	default:
		units = 0
	}
	headroom, floor = rng.Float64()*0.5, rng.Float64()*0.5
	if rng.IntN(10) == 0 {
		headroom, floor = DefaultHeadroom, DefaultFloor
	}
	return budget, units, wants, headroom, floor
}

// tol is the rounding a share may carry, relative to the budget.
const tol = 1e-9

// TestApportionPromises: the shares sum to at most the budget, absent
// consumers' equal shares included; none is negative; a consumer with no
// units gets 0; an absent one gets its equal share; a present one under its
// equal share gets at least its floor, min(E, max(d·(1+h), f·E)), and one
// over it at least E; and the returned division gives each consumer the
// same share when it computes its own.
func TestApportionPromises(t *testing.T) {
	rng := rand.New(rand.NewPCG(32, 1))
	for iter := range 20000 {
		budget, units, wants, h, f := randomCase(rng)
		rule, shares := Apportion(budget, units, wants, h, f)
		if len(shares) != len(wants) {
			t.Fatalf("iter %d: %d shares for %d consumers", iter, len(shares), len(wants))
		}
		var sum float64
		for i, w := range wants {
			g := shares[i]
			sum += g
			fail := func(what string, args ...any) {
				t.Helper()
				t.Fatalf("iter %d: consumer %d (%+v) of %d, budget %v, units %d, h %v, f %v: share %v: "+what,
					append([]any{iter, i, w, len(wants), budget, units, h, f, g}, args...)...)
			}
			if !(g >= 0) {
				fail("negative or NaN")
			}
			if w.Units == 0 {
				if g != 0 {
					fail("a consumer with no units gets something")
				}
				continue
			}
			if again, ok := Share(rule, w.Units, w.Offered, w.Absent, units); !ok || again != g {
				fail("computed again from the division: %v (ok %v)", again, ok)
			}
			e := Equal(budget, w.Units, rule.Units)
			d := sane(w.Offered)
			switch {
			case w.Absent:
				if g > e || g < e*(1-tol) {
					fail("absent, want its equal share %v", e)
				}
			case d <= e:
				if least := min(e, max(d*(1+rule.Headroom), rule.Floor*e)); g < least*(1-tol) {
					fail("under its equal share %v, want at least its floor %v", e, least)
				}
				if g > e*(1+rule.R)+tol*budget {
					fail("under its equal share %v, want at most that plus R = %v of it", e, rule.R)
				}
			default:
				if g < e*(1-tol) {
					fail("over its equal share %v, want at least that", e)
				}
			}
		}
		if sum > budget {
			t.Fatalf("iter %d: shares %v sum to %v > budget %v (units %d, wants %+v)", iter, shares, sum, budget, units, wants)
		}
	}
}

// TestApportionMonotone: raising one consumer's demand never lowers its
// own share and never raises another's; adding units to the whole (a
// consumer not heard from) never raises anyone's.
func TestApportionMonotone(t *testing.T) {
	rng := rand.New(rand.NewPCG(32, 2))
	for iter := range 20000 {
		budget, units, wants, h, f := randomCase(rng)
		_, before := Apportion(budget, units, wants, h, f)
		i := rng.IntN(len(wants))
		more := slices.Clone(wants)
		more[i].Offered = sane(more[i].Offered) + rng.ExpFloat64()*budget/float64(len(wants))
		_, after := Apportion(budget, units, more, h, f)
		slack := tol * budget
		if after[i] < before[i]-slack {
			t.Fatalf("iter %d: consumer %d wanting %v then %v: its share fell from %v to %v (%+v)", iter, i, wants[i].Offered, more[i].Offered, before[i], after[i], wants)
		}
		for j := range wants {
			if j != i && after[j] > before[j]+slack {
				t.Fatalf("iter %d: consumer %d wanting more raised consumer %d's share from %v to %v (%+v)", iter, i, j, before[j], after[j], wants)
			}
		}
		var sum uint32
		for _, w := range wants {
			sum += w.Units
		}
		_, wider := Apportion(budget, max(units, sum)+1+uint32(rng.IntN(3)), wants, h, f)
		for j := range wants {
			if wider[j] > before[j]+slack {
				t.Fatalf("iter %d: a wider whole raised consumer %d's share from %v to %v (%+v)", iter, j, before[j], wider[j], wants)
			}
		}
	}
}

// TestApportionTable is the rule's worked examples through Apportion.
func TestApportionTable(t *testing.T) {
	for _, tc := range []struct {
		name   string
		budget float64
		units  uint32
		h, f   float64
		wants  []Want
		want   []float64
	}{
		{"doorman example", 120, 3, 0, 0,
			[]Want{{Units: 1, Offered: 1000}, {Units: 1, Offered: 50}, {Units: 1, Offered: 10}},
			[]float64{40 + 30*960.0/970, 40 + 30*10.0/970, 10}},
		{"the floor for an idle consumer", 100, 2, 0.1, 0.1,
			[]Want{{Units: 1, Offered: 0}, {Units: 1, Offered: 500}}, []float64{5, 95}},
		{"everyone under: the rest spread evenly", 100, 0, 0, 0,
			[]Want{{Units: 1, Offered: 10}, {Units: 1, Offered: 10}, {Units: 1, Offered: 10}, {Units: 1, Offered: 10}},
			[]float64{25, 25, 25, 25}},
		{"an absent consumer keeps its equal share", 120, 3, 0, 0,
			[]Want{{Units: 1, Offered: 1000}, {Units: 1, Absent: true}, {Units: 1, Offered: 0}}, []float64{80, 40, 0}},
		{"a consumer not heard from keeps its part", 120, 3, 0, 0,
			[]Want{{Units: 1, Offered: 1000}, {Units: 1, Offered: 0}}, []float64{80, 0}},
		{"no units, nothing", 100, 2, 0, 0,
			[]Want{{Units: 0, Offered: 100}, {Units: 2, Offered: 1000}}, []float64{0, 100}},
		{"no budget, nothing", 0, 2, 0, 0,
			[]Want{{Units: 1, Offered: 100}, {Units: 1, Offered: 1000}}, []float64{0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, got := Apportion(tc.budget, tc.units, tc.wants, tc.h, tc.f)
			for i := range tc.want {
				if math.Abs(got[i]-tc.want[i]) > 1e-6*max(tc.budget, 1) {
					t.Errorf("consumer %d: share %v, want %v", i, got[i], tc.want[i])
				}
			}
		})
	}
}
