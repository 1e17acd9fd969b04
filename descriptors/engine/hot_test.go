package engine

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/demand"
	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// hotRig is a per-client limit of 100 a second (burst 100) shared by
// demand, at equal share 0.25.
func hotRig(t *testing.T) (*Engine, *DemandRule) { return hotRigTop(t, DefaultTopKeys) }

// hotRigTop is hotRig with --demand-top-keys top.
func hotRigTop(t *testing.T, top int) (*Engine, *DemandRule) {
	t.Helper()
	return hotRigWith(t, Options{Weight: 0.25, TopKeys: top})
}

// hotRigWith is hotRig with an engine built with opts.
func hotRigWith(t *testing.T, opts Options) (*Engine, *DemandRule) {
	t.Helper()
	set, err := descriptors.Compile(descriptors.File{Name: "a.yaml", Data: []byte("domain: a\ndescriptors:\n" +
		"  - key: client\n    rate_limit: {unit: second, requests_per_unit: 100, share: demand}\n" +
		"  - key: w\n    rate_limit: {unit: second, requests_per_unit: 10, share: demand, policy: wait, max_wait: 500ms}\n" +
		"  - key: stop\n    value: x\n    rate_limit: {unit: second, requests_per_unit: 0}\n")})
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, set, bucket.NewStore(0), opts)
	d := demandOf(t, e, "a.client")
	if d == nil || !d.PerValue() {
		t.Fatalf("a.client is not a per-value demand rule: %+v", d)
	}
	return e, d
}

func idOf(e *Engine, d *DemandRule, kvs ...string) uint64 {
	r := e.Set().Match("a", desc(kvs...).Entries)
	return ValueID(d.RuleID(), r, desc(kvs...).Entries)
}

// A hot value is divided by a group of its own; every other value of the
// rule keeps the equal share, and the hot value's meter counts its tokens.
func TestHotValueHasItsOwnShare(t *testing.T) {
	e, d := hotRig(t)
	hot := e.SetHot(d, []uint64{idOf(e, d, "client=c1")}, 0)
	if len(hot) != 1 || hot[0].Group() == d.DomainGroup() {
		t.Fatalf("hot values %+v", hot)
	}
	if w := e.GroupWeight(hot[0].Group()).W; w != 0.25 {
		t.Fatalf("a new hot value starts at %v, want the equal share 0.25", w)
	}
	e.SetGroupWeight(hot[0].Group(), 0.8, 0)
	if got := admitted(t, e, "a", desc("client=c1"), 200, 0); got != 80 {
		t.Errorf("hot value at 0.8 admitted %d of a burst of 100, want 80", got)
	}
	if got := admitted(t, e, "a", desc("client=c2"), 200, 0); got != 25 {
		t.Errorf("a cold value admitted %d, want its equal share 25", got)
	}
	if off, adm := hot[0].Counts(); off != 200 || adm != 80 {
		t.Errorf("hot meter: offered %d admitted %d, want 200 and 80", off, adm)
	}
	if off, adm := d.Counts(); off != 400 || adm != 105 {
		t.Errorf("rule meter: offered %d admitted %d, want 400 and 105", off, adm)
	}
	if l := hot[0].Label(); l != "client=c1" {
		t.Errorf("label %q", l)
	}
}

// Becoming hot hands out no burst: the hot bucket starts no fuller than the
// value's usual bucket, and refills from there at the hot share.
func TestHotValueInheritsDebt(t *testing.T) {
	e, d := hotRig(t)
	if got := admitted(t, e, "a", desc("client=c1"), 30, 0); got != 25 {
		t.Fatalf("equal share admitted %d, want 25", got)
	}
	hot := e.SetHot(d, []uint64{idOf(e, d, "client=c1")}, 0)
	e.SetGroupWeight(hot[0].Group(), 0.8, 0)
	if got := admitted(t, e, "a", desc("client=c1"), 10, 0); got != 0 {
		t.Fatalf("a value that had spent its bucket admitted %d on becoming hot", got)
	}
	// Half a second later at 80/s: 40 tokens.
	if got := admitted(t, e, "a", desc("client=c1"), 100, 5e8); got != 40 {
		t.Errorf("after 0.5 s at the hot share: %d admitted, want 40", got)
	}
}

// Cooling hands the debt back: a value that spent its hot bucket and goes
// back to its usual bucket finds it spent too.
func TestColdValueHandsBackDebt(t *testing.T) {
	e, d := hotRig(t)
	hot := e.SetHot(d, []uint64{idOf(e, d, "client=c1")}, 0)
	e.SetGroupWeight(hot[0].Group(), 0.8, 0)
	if got := admitted(t, e, "a", desc("client=c1"), 100, 0); got != 80 {
		t.Fatalf("hot admitted %d, want 80", got)
	}
	live := e.Store().Live()
	if rest := e.SetHot(d, nil, 0); len(rest) != 0 {
		t.Fatalf("still hot: %v", rest)
	}
	if got := admitted(t, e, "a", desc("client=c1"), 10, 0); got != 0 {
		t.Fatalf("a value that spent its hot bucket admitted %d on cooling", got)
	}
	// 0.4 s later at the equal share, 25/s: 10 tokens.
	if got := admitted(t, e, "a", desc("client=c1"), 100, 4e8); got != 10 {
		t.Errorf("after 0.4 s at the equal share: %d admitted, want 10", got)
	}
	if e.Store().Live() != live {
		t.Errorf("live buckets %d, was %d: the hot bucket's place should pass to the usual one", e.Store().Live(), live)
	}
}

// A rule takes its slots when it is installed, twice its top-keys, and
// never more: a slot freed by a value that cooled is reused, and the next
// value gets a bucket the last one never used.
func TestHotSlotsAreReusedAndBounded(t *testing.T) {
	groups0 := newEngine(t, nil, bucket.NewStore(0), Options{Weight: 0.25}).groups.Load()
	e, d := hotRigTop(t, 2)
	// Two per-value demand rules (client and w), four slots each.
	if n := e.groups.Load() - groups0; n != 8 || d.Slots() != 4 {
		t.Fatalf("%d groups taken, %d slots, want 8 and 4 for top-keys 2", n, d.Slots())
	}
	ids := func(vals ...string) []uint64 {
		var out []uint64
		for _, v := range vals {
			out = append(out, idOf(e, d, "client="+v))
		}
		return out
	}
	if hot := e.SetHot(d, ids("a", "b", "c", "d", "e"), 0); len(hot) != 4 {
		t.Fatalf("%d hot with 4 slots", len(hot))
	}
	e.SetHot(d, ids("a", "b"), 0)
	for _, hv := range d.HotValues() {
		e.SetGroupWeight(hv.Group(), 0.5, 0)
	}
	if got := admitted(t, e, "a", desc("client=a"), 100, 0); got != 50 {
		t.Fatalf("a admitted %d", got)
	}
	groups := e.groups.Load()
	for round := range 20 {
		e.SetHot(d, ids(fmt.Sprint("x", round), fmt.Sprint("y", round)), 0)
	}
	if n := e.groups.Load(); n != groups {
		t.Fatalf("%d groups after values came and went, was %d", n, groups)
	}
	// a is hot again, in a slot another value used since: it finds its own
	// debt (handed back to its usual bucket when it cooled), no fresh burst.
	hot := e.SetHot(d, ids("a"), 0)
	if w := e.GroupWeight(hot[0].Group()).W; w != 0.25 {
		t.Fatalf("a reused slot starts at %v, want the equal share", w)
	}
	if got := admitted(t, e, "a", desc("client=a"), 100, 0); got != 0 {
		t.Errorf("a admitted %d on heating again", got)
	}
}

// A per-value rule that is renamed (a new identity) gives its slots back:
// renames never use up the groups. One whose limit is edited keeps its
// identity, and its slots.
func TestReloadsGiveSlotsBack(t *testing.T) {
	e := newEngine(t, nil, bucket.NewStore(0), Options{Weight: 0.25, TopKeys: MaxTopKeys})
	var groups int32
	for i := range 10 {
		set, err := descriptors.Compile(descriptors.File{Name: "a.yaml", Data: []byte(fmt.Sprintf("domain: a\ndescriptors:\n  - key: client%d\n    rate_limit: {unit: second, requests_per_unit: %d, share: demand}\n", i%3, 100+i))})
		if err != nil {
			t.Fatal(err)
		}
		e.Swap(set)
		d := demandOf(t, e, fmt.Sprintf("a.client%d", i%3))
		if d == nil || d.Slots() != 2*MaxTopKeys {
			t.Fatalf("edit %d: the rule got no slots", i)
		}
		if i == 1 {
			groups = e.groups.Load()
		}
		if i > 1 && e.groups.Load() != groups {
			t.Fatalf("edit %d: %d groups, was %d", i, e.groups.Load(), groups)
		}
	}
}

// When the groups run out, a per-value rule is not shared by demand on this
// replica at all (its report does not name it, so the leader counts it at
// its equal share, which is what it enforces), never half.
func TestNoGroupsNoPerValueDemand(t *testing.T) {
	var groups []Group
	for i := DefaultGroup + 1; i <= MaxGroups; i++ {
		groups = append(groups, Group{Weight: 0.5})
	}
	e := newEngine(t, nil, bucket.NewStore(0), Options{Weight: 0.25, Groups: groups})
	set, err := descriptors.Compile(descriptors.File{Name: "a.yaml", Data: []byte("domain: a\ndescriptors:\n  - key: client\n    rate_limit: {unit: second, requests_per_unit: 100, share: demand}\n")})
	if err != nil {
		t.Fatal(err)
	}
	e.Swap(set)
	if d := demandOf(t, e, "a.client"); d != nil {
		t.Fatalf("a per-value demand rule bound with no group left: %d slots", d.Slots())
	}
}

// A value that spent its tokens through the rule's shared overflow bucket
// (the store at its cap) does not get a fresh burst by becoming hot.
func TestHeatAtCapKeepsDebt(t *testing.T) {
	set, err := descriptors.Compile(descriptors.File{Name: "a.yaml", Data: []byte("domain: a\ndescriptors:\n" +
		"  - key: client\n    rate_limit: {unit: second, requests_per_unit: 100, share: demand}\n")})
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, set, bucket.NewStore(64), Options{Weight: 0.25}) // 48 buckets, 16 kept for overflow
	d := demandOf(t, e, "a.client")
	for i := 0; e.Store().Live() < 48; i++ {
		admitted(t, e, "a", desc(fmt.Sprintf("client=filler%d", i)), 1, 0)
	}
	if got := admitted(t, e, "a", desc("client=v"), 40, 0); got != 25 {
		t.Fatalf("v admitted %d through the overflow bucket, want 25", got)
	}
	e.SetHot(d, []uint64{idOf(e, d, "client=v")}, 0)
	if got := admitted(t, e, "a", desc("client=v"), 40, 0); got != 0 {
		t.Errorf("v admitted %d right after becoming hot at its equal share, want 0: it had spent its tokens", got)
	}
}

// Candidates: the sampled demand of values that are not hot, bounded by
// top-keys, with a value that draws most of the tokens always among them.
func TestCandidatesFindTheHeavyValue(t *testing.T) {
	e, d := hotRigTop(t, 4)
	var heavy int
	for i := range 20000 {
		v := fmt.Sprint("cold", i) // 10,000 distinct cold values
		if i%2 == 0 {
			v = "heavy"
			heavy++
		}
		if _, _, err := decide(e, "a", []*commonv3.RateLimitDescriptor{desc("client=" + v)}, 0, int64(i)*1e6, nil); err != nil {
			t.Fatal(err)
		}
	}
	c := d.Candidates()
	if bound := candidateShards * shardCapacity(4); len(c) > bound {
		t.Fatalf("%d candidates, bound %d", len(c), bound)
	}
	got := float64(c[idOf(e, d, "client=heavy")] * CandidateSampling)
	// The summary undercounts by at most its decrements; half the tokens
	// are heavy's, so it keeps well over a third of them.
	if got < float64(heavy)/3 || got > float64(heavy)*1.5 {
		t.Fatalf("heavy's estimate %v of %d tokens (candidates %v)", got, heavy, c)
	}
	if c2 := d.Candidates(); len(c2) != 0 {
		t.Fatalf("candidates not forgotten: %v", c2)
	}
}

// The rule and value IDs are the ones every replica computes: the rule's is
// demand.RuleIDOf of its identity, and a value's does not depend on the
// process's seed.
func TestValueIDsAreStable(t *testing.T) {
	e1, d1 := hotRig(t)
	e2, d2 := hotRig(t)
	if d1.RuleID() != uint64(demand.RuleIDOf(d1.Identity())) {
		t.Fatalf("rule ID %x, demand says %x", d1.RuleID(), demand.RuleIDOf(d1.Identity()))
	}
	a, b := idOf(e1, d1, "client=10.0.0.1"), idOf(e2, d2, "client=10.0.0.1")
	if a != b || a == idOf(e1, d1, "client=10.0.0.2") {
		t.Fatalf("IDs %x %x", a, b)
	}
	// The separator: ("ab", "c") and ("a", "bc") differ.
	set, err := descriptors.Compile(descriptors.File{Name: "b.yaml", Data: []byte("domain: a\ndescriptors:\n  - key: x\n    descriptors:\n      - key: y\n        rate_limit: {unit: second, requests_per_unit: 1}\n")})
	if err != nil {
		t.Fatal(err)
	}
	r := set.Match("a", desc("x=ab", "y=c").Entries)
	if ValueID(1, r, desc("x=ab", "y=c").Entries) == ValueID(1, r, desc("x=a", "y=bc").Entries) {
		t.Fatal("value boundaries are not part of the ID")
	}
}

// A wait-policy reservation on a hot value given back when the request is
// refused goes back to the hot bucket, and is not counted as admitted.
func TestHotWaitGiveBack(t *testing.T) {
	e, _ := hotRig(t)
	d := demandOf(t, e, "a.w")
	hot := e.SetHot(d, []uint64{idOf(e, d, "w=q")}, 0)
	e.SetGroupWeight(hot[0].Group(), 1, 0)
	if got := admitted(t, e, "a", desc("w=q"), 10, 0); got != 10 {
		t.Fatalf("fresh hot bucket of 10 admitted %d", got)
	}
	descs := []*commonv3.RateLimitDescriptor{desc("w=q"), desc("stop=x")}
	for range 3 {
		if _, code, err := decide(e, "a", descs, 1, 0, nil); err != nil || code != OverLimit {
			t.Fatalf("code %v, err %v", code, err)
		}
	}
	if off, adm := hot[0].Counts(); off != 13 || adm != 10 {
		t.Errorf("hot meter: offered %d admitted %d, want 13 and 10", off, adm)
	}
	// Given back to the hot bucket: 0.1 s later one token (10/s) is there.
	if got := admitted(t, e, "a", desc("w=q"), 1, 1e8); got != 1 {
		t.Errorf("after the give-backs and 0.1 s: %d admitted, want 1", got)
	}
}

// Model: a value heats and cools while goroutines draw on it, with the hot
// share equal to the equal share. In each step of 1 ms every goroutine
// draws twice while the change (if the step has one) runs alongside.
// Whatever the interleaving, the value admits no more than one burst plus
// what its share refills, plus at most one draw per goroutine per change (a
// draw that looked at the old hot set before a change and reached a bucket
// after it). A change that handed out a burst (25) would break the bound.
func TestHotChangesHandOutNoBurst(t *testing.T) {
	e, d := hotRig(t)
	id := idOf(e, d, "client=m")
	const (
		workers = 8
		steps   = 2000 // 2 s
		every   = 10   // a change every 10 ms: 200 changes
	)
	var ok atomic.Int64
	descs := []*commonv3.RateLimitDescriptor{desc("client=m")}
	for i := range steps {
		now := int64(i) * 1e6
		var wg sync.WaitGroup
		if i%every == 0 {
			ids := []uint64{id}
			if (i/every)%2 == 1 {
				ids = nil
			}
			wg.Go(func() { e.SetHot(d, ids, now) })
		}
		for range workers {
			wg.Go(func() {
				for range 2 {
					_, code, err := decide(e, "a", descs, 0, now, nil)
					if err != nil {
						t.Error(err)
					}
					if code == OK {
						ok.Add(1)
					}
				}
			})
		}
		wg.Wait()
	}
	// Equal share 0.25: a burst of 25 and 25/s over 2 s.
	strict := 25 + 25*2.0
	bound := strict + workers*steps/every
	if got := float64(ok.Load()); got > bound {
		t.Fatalf("admitted %v, bound %v", got, bound)
	}
	t.Logf("admitted %d; the bound without in-flight draws is %v", ok.Load(), strict)
}

// explain says how a per-value rule shared by demand divides its values.
func TestExplainPerValueDemand(t *testing.T) {
	e, _ := hotRig(t)
	var b strings.Builder
	descriptors.Explain(&b, e.Set(), "a", [][]*commonv3.RateLimitDescriptor_Entry{desc("client=c1").Entries}, 0.25)
	if !strings.Contains(b.String(), "share: demand, per value: the rule's hottest values") {
		t.Fatalf("explain:\n%s", b.String())
	}
}
