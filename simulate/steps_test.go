package simulate

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/demand"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*max(1, math.Abs(a), math.Abs(b)) }

func names(reps []*replica) []string {
	out := make([]string, len(reps))
	for i, r := range reps {
		out[i] = r.name
	}
	return out
}

func TestWeights(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		shape string
		n     int
		at    time.Duration
		total float64 // × Offered
		want  []float64
	}{
		{"even", Even, 4, 0, 1, []float64{0.25, 0.25, 0.25, 0.25}},
		{"zipf", Zipf, 3, 0, 1, []float64{6.0 / 11, 3.0 / 11, 2.0 / 11}},
		{"hot", Hot, 4, 0, 1, []float64{0.8, 0.2 / 3, 0.2 / 3, 0.2 / 3}},
		{"hot alone", Hot, 1, 0, 1, []float64{1}},
		{"moving, first third", Moving, 3, 9 * time.Second, 1, []float64{0.8, 0.1, 0.1}},
		{"moving, second third", Moving, 3, 10 * time.Second, 1, []float64{0.1, 0.8, 0.1}},
		{"moving, wraps past the replicas", Moving, 2, 25 * time.Second, 1, []float64{0.8, 0.2}},
		{"steps, first quarter", Steps, 2, 0, 0.5, []float64{0.5, 0.5}},
		{"steps, second quarter", Steps, 2, 8 * time.Second, 2, []float64{0.5, 0.5}},
		{"steps, third quarter", Steps, 2, 15 * time.Second, 1, []float64{0.5, 0.5}},
		{"steps, last step", Steps, 2, 30*time.Second - step, 3, []float64{0.5, 0.5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := base(tc.n, tc.shape, true)
			out := make([]float64, tc.n)
			total := c.weights(tc.n, tc.at, out)
			if total != tc.total*c.Offered {
				t.Errorf("total %v, want %v", total, tc.total*c.Offered)
			}
			var sum float64
			for i := range out {
				sum += out[i]
				if !near(out[i], tc.want[i]) {
					t.Errorf("weights %v, want %v", out, tc.want)
					break
				}
			}
			if !near(sum, 1) {
				t.Errorf("weights sum to %v", sum)
			}
		})
	}
}

func TestDue(t *testing.T) {
	t.Parallel()
	const stretched = time.Second
	last := &demand.Report{Rules: []demand.RuleDemand{{ID: ruleID, Offered: 10}}}
	for _, tc := range []struct {
		name    string
		r       replica
		at      time.Duration
		offered float64
		want    bool
	}{
		{"first report at once", replica{}, 0, 0, true},
		{"never sooner than the interval", replica{wrote: true, last: last, lastWrite: 5 * time.Second}, 5*time.Second + stretched - step, 1000, false},
		{"at the interval when demand moved", replica{wrote: true, last: last, lastWrite: 5 * time.Second}, 5*time.Second + stretched, 20, true},
		{"not when demand moved by less than 1/s", replica{wrote: true, last: last, lastWrite: 5 * time.Second}, 5*time.Second + stretched, 10.9, false},
		{"not when demand moved by less than 10%", replica{wrote: true, last: &demand.Report{Rules: []demand.RuleDemand{{Offered: 100}}}, lastWrite: 0}, stretched, 108, false},
		{"always by twice the interval", replica{wrote: true, last: last, lastWrite: 5 * time.Second}, 5*time.Second + 2*stretched, 10, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.r.due(tc.at, stretched, tc.offered); got != tc.want {
				t.Errorf("due = %t, want %t", got, tc.want)
			}
		})
	}
}

func TestApproach(t *testing.T) {
	t.Parallel()
	const burst = 100
	delay := queryGap + growSlack
	for _, tc := range []struct {
		name      string
		grows     []pendingGrow
		target    float64
		at        time.Duration
		wantW     float64
		wantGrows []pendingGrow
	}{
		{"a smaller share at once, dropping the grows", []pendingGrow{{0.6, 2 * time.Second}}, 0.1, time.Second, 0.1, nil},
		{"the same share: nothing waits", nil, 0.25, time.Second, 0.25, nil},
		{"a larger share waits the grow delay", nil, 0.5, time.Second, 0.25, []pendingGrow{{0.5, time.Second + delay}}},
		{"and applies once it has", []pendingGrow{{0.5, time.Second + delay}}, 0.5, time.Second + delay, 0.5, nil},
		{"a still larger one waits its own delay", []pendingGrow{{0.4, 3 * time.Second}}, 0.6, 2 * time.Second, 0.25, []pendingGrow{{0.4, 3 * time.Second}, {0.6, 2*time.Second + delay}}},
		{"the earlier grow applies while the later waits", []pendingGrow{{0.4, 2 * time.Second}, {0.6, 3 * time.Second}}, 0.6, 2 * time.Second, 0.4, []pendingGrow{{0.6, 3 * time.Second}}},
		{"a grow never goes past the latest target", []pendingGrow{{0.6, time.Second}}, 0.4, 2 * time.Second, 0.4, nil},
		{"a waiting grow is lowered to the latest target", []pendingGrow{{0.6, 3 * time.Second}}, 0.4, 2 * time.Second, 0.25, []pendingGrow{{0.4, 3 * time.Second}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := &replica{w: 0.25, tokens: 20, grows: slices.Clone(tc.grows)}
			r.approach(tc.target, tc.at, burst)
			if r.w != tc.wantW {
				t.Errorf("share %v, want %v", r.w, tc.wantW)
			}
			if len(r.grows) != len(tc.wantGrows) || (len(r.grows) > 0 && !slices.Equal(r.grows, tc.wantGrows)) {
				t.Errorf("grows %v, want %v", r.grows, tc.wantGrows)
			}
			if want := 20 * max(tc.wantW*burst, 1) / 25; !near(r.tokens, want) {
				t.Errorf("tokens %v, want %v: the fill ratio kept", r.tokens, want)
			}
		})
	}
}

func TestSetShare(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name             string
		w, tokens, to    float64
		wantTokens, size float64
	}{
		{"halved: half the tokens", 0.5, 25, 0.25, 12.5, 25},
		{"doubled: twice the tokens", 0.25, 25, 0.5, 50, 50},
		{"from the one-token floor", 0.001, 1, 0.5, 50, 50},
		{"to the one-token floor", 0.5, 50, 0.001, 1, 1},
		{"unchanged", 0.5, 7, 0.5, 7, 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := &replica{w: tc.w, tokens: tc.tokens}
			setShare(r, tc.to, 100)
			if r.w != tc.to || !near(r.tokens, tc.wantTokens) {
				t.Errorf("share %v, tokens %v; want %v, %v", r.w, r.tokens, tc.to, tc.wantTokens)
			}
		})
	}
}

// TestEvents: newcomers start with a full bucket at their equal share, the
// others keep theirs; leavers are the last replicas, and the leader drops
// their reports; events apply in time order whatever their order in Config.
func TestEvents(t *testing.T) {
	t.Parallel()
	c := base(3, Even, true)
	c.Events = []Event{{At: 2 * time.Second, Delta: 2}, {At: time.Second, Delta: -1}}
	s := newSim(c)
	if got := names(s.reps); !slices.Equal(got, []string{"node1", "node2", "node3"}) {
		t.Fatalf("replicas %v", got)
	}
	for _, r := range s.reps {
		if !near(r.w, 1.0/3) || !near(r.tokens, c.Limit/3) || r.lastWrite != 0 {
			t.Errorf("%s: share %v, tokens %v, last write %v", r.name, r.w, r.tokens, r.lastWrite)
		}
	}
	s.kv["node3"] = kvReport{index: 1}
	s.kv["node1"] = kvReport{index: 2}
	s.applyEvents(time.Second - step)
	if len(s.reps) != 3 {
		t.Fatalf("an event applied early: %v", names(s.reps))
	}
	s.applyEvents(time.Second)
	if got := names(s.reps); !slices.Equal(got, []string{"node1", "node2"}) {
		t.Errorf("after the leave: %v", got)
	}
	if _, ok := s.kv["node3"]; ok || len(s.kv) != 1 {
		t.Errorf("the leaver's report stayed: %v", s.kv)
	}
	s.applyEvents(2 * time.Second)
	if got := names(s.reps); !slices.Equal(got, []string{"node1", "node2", "node4", "node5"}) {
		t.Fatalf("after the join: %v", got)
	}
	for _, r := range s.reps[2:] {
		if r.w != 0.25 || r.tokens != c.Limit/4 || r.lastWrite != 2*time.Second {
			t.Errorf("newcomer %s: share %v, tokens %v, last write %v", r.name, r.w, r.tokens, r.lastWrite)
		}
	}
	if !near(s.reps[0].w, 1.0/3) {
		t.Errorf("node1's share changed on the join: %v", s.reps[0].w)
	}
	if len(s.events) != 0 {
		t.Errorf("events left: %v", s.events)
	}
}

// TestEqualShares: a smaller equal share applies at once; a larger one
// once it has held for Hold; a shrink while a grow is held cancels it.
func TestEqualShares(t *testing.T) {
	t.Parallel()
	c := base(4, Even, false)
	c.Hold = 2 * time.Second
	s := newSim(c)
	s.leave(2)
	s.equalShares(0)
	if s.reps[0].w != 0.25 || s.reps[0].holdAt != c.Hold || s.reps[0].holdW != 0.5 {
		t.Fatalf("a grow applied before its hold: share %v, held until %v to %v", s.reps[0].w, s.reps[0].holdAt, s.reps[0].holdW)
	}
	s.equalShares(c.Hold - step)
	if s.reps[0].w != 0.25 {
		t.Fatalf("a grow applied before its hold: share %v", s.reps[0].w)
	}
	s.equalShares(c.Hold)
	for _, r := range s.reps {
		if r.w != 0.5 {
			t.Errorf("%s: share %v after the hold, want 0.5", r.name, r.w)
		}
	}
	if s.reps[0].holdAt != -1 {
		t.Errorf("hold still pending: %v", s.reps[0].holdAt)
	}
	s.leave(1)
	s.equalShares(3 * time.Second) // a grow to 1, held
	s.join(3, 3*time.Second+step)
	s.equalShares(3*time.Second + step)
	for _, r := range s.reps {
		if r.w != 0.25 {
			t.Errorf("%s: share %v after the join, want 0.25 at once", r.name, r.w)
		}
	}
	if s.reps[0].holdAt != -1 {
		t.Errorf("a shrink left the held grow pending until %v", s.reps[0].holdAt)
	}
}

// TestDivideAndDeliver: the leader divides the reports in the KV, lists
// them by index, and its parameters reach every replica after the watch
// delay; Consul's load is counted.
func TestDivideAndDeliver(t *testing.T) {
	t.Parallel()
	s := newSim(base(3, Even, true))
	s.kv["node2"] = kvReport{rep: demand.Report{Units: 1, Rules: []demand.RuleDemand{{ID: ruleID, Offered: 100, Admitted: 90}}}, index: 5}
	s.kv["node1"] = kvReport{rep: demand.Report{Units: 1, Rules: []demand.RuleDemand{{ID: ruleID, Offered: 300, Admitted: 130}}}, index: 7}
	s.index, s.res.ReportBytes = 7, 40
	if err := s.divide(time.Second, time.Unix(1, 0)); err != nil {
		t.Fatal(err)
	}
	if len(s.pending) != 1 || s.pending[0].at != time.Second+watchDelay {
		t.Fatalf("pending %+v", s.pending)
	}
	p := s.pending[0].p
	wantRefs := []demand.ReportRef{{Index: 5, Node: demand.TagOf("node2")}, {Index: 7, Node: demand.TagOf("node1")}}
	if !slices.Equal(p.Reports, wantRefs) || p.Snapshot != 7 || p.Leader != "node1" || p.At != time.Unix(1, 0).UnixNano() {
		t.Errorf("params %+v", p)
	}
	rule := demand.Divide(400, 3, []demand.Want{{Units: 1, Offered: 300}, {Units: 1, Offered: 100}}, demand.DefaultHeadroom, demand.DefaultFloor)
	// The encoding keeps K and R to a float32, rounded down.
	if rp := p.Find(ruleID); rp == nil || rp.Admitted != 220 || p.Units != rule.Units || math.Abs(rp.K-rule.K) > 1e-6 || math.Abs(rp.R-rule.R) > 1e-6 {
		t.Errorf("rule %+v, want %+v admitted 220", rp, rule)
	}
	if s.index != 8 || s.res.ParamsBytes == 0 || s.leaderBytes != 80 || s.paramsBytes != float64(3*s.res.ParamsBytes) {
		t.Errorf("index %d, params %d B, leader read %v B, served %v B", s.index, s.res.ParamsBytes, s.leaderBytes, s.paramsBytes)
	}
	s.deliver(time.Second + watchDelay - step)
	if s.reps[0].params != nil {
		t.Fatal("parameters delivered before the watch delay")
	}
	s.deliver(time.Second + watchDelay)
	for _, r := range s.reps {
		if r.params == nil || r.params.Snapshot != 7 {
			t.Errorf("%s: params %+v", r.name, r.params)
		}
	}
	if len(s.pending) != 0 {
		t.Errorf("pending %+v", s.pending)
	}
}

// TestReport: a write takes the next KV index, is kept in the replica's
// history and counted in the second.
func TestReport(t *testing.T) {
	t.Parallel()
	s := newSim(base(2, Even, true))
	r := s.reps[1]
	for i, at := range []time.Duration{time.Second, 2 * time.Second} {
		if err := s.report(r, at, time.Unix(0, 0).Add(at), 12.5, 10); err != nil {
			t.Fatal(err)
		}
		want := uint64(i + 1)
		got := s.kv["node2"]
		if got.index != want || s.index != want || got.rep.Seq != want || got.rep.Node != "node2" || r.last.Seq != want || r.lastWrite != at || !r.wrote {
			t.Errorf("write %d: kv %+v, index %d, last %+v at %v", i, got, s.index, r.last, r.lastWrite)
		}
		if d := got.rep.Find(ruleID); d == nil || !near(d.Offered, 12.5) || !near(d.Admitted, 10) {
			t.Errorf("write %d: rule %+v", i, d)
		}
	}
	if s.writes != 2 || s.bin.Writes != 2 || s.res.ReportBytes == 0 {
		t.Errorf("writes %v, in the bin %d, %d B", s.writes, s.bin.Writes, s.res.ReportBytes)
	}
	p := &demand.Params{Reports: []demand.ReportRef{{Index: 2, Node: demand.TagOf("node2")}}}
	if _, standing := r.hist.Reported(p, r.name); standing != demand.Counted {
		t.Errorf("the last report is %v in the replica's history", standing)
	}
}

// TestTarget: without parameters, or a rule in them, a replica keeps its
// equal share; a counted replica gets demand.Share's; one the division did
// not count gets no more than the equal share the division assumed.
func TestTarget(t *testing.T) {
	t.Parallel()
	s := newSim(base(2, Even, true))
	busy, idle := s.reps[0], s.reps[1]
	if got := busy.target(0.5, 400, 2); got != 0.5 {
		t.Errorf("no parameters: %v, want the equal share", got)
	}
	busy.params = &demand.Params{Units: 2}
	if got := busy.target(0.5, 400, 2); got != 0.5 {
		t.Errorf("no rule: %v, want the equal share", got)
	}
	for _, x := range []struct {
		r       *replica
		offered float64
	}{{busy, 300}, {idle, 50}} {
		if err := s.report(x.r, time.Second, time.Unix(1, 0), x.offered, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.divide(time.Second, time.Unix(1, 0)); err != nil {
		t.Fatal(err)
	}
	s.deliver(time.Second + watchDelay)
	b, i := busy.target(0.5, 400, 2), idle.target(0.5, 400, 2)
	p := busy.params
	g, _ := demand.Share(p.Rule(p.Find(ruleID)), 1, 300, false, 2)
	if b != g/400 || b <= 0.5 || i >= 0.5 || b+i > 1 {
		t.Errorf("busy %v (demand.Share %v), idle %v", b, g/400, i)
	}
	s.join(1, 2*time.Second)
	late := s.reps[2]
	late.params = p
	if got := late.target(1.0/3, 400, 3); got > 1.0/3 {
		t.Errorf("a newcomer the division did not count: %v, above its equal share", got)
	}
	if got := busy.target(1.0/3, 400, 3); got >= b {
		t.Errorf("after a join, the busy replica's share %v did not shrink from %v", got, b)
	}
}

// TestTraffic: each bucket refills at its share of L up to its share of B
// (at least one token), and admits what it was offered, up to its tokens.
func TestTraffic(t *testing.T) {
	t.Parallel()
	s := newSim(base(2, Even, true))
	s.reps[0].tokens, s.reps[1].tokens = 0, 199.5
	sumW := s.traffic(0)
	dt := step.Seconds()
	refill, offered := 0.5*400*dt, 800*0.5*dt
	if sumW != 1 {
		t.Errorf("shares sum %v", sumW)
	}
	if r := s.reps[0]; !near(r.admBin, refill) || !near(r.tokens, 0) || r.offered != uint64(offered*1000) || r.admitted != uint64(refill*1000) {
		t.Errorf("an empty bucket: admitted %v, tokens %v, meters %d/%d", r.admBin, r.tokens, r.admitted, r.offered)
	}
	if r := s.reps[1]; !near(r.admBin, offered) || !near(r.tokens, 200-offered) {
		t.Errorf("a full bucket, capped at its share of B: admitted %v, tokens %v", r.admBin, r.tokens)
	}
	if !near(s.bin.Admitted, refill+offered) || !near(s.bin.Offered, 2*offered) {
		t.Errorf("bin %+v", s.bin)
	}
}

// TestCloseBin: a second's bin is stored; its two busiest replicas join the
// busiest, up to four, whose series start with zeros; the replicas are
// back in the order of their names.
func TestCloseBin(t *testing.T) {
	t.Parallel()
	s := newSim(base(12, Even, true))
	second := func(end time.Duration, admitted map[int]float64) {
		for i, a := range admitted {
			s.reps[i-1].admBin = a
		}
		s.bin.Admitted = 42
		s.closeBin(end, 0.9)
	}
	second(time.Second, map[int]float64{1: 5, 2: 9, 3: 7})
	if b := s.res.Bins[0]; b.T != 0 || b.Replicas != 12 || b.Shares != 0.9 || b.Admitted != 42 {
		t.Errorf("bin %+v", b)
	}
	if s.bin != (Bin{}) {
		t.Errorf("the next bin starts at %+v", s.bin)
	}
	second(2*time.Second, map[int]float64{1: 20, 2: 1, 3: 2})
	second(3*time.Second, map[int]float64{10: 20, 11: 30, 12: 40})
	want := map[string][]float64{"node1": {0, 20, 0}, "node2": {9, 1, 0}, "node3": {7, 2, 0}, "node12": {0, 0, 40}}
	if len(s.res.PerReplica) != len(want) {
		t.Fatalf("busiest %v, want %v", s.res.PerReplica, want)
	}
	for n, v := range want {
		if !slices.Equal(s.res.PerReplica[n], v) {
			t.Errorf("%s: %v, want %v", n, s.res.PerReplica[n], v)
		}
	}
	if got := names(s.reps); got[0] != "node1" || got[9] != "node10" || got[11] != "node12" {
		t.Errorf("order after the bin: %v", got)
	}
	for _, r := range s.reps {
		if r.admBin != 0 {
			t.Errorf("%s: %v carried into the next second", r.name, r.admBin)
		}
	}
}

func TestFinish(t *testing.T) {
	t.Parallel()
	c := base(2, Even, true)
	c.Duration = 4 * time.Second
	s := newSim(c)
	s.res.PerReplica["node1"] = []float64{1, 2}
	s.writes, s.leaderBytes, s.paramsBytes = 6, 400, 1000
	r := s.finish()
	if !slices.Equal(r.PerReplica["node1"], []float64{1, 2, 0, 0}) {
		t.Errorf("series %v", r.PerReplica["node1"])
	}
	if r.WritesPerSecond != 1.5 || r.LeaderReadBytesPerS != 100 || r.ParamsServedBytesPer != 250 {
		t.Errorf("rates %v %v %v", r.WritesPerSecond, r.LeaderReadBytesPerS, r.ParamsServedBytesPer)
	}
}

// TestEqualSharesHeldGrowTakesTheSmallest: a join while a grow is held, that
// still leaves the equal share above the one in force, must lower the held
// grow, as the membership damper does (the weight in force is the smallest
// of the views seen during the hold). Applying the first held value gives
// 4 replicas −2 then +1 shares of 0.5 each: 1.5 × the limit.
func TestEqualSharesHeldGrowTakesTheSmallest(t *testing.T) {
	t.Parallel()
	c := base(4, Even, false)
	c.Hold = 2 * time.Second
	s := newSim(c)
	s.leave(2)
	s.equalShares(time.Second) // 2 replicas: a grow to 0.5, held until 3 s
	s.join(1, 2*time.Second)
	s.equalShares(2 * time.Second) // 3 replicas: a grow to 1/3 still held
	for at := 2 * time.Second; at <= 5*time.Second; at += 10 * time.Millisecond {
		s.equalShares(at)
		sum := 0.0
		for _, r := range s.reps {
			sum += r.w
		}
		if sum > 1+1e-9 {
			t.Fatalf("at %v the %d replicas' shares sum to %.3f of the limit", at, len(s.reps), sum)
		}
	}
	for _, r := range s.reps {
		if math.Abs(r.w-1.0/3) > 1e-9 {
			t.Errorf("%s: share %v once the hold passed, want 1/3", r.name, r.w)
		}
	}
}

// TestEqualSharesHeldGrowCancelledOnReturn: replicas that leave and come
// back while the grow is held leave the equal share where it was; the held
// grow must not apply (4 −2 +2 with a 5 s hold gave four shares of 0.5).
func TestEqualSharesHeldGrowCancelledOnReturn(t *testing.T) {
	t.Parallel()
	res, err := Run(Config{Replicas: 4, Limit: 100, Offered: 1000, Shape: Even, Duration: 10 * time.Second,
		Interval: time.Second, MaxWrites: 100, Hold: 5 * time.Second,
		Events: []Event{{At: time.Second, Delta: -2}, {At: 2 * time.Second, Delta: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.MaxShareSum > 1+1e-9 {
		t.Errorf("shares summed to %.3f × the limit", res.MaxShareSum)
	}
}

// TestValidateEventsInTimeOrder: Validate counts replicas in the order Run
// applies the events (by time), not the order given: 1 replica, +1 at 20 s
// and −1 at 10 s leaves none at 10 s and must be refused, not run.
func TestValidateEventsInTimeOrder(t *testing.T) {
	t.Parallel()
	c := Config{Replicas: 1, Limit: 400, Offered: 800, Shape: Hot, Duration: 30 * time.Second,
		Interval: time.Second, MaxWrites: 100, Hold: 2 * time.Second,
		Events: []Event{{At: 20 * time.Second, Delta: 1}, {At: 10 * time.Second, Delta: -1}}}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "leaves 0 replicas") {
		t.Fatalf("Validate: %v, want the 0 replicas at 10 s refused", err)
	}
}
