package rlqs

import (
	"testing"
	"time"
)

// After a restart, the node's Envoys still enforce the assignments of the
// previous process, which this one does not know, until each has reported
// here. For StartHold after the service starts, a stream's part is at most
// the rate its Envoy reported admitting; then the parts grow as usual.
func TestStartHoldCapsPartsAtReportedAdmits(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.Hold = 0; o.StartHold = 6 * time.Second })
	f.eng.limit("edge", "tenant=a", 1, 100, 100, 1)
	a, _ := f.stream()
	// A admitted 30/s under its old assignment (and was denied more).
	got := envoyRate(assignment(f.exchange(a, report("edge", usage(tenantA, 150, 350, 5*time.Second))), tenantA))
	if got > 30+1e-9 {
		t.Fatalf("A's part just after the start: %.2f/s, more than the 30/s it reported admitting", got)
	}
	f.clock.advance(2 * time.Second)
	b, _ := f.stream()
	got = envoyRate(assignment(f.exchange(b, report("edge", usage(tenantA, 100, 0, 5*time.Second))), tenantA))
	if got > 20+1e-9 {
		t.Fatalf("B's part 2 s after the start: %.2f/s, more than the 20/s it reported admitting", got)
	}
	checkSums(t, f.svc.Snapshot())
	// Once the hold is over, A's part grows to its demand's share.
	f.clock.advance(5 * time.Second)
	f.svc.Tick()
	eventually(t, "A's part to grow past 30/s", func() bool {
		f.clock.advance(sweepEvery)
		f.svc.Tick()
		for _, bk := range f.svc.Snapshot().Buckets {
			for _, p := range bk.Parts {
				if p.Stream == 1 && p.Rate > 31 {
					return true
				}
			}
		}
		return false
	})
}

// A new bucket's first report (time_elapsed 0) comes while other Envoys,
// yet to report, may still enforce all of the share under the previous
// process's assignments: StartHold denies it, and it gets its part once
// the hold is over.
func TestStartHoldDeniesNewBuckets(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.Hold = 0; o.StartHold = 6 * time.Second })
	f.eng.limit("edge", "tenant=a", 1, 100, 100, 1)
	a, _ := f.stream()
	if got := envoyRate(assignment(f.exchange(a, report("edge", usage(tenantA, 1, 0, 0))), tenantA)); got != 0 {
		t.Fatalf("a new bucket just after the start: %.2f/s, want DENY_ALL", got)
	}
	f.clock.advance(6 * time.Second)
	f.svc.Tick()
	f.svc.Tick()
	r, err := recvWithin(t, a, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := envoyRate(assignment(r, tenantA)); got < 99 {
		t.Fatalf("the new bucket once the hold is over: %.2f/s, want the share", got)
	}
}

// A daemon restarts (no state file). Envoy X still enforces the part the
// old process gave it; before X's next report (up to 5 s), Envoy Y sees
// its first request for the same id: a new bucket, time_elapsed 0, which
// the start hold denies. X's old part and Y's new one together must stay
// within the share until X reports. The hold runs from Serving, not New:
// the daemon builds the service before it serves (with --xds-server it
// waits for the first config first), and X reports only after Serve.
func TestStartHoldNewBucketBesideAnEnvoyYetToReport(t *testing.T) {
	for _, serveAfter := range []time.Duration{0, 7 * time.Second} {
		t.Run("serving "+serveAfter.String()+" after New", func(t *testing.T) { newBucketBesideOld(t, serveAfter) })
	}
}

func newBucketBesideOld(t *testing.T, serveAfter time.Duration) {
	eng := newFakeEngine()
	clock := &fakeClock{}
	clock.ns.Store(int64(time.Hour))
	eng.limit("edge", "tenant=a", 1, 100, 100, 1)
	id := map[string]string{"tenant": "a"}
	opt := Options{Engine: eng, Clock: clock.now, Hold: 200 * time.Millisecond, StartHold: 6 * time.Second, AbandonAfter: time.Minute, Queue: 1 << 10}
	oldOpt := opt
	oldOpt.StartHold = 0 // it had run for long
	old, err := New(oldOpt)
	if err != nil {
		t.Fatal(err)
	}
	x := old.open(func(error) {}, "x")
	var lx modelLimiter
	old.report(x, report("edge", usage(id, 400, 0, 5*time.Second)))
	for range 30 {
		clock.advance(100 * time.Millisecond)
		old.Tick()
		pumpInto(x, &lx, clock.now())
	}
	t.Logf("X enforces %.1f/s, burst %.0f, from the old process", lx.rate, lx.max)
	// Restart: a new Service, the same clock; X has not reported yet.
	clock.advance(time.Second)
	svc, err := New(opt)
	if err != nil {
		t.Fatal(err)
	}
	clock.advance(serveAfter)
	svc.Serving()
	y := svc.open(func(error) {}, "y")
	var ly modelLimiter
	svc.report(y, report("edge", usage(id, 1, 0, 0)))
	for range 20 {
		clock.advance(100 * time.Millisecond)
		svc.Tick()
		pumpInto(y, &ly, clock.now())
	}
	t.Logf("Y is given %.1f/s, burst %.0f, by the new process", ly.rate, ly.max)
	if lx.rate+ly.rate > 100+1e-9 {
		t.Fatalf("X's %.1f/s and Y's %.1f/s: %.1f/s, over the share of 100/s", lx.rate, ly.rate, lx.rate+ly.rate)
	}
}

// The same after a restart, with only inherited buckets: the StartHold cap
// is the rate an Envoy reported admitting, and what it admitted over the
// period includes its burst. X (old part 1/s, burst 10, of 10/s and 100)
// spent its burst and its rate over the 5 s period: 15 requests, 3/s. It
// reports first and is capped at 3/s, three times its old part, while Y
// still enforces its old 8/s.
func TestStartHoldAdmitsLessTheBurst(t *testing.T) {
	eng := newFakeEngine()
	clock := &fakeClock{}
	clock.ns.Store(int64(time.Hour))
	eng.limit("edge", "tenant=a", 1, 10, 100, 1)
	id := map[string]string{"tenant": "a"}
	opt := Options{Engine: eng, Clock: clock.now, Hold: 200 * time.Millisecond, StartHold: 6 * time.Second, AbandonAfter: time.Minute, Queue: 1 << 10}
	oldOpt := opt
	oldOpt.StartHold = 0 // it had run for long
	old, err := New(oldOpt)
	if err != nil {
		t.Fatal(err)
	}
	x, y := old.open(func(error) {}, "x"), old.open(func(error) {}, "y")
	var lx, ly modelLimiter
	old.report(x, report("edge", usage(id, 5, 0, 5*time.Second)))
	old.report(y, report("edge", usage(id, 40, 0, 5*time.Second)))
	for range 30 {
		clock.advance(100 * time.Millisecond)
		old.Tick()
		pumpInto(x, &lx, clock.now())
		pumpInto(y, &ly, clock.now())
	}
	t.Logf("old process: X %.1f/s burst %.0f, Y %.1f/s burst %.0f", lx.rate, lx.max, ly.rate, ly.max)
	// X spends its burst and its rate for 5 s: it reports what it admitted.
	admitted := float64(lx.drain(clock.now())) + 5*lx.rate
	clock.advance(time.Second)
	svc, err := New(opt)
	if err != nil {
		t.Fatal(err)
	}
	x2 := svc.open(func(error) {}, "x")
	var lx2 modelLimiter
	lx2 = lx
	svc.report(x2, report("edge", usage(id, uint64(admitted), 500, 5*time.Second)))
	for range 20 {
		clock.advance(100 * time.Millisecond)
		svc.Tick()
		pumpInto(x2, &lx2, clock.now())
	}
	t.Logf("new process: X reported %.0f admitted over 5 s and is given %.1f/s; Y still enforces %.1f/s", admitted, lx2.rate, ly.rate)
	x2rate := lx2.rate
	if !lx2.has {
		x2rate = 0 // a blanket rule
	}
	if x2rate+ly.rate > 10+1e-9 {
		t.Fatalf("X's %.1f/s and Y's old %.1f/s: %.1f/s, over the share of 10/s", x2rate, ly.rate, x2rate+ly.rate)
	}
}
