package rlqs

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// Envoys with Envoy's limiter semantics (modelLimiter) report every 5 s, at
// their own phases, what they admitted and what they were denied; between
// reports each is idle or greedy at random. Over every window, what they
// admit together must stay within the key's token bucket: B + R·t.
func TestWindowsStayWithinTheKey(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { windows(t, rand.New(rand.NewPCG(seed, 3))) })
	}
}

func windows(t *testing.T, rng *rand.Rand) {
	const (
		rate, burst = 20.0, 100.0
		dt          = 50 * time.Millisecond
		steps       = 1200 // 60 s
		n           = 3
	)
	eng := newFakeEngine()
	clock := &fakeClock{}
	clock.ns.Store(int64(time.Hour))
	eng.limit("edge", "tenant=a", 1, rate, burst, 1)
	svc, err := New(Options{Engine: eng, Clock: clock.now, Hold: 200 * time.Millisecond, AbandonAfter: time.Minute, Queue: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	id := map[string]string{"tenant": "a"}
	sts := make([]*stream, n)
	ls := make([]modelLimiter, n)
	phase := make([]int, n)
	greedy := make([]bool, n)
	allowed, denied := make([]uint64, n), make([]uint64, n)
	for i := range sts {
		sts[i] = svc.open(func(error) {}, "e")
		phase[i] = rng.IntN(100)
	}
	per := make([]int, steps)
	for s := range steps {
		clock.advance(dt)
		svc.Tick()
		for i := range sts {
			pumpInto(sts[i], &ls[i], clock.now())
			if s%100 == phase[i] {
				el := 5 * time.Second
				if s < 100 {
					el = 0
				}
				svc.report(sts[i], report("edge", usage(id, allowed[i], denied[i], el)))
				allowed[i], denied[i] = 0, 0
				pumpInto(sts[i], &ls[i], clock.now())
			}
			if rng.IntN(20) == 0 {
				greedy[i] = !greedy[i]
			}
			if greedy[i] && ls[i].has {
				k := ls[i].drain(clock.now())
				per[s] += k
				allowed[i] += uint64(k)
				denied[i] += uint64(rng.IntN(50))
			}
		}
	}
	worst, at, span := worstOverBucket(per, 100, 100, burst, rate, dt) // after the first reports
	total := 0
	for _, k := range per {
		total += k
	}
	t.Logf("admitted %d in %d s (the key: %.0f/s); worst window %.1f over", total, steps/20, rate, worst)
	if worst > 1 {
		t.Fatalf("%.0f requests over B + R·t in %.2f s from %.2f s", worst, float64(span)*dt.Seconds(), float64(at)*dt.Seconds())
	}
}

// worstOverBucket scans what was admitted per step of dt (per) for the
// window, from step from on and at most span steps long, that admitted the
// most over a key's token bucket, burst + rate·t: by how much, and its
// first step and length in steps.
func worstOverBucket(per []int, from, span int, burst, rate float64, dt time.Duration) (worst float64, at, steps int) {
	for a := from; a < len(per); a++ {
		sum := 0
		for b := a; b < len(per) && b < a+span; b++ {
			sum += per[b]
			if over := float64(sum) - (burst + rate*float64(b-a+1)*dt.Seconds()); over > worst {
				worst, at, steps = over, a, b-a+1
			}
		}
	}
	return worst, at, steps
}
