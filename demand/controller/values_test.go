package controller

import (
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/demand"
	"github.com/sharelimit/sharelimit/demand/consulkv"
	"github.com/sharelimit/sharelimit/descriptors/engine"
)

// valueRig is a controller over one per-client rule of 400/s shared by
// demand, four replicas of weight 1, on the real engine, no Consul.
type valueRig struct {
	*demandRig
}

const valueYAML = "domain: a\ndescriptors:\n  - key: client\n    rate_limit: {unit: second, requests_per_unit: 400, share: demand}\n"

func newValueRig(t *testing.T) *valueRig {
	t.Helper()
	r := newRig(t, valueYAML, "n1", 4, 4, time.Unix(1_000_000, 0))
	if !r.rule.PerValue {
		t.Fatalf("demand rule %+v is not per value", r.rule)
	}
	return &valueRig{r}
}

func clientDesc(v string) []*commonv3.RateLimitDescriptor {
	return []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "client", Value: v}}}}
}

func (r *valueRig) id(v string) uint64 {
	rule := r.e.Set().Match("a", clientDesc(v)[0].Entries)
	return engine.ValueID(uint64(demand.RuleIDOf(r.rule.Identity)), rule, clientDesc(v)[0].Entries)
}

// admit draws n times for value v and returns how many were admitted.
func (r *valueRig) admit(v string, n int) int {
	ok := 0
	var dec engine.Decision
	for range n {
		if err := r.e.Decide(&dec, "a", clientDesc(v), 1, 0); err != nil {
			r.t.Fatal(err)
		}
		if dec.Code == engine.OK {
			ok++
		}
	}
	return ok
}

// wroteValues records a report of this replica with these values' demand.
func (r *valueRig) wroteValues(values map[string]float64) {
	r.idx++
	rd := demand.RuleDemand{ID: demand.RuleIDOf(r.rule.Identity)}
	for v, o := range values {
		rd.Values = append(rd.Values, demand.ValueDemand{ID: r.id(v), Offered: o})
	}
	sortValues(rd.Values)
	rep := demand.Report{Seq: r.idx, At: r.now.UnixNano(), Units: 1, Node: "n1", Rules: []demand.RuleDemand{rd}}
	b, err := demand.AppendReport(nil, &rep)
	if err != nil {
		r.t.Fatal(err)
	}
	dec, _ := demand.DecodeReport(b)
	r.d.mu.Lock()
	r.d.hist.Add(r.idx, dec)
	r.d.mu.Unlock()
	r.wroteAt = r.idx
}

func sortValues(vs []demand.ValueDemand) {
	for i := range vs {
		for j := i + 1; j < len(vs); j++ {
			if vs[j].ID < vs[i].ID {
				vs[i], vs[j] = vs[j], vs[i]
			}
		}
	}
}

// valueParams delivers parameters in which value v is hot, divided among
// four replicas wanting offered (this replica first).
func (r *valueRig) valueParams(hot map[string][]float64) {
	r.idx++
	rp := demand.RuleParams{ID: demand.RuleIDOf(r.rule.Identity), Limit: 400}
	var units uint32
	for v, offered := range hot {
		wants := make([]demand.Want, len(offered))
		for i, o := range offered {
			wants[i] = demand.Want{Units: 1, Offered: o}
		}
		rule := demand.Divide(400, 4, wants, demand.DefaultHeadroom, demand.DefaultFloor)
		units = rule.Units
		rp.Values = append(rp.Values, demand.ValueParams{ID: r.id(v), K: rule.K, R: rule.R})
	}
	for i := range rp.Values {
		for j := i + 1; j < len(rp.Values); j++ {
			if rp.Values[j].ID < rp.Values[i].ID {
				rp.Values[i], rp.Values[j] = rp.Values[j], rp.Values[i]
			}
		}
	}
	p := demand.Params{At: r.now.UnixNano(), Snapshot: r.idx - 1, Reports: r.counted(), Units: units, Headroom: demand.DefaultHeadroom, Floor: demand.DefaultFloor,
		Leader: "n2", Rules: []demand.RuleParams{rp}}
	b, err := demand.AppendParams(nil, &p)
	if err != nil {
		r.t.Fatal(err)
	}
	r.d.onParams(b, r.idx)
}

// hot is value v's hot value in the engine, or nil.
func (r *valueRig) hot(v string) *Hot {
	for _, rule := range r.d.rules() {
		for _, hv := range rule.Hot {
			if hv.ID == r.id(v) {
				return &hv
			}
		}
	}
	return nil
}

// A value the parameters make hot gets a share of its own (the grow after
// its delay); every other value keeps the equal share; a value the next
// parameters leave out cools, and its bucket's debt goes with it.
func TestHotValues(t *testing.T) {
	r := newValueRig(t)
	r.wroteValues(map[string]float64{"big": 1000})
	r.valueParams(map[string][]float64{"big": {1000, 10, 10, 10}})
	hv := r.hot("big")
	if hv == nil {
		t.Fatalf("big is not hot: %v", r.d.rules())
	}
	if w := r.e.GroupWeight(hv.Group).W; w != 0.25 {
		t.Fatalf("a new hot value starts at %v, want the equal 0.25", w)
	}
	r.tick(r.d.growDelay())
	if w := r.e.GroupWeight(hv.Group).W; w < 0.9 {
		t.Fatalf("after the grow delay big's share is %v, want about 0.9", w)
	}
	if got := r.admit("big", 400); got < 365 || got > 369 {
		t.Errorf("big admitted %d of a burst of 400 at its share, want 368 (400 less three times 10.5)", got)
	}
	if got := r.admit("small", 400); got != 100 {
		t.Errorf("a value that is not hot admitted %d, want its equal share 100", got)
	}
	// The others want big now: this replica's share of it shrinks at once.
	r.wroteValues(map[string]float64{"big": 10})
	r.valueParams(map[string][]float64{"big": {10, 1000, 10, 10}})
	if w := r.e.GroupWeight(hv.Group).W; w > 0.05 {
		t.Errorf("big's share after the others took it: %v, want its demand plus headroom", w)
	}
	// Leaving big out cools it once its share has grown back to the equal
	// share (the grow delay), without a fresh burst: the clock of the
	// buckets stands still here, so its bucket is as spent as it was.
	r.valueParams(map[string][]float64{})
	r.tick(r.d.growDelay())
	r.tick(tickEvery)
	if r.hot("big") != nil {
		t.Fatal("big still hot")
	}
	if got := r.admit("big", 10); got != 0 {
		t.Errorf("big admitted %d on cooling, its bucket spent", got)
	}
	// Stale parameters: a hot value stays, at the equal share.
	r.wroteValues(map[string]float64{"big": 1000})
	r.valueParams(map[string][]float64{"big": {1000, 10, 10, 10}})
	r.tick(r.d.growDelay())
	r.tick(r.d.staleAfter() + time.Second)
	if hv := r.hot("big"); hv == nil || r.e.GroupWeight(hv.Group).W != 0.25 {
		t.Errorf("with stale parameters big should be hot at the equal 0.25: %v", hv)
	}
}

// The report names the values the replica draws most on, as candidates,
// only those over half its equal share; and every hot value, 0 included.
func TestReportsValues(t *testing.T) {
	r := newValueRig(t)
	step := func() {
		r.now = r.now.Add(100 * time.Millisecond)
		r.d.mu.Lock()
		r.d.rates[r.rule.Identity] = &demand.Rates{}
		r.d.meterValues(r.d.rules()[0], r.now)
		r.d.mu.Unlock()
	}
	step() // primes the candidates
	for range 20 {
		r.admit("big", 400) // 4,000 a second offered; the equal share is 100
		r.admit("tiny", 1)  // 10 a second: under half the equal share
		step()
	}
	r.d.mu.Lock()
	vals := r.d.values(r.rule, 0.25)
	r.d.mu.Unlock()
	if len(vals) != 1 || vals[0].ID != r.id("big") || vals[0].Offered < 2000 || vals[0].Offered > 6000 {
		t.Fatalf("values %+v, want big alone at about 4000/s", vals)
	}
	// Made hot, with nothing offered since: still reported, at about 0.
	r.wroteValues(map[string]float64{"big": 4000})
	r.valueParams(map[string][]float64{"big": {4000, 10, 10, 10}})
	for range 30 {
		step()
	}
	r.d.mu.Lock()
	vals = r.d.values(r.rule, 0.25)
	r.d.mu.Unlock()
	if len(vals) != 1 || vals[0].ID != r.id("big") || vals[0].Offered > 1 {
		t.Fatalf("values %+v, want big at about 0", vals)
	}
}

// The leader makes the values with the most cluster demand hot (those some
// replica offers more than half its equal share) and divides each; a
// replica whose report does not name a value counts at its equal share for
// it; the shares of each value sum to at most L.
func TestLeaderDividesValues(t *testing.T) {
	r := newValueRig(t)
	rid := demand.RuleIDOf(r.rule.Identity)
	var index uint64
	report := func(node string, values map[string]float64) consulkv.KVReport {
		index++
		rd := demand.RuleDemand{ID: rid}
		for v, o := range values {
			rd.Values = append(rd.Values, demand.ValueDemand{ID: r.id(v), Offered: o, Admitted: min(o, 100)})
		}
		sortValues(rd.Values)
		b, err := demand.AppendReport(nil, &demand.Report{Seq: 1, Units: 1, Node: node, Rules: []demand.RuleDemand{rd}})
		if err != nil {
			t.Fatal(err)
		}
		return consulkv.KVReport{Node: node, Value: b, ModifyIndex: index}
	}
	snap := consulkv.Snapshot{Index: 7, Reports: []consulkv.KVReport{
		report("n1", map[string]float64{"a": 1000, "b": 60, "c": 40}),
		report("n2", map[string]float64{"a": 10, "b": 60}),
		report("n3", map[string]float64{"a": 10}),
		// n4 sent no report: it counts at its equal share of every value.
	}}
	b, err := r.d.divide(snap)
	if err != nil {
		t.Fatal(err)
	}
	p, err := demand.DecodeParams(b)
	if err != nil {
		t.Fatal(err)
	}
	rp := p.Find(rid)
	if rp == nil {
		t.Fatalf("no parameters for the rule: %+v", p)
	}
	// c (40 < 50) qualifies nowhere; a and b do.
	if len(rp.Values) != 2 || rp.FindValue(r.id("a")) == nil || rp.FindValue(r.id("b")) == nil {
		t.Fatalf("hot values %+v, want a and b", rp.Values)
	}
	for _, v := range []string{"a", "b"} {
		vp := rp.FindValue(r.id(v))
		rule := p.ValueRule(rp, vp)
		var sum float64
		for i, rep := range snap.Reports {
			dec, _ := demand.DecodeReport(rep.Value)
			off, absent := 0.0, true
			if x := dec.Rules[0].FindValue(r.id(v)); x != nil {
				off, absent = x.Offered, false
			}
			g, ok := demand.Share(rule, 1, off, absent, 4)
			if !ok {
				t.Fatalf("value %s, replica %d: no share", v, i)
			}
			sum += g
		}
		sum += 100 // n4, absent: its equal share
		if sum > 400*(1+1e-9) {
			t.Errorf("value %s: shares sum to %v > 400", v, sum)
		}
		if v == "a" && sum < 390 {
			t.Errorf("value a: shares sum to %v, want close to 400", sum)
		}
	}
	// The leader's division lists a's replicas first (it is the busiest).
	r.d.mu.Lock()
	div := r.d.division
	r.d.mu.Unlock()
	if len(div) == 0 || div[0].Value == "" || div[0].Node != "n1" {
		t.Fatalf("division %+v", div)
	}
}

func (r *valueRig) admitAt(v string, n int, now int64) int {
	ok := 0
	var dec engine.Decision
	for range n {
		if err := r.e.Decide(&dec, "a", clientDesc(v), 1, now); err != nil {
			r.t.Fatal(err)
		}
		if dec.Code == engine.OK {
			ok++
		}
	}
	return ok
}

// Cooling a value is a grow for a replica whose hot share was under its
// equal share: it waits the grow delay, as every grow does, since a peer
// that has not had the cooling parameters yet still enforces its large hot
// share. Only then does the value go back to its usual bucket.
func TestCoolingWaitsLikeAGrow(t *testing.T) {
	r := newValueRig(t)
	var mono int64
	// P1: big is hot; n2 wants it (1000/s), this replica 10/s.
	r.wroteValues(map[string]float64{"big": 10})
	r.valueParams(map[string][]float64{"big": {10, 1000, 10, 10}})
	hv := r.hot("big")
	if hv == nil {
		t.Fatal("big not hot")
	}
	small := r.e.GroupWeight(hv.Group).W
	r.admitAt("big", 400, mono) // spends this replica's small bucket
	// P2 leaves big out (hotter values displaced it, say).
	r.valueParams(map[string][]float64{})
	dt := r.d.growDelay() / 2
	mono += int64(dt)
	r.mono.Store(mono)
	r.tick(dt)
	got := r.admitAt("big", 400, mono)
	if allowed := small*400*dt.Seconds() + 1; float64(got) > allowed {
		t.Errorf("big admitted %d within %v of cooling, before the grow delay: at most %.1f at its share under P1", got, dt, allowed)
	}
	if r.hot("big") == nil {
		t.Error("big left its slot before its share grew back to the equal share")
	}
	// After the delay, the share is back at equal, and the value cools.
	mono += int64(r.d.growDelay())
	r.mono.Store(mono)
	r.tick(r.d.growDelay())
	r.tick(tickEvery)
	if r.hot("big") != nil {
		t.Errorf("big still hot at weight %v after the grow delay", r.e.GroupWeight(hv.Group).W)
	}
}
