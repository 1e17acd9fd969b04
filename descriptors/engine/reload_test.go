package engine

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// Reloads keep the cap: a rule whose limit a reload changes keeps its
// buckets' fill ratio, and the buckets of a rule a reload adds (a new rule,
// a renamed one, one that was unlimited or blocked, or one whose share
// changed) start empty and fill over the rule's burst time. Never a fresh
// burst.

// oneRule is domain d with one rule: key k (value-less, so one bucket per
// value) with rate_limit {rl}.
func oneRule(k, rl string) string {
	return "domain: d\ndescriptors:\n  - key: " + k + "\n    rate_limit: {" + rl + "}\n"
}

const ms = int64(time.Millisecond)

func TestReloadKeepsFillRatio(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		old, new string
		drain    int   // drawn at 0, before the reload
		reloadAt int64 // ms
		at       int64 // ms: when the draws after the reload are made
		want     int   // admitted of 1000 single draws then
	}{
		// 300/s drained, lowered to 280/s during the incident: empty, as
		// the old bucket was, then refilling at 280/s.
		{"lowered, at once", "unit: second, requests_per_unit: 300", "unit: second, requests_per_unit: 280", 300, 0, 0, 0},
		{"lowered, half a second on", "unit: second, requests_per_unit: 300", "unit: second, requests_per_unit: 280", 300, 0, 500, 140},
		// Half full stays half full: of 200 now.
		{"raised", "unit: second, requests_per_unit: 100", "unit: second, requests_per_unit: 200", 50, 0, 0, 100},
		{"burst lowered", "unit: second, requests_per_unit: 100", "unit: second, requests_per_unit: 100, burst: 10", 50, 0, 0, 5},
		{"unit changed", "unit: second, requests_per_unit: 60", "unit: minute, requests_per_unit: 60", 60, 0, 0, 0},
		{"multiplier changed", "unit: second, requests_per_unit: 10", "unit: second, requests_per_unit: 10, unit_multiplier: 2", 5, 0, 0, 5},
		// A policy or max_wait change keeps the bucket as it is.
		{"policy changed", "unit: second, requests_per_unit: 10", "unit: second, requests_per_unit: 10, policy: wait, max_wait: 10ms", 10, 0, 0, 0},
		// The time between the last draw and the reload refills at the
		// slower of the two limits, never at the faster: 1 token a second
		// in a bucket of 10 drained at 0, raised at 1 s to 100 a second.
		// The old limit had refilled one token by then; the new one would
		// have refilled the bucket ten times over.
		{"gap refilled no faster than the old limit", "unit: second, requests_per_unit: 1, burst: 10", "unit: second, requests_per_unit: 100, burst: 10", 10, 1000, 1000, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEngine(t, mustParse(t, oneRule("k", tc.old)), bucket.NewStore(0), Options{})
			if got := admitted(t, e, "d", desc("k=x"), tc.drain, 0); got != tc.drain {
				t.Fatalf("drained %d of %d", got, tc.drain)
			}
			e.SwapAt(mustParse(t, oneRule("k", tc.new)), tc.reloadAt*ms)
			if got := admitted(t, e, "d", desc("k=x"), 1000, tc.at*ms); got != tc.want {
				t.Errorf("after the reload admitted %d, want %d", got, tc.want)
			}
		})
	}
}

// A bucket nobody uses across a reload that slows its limit (a unit of a
// second made a minute) must not be judged full at the old rate by the
// sweeper: dropped, it would come back full.
func TestReloadSweepJudgesAtTheNewLimit(t *testing.T) {
	t.Parallel()
	e := newEngine(t, mustParse(t, oneRule("k", "unit: second, requests_per_unit: 10")), bucket.NewStore(0), Options{})
	admitted(t, e, "d", desc("k=x"), 10, 0)
	e.SwapAt(mustParse(t, oneRule("k", "unit: minute, requests_per_unit: 10")), 500*ms)
	e.Sweep(2000 * ms) // full by now at 10/s; not at 10/min
	// The truth: 0.5 s at 1 bucket a second, then 1.5 s at 1/60: 5.25
	// tokens. Anything up to 5 is never looser.
	if got := admitted(t, e, "d", desc("k=x"), 100, 2000*ms); got > 5 {
		t.Errorf("admitted %d two seconds on, more than the 5 the limits in force refilled", got)
	}
}

// A bucket untouched across two reloads, fast to slow to fast, refills the
// slow limit's time at the slow rate.
func TestReloadUntouchedAcrossTwoReloads(t *testing.T) {
	t.Parallel()
	fast, slow := "unit: second, requests_per_unit: 10", "unit: minute, requests_per_unit: 10"
	e := newEngine(t, mustParse(t, oneRule("k", fast)), bucket.NewStore(0), Options{})
	admitted(t, e, "d", desc("k=x"), 10, 0)
	e.SwapAt(mustParse(t, oneRule("k", slow)), 100*ms)
	e.SwapAt(mustParse(t, oneRule("k", fast)), 200*ms)
	// The truth: 0.1 s fast, 0.1 s slow, 0.1 s fast: 2.02 tokens.
	if got := admitted(t, e, "d", desc("k=x"), 100, 300*ms); got > 2 {
		t.Errorf("admitted %d at 0.3 s, more than the 2 the limits in force refilled", got)
	}
}

// A wait-policy bucket's reservations (a fill below empty) are kept across a
// reload, as a debt of the same share of the bucket.
func TestReloadKeepsWaitDebt(t *testing.T) {
	t.Parallel()
	e := newEngine(t, mustParse(t, oneRule("k", "unit: second, requests_per_unit: 10, policy: wait, max_wait: 1s")), bucket.NewStore(0), Options{})
	if got := admitted(t, e, "d", desc("k=x"), 15, 0); got != 15 {
		t.Fatalf("admitted %d of 10 and 5 reserved", got)
	}
	// Half a bucket owed, of 20 now: -10 tokens, refilling at 10/s.
	e.SwapAt(mustParse(t, oneRule("k", "unit: second, requests_per_unit: 10, burst: 20")), 0)
	if got := admitted(t, e, "d", desc("k=x"), 100, 0); got != 0 {
		t.Fatalf("admitted %d with reservations outstanding", got)
	}
	if got := admitted(t, e, "d", desc("k=x"), 100, 2000*ms); got != 10 {
		t.Errorf("two seconds on admitted %d, want 10 (the debt of 10 repaid, then 10)", got)
	}
}

// Past the store's cap, keys share the rule's overflow bucket; a reload
// that changes the limit keeps that bucket's fill too.
func TestReloadKeepsOverflowBucket(t *testing.T) {
	t.Parallel()
	// A cap of 8 keeps 2 places for overflow buckets: six keys fill the
	// rest.
	e := newEngine(t, mustParse(t, oneRule("ip", "unit: second, requests_per_unit: 10")), bucket.NewStore(8), Options{})
	for _, ip := range []string{"a", "b", "c", "d", "e", "f"} {
		admitted(t, e, "d", desc("ip="+ip), 1, 0)
	}
	out, _, _ := decide(e, "d", descs(desc("ip=g")), 0, 0, nil)
	if !out[0].Overflow {
		t.Fatal("the seventh key did not overflow")
	}
	admitted(t, e, "d", desc("ip=g"), 20, 0) // the overflow bucket drained
	e.SwapAt(mustParse(t, oneRule("ip", "unit: second, requests_per_unit: 20")), 0)
	if got := admitted(t, e, "d", desc("ip=h"), 20, 0); got != 0 {
		t.Errorf("a new key admitted %d through the overflow bucket after the reload", got)
	}
}

// A rule a reload adds starts its buckets empty and fills them over its
// burst time, B/R, when it may be a rule renamed: when some rule stopped
// drawing (removed, renamed, given another share, made unlimited or
// blocked) less than that rule's burst time ago. Otherwise it starts full,
// as a rule in the first set does.
func TestReloadNewRule(t *testing.T) {
	t.Parallel()
	lim := "unit: second, requests_per_unit: 100"
	two := func(a, b string) string {
		return "domain: d\ndescriptors:\n  - key: " + a + "\n    rate_limit: {" + lim + "}\n  - key: " + b + "\n    rate_limit: {" + lim + "}\n"
	}
	cases := []struct {
		name  string
		steps []string // the first set, then one reload each 500 ms; the last, at 1 s, has rule k
		ramps bool
	}{
		{"renamed", []string{oneRule("old", lim), oneRule("old", lim), oneRule("k", lim)}, true},
		{"share changed", []string{oneRule("k", lim), oneRule("k", lim), oneRule("k", lim+", share: replica")}, true},
		{"added as another is removed", []string{two("other", "gone"), two("other", "gone"), two("other", "k")}, true},
		{"removed, then added", []string{oneRule("old", lim), oneRule("other", lim), two("other", "k")}, true},
		{"made unlimited, then limited again", []string{oneRule("k", lim), oneRule("k", "unlimited: true"), oneRule("k", lim)}, true},
		{"blocked, then limited again", []string{oneRule("k", lim), oneRule("k", "unit: second, requests_per_unit: 0"), oneRule("k", lim)}, true},
		{"had no limit, a deeper rule had", []string{
			"domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: z\n        rate_limit: {" + lim + "}\n",
			"domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: z\n        rate_limit: {" + lim + "}\n",
			oneRule("k", lim)}, true},
		{"added", []string{oneRule("other", lim), oneRule("other", lim), two("other", "k")}, false},
		{"unlimited since the first set", []string{oneRule("k", "unlimited: true"), oneRule("k", "unlimited: true"), oneRule("k", lim)}, false},
		{"blocked since the first set", []string{oneRule("k", "unit: second, requests_per_unit: 0"), oneRule("k", "unit: second, requests_per_unit: 0"), oneRule("k", lim)}, false},
		// A rule of 100 a second refills its burst in 1 s; removed 1 s
		// before, it is refilled.
		{"added long after a removal", []string{oneRule("old", lim), oneRule("other", lim), oneRule("other", lim), two("other", "k")}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEngine(t, mustParse(t, tc.steps[0]), bucket.NewStore(0), Options{})
			at := int64(0)
			for _, step := range tc.steps[1:] {
				at += 500 * ms
				e.SwapAt(mustParse(t, step), at)
			}
			want := []int{100, 100, 100}
			if tc.ramps {
				want = []int{0, 50, 100}
			}
			for i, key := range []string{"k=x", "k=y", "k=z"} {
				now := at + int64(i)*500*ms
				if got := admitted(t, e, "d", desc(key), 200, now); got != want[i] {
					t.Errorf("%v after the reload a new key admitted %d, want %d", time.Duration(now-at), got, want[i])
				}
			}
		})
	}
}

// A rule renamed and renamed back finds its old buckets again; they are
// held to the ramp too: the renamed rule's draws spent the same limit.
func TestReloadRenameAndBack(t *testing.T) {
	t.Parallel()
	lim := "unit: second, requests_per_unit: 100"
	e := newEngine(t, mustParse(t, oneRule("a", lim)), bucket.NewStore(0), Options{})
	admitted(t, e, "d", desc("a=x"), 100, 0)
	e.SwapAt(mustParse(t, oneRule("b", lim)), 0)
	if got := admitted(t, e, "d", desc("b=x"), 200, 500*ms); got != 50 {
		t.Fatalf("renamed rule half its ramp on admitted %d, want 50", got)
	}
	e.SwapAt(mustParse(t, oneRule("a", lim)), 500*ms)
	if got := admitted(t, e, "d", desc("a=x"), 200, 500*ms); got != 0 {
		t.Errorf("renamed back, the old bucket admitted %d at once", got)
	}
}

// A demand-shared rule whose limit changes keeps its demand state: its
// weight group (which its buckets live by), its meter and its ID across
// replicas. The leader's parameters carry the limit they divide, which is
// what tells replicas with different limits apart.
func TestReloadKeepsDemandState(t *testing.T) {
	t.Parallel()
	const hot = "  - key: hot\n    value: x\n    rate_limit: {unit: second, requests_per_unit: 100, share: demand}\n"
	e := newEngine(t, mustParse(t, "domain: a\ndescriptors:\n"+hot), bucket.NewStore(0), Options{Weight: 0.25})
	d := demandOf(t, e, "a.hot_x")
	if got := admitted(t, e, "a", desc("hot=x"), 100, 0); got != 25 {
		t.Fatalf("admitted %d of the equal share's 25", got)
	}
	e.SwapAt(mustParse(t, "domain: a\ndescriptors:\n"+strings.Replace(hot, "100", "50", 1)), 0)
	d2 := demandOf(t, e, "a.hot_x")
	if d2 != d || d2.Group() != d.Group() || d2.RuleID() != d.RuleID() {
		t.Fatalf("demand state %p group %d ID %x, was %p group %d ID %x", d2, d2.Group(), d2.RuleID(), d, d.Group(), d.RuleID())
	}
	if got := admitted(t, e, "a", desc("hot=x"), 100, 0); got != 0 {
		t.Errorf("admitted %d after the reload, want 0: the bucket was empty", got)
	}
}

// A state file saved under one limit and restored under another keeps each
// bucket's fill ratio; the time the daemon was down refills at the slower
// of the two limits.
func TestRestoreUnderChangedLimit(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		old, new string
		down     time.Duration
		want     int
	}{
		{"lowered", "unit: second, requests_per_unit: 10", "unit: second, requests_per_unit: 8", 500 * time.Millisecond, 4},
		{"raised", "unit: second, requests_per_unit: 10", "unit: second, requests_per_unit: 20", 500 * time.Millisecond, 10},
		// 1 token a second in 10, then 100 a second in 10: 0.5 s down is
		// half a token at the old rate, the whole bucket at the new.
		{"faster refill", "unit: second, requests_per_unit: 1, burst: 10", "unit: second, requests_per_unit: 100, burst: 10", 500 * time.Millisecond, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := snapEngine(t, oneRule("ip", tc.old))
			admitted(t, a, "d", desc("ip=1.2.3.4"), 100, 0)
			saved := export(a, 0)
			b := seededEngine(t, oneRule("ip", tc.new), a.Seed())
			if res := b.Restore(saved, a.Weights(), tc.down, noOverrides, 0); res.Kept != 1 {
				t.Fatalf("%+v, want the bucket kept", res)
			}
			if got := count(t, b, "ip=1.2.3.4", 100, 0); got != tc.want {
				t.Errorf("restored bucket admitted %d, want %d", got, tc.want)
			}
		})
	}
}

// TestReloadsNeverOpenTheCap is the property the tests above are cases of.
// One logical rule, at weight 1, is drawn from by a client that always uses
// its current name, while reloads change its limit (requests_per_unit,
// unit, burst), rename it, make it unlimited or blocked, and bring it back.
// Measure what is admitted in fill units: a token drawn while the limit in
// force has burst B counts 1/B. Then for every window [s, e] between two
// draws:
//
//	Σ n/B  ≤  1 + Σ_k (R_k/B_k)·|[s, e] ∩ P_k|
//
// where P_k are the periods a limit (R_k, B_k) was in force. While the rule
// is unlimited or blocked, the last limit that drew stands in the sum (its
// spent burst refills meanwhile, as it would had the rule stayed), and what
// an unlimited rule admits is not counted. In tokens, for a window within
// one limit's period, this is B + R·t; for a window that starts at a
// reload, it is f·B_new + R_new·t, where f ≤ 1 is the fill ratio the old
// bucket had. A fresh bucket at a reload breaks it at once: two buckets in
// one instant.
func TestReloadsNeverOpenTheCap(t *testing.T) {
	t.Parallel()
	type period struct {
		start int64
		ratio float64 // R/B per second; 0 when the rule does not draw
	}
	type draw struct {
		at    int64
		units float64
	}
	for seed := range uint64(300) {
		r := rand.New(rand.NewPCG(seed, 30))
		// size is the burst B in force; 0 while unlimited, -1 while blocked.
		variant := func() (name, rl string, b, ratio float64) {
			name = []string{"a", "b"}[r.IntN(2)]
			switch r.IntN(10) {
			case 0:
				return name, "unlimited: true", 0, 0
			case 1:
				return name, "unit: second, requests_per_unit: 0", -1, 0
			}
			rpu := []int{1, 5, 10, 20, 50}[r.IntN(5)]
			unit, secs := "second", 1.0
			if r.IntN(3) == 0 {
				unit, secs = "minute", 60
			}
			burst := []int{0, 1, 5, 30, 100}[r.IntN(5)]
			rl = fmt.Sprintf("unit: %s, requests_per_unit: %d", unit, rpu)
			b = float64(rpu)
			if burst > 0 {
				rl += fmt.Sprintf(", burst: %d", burst)
				b = float64(burst)
			}
			return name, rl, b, float64(rpu) / secs / b
		}
		name, rl, size, ratio := variant()
		e := newEngine(t, mustParse(t, oneRule(name, rl)), bucket.NewStore(0), Options{})
		periods := []period{{0, ratio}}
		var draws []draw
		now := int64(0)
		for range 150 {
			now += int64(r.IntN(300)) * ms
			switch r.IntN(8) {
			case 0:
				e.Sweep(now)
				continue
			case 1, 2:
				last := ratio
				name, rl, size, ratio = variant()
				e.SwapAt(mustParse(t, oneRule(name, rl)), now)
				if size <= 0 {
					ratio = last // the bound's, not the rule's: see above
				}
				periods = append(periods, period{now, ratio})
				continue
			}
			n := 1 + r.IntN(3)
			for range 1 + r.IntN(40) {
				_, code, err := decide(e, "d", descs(desc(name+"=x")), uint32(n), now, nil)
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case code.String() != "OK" || size == 0:
					continue
				case size < 0:
					t.Fatalf("seed %d: a blocked rule admitted", seed)
				}
				draws = append(draws, draw{now, float64(n) / size})
			}
		}
		// phi(t) is the refill the limits in force allowed from 0 to t, in
		// fill units.
		phi := func(t int64) float64 {
			sum := 0.0
			for i, p := range periods {
				end := t
				if i+1 < len(periods) && periods[i+1].start < t {
					end = periods[i+1].start
				}
				if end > p.start {
					sum += p.ratio * float64(end-p.start) / 1e9
				}
			}
			return sum
		}
		sum := make([]float64, len(draws)+1)
		for i, d := range draws {
			sum[i+1] = sum[i] + d.units
		}
		for i := range draws {
			for j := i; j < len(draws); j++ {
				got, bound := sum[j+1]-sum[i], 1+phi(draws[j].at)-phi(draws[i].at)
				if got > bound+1e-6*float64(j-i+1) {
					t.Fatalf("seed %d: from %v to %v admitted %.4f buckets, bound %.4f", seed,
						time.Duration(draws[i].at), time.Duration(draws[j].at), got, bound)
				}
			}
		}
	}
}

// TestReloadsUnderConcurrentDraws: goroutines draw on one key while another
// reloads its limit (lowered, raised, burst changed, renamed and back) and
// sweeps, all at one instant, so nothing refills. Every admitted token
// counts 1/B of the limit it was decided under (the status's limit): a
// bucket keeps its fill ratio across each reload, and a renamed rule ramps
// from empty, so the sum is at most the one bucket there was, plus what the
// wait-policy limit may reserve past empty: R·max_wait = 0.05 of a token
// in 300. Under -race,
// nothing is read unsafely.
func TestReloadsUnderConcurrentDraws(t *testing.T) {
	t.Parallel()
	limits := []string{
		oneRule("a", "unit: second, requests_per_unit: 300"),
		oneRule("a", "unit: second, requests_per_unit: 280"),
		oneRule("a", "unit: second, requests_per_unit: 1000, burst: 50"),
		oneRule("b", "unit: second, requests_per_unit: 300"),
		oneRule("a", "unit: minute, requests_per_unit: 300, policy: wait, max_wait: 10ms"),
	}
	sets := make([]*descriptors.Set, len(limits))
	for i, l := range limits {
		sets[i] = mustParse(t, l)
	}
	for trial := range 8 {
		e := newEngine(t, sets[0], bucket.NewStore(0), Options{})
		now := int64(trial) * int64(time.Hour)
		e.SwapAt(sets[0], now) // a reload at now, so the renames ramp
		var wg sync.WaitGroup
		var mu sync.Mutex
		units := 0.0
		var decided atomic.Int64
		stop := make(chan struct{})
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var dec Decision
				d := []*commonv3.RateLimitDescriptor{desc("a=x"), desc("b=x")}
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					if err := e.Decide(&dec, "d", d[(g+i)%2:(g+i)%2+1], 1, now); err != nil {
						t.Error(err)
						return
					}
					decided.Add(1)
					if st := dec.Statuses[0]; st.Code == OK && st.Limit != nil {
						mu.Lock()
						units += 1 / float64(st.Limit.Burst())
						mu.Unlock()
					}
				}
			}()
		}
		r := rand.New(rand.NewPCG(uint64(trial), 1))
		for range 200 {
			// Let some decisions through between reloads.
			for seen := decided.Load(); decided.Load() < seen+20; {
				runtime.Gosched()
			}
			e.SwapAt(sets[r.IntN(len(sets))], now)
			if r.IntN(4) == 0 {
				e.Sweep(now)
			}
		}
		close(stop)
		wg.Wait()
		if units > 1+0.05/300+1e-6 {
			t.Fatalf("trial %d: admitted %.4f buckets at one instant across reloads, more than the one there was", trial, units)
		}
	}
}
