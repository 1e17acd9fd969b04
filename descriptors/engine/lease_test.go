package engine

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

const leaseRules = `domain: q
descriptors:
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 100, burst: 1000}
  - key: guard
    rate_limit: {unit: second, requests_per_unit: 10, share: replica}
  - key: open
    rate_limit: {unlimited: true}
  - key: nolimit
    value: x
    descriptors:
      - key: below
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: dem
    value: x
    rate_limit: {unit: second, requests_per_unit: 10, share: demand}
`

// leaseRig is an engine at weight 0.5 over leaseRules.
func leaseRig(t testing.TB, opts Options) *Engine {
	t.Helper()
	if opts.Weight == 0 {
		opts.Weight = 0.5
	}
	return newEngine(t, mustParse(t, leaseRules), bucket.NewStore(0), opts)
}

// share is BucketShare for one id of domain q, given as "k=v" pairs.
func share(e *Engine, kvs ...string) BucketShare {
	id := map[string]string{}
	for _, en := range entries(kvs...) {
		id[en.Key] = en.Value
	}
	return e.BucketShare("q", id)
}

// lease leases the bucket of kvs at weight w, failing t on an error.
func lease(t testing.TB, e *Engine, w float64, now int64, kvs ...string) *Lease {
	t.Helper()
	s := share(e, kvs...)
	l, err := e.Lease(s.Rule, s.Key, w, now)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestBucketShare(t *testing.T) {
	e := leaseRig(t, Options{})
	d := demandOf(t, e, "q.dem_x")
	e.SetGroupWeight(d.Group(), 0.3, 0)
	cases := []struct {
		name        string
		domain      string
		id          []string
		path        string // "" for no rule
		rate, burst float64
		weight      float64
	}{
		{"per value, the domain's group", "q", []string{"ip=1.2.3.4"}, "q.ip", 100, 1000, 0.5},
		{"share replica: 1", "q", []string{"guard=g"}, "q.guard", 10, 10, 1},
		{"shared by demand: its own group", "q", []string{"dem=x"}, "q.dem_x", 10, 10, 0.3},
		{"unlimited: no bucket", "q", []string{"open=1"}, "q.open", 0, 0, 0},
		{"no limit: no bucket", "q", []string{"nolimit=x"}, "q.nolimit_x", 0, 0, 0},
		{"no rule", "q", []string{"user=1"}, "", 0, 0, 0},
		{"unknown domain", "nope", []string{"ip=1"}, "", 0, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := map[string]string{}
			for _, en := range entries(tc.id...) {
				id[en.Key] = en.Value
			}
			s := e.BucketShare(tc.domain, id)
			path := ""
			if s.Rule != nil {
				path = s.Rule.Path()
			}
			if path != tc.path || s.Rate != tc.rate || s.Burst != tc.burst || s.Weight != tc.weight {
				t.Fatalf("rule %q R %v B %v w %v, want %q %v %v %v", path, s.Rate, s.Burst, s.Weight, tc.path, tc.rate, tc.burst, tc.weight)
			}
			if (s.Key != 0) != (tc.weight != 0) || s.Set != e.Set() || s.Lease != nil {
				t.Fatalf("key %#x set %p lease %v", s.Key, s.Set, s.Lease)
			}
		})
	}
	if a, b, c := share(e, "ip=1"), share(e, "ip=1"), share(e, "ip=2"); a.Key != b.Key || a.Key == c.Key {
		t.Fatalf("keys %#x %#x %#x: one per value", a.Key, b.Key, c.Key)
	}
}

// A hot value's share is its group's; the other values keep the equal one.
func TestBucketShareOfAHotValue(t *testing.T) {
	e, d := hotRig(t)
	hot := e.SetHot(d, []uint64{idOf(e, d, "client=c1")}, 0)
	e.SetGroupWeight(hot[0].Group(), 0.8, 0)
	if w := e.BucketShare("a", map[string]string{"client": "c1"}).Weight; w != 0.8 {
		t.Fatalf("hot value's weight %v, want 0.8", w)
	}
	if w := e.BucketShare("a", map[string]string{"client": "c2"}).Weight; w != 0.25 {
		t.Fatalf("cold value's weight %v, want 0.25", w)
	}
	if off, _ := hot[0].Counts(); off != 0 {
		t.Fatalf("BucketShare counted %d tokens", off)
	}
	if hot[0].Label() != "" {
		t.Fatalf("BucketShare labelled the hot value %q", hot[0].Label())
	}
}

// A leased key draws at the lease's weight and is counted; other keys of
// the rule keep the share.
func TestLeaseDividesTheKeysRLSDraws(t *testing.T) {
	e := leaseRig(t, Options{})
	l := lease(t, e, 0.1, 0, "ip=1.2.3.4")
	if got := share(e, "ip=1.2.3.4").Lease; got != l {
		t.Fatalf("BucketShare's lease %v, want %v", got, l)
	}
	if got := admitted(t, e, "q", desc("ip=1.2.3.4"), 300, 0); got != 100 {
		t.Fatalf("leased key admitted %d, want 0.1 × 1000", got)
	}
	if got := admitted(t, e, "q", desc("ip=5.6.7.8"), 600, 0); got != 500 {
		t.Fatalf("another key admitted %d, want 0.5 × 1000", got)
	}
	if off, adm := l.Counts(); off != 300 || adm != 100 {
		t.Fatalf("lease counts %d %d, want 300 100", off, adm)
	}
	if l.Set(0.2, int64(time.Second)); l.Weight() != 0.2 {
		t.Fatalf("weight %v after Set(0.2)", l.Weight())
	}
	// The grow keeps the bucket's tokens, not its fill ratio: the 10
	// refilled at 0.1 in the second before it.
	if got := admitted(t, e, "q", desc("ip=1.2.3.4"), 100, int64(time.Second)); got != 10 {
		t.Fatalf("at the grow to 0.2 admitted %d, want the 10 refilled at 0.1", got)
	}
	// A second at 0.2: 20 tokens refilled.
	if got := admitted(t, e, "q", desc("ip=1.2.3.4"), 100, int64(2*time.Second)); got != 20 {
		t.Fatalf("after a second at 0.2 admitted %d, want 20", got)
	}
}

// The leased bucket starts at the usual bucket's fill, never full, and on
// release the usual bucket ends no fuller than the leased one.
func TestLeaseMigratesTokens(t *testing.T) {
	e := leaseRig(t, Options{})
	if got := admitted(t, e, "q", desc("ip=1"), 400, 0); got != 400 {
		t.Fatal(got)
	}
	l := lease(t, e, 0.1, 0, "ip=1")
	// The usual bucket is at 100/500 = 0.2: the leased one starts at 0.2 × 100.
	if got := admitted(t, e, "q", desc("ip=1"), 100, 0); got != 20 {
		t.Fatalf("leased bucket gave %d at once, want 20 (the usual bucket's fill)", got)
	}
	l.Release(0)
	g := e.GroupWeight(int(l.group)).W
	if l.Set(0.5, 0); l.Active() || l.Weight() != 0 || e.GroupWeight(int(l.group)).W != g {
		t.Fatal("a released lease is still active")
	}
	if got := admitted(t, e, "q", desc("ip=1"), 100, 0); got != 0 {
		t.Fatalf("after release the usual bucket gave %d, want 0 (the leased bucket was empty)", got)
	}
	l.Release(0) // twice is nothing
	// Released, the key can be leased again; it starts from the usual bucket.
	l2 := lease(t, e, 0.1, int64(time.Second), "ip=1")
	if got := admitted(t, e, "q", desc("ip=1"), 100, int64(time.Second)); got != 10 {
		t.Fatalf("a second later the new lease gave %d, want 10 (the usual bucket's 50/500 × 100)", got)
	}
	if off, _ := l2.Counts(); off != 100 {
		t.Fatalf("the new lease counted %d", off)
	}
}

func TestLeaseErrors(t *testing.T) {
	e := leaseRig(t, Options{})
	lease(t, e, 0.1, 0, "ip=1")
	s := share(e, "ip=1")
	if _, err := e.Lease(s.Rule, s.Key, 0.1, 0); !errors.Is(err, ErrLease) {
		t.Fatalf("leasing twice: %v", err)
	}
	o := share(e, "open=1")
	if _, err := e.Lease(o.Rule, 1, 0.1, 0); !errors.Is(err, ErrLease) {
		t.Fatalf("leasing an unlimited rule: %v", err)
	}
	if _, err := e.Lease(nil, 1, 0.1, 0); !errors.Is(err, ErrLease) {
		t.Fatalf("leasing no rule: %v", err)
	}
}

// When no weight group is free, Lease fails with ErrGroup and takes none;
// a released lease's group serves the next.
func TestLeaseWithoutAFreeGroup(t *testing.T) {
	var groups []Group
	for i := range MaxGroups - 1 - 3 - 1 { // all but three, the demand rule's taken too
		groups = append(groups, Group{Domains: []string{fmt.Sprintf("g%d", i)}, Weight: 1})
	}
	e := leaseRig(t, Options{Groups: groups})
	var ls []*Lease
	for i := range 3 {
		ls = append(ls, lease(t, e, 0.1, 0, fmt.Sprintf("ip=%d", i)))
	}
	s := share(e, "ip=9")
	_, err := e.Lease(s.Rule, s.Key, 0.1, 0)
	if !errors.Is(err, ErrGroup) || !errors.Is(err, ErrLease) {
		t.Fatalf("a fourth lease: %v, want ErrGroup and ErrLease", err)
	}
	if share(e, "ip=9").Lease != nil {
		t.Fatal("a failed lease is in force")
	}
	ls[1].Release(0)
	if _, err := e.Lease(s.Rule, s.Key, 0.1, 0); err != nil {
		t.Fatalf("after a release: %v", err)
	}
}

// A reload that keeps the rule's identity keeps its leases, whatever it
// does to the limit; one that drops the rule ends them and frees their
// groups.
func TestLeaseAcrossReloads(t *testing.T) {
	e := leaseRig(t, Options{})
	l := lease(t, e, 0.1, 0, "ip=1")
	if got := admitted(t, e, "q", desc("ip=1"), 50, 0); got != 50 {
		t.Fatal(got)
	}
	changed := mustParse(t, `domain: q
descriptors:
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 200, burst: 1000}
`)
	e.SwapAt(changed, 0)
	if !l.Active() || share(e, "ip=1").Lease != l {
		t.Fatal("a reload that kept the rule dropped its lease")
	}
	// The leased bucket kept its fill: 50 of 100 left, not a fresh 100.
	if got := admitted(t, e, "q", desc("ip=1"), 100, 0); got != 50 {
		t.Fatalf("after the reload the leased key gave %d, want the 50 left", got)
	}
	if off, adm := l.Counts(); off != 150 || adm != 100 {
		t.Fatalf("counts %d %d", off, adm)
	}
	groups := e.groups.Load()
	e.SwapAt(mustParse(t, "domain: q\ndescriptors:\n  - key: other\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0)
	if l.Active() {
		t.Fatal("a reload that dropped the rule kept its lease")
	}
	e.SwapAt(changed, 0)
	if share(e, "ip=1").Lease != nil {
		t.Fatal("the rule came back with its dropped lease")
	}
	lease(t, e, 0.1, 0, "ip=1")
	if e.groups.Load() != groups {
		t.Fatalf("groups %d, want %d: the dropped lease's group serves the new one", e.groups.Load(), groups)
	}
}

// TestLeaseModel: with a lease at part p of the share w, RLS on the key
// admits at most what the leased bucket can hold and refill: the tokens
// migrated from the usual bucket, p·w·R over each stretch of time, and
// (p'−p)·w·B for each grow of the part (a bucket keeps its fill ratio when
// its weight changes), over random traffic and part changes.
func TestLeaseModel(t *testing.T) {
	const w, R, B = 0.5, 100.0, 1000.0
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 7))
		e := leaseRig(t, Options{})
		drained := rng.IntN(500)
		if got := admitted(t, e, "q", desc("ip=1"), drained, 0); got != drained {
			t.Fatal(got)
		}
		p := 0.05 + 0.95*rng.Float64()
		l := lease(t, e, p*w, 0, "ip=1")
		bound := float64(500-drained) / 500 * p * w * B // migrated
		var now int64
		var got uint64
		refill := 0.0
		for step := range 400 {
			dt := int64(rng.IntN(300)) * int64(time.Millisecond)
			now += dt
			bound += p * w * R * float64(dt) / 1e9
			refill += p * w * R * float64(dt) / 1e9
			if rng.IntN(5) == 0 {
				q := 0.05 + 0.95*rng.Float64()
				if q > p {
					bound += (q - p) * w * B
				}
				p = q
				l.Set(p*w, now)
			}
			hits := uint32(1 + rng.IntN(5))
			for range rng.IntN(30) {
				_, code, err := decide(e, "q", descs(desc("ip=1")), hits, now, nil)
				if err != nil {
					t.Fatal(err)
				}
				if code == OK {
					got += uint64(hits)
				}
			}
			if float64(got) > bound+1e-6 {
				t.Fatalf("seed %d step %d: admitted %d, bound %.3f", seed, step, got, bound)
			}
		}
		if _, adm := l.Counts(); adm != got {
			t.Fatalf("seed %d: lease counted %d admitted, want %d", seed, adm, got)
		}
		if got < uint64(refill/2) {
			t.Fatalf("seed %d: admitted %d of a refill of %.0f at the part: the lease starves the key", seed, got, refill)
		}
	}
}

// Concurrent draws on a leased key while its part shrinks, and leases come
// and go on other keys: never more than the part at the start allows.
func TestLeaseConcurrent(t *testing.T) {
	e := leaseRig(t, Options{})
	l := lease(t, e, 0.2, 0, "ip=1")
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok := 0
			for range 200 {
				_, code, err := decide(e, "q", descs(desc("ip=1")), 1, 0, nil)
				if err == nil && code == OK {
					ok++
				}
			}
			mu.Lock()
			total += ok
			mu.Unlock()
		}()
	}
	for i := range 50 {
		l.Set(0.2-0.003*float64(i), 0)
		other := lease(t, e, 0.1, 0, fmt.Sprintf("ip=x%d", i))
		other.Release(0)
	}
	wg.Wait()
	if total > 200 {
		t.Fatalf("admitted %d, more than 0.2 × 1000", total)
	}
	if _, adm := l.Counts(); adm != uint64(total) {
		t.Fatalf("lease counted %d, want %d", adm, total)
	}
}

// A snapshot holds a leased key's debt under its usual bucket, where a
// restore, which knows no leases, finds it; never the leased bucket.
func TestLeaseInASnapshot(t *testing.T) {
	e := leaseRig(t, Options{})
	l := lease(t, e, 0.1, 0, "ip=1")
	if got := admitted(t, e, "q", desc("ip=1"), 80, 0); got != 80 {
		t.Fatal(got)
	}
	var saved []bucket.Saved
	e.Export(0, func(b []bucket.Saved) { saved = append(saved, b...) })
	if len(saved) != 1 || saved[0].Key != l.Key() || saved[0].Fill > 0.2+1e-9 {
		t.Fatalf("saved %+v, want the usual bucket %#x at fill 0.2", saved, l.Key())
	}
}

// A lease on a hot value's key starts from the hot bucket; when the value
// cools while leased, the lease's debt goes to the usual bucket, where
// the value's own went, not to the forgotten hot bucket.
func TestLeaseOnAHotValue(t *testing.T) {
	e, d := hotRig(t)
	hot := e.SetHot(d, []uint64{idOf(e, d, "client=c1")}, 0)
	e.SetGroupWeight(hot[0].Group(), 0.8, 0)
	if got := admitted(t, e, "a", desc("client=c1"), 40, 0); got != 40 {
		t.Fatal(got)
	}
	s := e.BucketShare("a", map[string]string{"client": "c1"})
	l, err := e.Lease(s.Rule, s.Key, 0.4, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The hot bucket is at 40/80 = 0.5: the lease starts at 0.5 × 40.
	if got := admitted(t, e, "a", desc("client=c1"), 100, 0); got != 20 {
		t.Fatalf("the lease gave %d at once, want 20 (the hot bucket's fill)", got)
	}
	if off, adm := hot[0].Counts(); off != 140 || adm != 60 {
		t.Fatalf("hot meter %d %d: draws through the lease still meter the hot value", off, adm)
	}
	e.SetHot(d, nil, 0) // c1 cools while leased
	l.Release(0)
	if got := admitted(t, e, "a", desc("client=c1"), 100, 0); got != 0 {
		t.Fatalf("after the value cooled and the lease ended, c1 got %d, want 0 (the lease's bucket was empty)", got)
	}
}
