package engine

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// twoDomains is one limit of 100 a second in each of domains a and b, and a
// share: replica guard of 10 in a.
func twoDomains(t *testing.T) *descriptors.Set {
	t.Helper()
	set, err := descriptors.Compile(
		descriptors.File{Name: "a.yaml", Data: []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100}\n" +
			"  - key: guard\n    rate_limit: {unit: second, requests_per_unit: 10, share: replica}\n")},
		descriptors.File{Name: "b.yaml", Data: []byte("domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100}\n")},
	)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// admitted draws n single hits from domain's descriptor at now and counts
// the OKs.
func admitted(t *testing.T, e *Engine, domain string, d *commonv3.RateLimitDescriptor, n int, now int64) int {
	t.Helper()
	ok := 0
	for range n {
		_, code, err := decide(e, domain, []*commonv3.RateLimitDescriptor{d}, 0, now, nil)
		if err != nil {
			t.Fatal(err)
		}
		if code.String() == "OK" {
			ok++
		}
	}
	return ok
}

func TestGroupsDivideTheirOwnDomains(t *testing.T) {
	e := newEngine(t, twoDomains(t), bucket.NewStore(0), Options{Weight: 0.5, Groups: []Group{{Domains: []string{"b"}, Weight: 0.25}}})
	g := DefaultGroup + 1
	if e.DomainGroup("a") != DefaultGroup || e.DomainGroup("b") != g || e.DomainGroup("unknown") != DefaultGroup {
		t.Fatalf("groups: a=%d b=%d unknown=%d, added %d", e.DomainGroup("a"), e.DomainGroup("b"), e.DomainGroup("unknown"), g)
	}
	if got := admitted(t, e, "a", desc("k=x"), 200, 0); got != 50 {
		t.Errorf("domain a at weight 0.5 admitted %d of a burst of 100, want 50", got)
	}
	if got := admitted(t, e, "b", desc("k=x"), 200, 0); got != 25 {
		t.Errorf("domain b at weight 0.25 admitted %d of a burst of 100, want 25", got)
	}
	// share: replica is never divided, whatever its domain's weight.
	if got := admitted(t, e, "a", desc("guard=x"), 100, 0); got != 10 {
		t.Errorf("share: replica admitted %d of 10 at weight 0.5", got)
	}
	// A change in b's group re-divides b only: a's empty bucket stays empty
	// (it refills at a's rate, 50/s), b's refills at its new one.
	e.SetGroupWeight(g, 1, 0)
	sec := int64(1e9)
	if got := admitted(t, e, "a", desc("k=x"), 200, sec/10); got != 5 {
		t.Errorf("domain a after 100ms at 50/s admitted %d, want 5", got)
	}
	if got := admitted(t, e, "b", desc("k=x"), 200, sec/10); got != 10 {
		t.Errorf("domain b after 100ms at 100/s admitted %d, want 10", got)
	}
	if w := e.Weight().W; w != 0.5 {
		t.Errorf("default weight %v after b's change", w)
	}
	if w := e.GroupWeight(g).W; w != 1 {
		t.Errorf("b's weight %v", w)
	}
	// The default group's change leaves b and the replica guard alone.
	e.SetWeight(0.1, sec/10)
	if w := e.GroupWeight(g); w.W != 1 || w.Epoch != 1 {
		t.Errorf("b's weight epoch %+v after a default change", *w)
	}
	if r := e.Set().Rules()[1]; e.RuleWeight(r).W != 1 {
		t.Errorf("share: replica rule weighs %v", e.RuleWeight(r).W)
	}
	if r := e.Set().Rules()[0]; e.RuleWeight(r).W != 0.1 {
		t.Errorf("cluster rule in a weighs %v", e.RuleWeight(r).W)
	}
}

func TestNewRefusesBadGroups(t *testing.T) {
	b := Group{Domains: []string{"b"}, Weight: 0.5}
	if _, err := New(twoDomains(t), bucket.NewStore(0), Options{Groups: []Group{b}}); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		domains []string
		w       float64
	}{
		"domain in a group":  {[]string{"b"}, 0.5},
		"domain twice":       {[]string{"c", "c"}, 0.5},
		"empty domain":       {[]string{""}, 0.5},
		"weight zero":        {[]string{"c"}, 0},
		"weight above one":   {[]string{"c"}, 1.5},
		"weight not number":  {[]string{"c"}, math.NaN()},
		"weight is negative": {[]string{"c"}, -1},
	} {
		e, err := New(twoDomains(t), bucket.NewStore(0), Options{Groups: []Group{b, {Domains: c.domains, Weight: c.w}}})
		if !errors.Is(err, ErrGroup) || e != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, w := range []float64{-1, 1.5, math.NaN()} {
		if _, err := New(twoDomains(t), bucket.NewStore(0), Options{Weight: w}); !errors.Is(err, ErrGroup) {
			t.Errorf("default weight %v: %v", w, err)
		}
	}
	// The cap, at cap + 1: the default group and b exist beside these.
	groups := []Group{b}
	for i := 3; i <= MaxGroups; i++ {
		groups = append(groups, Group{Domains: []string{fmt.Sprint("d", i)}, Weight: 1})
	}
	e, err := New(twoDomains(t), bucket.NewStore(0), Options{Groups: groups})
	if err != nil {
		t.Fatalf("%d groups: %v", MaxGroups, err)
	}
	if g := e.DomainGroup(fmt.Sprint("d", MaxGroups)); g != MaxGroups {
		t.Fatalf("the last group is %d, want %d", g, MaxGroups)
	}
	groups = append(groups, Group{Domains: []string{"one-too-many"}, Weight: 1})
	if _, err := New(twoDomains(t), bucket.NewStore(0), Options{Groups: groups}); !errors.Is(err, ErrGroup) {
		t.Fatalf("group %d: %v", MaxGroups+1, err)
	}
}

// A sweep judges each bucket by its own group's weight. Judged by a larger
// weight, a bucket that is not yet full looks full and is dropped: it would
// come back full, a fresh burst.
func TestSweepJudgesEachGroupByItsOwnWeight(t *testing.T) {
	// b's share: B·w = 0.1, floored at 1 token, refilling 0.1/s: a tenth of
	// itself a second. At the default weight, 1, it would refill whole in 1 s.
	e := newEngine(t, twoDomains(t), bucket.NewStore(0), Options{Groups: []Group{{Domains: []string{"b"}, Weight: 0.001}}})
	g := e.DomainGroup("b")
	if got := admitted(t, e, "b", desc("k=x"), 5, 0); got != 1 {
		t.Fatalf("admitted %d", got)
	}
	// 2 s on: a fifth refilled at its own rate, not full.
	now := int64(2e9)
	if n := e.Sweep(now); n != 0 {
		t.Fatalf("swept %d buckets of group %d that were not full", n, g)
	}
	if got := admitted(t, e, "b", desc("k=x"), 1, now); got != 0 {
		t.Fatal("the bucket came back full after a sweep")
	}
	// 10 s after that it is full, and swept.
	if n := e.Sweep(now + 10e9); n != 1 {
		t.Fatalf("swept %d at full", n)
	}
}

// Groups re-divided and sets swapped while requests are decided: under
// -race, nothing is read unsafely, and no domain's buckets see another's
// weight.
func TestGroupsConcurrent(t *testing.T) {
	var groups []Group
	for i := range 20 {
		groups = append(groups, Group{Domains: []string{fmt.Sprint("x", i)}, Weight: 0.5})
	}
	e := newEngine(t, twoDomains(t), bucket.NewStore(0), Options{Groups: groups})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for _, dom := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int64(0); ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, _, err := decide(e, dom, []*commonv3.RateLimitDescriptor{desc("k=x")}, 0, i, nil); err != nil {
					t.Error(err)
					return
				}
				e.Sweep(i)
			}
		}()
	}
	var gs []int
	for i := range 20 {
		g := e.DomainGroup(fmt.Sprint("x", i))
		gs = append(gs, g)
		e.SetGroupWeight(g, 0.25, int64(i))
		e.Swap(twoDomains(t))
	}
	close(stop)
	wg.Wait()
	for _, g := range gs {
		if w := e.GroupWeight(g).W; w != 0.25 {
			t.Errorf("group %d at %v", g, w)
		}
	}
	if w := e.Weight().W; w != 1 {
		t.Errorf("default group moved to %v", w)
	}
}

// A rule changed from share: cluster to share: replica starts new buckets:
// a bucket's weight history belongs to one share. Under Swap (before
// serving) they start full; a reload while serving (SwapAt) ramps them
// (TestReloadNewRule).
func TestShareChangeIsANewBucket(t *testing.T) {
	cluster := "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10}\n"
	e := newEngine(t, mustParse(t, cluster), bucket.NewStore(0), Options{Weight: 0.5})
	if got := admitted(t, e, "a", desc("k=x"), 20, 0); got != 5 {
		t.Fatalf("cluster share admitted %d", got)
	}
	e.Swap(mustParse(t, strings.Replace(cluster, "10}", "10, share: replica}", 1)))
	if got := admitted(t, e, "a", desc("k=x"), 20, 0); got != 10 {
		t.Fatalf("replica share admitted %d, want a whole burst of 10 in a bucket of its own", got)
	}
}
