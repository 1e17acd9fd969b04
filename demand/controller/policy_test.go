package controller

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/demand"
	"github.com/sharelimit/sharelimit/demand/consulkv"
	"github.com/sharelimit/sharelimit/internal/testutil"
)

// The policy on a fake clock, with fake engines and a fake store: no
// daemon, no Consul. Each replica meters its load through its engine's
// meters, writes through its store, and the first replica divides.

// shared is the identity of the rule the cluster shares: 400/s, one bucket.
const shared = "a|k_v"

// cluster is n replicas on one fake reports folder and one clock.
type cluster struct {
	t     *testing.T
	kv    *fakeKV
	clock *fakeClock
	reps  []*replica
}

func newCluster(t *testing.T, n int, rules ...Rule) *cluster {
	t.Helper()
	if len(rules) == 0 {
		rules = []Rule{{Identity: shared, Path: "k_v", Limit: 400}}
	}
	cl := &cluster{t: t, kv: newFakeKV(), clock: newFakeClock()}
	for i := range n {
		cl.reps = append(cl.reps, newReplica(t, fmt.Sprintf("n%d", i+1), n, cl.kv, cl.clock, rules...))
	}
	cl.reps[0].st.leading = true
	return cl
}

// run offers each replica its load (per second) of the shared rule for d,
// ticking every replica every tickEvery.
func (cl *cluster) run(d time.Duration, load ...float64) {
	for range int(d / tickEvery) {
		cl.clock.Advance(tickEvery)
		for i, r := range cl.reps {
			n := uint64(load[i] * tickEvery.Seconds())
			r.eng.meter(shared, 0, n, min(n, 10))
			r.c.tick(context.Background())
		}
	}
}

// deliver hands params to every replica, as the watch does.
func (cl *cluster) deliver(params []byte) {
	for _, r := range cl.reps {
		r.c.onParams(params, 0)
	}
}

// settle lets every grow due by now+d apply.
func (cl *cluster) settle(d time.Duration) {
	cl.clock.Advance(d)
	for _, r := range cl.reps {
		r.c.apply(cl.clock.Now())
	}
}

// sum is the sum of the shares in force, as a fraction of L.
func (cl *cluster) sum() float64 {
	var s float64
	for _, r := range cl.reps {
		s += r.weight(shared)
	}
	return s
}

// TestPolicyShares: what this replica (n1) takes under each fault of its
// report, its session, its view or the parameters; and the shares of one
// division never sum past L.
func TestPolicyShares(t *testing.T) {
	const busy, idle = 1000, 10
	floor := 0.25 * demand.DefaultFloor
	for _, tc := range []struct {
		name string
		load []float64
		// fault acts after the load has run and every replica has written
		// its report; it returns the parameters every replica gets, or nil
		// for a division of the reports as they are then.
		fault    func(cl *cluster) []byte
		lo, hi   float64 // the bounds of n1's share once grows applied
		standing demand.Standing
	}{
		{"counted, busy: the busy share", []float64{busy, idle, idle, idle}, nil, 0.9, 1, demand.Counted},
		{"counted, idle: its demand and headroom, and the spread", []float64{idle, busy, idle, idle}, nil, floor, 0.06, demand.Counted},
		{"its write lost on the way back: the floor", []float64{busy, idle, idle, idle}, func(cl *cluster) []byte {
			n1 := cl.reps[0]
			n1.st.fail, n1.st.lost = fmt.Errorf("write: %w", context.DeadlineExceeded), true
			cl.run(3*time.Second, busy, idle, idle, idle)
			return nil
		}, 0, 0.25 * (demand.DefaultFloor + 0.01), demand.Unknown},
		{"its session expired, its report with it: at most equal", []float64{busy, idle, idle, idle}, func(cl *cluster) []byte {
			cl.reps[0].st.expire()
			return nil
		}, 0, 0.25, demand.Absent},
		{"a division from before its session expired, delivered after: the floor", []float64{busy, idle, idle, idle}, func(cl *cluster) []byte {
			params := cl.reps[0].params(cl.t, cl.kv)
			cl.reps[0].st.expire()
			cl.run(tickEvery, busy, idle, idle, idle) // notices, and writes afresh
			return params
		}, 0, 0.25 * (demand.DefaultFloor + 0.01), demand.Unknown},
		{"a stale report divided: its figures, not the latest", []float64{idle, idle, idle, idle}, func(cl *cluster) []byte {
			snap := cl.kv.snapshot()
			cl.run(3*time.Second, busy, idle, idle, idle) // now busy, and written
			b, err := cl.reps[0].c.divide(snap)
			if err != nil {
				cl.t.Fatal(err)
			}
			return b
		}, floor, 0.26, demand.Counted},
		{"its session unrenewed nearly a TTL: at most equal", []float64{busy, idle, idle, idle}, func(cl *cluster) []byte {
			cl.reps[0].st.renewed = cl.clock.Now().Add(-(sessionTTL - sessionMargin + time.Second))
			return nil
		}, 0, 0.25, demand.Counted},
		{"its node not passing: at most equal", []float64{busy, idle, idle, idle}, func(cl *cluster) []byte {
			mv := cl.reps[0].membership()
			mv.Local, mv.LocalWeight = 0, 0
			cl.reps[0].setView(mv)
			return nil
		}, 0, 0.25, demand.Counted},
		{"a replica joined since the division: scaled to fit it", []float64{busy, idle, idle, idle}, func(cl *cluster) []byte {
			params := cl.reps[0].params(cl.t, cl.kv)
			for _, r := range cl.reps {
				mv := r.membership()
				mv.Total, mv.TotalWeight, mv.Weight = 5, 5, 0.2
				r.setView(mv)
			}
			return params
		}, 0.7, 0.8, demand.Counted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cl := newCluster(t, 4)
			cl.run(3*time.Second, tc.load...)
			var params []byte
			if tc.fault != nil {
				params = tc.fault(cl)
			}
			if params == nil {
				params = cl.reps[0].params(t, cl.kv)
			}
			cl.deliver(params)
			cl.settle(cl.reps[0].c.growDelay())
			got := cl.reps[0].weight(shared)
			t.Logf("n1's share %.4f, sum %.4f", got, cl.sum())
			if got < tc.lo || got > tc.hi {
				t.Errorf("n1's share %.4f, want within [%.4f, %.4f]", got, tc.lo, tc.hi)
			}
			if st := cl.reps[0].standing(); st != tc.standing {
				t.Errorf("n1's report %s, want %s", st, tc.standing)
			}
			if s := cl.sum(); s > 1+1e-9 {
				t.Errorf("the shares sum to %.6f of L", s)
			}
		})
	}
}

// TestPolicyGrowDelay: a smaller share applies at once; a larger one only
// once it has waited the grow delay; a bigger grow from newer parameters
// waits its own full delay while the smaller one still applies at its time.
func TestPolicyGrowDelay(t *testing.T) {
	cl := newCluster(t, 4)
	n1 := cl.reps[0]
	if d := n1.c.growDelay(); d != 750*time.Millisecond {
		t.Fatalf("grow delay %v: the steps below assume 750 ms (a query rate of 2)", d)
	}
	cl.run(3*time.Second, 10, 1000, 10, 10)
	cl.deliver(n1.params(t, cl.kv))
	cold := n1.weight(shared)
	if cold > 0.05 {
		t.Fatalf("an idle replica's share %.4f, not shrunk at once", cold)
	}
	cl.run(2*time.Second, 100, 1000, 10, 10)
	cl.deliver(n1.params(t, cl.kv)) // at t: a grow to about 100/s, due at t+750ms
	for _, s := range []struct {
		ticks   int // of 100 ms, n1 offering 1000/s
		deliver bool
		lo, hi  float64
		what    string
	}{
		{3, true, cold, cold, "t+300ms, neither grow applies; newer parameters ask for more, due at t+1050ms"},
		{5, false, 0.2, 0.3, "t+800ms, the first grow applies, as it was"},
		{2, false, 0.2, 0.3, "t+1000ms, the bigger grow still waits"},
		{1, false, 0.3, 1, "t+1100ms, the bigger grow applies"},
	} {
		cl.run(time.Duration(s.ticks)*tickEvery, 1000, 10, 10, 10)
		if s.deliver {
			cl.deliver(n1.params(t, cl.kv))
		}
		if w := n1.weight(shared); w < s.lo-1e-9 || w > s.hi+1e-9 {
			t.Errorf("%s: share %.4f, want within [%.4f, %.4f]", s.what, w, s.lo, s.hi)
		}
	}
}

// TestPolicyParamsFallBack: parameters that are stale, that divide another
// limit than this replica's, or that do not decode give the equal share
// (garbage leaves the parameters in force standing, and is counted).
func TestPolicyParamsFallBack(t *testing.T) {
	for _, tc := range []struct {
		name  string
		act   func(cl *cluster)
		equal bool
	}{
		{"fresh", func(*cluster) {}, false},
		{"garbage after them", func(cl *cluster) { cl.reps[0].c.onParams([]byte("garbage"), 0) }, false},
		{"stale", func(cl *cluster) { cl.settle(cl.reps[0].c.staleAfter() + time.Second) }, true},
		{"another limit", func(cl *cluster) {
			n1 := cl.reps[0]
			n1.eng.mu.Lock()
			n1.eng.rule(shared).Limit = 500
			n1.eng.mu.Unlock()
			n1.c.apply(cl.clock.Now())
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cl := newCluster(t, 4)
			cl.run(3*time.Second, 1000, 10, 10, 10)
			cl.deliver(cl.reps[0].params(t, cl.kv))
			cl.settle(cl.reps[0].c.growDelay())
			tc.act(cl)
			w := cl.reps[0].weight(shared)
			if tc.equal && w != 0.25 {
				t.Errorf("share %.4f, want the equal 0.25", w)
			}
			if !tc.equal && w < 0.9 {
				t.Errorf("share %.4f, want the busy share", w)
			}
		})
	}
}

// TestPolicyReportDue: when a report is written: not within the interval;
// at its end only when the demand moved by more than the threshold (and
// 1/s), or its units changed; and after two intervals as a heartbeat.
func TestPolicyReportDue(t *testing.T) {
	for _, tc := range []struct {
		name  string
		at    time.Duration // since the last report, a multiple of tickEvery
		load  float64       // from the last report on, per second (it was 100)
		units int
		want  bool
	}{
		{"within the interval, moved", 500 * time.Millisecond, 1000, 1, false},
		{"at the interval, not moved", time.Second, 100, 1, false},
		{"at the interval, moved less than the threshold", time.Second, 108, 1, false},
		{"at the interval, moved more than the threshold", time.Second, 130, 1, true},
		{"at the interval, its units changed", time.Second, 100, 2, true},
		{"the heartbeat", 2 * time.Second, 100, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cl := newCluster(t, 1)
			r := cl.reps[0]
			cl.run(4*time.Second, 100) // the heartbeat at 3.1 s wrote about 100/s
			r.c.mu.Lock()
			r.c.lastAt = cl.clock.Now() // as if just written
			r.c.mu.Unlock()
			mv := r.membership()
			mv.LocalWeight = tc.units
			r.mu.Lock()
			r.view = mv
			r.mu.Unlock()
			before := cl.kv.snapshot().Index
			cl.run(tc.at-tickEvery, tc.load)
			mid := cl.kv.snapshot().Index
			cl.run(tickEvery, tc.load)
			if mid != before {
				t.Fatalf("written before the interval")
			}
			if wrote := cl.kv.snapshot().Index != mid; wrote != tc.want {
				t.Errorf("written %v, want %v", wrote, tc.want)
			}
		})
	}
}

// TestPolicyWriteFailures: a failed write is counted by cause, shown while
// it lasts, warned of once per cause, and retried an interval later; a
// write with no session yet is neither counted nor delayed.
func TestPolicyWriteFailures(t *testing.T) {
	cl := newCluster(t, 1)
	r := cl.reps[0]
	logs := &testutil.Buffer{}
	r.c.log = slog.New(slog.NewTextHandler(logs, nil))
	cl.run(time.Second, 100)
	held := fmt.Errorf("%w: k: held by session x", consulkv.ErrHeld)
	r.st.fail = held
	cl.run(5*time.Second, 100) // heartbeats, refused
	r.c.mu.Lock()
	n, shown := r.c.writeErrs[writeHeld], r.c.writeErr
	r.c.mu.Unlock()
	if n < 2 || !strings.HasPrefix(shown, "held: ") {
		t.Errorf("refused writes counted %d, shown %q", n, shown)
	}
	if got := strings.Count(logs.String(), "demand report not written"); got != 1 {
		t.Errorf("warned %d times, want once:\n%s", got, logs)
	}
	r.st.fail = consulkv.ErrNoSession
	before := r.c.failures
	cl.run(3*time.Second, 100)
	if r.c.failures != before {
		t.Errorf("a write without a session counted as failed")
	}
	r.st.fail = nil
	cl.run(tickEvery, 100) // no session was not a failure: no wait
	if st := r.c.Status(); st.WriteError != "" || !strings.Contains(logs.String(), "demand report written again") {
		t.Errorf("after a good write: status %+v, log:\n%s", st, logs)
	}
}

// TestPolicyLeaderSkipsWhatItCannotCount: the leader leaves out the report
// of a node with no passing instance, and counts neither of two reports
// written at one index; their replicas keep at most their equal shares.
func TestPolicyLeaderSkipsWhatItCannotCount(t *testing.T) {
	cl := newCluster(t, 4)
	cl.run(3*time.Second, 1000, 1000, 10, 10)
	leader := cl.reps[0]
	leader.c.set.Passing = func() []string { return []string{"n1", "n3", "n4"} }
	snap := cl.kv.snapshot()
	snap.Reports[3].ModifyIndex = snap.Reports[2].ModifyIndex // n3's and n4's in one transaction
	b, err := leader.c.divide(snap)
	if err != nil {
		t.Fatal(err)
	}
	p, err := demand.DecodeParams(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Reports) != 1 || p.Reports[0].Node != demand.TagOf("n1") {
		t.Fatalf("reports counted %+v, want n1's alone", p.Reports)
	}
	cl.deliver(b)
	cl.settle(leader.c.growDelay())
	for i, r := range cl.reps[1:] {
		if w := r.weight(shared); w > 0.25 {
			t.Errorf("n%d, not counted, takes %.4f", i+2, w)
		}
	}
	if s := cl.sum(); s > 1+1e-9 {
		t.Errorf("the shares sum to %.6f of L", s)
	}
}
