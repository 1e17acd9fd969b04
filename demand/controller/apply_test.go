package controller

import (
	"log/slog"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/demand"
	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/membership"
)

// demandRig is a controller over one share: demand rule of 400/s, four
// replicas of weight 1, on the real engine, its clock in the test's hands;
// parameters are fed as the watch would, no Consul involved.
type demandRig struct {
	t    *testing.T
	e    *engine.Engine
	d    *Controller
	rule Rule
	now  time.Time
	idx  uint64
	mv   atomic.Pointer[membership.View]
	mono atomic.Int64 // the engine's clock
	// wroteAt is the index of this replica's latest write, which the
	// parameters the rig delivers list as counted; 0 before any.
	wroteAt uint64
}

// newRig is a controller of node over the rule yaml on a service of total
// replicas of weight 1, with topKeys hot values per per-value rule.
func newRig(t *testing.T, yaml, node string, total, topKeys int, now time.Time) *demandRig {
	t.Helper()
	set, err := descriptors.Compile(descriptors.File{Name: "a.yaml", Data: []byte(yaml)})
	if err != nil {
		t.Fatal(err)
	}
	equal := 1 / float64(total)
	e, err := engine.New(set, bucket.NewStore(0), engine.Options{Weight: equal})
	if err != nil {
		t.Fatal(err)
	}
	r := &demandRig{t: t, e: e, now: now}
	r.mv.Store(&membership.View{Source: "consul", Node: node, Total: total, Local: 1, TotalWeight: total, LocalWeight: 1, Weight: equal})
	r.d = New(NewEngine(e), nil, Config{Service: "web", Group: engine.DefaultGroup, Prefix: "p/", Interval: time.Second,
		MaxWrites: 100, QueryRate: 2, Node: node, TopKeys: topKeys,
		View: func() membership.View { return *r.mv.Load() }, Clock: r.mono.Load, Logger: slog.New(slog.DiscardHandler)})
	r.d.wall = func() time.Time { return r.now }
	rules := r.d.rules()
	if len(rules) != 1 {
		t.Fatalf("demand rules %v", rules)
	}
	r.rule = rules[0]
	return r
}

const ruleYAML = "domain: a\ndescriptors:\n  - key: k\n    value: v\n    rate_limit: {unit: second, requests_per_unit: 400, share: demand}\n"

func newDemandRig(t *testing.T) *demandRig {
	t.Helper()
	return newRig(t, ruleYAML, "n1", 4, 0, time.Unix(1_000_000, 0))
}

// publish puts membership view mv in force, as the daemon's view does: the
// engine re-divides the group, and the controller re-applies.
func (r *demandRig) publish(mv membership.View) {
	r.mv.Store(&mv)
	r.e.SetGroupWeight(engine.DefaultGroup, mv.Weight, r.mono.Load())
	r.d.ViewChanged()
}

func (r *demandRig) weight() float64 { return r.e.GroupWeight(r.rule.Group).W }

// wrote records a report of this replica written now, at the next index.
func (r *demandRig) wrote(offered float64) {
	r.idx++
	rep := demand.Report{Seq: r.idx, At: r.now.UnixNano(), Units: 1, Node: "n1",
		Rules: []demand.RuleDemand{{ID: demand.RuleIDOf(r.rule.Identity), Offered: offered}}}
	b, _ := demand.AppendReport(nil, &rep)
	dec, _ := demand.DecodeReport(b)
	r.d.mu.Lock()
	r.d.hist.Add(r.idx, dec)
	r.d.mu.Unlock()
	r.wroteAt = r.idx
}

// counted is the list of reports the rig's parameters divided: this
// replica's latest write (the others' do not matter to it).
func (r *demandRig) counted() []demand.ReportRef {
	if r.wroteAt == 0 {
		return nil
	}
	return []demand.ReportRef{{Index: r.wroteAt, Node: demand.TagOf("n1")}}
}

// params delivers parameters dividing 400 among four replicas wanting
// offered (this replica first), at a snapshot holding every write so far.
func (r *demandRig) params(offered ...float64) {
	r.idx++
	wants := make([]demand.Want, len(offered))
	for i, o := range offered {
		wants[i] = demand.Want{Units: 1, Offered: o}
	}
	rule := demand.Divide(400, 4, wants, demand.DefaultHeadroom, demand.DefaultFloor)
	p := demand.Params{At: r.now.UnixNano(), Snapshot: r.idx - 1, Reports: r.counted(), Units: rule.Units, Headroom: rule.Headroom, Floor: rule.Floor, Leader: "n2",
		Rules: []demand.RuleParams{{ID: demand.RuleIDOf(r.rule.Identity), Limit: 400, K: rule.K, R: rule.R}}}
	b, err := demand.AppendParams(nil, &p)
	if err != nil {
		r.t.Fatal(err)
	}
	r.d.onParams(b, r.idx)
}

func (r *demandRig) tick(d time.Duration) {
	r.now = r.now.Add(d)
	r.d.apply(r.now)
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

// TestShrinksAtOnceGrowsLater: a smaller share applies when the
// parameters come; a larger one only after the grow delay.
func TestShrinksAtOnceGrowsLater(t *testing.T) {
	r := newDemandRig(t)
	if w := r.weight(); w != 0.25 {
		t.Fatalf("start at %v, want the equal 0.25", w)
	}
	r.wrote(10) // cold: wants 10 of its 100
	r.params(10, 1000, 10, 10)
	cold := r.weight()
	if cold >= 0.25 || !near(cold, 10*(1+demand.DefaultHeadroom)/400*(1-1e-9)) && cold > 0.03 {
		t.Fatalf("a cold replica's share %v: want its demand plus headroom, at once", cold)
	}
	// Now it is hot and the others cold: its share grows, but not at once.
	r.wrote(1000)
	r.params(1000, 10, 10, 10)
	if w := r.weight(); w != cold {
		t.Fatalf("a grow applied at once: %v", w)
	}
	r.tick(r.d.growDelay() - time.Millisecond)
	if w := r.weight(); w != cold {
		t.Fatalf("a grow applied before its delay: %v", w)
	}
	r.tick(time.Millisecond)
	if w := r.weight(); w < 0.9 {
		t.Fatalf("after the delay the share is %v, want the hot share", w)
	}
}

// TestBiggerGrowRestartsTheDelay: a grow held back, then parameters
// that grow the share further: the further grow waits its own full delay,
// since the others may not have those parameters yet.
func TestBiggerGrowRestartsTheDelay(t *testing.T) {
	r := newDemandRig(t)
	r.wrote(10)
	r.params(10, 1000, 10, 10)
	cold := r.weight()
	r.wrote(100)
	r.params(100, 1000, 10, 10) // a grow to its 100 + headroom
	first := r.d.growDelay()
	r.tick(first - 10*time.Millisecond)
	r.wrote(1000)
	r.params(1000, 10, 10, 10) // a much bigger grow, just before the first is due
	r.tick(10 * time.Millisecond)
	if w := r.weight(); w > 0.27 {
		t.Fatalf("the bigger grow applied %v after its parameters came (share %v, from %v)", 10*time.Millisecond, w, cold)
	}
	r.tick(first)
	if w := r.weight(); w < 0.9 {
		t.Fatalf("after its own delay the share is %v, want the hot share", w)
	}
}

// TestFallsBack: stale parameters, a limit the leader does not
// divide, and garbage all give the equal share, never more.
func TestFallsBack(t *testing.T) {
	r := newDemandRig(t)
	r.wrote(1000)
	r.params(1000, 10, 10, 10)
	r.tick(r.d.growDelay())
	if w := r.weight(); w < 0.9 {
		t.Fatalf("hot share %v", w)
	}
	r.d.onParams([]byte("garbage"), r.idx+1)
	r.tick(time.Millisecond)
	if w := r.weight(); w < 0.9 {
		t.Errorf("garbage replaced the parameters in force: %v", w)
	}
	if r.d.badParam != 1 {
		t.Errorf("bad parameters counted %d", r.d.badParam)
	}
	r.tick(r.d.staleAfter() + time.Second)
	if w := r.weight(); w != 0.25 {
		t.Errorf("stale parameters: share %v, want the equal 0.25", w)
	}
	// A replica joins (the view counts 5): parameters divided among 4 are
	// scaled down at once.
	r.now = r.now.Add(time.Second)
	r.wrote(1000)
	r.params(1000, 10, 10, 10)
	r.tick(r.d.growDelay())
	hot := r.weight()
	mv := *r.mv.Load()
	mv.Total, mv.TotalWeight, mv.Weight = 5, 5, 0.2
	r.publish(mv)
	if w := r.weight(); !near(w, hot*4/5) && w > hot*4/5 {
		t.Errorf("after a join the share is %v, want at most %v", w, hot*4/5)
	}
}

// TestNotPassingTakesAtMostEqual: a replica whose node has no
// passing instance is not counted by the leader, so it takes at most its
// equal share, however large its demand share would be.
func TestNotPassingTakesAtMostEqual(t *testing.T) {
	r := newDemandRig(t)
	r.wrote(1000)
	r.params(1000, 10, 10, 10)
	r.tick(r.d.growDelay())
	if w := r.weight(); w < 0.9 {
		t.Fatalf("hot share %v", w)
	}
	mv := *r.mv.Load()
	mv.Local, mv.LocalWeight = 0, 0 // its check failed; it counts itself in
	mv.Total, mv.TotalWeight, mv.Weight = 4, 4, 0.25
	r.publish(mv)
	if w := r.weight(); w > 0.25 {
		t.Errorf("not passing, the share is %v, want at most the equal 0.25", w)
	}
}
