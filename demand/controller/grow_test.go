package controller

import (
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/demand"
)

// TestAim is the grow delay as a table on a fake clock: a smaller weight
// applies at once and drops the grows waiting; a larger one waits the
// delay from the parameters that asked for it; a bigger one from newer
// parameters waits its own delay, while the smaller one still applies at
// its time; and a grow waiting is capped by a want that fell since.
func TestAim(t *testing.T) {
	const g = 2
	clock := newFakeClock()
	eng := newFakeEngine(0.25, Rule{Identity: shared, Limit: 400})
	c := New(eng, nil, Config{Group: 1, Interval: time.Second, QueryRate: 2, View: nil, Clock: clock.Mono})
	delay := c.growDelay() // 750 ms
	start := clock.Now()
	for i, s := range []struct {
		at     time.Duration
		want   float64
		weight float64
	}{
		{0, 0.1, 0.1},                            // a shrink: at once
		{0, 0.5, 0.1},                            // a grow: waits until delay
		{300 * time.Millisecond, 0.9, 0.1},       // a bigger grow: until 300 ms + delay
		{500 * time.Millisecond, 0.4, 0.1},       // both capped at 0.4, neither due
		{delay, 0.4, 0.4},                        // the first, as capped
		{300*time.Millisecond + delay, 0.9, 0.4}, // the second, capped too; 0.9 asked again waits anew
		{300*time.Millisecond + 2*delay, 0.9, 0.9},
		{300*time.Millisecond + 2*delay, 0.2, 0.2}, // a shrink drops what waits
		{400*time.Millisecond + 2*delay, 0.3, 0.2},
		{400*time.Millisecond + 3*delay, 0.3, 0.3},
	} {
		now := start.Add(s.at)
		c.mu.Lock()
		c.aim(g, s.want, now, int64(s.at), c.growDelay())
		c.mu.Unlock()
		if w := eng.Weight(g); w != s.weight {
			t.Errorf("step %d, at %v asking %v: weight %v, want %v", i, s.at, s.want, w, s.weight)
		}
	}
}

// TestPolicyHotValues: the parameters' hot values take slots, at the equal
// share and then their own after the grow delay; a value they leave out
// stays hot until its share has grown back to equal; stale parameters
// leave the hot values at the equal share; and more hot values than this
// replica holds is warned of once.
func TestPolicyHotValues(t *testing.T) {
	const id = "a|client"
	rule := Rule{Identity: id, Path: "client", Limit: 400, PerValue: true, Slots: 4}
	clock := newFakeClock()
	r := newReplica(t, "n1", 4, newFakeKV(), clock, rule)
	r.c.set.TopKeys = 2
	rid := demand.RuleIDOf(id)
	// Parameters making values hot, each divided among four replicas
	// wanting offered (this replica first), counting its report at index 1
	// which said mine of each.
	deliver := func(values map[uint64][2]float64) {
		rd := demand.RuleDemand{ID: rid}
		rp := demand.RuleParams{ID: rid, Limit: 400}
		for _, v := range []uint64{1, 2, 3, 4} {
			o, ok := values[v]
			if !ok {
				continue
			}
			rd.Values = append(rd.Values, demand.ValueDemand{ID: v, Offered: o[0]})
			div := demand.Divide(400, 4, []demand.Want{{Units: 1, Offered: o[0]}, {Units: 1, Offered: o[1]}, {Units: 1}, {Units: 1}}, demand.DefaultHeadroom, demand.DefaultFloor)
			rp.Values = append(rp.Values, demand.ValueParams{ID: v, K: div.K, R: div.R})
		}
		rep := demand.Report{Seq: 1, Units: 1, Node: "n1", Rules: []demand.RuleDemand{rd}}
		b, _ := demand.AppendReport(nil, &rep)
		dec, _ := demand.DecodeReport(b)
		r.c.mu.Lock()
		r.c.hist.Reset()
		r.c.hist.Add(1, dec)
		r.c.mu.Unlock()
		p := demand.Params{At: clock.Now().UnixNano(), Snapshot: 1, Reports: []demand.ReportRef{{Index: 1, Node: demand.TagOf("n1")}},
			Units: 4, Headroom: demand.DefaultHeadroom, Floor: demand.DefaultFloor, Rules: []demand.RuleParams{rp}}
		pb, err := demand.AppendParams(nil, &p)
		if err != nil {
			t.Fatal(err)
		}
		r.c.onParams(pb, 0)
	}
	hot := func() map[uint64]float64 {
		out := map[uint64]float64{}
		for _, hv := range r.eng.Rules(1)[0].Hot {
			out[hv.ID] = r.eng.Weight(hv.Group)
		}
		return out
	}
	settle := func(d time.Duration) {
		clock.Advance(d)
		r.c.apply(clock.Now())
	}
	deliver(map[uint64][2]float64{1: {1000, 10}, 2: {10, 1000}})
	if h := hot(); len(h) != 2 || h[1] != 0.25 || h[2] > 0.03 {
		t.Fatalf("hot values %v: want 1 at the equal share (a grow waits), 2 shrunk at once", h)
	}
	settle(r.c.growDelay())
	if h := hot(); h[1] < 0.9 {
		t.Fatalf("hot values %v: want 1 grown after the delay", h)
	}
	// Value 2 left out: it stays hot, its share growing back to equal
	// after the delay, and only then cools.
	deliver(map[uint64][2]float64{1: {1000, 10}})
	if h := hot(); len(h) != 2 || h[2] > 0.03 {
		t.Fatalf("hot values %v: want 2 still hot at its small share", h)
	}
	settle(r.c.growDelay())
	if h := hot(); h[2] != 0.25 {
		t.Fatalf("hot values %v: want 2 back at the equal share", h)
	}
	settle(tickEvery)
	if h := hot(); len(h) != 1 {
		t.Fatalf("hot values %v: want 2 cooled", h)
	}
	// Stale parameters: the hot value stays, at the equal share.
	settle(r.c.staleAfter() + time.Second)
	if h := hot(); len(h) != 1 || h[1] != 0.25 {
		t.Fatalf("hot values %v with stale parameters: want 1 at the equal share", h)
	}
	// More hot values than half the slots (its top-keys): warned once.
	deliver(map[uint64][2]float64{1: {100, 100}, 2: {100, 100}, 3: {100, 100}})
	deliver(map[uint64][2]float64{1: {100, 100}, 2: {100, 100}, 3: {100, 100}})
	r.c.mu.Lock()
	warned := r.c.warnedSlots
	r.c.mu.Unlock()
	if !warned || len(hot()) != 3 {
		t.Errorf("three hot values on two top-keys: warned %v, hot %v", warned, hot())
	}
}
