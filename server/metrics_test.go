package server

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/source"
)

// The families a rule owns; everything else in the registry is left alone.
var ruleFamilies = map[string]bool{
	"sharelimit_decisions_total":          true,
	"sharelimit_decisions_detailed_total": true,
	"sharelimit_shadow_over_limit_total":  true,
}

// series gathers the rule families as `family{label="v",...}` -> value, labels
// sorted by name, so a test can look a series up by its exposition text.
func series(t testing.TB, m *Metrics) map[string]float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if !ruleFamilies[mf.GetName()] {
			continue
		}
		for _, s := range mf.GetMetric() {
			var ls []string
			for _, l := range s.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(ls)
			out[mf.GetName()+"{"+strings.Join(ls, ",")+"}"] = s.GetCounter().GetValue()
		}
	}
	return out
}

// matching returns the series whose text contains every one of parts.
func matching(all map[string]float64, parts ...string) map[string]float64 {
	out := map[string]float64{}
next:
	for k, v := range all {
		for _, p := range parts {
			if !strings.Contains(k, p) {
				continue next
			}
		}
		out[k] = v
	}
	return out
}

func sum(all map[string]float64) float64 {
	var n float64
	for _, v := range all {
		n += v
	}
	return n
}

func newTestMetrics() *Metrics {
	return NewMetrics(bucket.NewStore(1))
}

// loadSet compiles files (name -> YAML) as the daemon would a config dir.
func loadSet(t testing.TB, files map[string]string) *descriptors.Set {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	set, err := source.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func parseSet(t testing.TB, yml string) *descriptors.Set {
	t.Helper()
	set, err := descriptors.Parse("d.yaml", strings.NewReader(yml))
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func rule(t testing.TB, set *descriptors.Set, path string) *descriptors.Rule {
	t.Helper()
	for _, r := range set.Rules() {
		if r.Path() == path {
			return r
		}
	}
	t.Fatalf("no rule %s in the set", path)
	return nil
}

func desc(key, value string) []*commonv3.RateLimitDescriptor {
	return []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}}
}

// countRule counts one decision of r, as the service would after Decide.
func countRule(m *Metrics, set *descriptors.Set, r *descriptors.Rule, value string, code rlsv3.RateLimitResponse_Code, shadowed bool) {
	m.count(set, r.Domain(), desc(r.Key(), value), []engine.Status{{Rule: r, Limit: r.Limit(), Code: code, Shadowed: shadowed}}, 0, 0)
}

func countOverride(m *Metrics, set *descriptors.Set, domain string) {
	lim := new(descriptors.Limit) // counting reads only that there is a limit
	m.count(set, domain, desc("any", "x"), []engine.Status{{Limit: lim, Override: true, Code: engine.OK}}, 0, 0)
}

func TestReloadDropsRemovedRuleSeries(t *testing.T) {
	t.Parallel()
	const d1 = `
domain: d
descriptors:
  - key: keep
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: gone
    shadow_mode: true
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 10}
`
	const d2 = `
domain: d
descriptors:
  - key: keep
    rate_limit: {unit: second, requests_per_unit: 10}
`
	const e = `
domain: e
descriptors:
  - key: x
    rate_limit: {unit: second, requests_per_unit: 10}
`
	m := newTestMetrics()
	old := loadSet(t, map[string]string{"d.yaml": d1, "e.yaml": e})
	m.Bind(old)
	keep, gone, x := rule(t, old, "d.keep"), rule(t, old, "d.gone"), rule(t, old, "e.x")
	for range 3 {
		countRule(m, old, keep, "a", engine.OK, false)
	}
	countRule(m, old, keep, "a", engine.OverLimit, false)
	countRule(m, old, gone, "v1", engine.OK, false)
	countRule(m, old, gone, "v2", engine.OK, true) // shadowed: reported OK
	countRule(m, old, x, "b", engine.OK, false)
	countOverride(m, old, "d")
	countOverride(m, old, "e")
	before := series(t, m)
	for _, part := range []string{`rule="d.gone"`, `domain="e"`, `rule="override"`} {
		if len(matching(before, part)) == 0 {
			t.Fatalf("fixture: no %s series before the reload: %v", part, before)
		}
	}

	// The daemon's order: bind the new set, install it, then unbind the old.
	cur := loadSet(t, map[string]string{"d.yaml": d2})
	m.Bind(cur)
	m.Unbind(old)

	after := series(t, m)
	for _, part := range []string{`rule="d.gone"`, `rule="e.x"`, `domain="e"`} {
		if got := matching(after, part); len(got) > 0 {
			t.Errorf("series of a removed rule or domain survived the reload: %v", got)
		}
	}
	want := map[string]float64{
		`sharelimit_decisions_total{code="OK",domain="d",rule="d.keep"}`:         3,
		`sharelimit_decisions_total{code="OVER_LIMIT",domain="d",rule="d.keep"}`: 1,
		`sharelimit_decisions_total{code="OK",domain="d",rule="override"}`:       1,
	}
	for k, v := range want {
		if after[k] != v {
			t.Errorf("%s = %v, want %v (a rule in both sets keeps its count)", k, after[k], v)
		}
	}

	// A request decided with the old set and counted after the reload: the
	// shared rule counts exactly, and the removed ones stay removed.
	countRule(m, old, keep, "a", engine.OK, false)
	countRule(m, old, gone, "v3", engine.OK, true)
	countRule(m, old, x, "b", engine.OK, false)
	countOverride(m, old, "e")
	countRule(m, cur, rule(t, cur, "d.keep"), "a", engine.OK, false)
	late := series(t, m)
	if k := `sharelimit_decisions_total{code="OK",domain="d",rule="d.keep"}`; late[k] != 5 {
		t.Errorf("%s = %v, want 5", k, late[k])
	}
	for _, part := range []string{`rule="d.gone"`, `domain="e"`} {
		if got := matching(late, part); len(got) > 0 {
			t.Errorf("a late count resurrected a removed series: %v", got)
		}
	}

	// Unbinding a set twice, or one never bound, changes nothing.
	m.Unbind(old)
	m.Unbind(loadSet(t, map[string]string{"d.yaml": d2}))
	if got := series(t, m); len(got) != len(late) {
		t.Errorf("a stray Unbind changed the series: %v, was %v", got, late)
	}
}

func TestDetailedValuesCappedAcrossReloads(t *testing.T) {
	t.Parallel()
	const yml = `
domain: d
descriptors:
  - key: k
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 10}
`
	m := newTestMetrics()
	set := parseSet(t, yml)
	m.Bind(set)
	counted := 0
	next := 0
	countNew := func(n int) {
		for range n {
			countRule(m, set, rule(t, set, "d.k"), fmt.Sprintf("10.0.%d.%d", next/256, next%256), engine.OK, false)
			next++
			counted++
		}
	}
	check := func(when string) {
		t.Helper()
		detailed := matching(series(t, m), "sharelimit_decisions_detailed_total", `rule="d.k"`)
		values := map[string]bool{}
		for k := range detailed {
			_, v, _ := strings.Cut(k, `key="`)
			v, _, _ = strings.Cut(v, `"`)
			values[v] = true
		}
		if len(values) > maxDetailedValues+1 || !values["_other_"] {
			t.Fatalf("%s: %d values exported (want at most %d and _other_)", when, len(values), maxDetailedValues)
		}
		if got := sum(detailed); got != float64(counted) {
			t.Fatalf("%s: detailed series sum to %v, want %d", when, got, counted)
		}
	}
	countNew(maxDetailedValues + 50)
	check("first set")
	first := `sharelimit_decisions_detailed_total{code="OK",domain="d",key="d.k_10.0.0.0",rule="d.k"}`
	if got := series(t, m)[first]; got != 1 {
		t.Fatalf("%s = %v, want 1", first, got)
	}

	// Each reload brings the same rule in a new set: the cap is the rule's, not
	// the set's, so no reload lets clients mint another 100 series.
	for i := range 5 {
		old := set
		set = parseSet(t, yml)
		m.Bind(set)
		m.Unbind(old)
		countNew(maxDetailedValues)
		countRule(m, set, rule(t, set, "d.k"), "10.0.0.0", engine.OK, false)
		counted++
		check(fmt.Sprintf("reload %d", i+1))
	}
	if got := series(t, m)[first]; got != 6 {
		t.Fatalf("%s = %v, want 6: an admitted value keeps its series across reloads", first, got)
	}
}

// TestCountConcurrentWithReloads counts from many goroutines with whatever set
// is current while another goroutine reloads, as the service and the reload
// watcher do. Rule d.k is in every set; rule d.y<i> only in set i, so the
// y rules come and go with every reload.
func TestCountConcurrentWithReloads(t *testing.T) {
	t.Parallel()
	const workers, reloads, rounds = 8, 60, 20
	sets := make([]*descriptors.Set, reloads)
	for i := range sets {
		sets[i] = parseSet(t, fmt.Sprintf(`
domain: d
descriptors:
  - key: k
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: y%d
    value_to_metric: true
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 10}
`, i))
	}
	m := newTestMetrics()
	var cur atomic.Pointer[descriptors.Set]
	m.Bind(sets[0])
	cur.Store(sets[0])

	var done atomic.Bool
	var wg sync.WaitGroup
	counts := make([]int, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !done.Load() || i < 2000; i++ {
				set := cur.Load()
				code := engine.OK
				if i%3 == 0 {
					code = engine.OverLimit
				}
				value := fmt.Sprintf("user-%d", (w*7919+i)%(2*maxDetailedValues))
				k, y := set.Rule(0), set.Rule(1)
				// One request with both descriptors, as Envoy would send them.
				m.count(set, "d", append(desc(k.Key(), value), desc(y.Key(), value)...), []engine.Status{
					{Rule: k, Limit: k.Limit(), Code: code},
					{Rule: y, Limit: y.Limit(), Code: engine.OK, Shadowed: code == engine.OverLimit},
				}, 0, 0)
				counts[w]++
			}
		}()
	}
	// Cycle through the sets (a set may be bound again after its Unbind) for
	// long enough that the counting goroutines overlap many reloads.
	for i := 1; i < rounds*reloads; i++ {
		next, prev := sets[i%reloads], sets[(i-1)%reloads]
		m.Bind(next)
		cur.Store(next)
		m.Unbind(prev)
		runtime.Gosched()
	}
	done.Store(true)
	wg.Wait()

	total := 0
	for _, n := range counts {
		total += n
	}
	all := series(t, m)
	if got := sum(matching(all, "sharelimit_decisions_total{", `rule="d.k"`)); got != float64(total) {
		t.Errorf("decisions of d.k sum to %v, want %d", got, total)
	}
	detailed := matching(all, "sharelimit_decisions_detailed_total", `rule="d.k"`)
	if got := sum(detailed); got != float64(total) {
		t.Errorf("detailed series of d.k sum to %v, want %d", got, total)
	}
	if len(detailed) > 2*(maxDetailedValues+1) {
		t.Errorf("%d detailed series of d.k, want at most %d", len(detailed), 2*(maxDetailedValues+1))
	}
	last := fmt.Sprintf(`rule="d.y%d"`, reloads-1)
	for k := range matching(all, `rule="d.y`) {
		if !strings.Contains(k, last) {
			t.Errorf("series of a removed rule survived: %s", k)
		}
	}
	if len(matching(all, "sharelimit_decisions_total{", last)) == 0 {
		t.Errorf("no series for the rule in force, %s", last)
	}
}

// TestLateDetailedCountCreatesNoSeries plays the race a reload leaves open: a
// count reached the old set's binding just before Unbind retired the rule, and
// now meets a value (or code) that has no series yet. It must not create one.
func TestLateDetailedCountCreatesNoSeries(t *testing.T) {
	t.Parallel()
	m := newTestMetrics()
	old := parseSet(t, `
domain: d
descriptors:
  - key: gone
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 10}
`)
	m.Bind(old)
	gone := rule(t, old, "d.gone")
	countRule(m, old, gone, "seen", engine.OK, false)
	v, _ := m.bound.Load(old)
	stale := v.(*boundRules).lookup(&engine.Status{Rule: gone, Limit: gone.Limit()}, "d")
	if stale.detailed == nil {
		t.Fatal("fixture: the rule has no detailed values")
	}

	m.Bind(parseSet(t, "domain: d\ndescriptors: []\n"))
	m.Unbind(old)
	stale.detailed.inc([]byte("seen"), 1) // a code the value has not used
	stale.detailed.inc([]byte("new"), 0)  // a value never admitted
	stale.series.ok.Inc()
	if got := matching(series(t, m), `rule="d.gone"`); len(got) > 0 {
		t.Fatalf("a late count brought back a removed rule's series: %v", got)
	}
}

// TestDetailedKeyIsUpstreamsFullPath: a detailed_metric or value_to_metric
// decision is counted under upstream's stats key for the whole request, every
// level's value included, not under the last entry's value alone. A
// value_to_metric on a parent level (with no limit of its own) counts too.
func TestDetailedKeyIsUpstreamsFullPath(t *testing.T) {
	t.Parallel()
	set := parseSet(t, `
domain: d
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: tenant
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit: {unit: second, requests_per_unit: 10}
`)
	m := newTestMetrics()
	m.Bind(set)
	e := newEngine(t, set, bucket.NewStore(0), engine.Options{})
	for _, req := range [][]string{{"route", "draw", "method", "GET"}, {"tenant", "acme", "user", "42"}} {
		d := &commonv3.RateLimitDescriptor{Entries: []*commonv3.RateLimitDescriptor_Entry{
			{Key: req[0], Value: req[1]}, {Key: req[2], Value: req[3]}}}
		descs := []*commonv3.RateLimitDescriptor{d}
		var dec engine.Decision
		if err := e.Decide(&dec, "d", descs, 0, 0); err != nil {
			t.Fatal(err)
		}
		m.count(dec.Set, "d", descs, dec.Statuses, 0, 0)
	}
	got := matching(series(t, m), "sharelimit_decisions_detailed_total")
	for _, want := range []string{
		`sharelimit_decisions_detailed_total{code="OK",domain="d",key="d.route_draw.method",rule="d.route.method"}`,
		`sharelimit_decisions_detailed_total{code="OK",domain="d",key="d.tenant_acme.user_42",rule="d.tenant.user"}`,
	} {
		if got[want] != 1 {
			t.Errorf("%s = %v, want 1; all: %v", want, got[want], got)
		}
	}
}
