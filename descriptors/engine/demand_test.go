package engine

import (
	"fmt"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// demandSet is a share: demand limit of 100 a second, a cluster-shared fixed
// limit of 100 and a per-client limit of 100, all in domain a.
func demandSet(t *testing.T, extra string) *descriptors.Set {
	t.Helper()
	set, err := descriptors.Compile(descriptors.File{Name: "a.yaml", Data: []byte("domain: a\ndescriptors:\n" +
		"  - key: hot\n    value: x\n    rate_limit: {unit: second, requests_per_unit: 100, share: demand}\n" +
		"  - key: fixed\n    value: x\n    rate_limit: {unit: second, requests_per_unit: 100}\n" +
		"  - key: client\n    rate_limit: {unit: second, requests_per_unit: 100}\n" + extra)})
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func demandOf(t *testing.T, e *Engine, path string) *DemandRule {
	t.Helper()
	for _, b := range e.DemandRules() {
		if b.Rule.Path() == path {
			return b.State
		}
	}
	return nil
}

// TestDemandRuleHasItsOwnGroup: a share: demand rule's bucket is divided by
// a group of its own, which starts at its domain's weight (the equal share)
// and which only it follows; its meter counts what it was asked and gave.
func TestDemandRuleHasItsOwnGroup(t *testing.T) {
	e := newEngine(t, demandSet(t, ""), bucket.NewStore(0), Options{Weight: 0.25})
	d := demandOf(t, e, "a.hot_x")
	if d == nil || len(e.DemandRules()) != 1 {
		t.Fatalf("demand rules: %v", e.DemandRules())
	}
	if d.Group() == DefaultGroup || d.DomainGroup() != DefaultGroup {
		t.Fatalf("group %d, domain group %d", d.Group(), d.DomainGroup())
	}
	if w := e.GroupWeight(d.Group()).W; w != 0.25 {
		t.Errorf("a new demand group starts at %v, want the domain's 0.25", w)
	}
	// The controller gives this replica 80% of the limit.
	e.SetGroupWeight(d.Group(), 0.8, 0)
	if got := admitted(t, e, "a", desc("hot=x"), 200, 0); got != 80 {
		t.Errorf("demand rule at 0.8 admitted %d of a burst of 100, want 80", got)
	}
	if got := admitted(t, e, "a", desc("fixed=x"), 200, 0); got != 25 {
		t.Errorf("cluster rule admitted %d, want 25: the demand group must not move it", got)
	}
	if off, adm := d.Counts(); off != 200 || adm != 80 {
		t.Errorf("meter: offered %d admitted %d, want 200 and 80", off, adm)
	}
	if w := e.RuleWeight(e.Set().Match("a", desc("hot=x").Entries)).W; w != 0.8 {
		t.Errorf("RuleWeight of the demand rule = %v, want 0.8", w)
	}
	// A reload that keeps the rule keeps its state; its bucket stays spent.
	e.Swap(demandSet(t, "  - key: other\n    value: y\n    rate_limit: {unit: second, requests_per_unit: 5}\n"))
	if d2 := demandOf(t, e, "a.hot_x"); d2 != d {
		t.Errorf("a reload gave the rule new demand state")
	}
	if got := admitted(t, e, "a", desc("hot=x"), 10, 0); got != 0 {
		t.Errorf("after a reload the spent demand bucket admitted %d", got)
	}
}

// TestShareModeDemand: --share-mode demand shares every cluster limit by
// demand, per-value ones value by value, and leaves share: replica limits
// alone; a per-value rule's values keep the equal share until they are hot.
func TestShareModeDemand(t *testing.T) {
	e := newEngine(t, demandSet(t, "  - key: guard\n    value: g\n    rate_limit: {unit: second, requests_per_unit: 10, share: replica}\n"), bucket.NewStore(0), Options{Weight: 0.5, DemandAll: true})
	var paths []string
	for _, b := range e.DemandRules() {
		paths = append(paths, b.Rule.Path())
	}
	if len(paths) != 3 || paths[0] != "a.hot_x" || paths[1] != "a.fixed_x" || paths[2] != "a.client" {
		t.Fatalf("demand rules under --share-mode demand: %v, want a.hot_x, a.fixed_x and a.client", paths)
	}
	if d := demandOf(t, e, "a.client"); !d.PerValue() || d.Group() != d.DomainGroup() {
		t.Fatalf("per-value demand rule: per value %v, group %d, domain group %d", d.PerValue(), d.Group(), d.DomainGroup())
	}
	if got := admitted(t, e, "a", desc("client=c1"), 200, 0); got != 50 {
		t.Errorf("per-value rule admitted %d, want its equal share 50", got)
	}
	if got := admitted(t, e, "a", desc("guard=g"), 20, 0); got != 10 {
		t.Errorf("share: replica admitted %d, want 10", got)
	}
}

// TestDemandWaitGiveBack: a wait-policy draw given back when the request is
// refused anyway is not counted as admitted.
func TestDemandWaitGiveBack(t *testing.T) {
	set, err := descriptors.Compile(descriptors.File{Name: "a.yaml", Data: []byte("domain: a\ndescriptors:\n" +
		"  - key: w\n    value: x\n    rate_limit: {unit: second, requests_per_unit: 10, share: demand, policy: wait, max_wait: 500ms}\n" +
		"  - key: stop\n    value: x\n    rate_limit: {unit: second, requests_per_unit: 0}\n")})
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, set, bucket.NewStore(0), Options{})
	d := demandOf(t, e, "a.w_x")
	if got := admitted(t, e, "a", desc("w=x"), 10, 0); got != 10 {
		t.Fatalf("a fresh bucket of 10 admitted %d", got)
	}
	// Now each draw must wait for its token, and the blocked descriptor
	// refuses the request: the reservation is given back.
	descs := []*commonv3.RateLimitDescriptor{desc("w=x"), desc("stop=x")}
	for range 3 {
		if _, code, err := decide(e, "a", descs, 1, 0, nil); err != nil || code != OverLimit {
			t.Fatalf("code %v, err %v", code, err)
		}
	}
	if off, adm := d.Counts(); off != 13 || adm != 10 {
		t.Errorf("meter after ten admitted and three refused waits: offered %d admitted %d, want 13 and 10", off, adm)
	}
}

// TestDemandGroupsRunOut: when no group is left, a demand rule is divided by
// its domain's group, for the engine's life, never by no group.
func TestDemandGroupsRunOut(t *testing.T) {
	var groups []Group
	for i := DefaultGroup + 1; i <= MaxGroups; i++ {
		groups = append(groups, Group{Domains: []string{fmt.Sprintf("other%d", i)}, Weight: 1})
	}
	e := newEngine(t, descriptors.Empty(), bucket.NewStore(0), Options{Weight: 0.5, Groups: groups})
	e.Swap(demandSet(t, ""))
	if n := len(e.DemandRules()); n != 0 {
		t.Fatalf("%d demand rules bound with no group left", n)
	}
	if got := admitted(t, e, "a", desc("hot=x"), 200, 0); got != 50 {
		t.Errorf("demand rule without a group admitted %d, want its domain's share 50", got)
	}
}
