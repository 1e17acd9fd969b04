package membership

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// fakeClock is a clock whose time moves only when the test says so. Its
// timers fire on the test's goroutine, inside AdvanceTo, each at exactly its
// deadline, earliest first.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	// onFire, if set, runs after each timer's function, with the clock at
	// that timer's deadline.
	onFire func()
}

type fakeTimer struct {
	at   time.Time
	f    func()
	done bool
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc has time.AfterFunc's meaning, on the fake time.
func (c *fakeClock) AfterFunc(d time.Duration, f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		stopped := !t.done
		t.done = true
		return stopped
	}
}

// AdvanceTo moves the clock forward to t, firing every timer due on the way.
func (c *fakeClock) AdvanceTo(t time.Time) {
	for {
		c.mu.Lock()
		var next *fakeTimer
		for _, tm := range c.timers {
			if !tm.done && !tm.at.After(t) && (next == nil || tm.at.Before(next.at)) {
				next = tm
			}
		}
		if next == nil {
			if t.After(c.now) {
				c.now = t
			}
			c.timers = slices.DeleteFunc(c.timers, func(tm *fakeTimer) bool { return tm.done })
			c.mu.Unlock()
			return
		}
		next.done = true
		if next.at.After(c.now) {
			c.now = next.at
		}
		onFire := c.onFire
		c.mu.Unlock()
		next.f()
		if onFire != nil {
			onFire()
		}
	}
}

func (c *fakeClock) Advance(d time.Duration) { c.AdvanceTo(c.Now().Add(d)) }

// subscriber records what a Damper publishes.
type subscriber struct {
	mu    sync.Mutex
	views []View
}

func (s *subscriber) update(v View) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.views = append(s.views, v)
}

func (s *subscriber) last() (View, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.views) == 0 {
		return View{}, false
	}
	return s.views[len(s.views)-1], true
}

// newFakeDamper returns a running Damper on clk that publishes to sub.
func newFakeDamper(t *testing.T, clk *fakeClock, initial View, hold time.Duration, sub *subscriber) *Damper {
	t.Helper()
	d, err := NewDamper(initial, DamperConfig{Hold: hold, Clock: clk.Now, AfterFunc: clk.AfterFunc, OnUpdate: sub.update})
	if err != nil {
		t.Fatal(err)
	}
	runDamper(t, d)
	return d
}

// runDamper runs d until the test ends and waits until its timers are
// armed, so fake time can move.
func runDamper(t *testing.T, d *Damper) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Damper.Run returned %v after cancel, want nil", err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("Damper.Run still running 5 s after its context was cancelled")
		}
	})
	testutil.Eventually(t, 30*time.Second, testutil.Cond(d.armedForTest, "the damper to arm its timers"))
}

// seen returns a confirmed consul view of total instances, local of them
// on this node, observed at.
func seen(total, local int, at time.Time) View {
	w, err := Weight(local, total)
	if err != nil {
		panic(err)
	}
	return View{Source: "consul", Node: "node-a", Total: total, Local: local, TotalWeight: total, LocalWeight: local, Weight: w, ObservedAt: at}
}

func sameCounts(a, b View) bool {
	return a.Total == b.Total && a.Local == b.Local && a.TotalWeight == b.TotalWeight &&
		a.LocalWeight == b.LocalWeight && a.Weight == b.Weight && a.ObservedAt.Equal(b.ObservedAt)
}

// TestDamperSteps walks a damper through the cases one at a time on a fake
// clock: the first view applies at once, a shrink at once, a grow exactly
// Hold after it began, and a grow that arrives while a smaller weight is
// still in the window waits for that one to leave it.
func TestDamperSteps(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	t0 := clk.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var sub subscriber
	guess := replicasView("consul", 5)
	d := newFakeDamper(t, clk, guess, 2*time.Second, &sub)
	if v := d.View(); !sameCounts(v, guess) {
		t.Fatalf("initial view = %+v, want the --replicas guess", v)
	}

	type step struct {
		at      int    // ms after t0
		update  *View  // nil: only time passes
		want    View   // in force after the step
		pending *View  // the pending view, if any
		until   int    // ms after t0 at which the pending view applies
		why     string // what the step shows
	}
	// After the error at 1.2 s, every view counts it (Errors is a total).
	counted := func(v View) View { v.Errors = 1; return v }
	half, third := seen(2, 1, at(0)), seen(3, 1, at(1000))
	half2, quarter := counted(seen(2, 1, at(1500))), counted(seen(4, 1, at(4000)))
	half3, third2 := counted(seen(2, 1, at(4500))), counted(seen(3, 1, at(5000)))
	errored := third
	errored.Errors, errored.LastError = 1, "consul down"
	steps := []step{
		{at: 0, update: &half, want: half, why: "the first view applies at once, though it grows the --replicas guess"},
		{at: 1000, update: &third, want: third, why: "a shrink applies at once"},
		{at: 1200, update: &errored, want: errored, why: "an error changes only the error fields"},
		{at: 1500, update: &half2, want: counted(third), pending: &half2, until: 3500,
			why: "a grow is held; the error is cleared at once"},
		{at: 3499, want: counted(third), pending: &half2, until: 3500, why: "still held 1 ms before Hold"},
		{at: 3500, want: half2, why: "applied exactly Hold after it began"},
		{at: 4000, update: &quarter, want: quarter, why: "a shrink applies at once"},
		{at: 4500, update: &half3, want: quarter, pending: &half3, until: 6500, why: "a grow is held"},
		{at: 5000, update: &third2, want: quarter, pending: &third2, until: 6500,
			why: "a smaller grow replaces it, due when 1/4 leaves the window"},
		{at: 6499, want: quarter, pending: &third2, until: 6500, why: "1/4 was in force until 4.5 s"},
		{at: 6500, want: third2, why: "1/3 applies 2 s after 1/4 ended, though it began at 5 s: 1/2 never applied"},
	}
	for _, s := range steps {
		clk.AdvanceTo(at(s.at))
		if s.update != nil {
			d.Update(*s.update)
		}
		got := d.View()
		if !sameCounts(got, s.want) || got.Errors != s.want.Errors || got.LastError != s.want.LastError {
			t.Fatalf("at %d ms (%s): in force %+v, want %+v", s.at, s.why, got, s.want)
		}
		if pub, ok := sub.last(); !ok || !sameCounts(pub, got) || pub.Errors != got.Errors {
			t.Fatalf("at %d ms (%s): subscriber has %+v, want %+v", s.at, s.why, pub, got)
		}
		pv, until, ok := d.Pending()
		switch {
		case s.pending == nil && ok:
			t.Fatalf("at %d ms (%s): pending %+v at %s, want none", s.at, s.why, pv, until.Sub(t0))
		case s.pending != nil && (!ok || !sameCounts(pv, *s.pending) || !until.Equal(at(s.until))):
			t.Fatalf("at %d ms (%s): pending %+v at %s (%v), want %+v at %d ms", s.at, s.why, pv, until.Sub(t0), ok, *s.pending, s.until)
		}
		t.Logf("%5d ms: in force %d/%d (%.3f) %s", s.at, got.Local, got.Total, got.Weight, s.why)
	}
}

// TestDamperFlapping flaps a peer's check between passing and critical
// every 300 ms for ten seconds: the weight in force must never rise above
// the weight with the peer counted, 1/3, at any instant. When the peer stays
// down, 1/2 applies exactly Hold after it went down.
func TestDamperFlapping(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	t0 := clk.Now()
	var sub subscriber
	d := newFakeDamper(t, clk, replicasView("consul", 3), DefaultHold, &sub)
	d.Update(seen(3, 1, t0))
	worst := 0.0
	check := func(when string) {
		v := d.View()
		worst = max(worst, v.Weight)
		if v.Weight > 1.0/3 {
			t.Fatalf("%s after %s: weight %v in force, above 1/3", when, clk.Now().Sub(t0), v.Weight)
		}
	}
	clk.onFire = func() { check("timer") }
	var last time.Time
	for i := 1; i <= 33; i++ {
		flip := t0.Add(time.Duration(i) * 300 * time.Millisecond)
		for p := clk.Now(); p.Before(flip); p = p.Add(10 * time.Millisecond) {
			clk.AdvanceTo(p)
			check("probe")
		}
		clk.AdvanceTo(flip)
		if i%2 == 1 {
			d.Update(seen(2, 1, flip)) // the peer's check fails
		} else {
			d.Update(seen(3, 1, flip))
		}
		check("flip")
		last = flip
	}
	// The last flip took the peer down, and it stays down.
	clk.onFire = nil
	clk.AdvanceTo(last.Add(DefaultHold - time.Nanosecond))
	check("just before Hold")
	clk.AdvanceTo(last.Add(DefaultHold))
	if v := d.View(); v.Weight != 0.5 {
		t.Fatalf("Hold after the peer stayed down: weight %v, want 1/2", v.Weight)
	}
	t.Logf("33 flips at 300 ms: largest weight in force %.4f; 1/2 applied %s after the last flip", worst, DefaultHold)
}

// TestDamperModel feeds random views at random instants, on a fake clock,
// and checks at every instant where anything can change (each update, each
// timer, and probes in between) that the weight in force is the smallest
// weight seen during the last Hold, never more; that a view that stands for
// Hold is in force exactly Hold after it began; that Pending tells the next
// change; and that the subscriber saw what is in force.
func TestDamperModel(t *testing.T) {
	t.Parallel()
	for seed := range 300 {
		rng := rand.New(rand.NewPCG(uint64(seed), 0xda))
		hold := time.Duration(1+rng.IntN(3000)) * time.Millisecond
		clk := newFakeClock()
		var sub subscriber
		initial := replicasView("consul", 1+rng.IntN(6))
		d := newFakeDamper(t, clk, initial, hold, &sub)

		type input struct {
			at time.Time
			v  View
		}
		var hist []input
		// base is the first view the reference looks at: a view that
		// counts this replica when the one in force did not (absent)
		// applies at once, and the views before it are forgotten.
		base := 0
		// reference is the smallest weight seen during the last Hold at now:
		// every view whose time as the latest, [at, next.at), meets
		// (now-hold, now]; for a view replaced at the instant it came, that
		// is [at, at+hold).
		reference := func(now time.Time) float64 {
			m := math.Inf(1)
			for i, in := range hist {
				if i < base {
					continue
				}
				if in.at.After(now) {
					break
				}
				if i+1 < len(hist) && !now.Before(hist[i+1].at.Add(hold)) {
					continue
				}
				m = min(m, in.v.Weight)
			}
			return m
		}
		fail := func(format string, args ...any) {
			t.Helper()
			var b strings.Builder
			for _, in := range hist {
				fmt.Fprintf(&b, "\n  %8s  %d/%d  %.4f", in.at.Sub(hist[0].at), in.v.LocalWeight, in.v.TotalWeight, in.v.Weight)
			}
			t.Fatalf("seed %d, hold %s, now %s: %s\ninputs:%s", seed, hold, clk.Now().Sub(hist[0].at), fmt.Sprintf(format, args...), b.String())
		}
		check := func(when string) {
			t.Helper()
			now := clk.Now()
			cur := d.View()
			if len(hist) == 0 {
				if !sameCounts(cur, initial) {
					fail("%s: %+v in force before any view, want the initial one", when, cur)
				}
				return
			}
			ref := reference(now)
			if cur.Weight > ref {
				fail("%s: weight %v in force, above the smallest seen during the last Hold, %v", when, cur.Weight, ref)
			}
			if cur.Weight != ref {
				fail("%s: weight %v in force, want exactly the smallest seen during the last Hold, %v", when, cur.Weight, ref)
			}
			latest := hist[len(hist)-1].v
			if cur.Errors != latest.Errors || cur.LastError != latest.LastError {
				fail("%s: errors %d %q in force, want the latest view's %d %q", when, cur.Errors, cur.LastError, latest.Errors, latest.LastError)
			}
			if pub, ok := sub.last(); !ok || !sameCounts(pub, cur) || pub.Errors != cur.Errors {
				fail("%s: the subscriber last got %+v, but %+v is in force", when, pub, cur)
			}
			pv, until, ok := d.Pending()
			if ok != (cur.Weight != latest.Weight) {
				fail("%s: Pending ok = %v with %v in force and %v latest", when, ok, cur.Weight, latest.Weight)
			}
			if ok {
				if !until.After(now) || pv.Weight <= cur.Weight || reference(until) != pv.Weight || reference(until.Add(-1)) != cur.Weight {
					fail("%s: Pending = %v at %s; the reference says %v until then and %v from then", when,
						pv.Weight, until.Sub(hist[0].at), reference(until.Add(-1)), reference(until))
				}
			}
		}
		clk.onFire = func() { check("after a timer") }

		check("before any view")
		now := clk.Now()
		var errs uint64
		var prev View
		for i := range 5 + rng.IntN(55) {
			var gap time.Duration
			switch r := rng.IntN(10); {
			case r < 2 && i > 0:
				gap = 0
			case r < 4:
				gap = time.Duration(1 + rng.IntN(int(time.Millisecond)))
			case r < 5:
				gap = hold
			case r < 6:
				gap = hold + time.Duration(rng.IntN(3)-1)
			default:
				gap = time.Duration(rng.Int64N(int64(2 * hold)))
			}
			next := now.Add(gap)
			// Probe a few instants on the way, and the instant a view that
			// stood for Hold must apply.
			probes := []time.Time{next.Add(-1)}
			for range rng.IntN(3) {
				probes = append(probes, now.Add(time.Duration(rng.Int64N(int64(gap)+1))))
			}
			if len(hist) > 0 && gap >= hold {
				began := hist[len(hist)-1].at
				probes = append(probes, began.Add(hold-1), began.Add(hold))
			}
			slices.SortFunc(probes, func(a, b time.Time) int { return a.Compare(b) })
			for _, p := range probes {
				if p.After(now) && p.Before(next) {
					clk.AdvanceTo(p)
					check("probe")
				}
			}
			if len(hist) > 0 && gap >= hold {
				// The view before this one stood for Hold: it is in force.
				began := hist[len(hist)-1].at
				clk.AdvanceTo(began.Add(hold))
				if cur := d.View(); !sameCounts(cur, prev) {
					fail("a view that stood since %s is not in force Hold later: %+v", began.Sub(hist[0].at), cur)
				}
			}
			clk.AdvanceTo(next)
			now = next
			var v View
			if i > 0 && rng.IntN(6) == 0 {
				v = prev // an error: the counts stand
				errs++
				v.Errors, v.LastError = errs, fmt.Sprintf("error %d", errs)
			} else {
				total := 1 + rng.IntN(8)
				local := rng.IntN(min(total, 3) + 1)
				v = seen(total, local, now)
				if rng.IntN(3) == 0 { // weighted instances
					v.TotalWeight, v.LocalWeight = total+rng.IntN(10), local
					if local > 0 {
						v.LocalWeight = local + rng.IntN(v.TotalWeight-total+1)
					}
					v.Weight, _ = Weight(v.LocalWeight, v.TotalWeight)
				}
				v.Errors = errs
			}
			if v.Local > 0 && len(hist) > 0 && reference(now) == AbsentWeight {
				base = len(hist)
			}
			d.Update(v)
			hist = append(hist, input{now, v})
			prev = v
			check("after an update")
		}
		// The last view stands: it applies exactly Hold after it began.
		last := hist[len(hist)-1]
		clk.AdvanceTo(last.at.Add(hold - 1))
		check("1 ns before the last view's Hold")
		clk.AdvanceTo(last.at.Add(hold))
		if cur := d.View(); !sameCounts(cur, last.v) {
			fail("the last view is not in force Hold after it began: %+v", cur)
		}
		if _, _, ok := d.Pending(); ok {
			fail("still pending after the last view stood for Hold")
		}
	}
}

// TestDamperWindowBound feeds more rising views within one Hold than the
// damper keeps: it merges them, and stays at or below the smallest weight
// seen.
func TestDamperWindowBound(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	t0 := clk.Now()
	var sub subscriber
	d := newFakeDamper(t, clk, replicasView("consul", 1), time.Second, &sub)
	d.maxWindow = 4
	var weights []float64
	// Three Holds' worth, so merged views also leave the window.
	for i := range 300 {
		now := t0.Add(time.Duration(i) * 10 * time.Millisecond)
		clk.AdvanceTo(now)
		v := seen(1000-3*i, 1, now) // every view grows the weight
		d.Update(v)
		weights = append(weights, v.Weight)
		if got := d.windowLenForTest(); got > 4 {
			t.Fatalf("window holds %d views, want at most 4", got)
		}
		floor := weights[max(0, len(weights)-1-int(time.Second/(10*time.Millisecond)))]
		if w := d.View().Weight; w > floor {
			t.Fatalf("view %d: weight %v in force, above the smallest of the last second, %v", i, w, floor)
		}
	}
	clk.AdvanceTo(t0.Add(2990*time.Millisecond + time.Second))
	if w := d.View().Weight; w != weights[len(weights)-1] {
		t.Fatalf("Hold after the last view: weight %v, want %v", w, weights[len(weights)-1])
	}
}

// TestDamperUnconfirmed checks that views never confirmed by a source (the
// --replicas guess, with errors counted while Consul has not answered) pass
// through, and that the first confirmed view applies at once even when it
// grows the weight.
func TestDamperUnconfirmed(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	var sub subscriber
	guess := replicasView("consul", 4)
	d := newFakeDamper(t, clk, guess, DefaultHold, &sub)
	failing := guess
	failing.Errors, failing.LastError = 1, "connection refused"
	d.Update(failing)
	if v := d.View(); v.Errors != 1 || v.Weight != 0.25 {
		t.Fatalf("after an error before any answer: %+v", v)
	}
	clk.Advance(time.Second)
	first := seen(2, 1, clk.Now())
	d.Update(first)
	if v := d.View(); !sameCounts(v, first) {
		t.Fatalf("first answer (a grow, 1/4 to 1/2) not applied at once: %+v", v)
	}
	d.Update(View{Source: "consul", Total: 2, Local: 1, Weight: math.NaN(), ObservedAt: clk.Now()})
	d.Update(View{Source: "consul", Total: 2, Local: 1, Weight: 0, ObservedAt: clk.Now()})
	d.Update(View{Source: "consul", Total: 2, Local: 1, Weight: 1.5, ObservedAt: clk.Now()})
	if v := d.View(); !sameCounts(v, first) {
		t.Fatalf("a view with a weight outside (0, 1] was taken: %+v", v)
	}
}

// TestDamperRealTimers runs a damper on the real clock: a grow applies
// after Hold, through a real timer, and nothing outlives Run (goleak).
func TestDamperRealTimers(t *testing.T) {
	t.Parallel()
	applied := make(chan time.Time, 10)
	d, err := NewDamper(replicasView("consul", 3), DamperConfig{Hold: 100 * time.Millisecond, OnUpdate: func(v View) {
		if v.Weight == 1 {
			applied <- time.Now()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	runDamper(t, d)
	d.Update(seen(3, 1, time.Now()))
	start := time.Now()
	d.Update(seen(1, 1, time.Now()))
	select {
	case at := <-applied:
		if took := at.Sub(start); took < 100*time.Millisecond {
			t.Fatalf("grow applied after %s, before Hold", took)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("grow not applied within 5 s")
	}
	// A pending grow when Run ends is dropped with its timer.
	d.Update(seen(4, 1, time.Now()))
	d.Update(seen(2, 1, time.Now()))
	if _, _, ok := d.Pending(); !ok {
		t.Fatal("no pending grow")
	}
}

func TestDamperRunTwiceAndConfig(t *testing.T) {
	t.Parallel()
	d, err := NewDamper(replicasView("static", 1), DamperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if d.hold != DefaultHold {
		t.Fatalf("zero Hold gives %s, want DefaultHold", d.hold)
	}
	runDamper(t, d)
	if err := d.Run(t.Context()); !errors.Is(err, ErrDamperRunning) {
		t.Fatalf("second Run = %v, want ErrDamperRunning", err)
	}
	if _, err := NewDamper(replicasView("static", 1), DamperConfig{Hold: -time.Second}); err == nil {
		t.Fatal("a negative Hold was accepted")
	}
}

// TestDamperBeforeRun checks that a grow never applies while Run does not
// run (tighter, never looser), and applies once Run starts if it is due.
func TestDamperBeforeRun(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	var sub subscriber
	d, err := NewDamper(replicasView("consul", 2), DamperConfig{Hold: time.Second, Clock: clk.Now, AfterFunc: clk.AfterFunc, OnUpdate: sub.update})
	if err != nil {
		t.Fatal(err)
	}
	d.Update(seen(2, 1, clk.Now()))
	d.Update(seen(1, 1, clk.Now()))
	clk.Advance(5 * time.Second)
	if w := d.View().Weight; w != 0.5 {
		t.Fatalf("before Run: weight %v, want the grow held at 1/2", w)
	}
	runDamper(t, d)
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return d.View().Weight == 1 }, "the due grow to apply when Run starts"))
	if pub, _ := sub.last(); pub.Weight != 1 {
		t.Fatalf("subscriber has %+v", pub)
	}
}

// TestDamperConfirmedInitial starts a damper from a view its source has
// already confirmed (one restored from a state file, say): that view was
// seen, so a view that grows the weight from it is held for Hold like any
// other grow, not applied at once as the first answer after a guess is.
func TestDamperConfirmedInitial(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	t0 := clk.Now()
	var sub subscriber
	initial := seen(4, 1, t0.Add(-time.Minute))
	d := newFakeDamper(t, clk, initial, time.Second, &sub)
	clk.Advance(100 * time.Millisecond)
	grow := seen(2, 1, clk.Now())
	d.Update(grow)
	if v := d.View(); v.Weight != 0.25 {
		t.Fatalf("a grow from a confirmed initial view applied at once: weight %v, want 1/4 held", v.Weight)
	}
	if pub, _ := sub.last(); pub.Weight != 0.25 {
		t.Fatalf("subscriber got weight %v, want 1/4", pub.Weight)
	}
	if pv, at, ok := d.Pending(); !ok || pv.Weight != 0.5 || !at.Equal(clk.Now().Add(time.Second)) {
		t.Fatalf("Pending = %v at %s (%v), want 1/2 a Hold from now", pv.Weight, at.Sub(t0), ok)
	}
	clk.Advance(time.Second - time.Nanosecond)
	if v := d.View(); v.Weight != 0.25 {
		t.Fatalf("1 ns before Hold: weight %v, want 1/4", v.Weight)
	}
	clk.Advance(time.Nanosecond)
	if v := d.View(); v.Weight != 0.5 {
		t.Fatalf("Hold after the grow: weight %v, want 1/2", v.Weight)
	}
}

// TestDamperBadInitial checks that a damper never starts with a weight
// outside (0, 1] in force: NaN, 0 or more than 1 would reach the engine
// before the first view, and Update refuses the same weights.
func TestDamperBadInitial(t *testing.T) {
	t.Parallel()
	for _, w := range []float64{math.NaN(), 0, -0.5, 1.5, math.Inf(1), math.Inf(-1)} {
		t.Run(fmt.Sprint(w), func(t *testing.T) {
			t.Parallel()
			v := replicasView("consul", 2)
			v.Weight = w
			d, err := NewDamper(v, DamperConfig{})
			if err == nil {
				t.Fatalf("NewDamper took an initial weight of %v; in force: %v", w, d.View().Weight)
			}
		})
	}
	if _, err := NewDamper(View{}, DamperConfig{}); err == nil {
		t.Fatal("NewDamper took the zero View, weight 0")
	}
}

// TestDamperCountedAgainAppliesAtOnce: a view that counts this replica when
// the one in force did not (absent: weight AbsentWeight) applies at once,
// though it grows the weight: its peers, on the same catalog, shrink at once
// to leave it that share. Any other grow is still held.
func TestDamperCountedAgainAppliesAtOnce(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	var sub subscriber
	d := newFakeDamper(t, clk, replicasView("consul", 2), DefaultHold, &sub)
	d.Update(seen(4, 1, clk.Now()))
	clk.Advance(time.Second)
	absent := View{Source: "consul", Total: 3, Local: 0, TotalWeight: 3, Weight: AbsentWeight, ObservedAt: clk.Now(), Fault: FaultAbsent}
	d.Update(absent)
	if v := d.View(); v.Weight != AbsentWeight {
		t.Fatalf("absent: %+v, want AbsentWeight at once (a shrink)", v)
	}
	clk.Advance(time.Second)
	back := seen(4, 1, clk.Now())
	d.Update(back)
	if v := d.View(); !sameCounts(v, back) {
		t.Fatalf("counted again: %+v, want it at once", v)
	}
	clk.Advance(time.Second)
	d.Update(seen(3, 1, clk.Now()))
	if v := d.View(); v.Weight != 0.25 {
		t.Fatalf("a peer gone: %+v, want the grow to 1/3 held", v)
	}
}
