package server

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

func TestAdmittedRing(t *testing.T) {
	t.Parallel()
	var r admittedRing
	const n = 1_000_000 // any slot number; the ring only looks at it modulo its size
	for range 3 {
		r.add(n, false)
	}
	r.add(n, true)
	r.add(n+2, false)
	ok, over := r.read(n-1, n+3)
	if fmt.Sprint(ok, over) != "[0 3 0 1 0] [0 1 0 0 0]" {
		t.Fatalf("slots n-1..n+3: admitted %v, over %v", ok, over)
	}
	// A whole ring later, slot n's place is slot n+admittedSlots: it starts
	// from nothing, and slot n reads as nothing rather than as the new one.
	r.add(n+admittedSlots, true)
	if ok, over := r.read(n+admittedSlots, n+admittedSlots); ok[0] != 0 || over[0] != 1 {
		t.Fatalf("slot n+%d after the turn: admitted %v, over %v; want 0, 1", admittedSlots, ok, over)
	}
	if ok, over := r.read(n, n); ok[0] != 0 || over[0] != 0 {
		t.Fatalf("slot n after its place turned over: admitted %v, over %v; want nothing", ok, over)
	}
	// A reading older than the slot in its place is in no slot: counted late.
	r.add(n, false)
	if got := r.late.Load(); got != 1 {
		t.Fatalf("late = %d after a decision a ring too old, want 1", got)
	}
	if ok, _ := r.read(n+admittedSlots, n+admittedSlots); ok[0] != 0 {
		t.Fatalf("a too-old decision landed in slot n+%d", admittedSlots)
	}
}

// TestAdmittedRingConcurrent is the ring's model test: goroutines read a
// shared clock and count decisions in its slot, stalling at random between
// the reading and the count, while the clock runs through three turns of
// the ring (it moves on once every goroutine has read it, as a real clock
// outruns no request by a whole ring). Every decision is in its own slot,
// exactly: none lost to a turn-over, none counted twice, none late.
func TestAdmittedRingConcurrent(t *testing.T) {
	t.Parallel()
	const (
		workers = 8
		start   = 17_000_000_000 // about now, in slots since the Unix epoch
		end     = start + 3*admittedSlots
	)
	var r admittedRing
	var clock atomic.Int64
	clock.Store(start)
	var seen [workers]atomic.Int64
	counted := make([]map[int64][2]uint32, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			mine := map[int64][2]uint32{}
			for {
				n := clock.Load()
				if n >= end {
					break
				}
				for range rng.IntN(4) {
					if rng.IntN(8) == 0 {
						runtime.Gosched() // a stall between the reading and the count
					}
					over := rng.IntN(3) == 0
					r.add(n, over)
					c := mine[n]
					if over {
						c[1]++
					} else {
						c[0]++
					}
					mine[n] = c
				}
				seen[w].Store(n)
			}
			counted[w] = mine
		}()
	}
	for n := int64(start); n < end; n = clock.Add(1) {
		for w := range seen {
			for seen[w].Load() < n {
				runtime.Gosched()
			}
		}
	}
	wg.Wait()
	want := map[int64][2]uint32{}
	for _, mine := range counted {
		for n, c := range mine {
			x := want[n]
			want[n] = [2]uint32{x[0] + c[0], x[1] + c[1]}
		}
	}
	from, to := int64(end-admittedSlots+2), int64(end-1)
	ok, over := r.read(from, to)
	var total uint64
	for n := from; n <= to; n++ {
		if got, w := [2]uint32{ok[n-from], over[n-from]}, want[n]; got != w {
			t.Errorf("slot %d: counted %v, want %v", n, got, w)
		}
		total += uint64(ok[n-from] + over[n-from])
	}
	if total == 0 {
		t.Fatal("the model counted nothing")
	}
	if late := r.late.Load(); late != 0 {
		t.Errorf("%d decisions counted late; no reading was a ring old", late)
	}
}

// TestAdmittedEndpoint: decisions through the service land in the slot of
// the service's clock, as /rlconfig/admitted serves them; ?since and ?rule
// narrow the answer; a rule a reload removes stays listed, retired, with
// what it decided.
func TestAdmittedEndpoint(t *testing.T) {
	f, _, srv := newAdmin(t)
	fixed := &rlsv3.RateLimitRequest{Domain: "test", Descriptors: d2("fixed=one")}
	ask := func(req *rlsv3.RateLimitRequest, times int) {
		for range times {
			if _, err := f.svc.ShouldRateLimit(context.Background(), req); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Local share 1/s, burst 1: of three requests at one instant, one
	// passes, and 200 ms later the bucket holds a fifth of a token.
	f.now = int64(time.Hour) // the clock has run an hour: its slots are the wall clock's
	first := f.svc.slot(f.now)
	ask(fixed, 3)
	ask(&rlsv3.RateLimitRequest{Domain: "test", Descriptors: d2("general=a")}, 2)
	f.now += int64(2 * AdmittedSlot)
	ask(fixed, 1)
	last := f.svc.slot(f.now)
	if last != first+2 {
		t.Fatalf("slots %d then %d, 2 apart by the clock", first, last)
	}

	got := admittedOf(t, srv.URL+fmt.Sprintf("/rlconfig/admitted?since=%d", first))
	if got.FirstSlot != first || got.SlotSeconds != AdmittedSlot.Seconds() || !got.Start.Equal(time.Unix(0, first*int64(AdmittedSlot))) {
		t.Fatalf("first slot %d (want %d), slot %vs, start %v", got.FirstSlot, first, got.SlotSeconds, got.Start)
	}
	if want := time.Unix(0, f.svc.wall0+f.now); !got.Now.Equal(want) {
		t.Errorf("now %v, want the service's clock %v", got.Now, want)
	}
	rows := map[string]RuleAdmitted{}
	for _, r := range got.Rules {
		rows[r.Rule] = r
	}
	if r := rows["test.fixed_one"]; r.Domain != "test" || fmt.Sprint(r.Admitted, r.Over) != "[1 0 0] [2 0 1]" {
		t.Errorf("test.fixed_one: %+v; want admitted [1 0 0], over [2 0 1]", r)
	}
	if r := rows["test.general"]; fmt.Sprint(r.Admitted, r.Over) != "[2 0 0] [0 0 0]" {
		t.Errorf("test.general: %+v", r)
	}
	if len(rows) != 2 {
		t.Errorf("%d rules listed, want the 2 that decided: %+v", len(rows), got.Rules)
	}
	// The metrics agree: the slots count what the counters count.
	if m := series(t, f.metrics); m[`sharelimit_decisions_total{code="OVER_LIMIT",domain="test",rule="test.fixed_one"}`] != 3 {
		t.Errorf("metrics: %v", m)
	}

	got = admittedOf(t, srv.URL+fmt.Sprintf("/rlconfig/admitted?since=%d&rule=test.general", last))
	if len(got.Rules) != 1 || got.FirstSlot != last || fmt.Sprint(got.Rules[0].Admitted) != "[0]" {
		t.Errorf("since the last slot, test.general only: %+v", got)
	}
	// Without since: the whole ring, ending with the slot in progress.
	got = admittedOf(t, srv.URL+"/rlconfig/admitted")
	if n := len(got.Rules[0].Admitted); n != admittedSlots-1 || got.FirstSlot+int64(n)-1 != last {
		t.Errorf("the whole ring: %d slots from %d, want %d ending at %d", n, got.FirstSlot, admittedSlots-1, last)
	}
	if code, _ := get(t, srv.URL+"/rlconfig/admitted?since=x"); code != 400 {
		t.Errorf("since=x: %d, want 400", code)
	}

	// A reload without test.general: it stays, retired, until it ages out.
	next := parseSet(t, `
domain: test
descriptors:
  - key: fixed
    value: one
    rate_limit: {unit: second, requests_per_unit: 2}
`)
	old := f.engine.Set()
	f.metrics.Bind(next)
	f.engine.Swap(next)
	f.metrics.Unbind(old)
	got = admittedOf(t, srv.URL+fmt.Sprintf("/rlconfig/admitted?since=%d", first))
	rows = map[string]RuleAdmitted{}
	for _, r := range got.Rules {
		rows[r.Rule] = r
	}
	if r := rows["test.general"]; !r.Retired || fmt.Sprint(r.Admitted) != "[2 0 0]" {
		t.Errorf("test.general after the reload removed it: %+v; want retired, admitted [2 0 0]", r)
	}
	if r := rows["test.fixed_one"]; r.Retired || fmt.Sprint(r.Admitted, r.Over) != "[1 0 0] [2 0 1]" {
		t.Errorf("test.fixed_one, kept by the reload: %+v", r)
	}
	f.now += int64(admittedSlots * AdmittedSlot)
	for _, r := range admittedOf(t, srv.URL+"/rlconfig/admitted").Rules {
		if r.Retired {
			t.Errorf("a ring later, the retired rule is still listed: %+v", r)
		}
	}
}

func d2(kv string) []*commonv3.RateLimitDescriptor { return []*commonv3.RateLimitDescriptor{d(kv)} }

func admittedOf(t *testing.T, url string) Admitted {
	t.Helper()
	code, body := get(t, url)
	if code != 200 {
		t.Fatalf("GET %s: %d %s", url, code, body)
	}
	var a Admitted
	if err := json.Unmarshal([]byte(body), &a); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	return a
}
