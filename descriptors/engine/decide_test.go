package engine

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

const engineConfig = `
domain: d
descriptors:
  - key: fixed
    value: one
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: block
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: path
    value: "/api/*"
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: glob
    value: "/api/*"
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: general
    rate_limit: {unit: second, requests_per_unit: 100, name: general}
  - key: special
    rate_limit: {unit: second, requests_per_unit: 5, name: special, replaces: [{name: general}]}
  - key: big
    rate_limit: {unit: minute, requests_per_unit: 6000, burst: 50}
`

type decider struct {
	t   *testing.T
	e   *Engine
	now int64
}

func newDecider(t *testing.T, cfg string, w float64) *decider {
	t.Helper()
	return newDeciderWith(t, cfg, Options{Weight: w})
}

// newDeciderWith is newDecider with an engine built with opts.
func newDeciderWith(t *testing.T, cfg string, opts Options) *decider {
	t.Helper()
	return &decider{t: t, e: newEngine(t, mustParse(t, cfg), bucket.NewStore(0), opts)}
}

func desc(kvs ...string) *commonv3.RateLimitDescriptor {
	return &commonv3.RateLimitDescriptor{Entries: entries(kvs...)}
}

func (d *decider) decide(descs ...*commonv3.RateLimitDescriptor) ([]Status, string) {
	d.t.Helper()
	out, code, err := decide(d.e, "d", descs, 0, d.now, nil)
	if err != nil {
		d.t.Fatal(err)
	}
	return out, code.String()
}

// codes decides n times and returns one letter per decision: O for OK, X for
// OVER_LIMIT.
func (d *decider) codes(n int, descs ...*commonv3.RateLimitDescriptor) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		_, c := d.decide(descs...)
		if c == "OK" {
			b.WriteByte('O')
		} else {
			b.WriteByte('X')
		}
	}
	return b.String()
}

func (d *decider) advance(dt time.Duration) { d.now += int64(dt) }

func TestDecideRules(t *testing.T) {
	cases := []struct {
		name  string
		w     float64
		steps func(d *decider) string
		want  string
	}{
		{"fixed rule drains then refills", 1, func(d *decider) string {
			a := d.codes(4, desc("fixed=one"))
			d.advance(time.Second)
			return a + " " + d.codes(4, desc("fixed=one"))
		}, "OOOX OOOX"},
		{"per-value rule keeps one bucket per value", 1, func(d *decider) string {
			return d.codes(3, desc("ip=10.0.0.1")) + " " + d.codes(3, desc("ip=10.0.0.2"))
		}, "OOX OOX"},
		{"share_threshold: all matching values share one bucket", 1, func(d *decider) string {
			return d.codes(1, desc("path=/api/a")) + d.codes(1, desc("path=/api/b")) + d.codes(1, desc("path=/api/c"))
		}, "OOX"},
		{"wildcard without share_threshold: a bucket per value", 1, func(d *decider) string {
			return d.codes(2, desc("glob=/api/a")) + d.codes(2, desc("glob=/api/b")) + d.codes(1, desc("glob=/api/a"))
		}, "OOOOX"},
		{"shadow mode reports OK", 1, func(d *decider) string { return d.codes(3, desc("shadow=x")) }, "OOO"},
		{"unlimited always OK", 1, func(d *decider) string { return d.codes(5, desc("free=x")) }, "OOOOO"},
		{"requests_per_unit 0 blocks", 1, func(d *decider) string { return d.codes(2, desc("block=x")) }, "XX"},
		{"no match is OK", 1, func(d *decider) string { return d.codes(3, desc("nothing=x")) }, "OOO"},
		{"weight 1/2 halves the share", 0.5, func(d *decider) string {
			return d.codes(2, desc("fixed=one")) + " " + d.codes(3, desc("ip=a"))
		}, "OX OXX"},
		{"over if any descriptor is over", 1, func(d *decider) string {
			return d.codes(4, desc("fixed=one"), desc("free=1"))
		}, "OOOX"},
		{"shadow over does not make the request over", 1, func(d *decider) string {
			return d.codes(3, desc("shadow=x"), desc("free=1"))
		}, "OOO"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := newDecider(t, engineConfig, tc.w)
			if got := tc.steps(d); got != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
		})
	}
}

func TestDecideStatusFields(t *testing.T) {
	d := newDecider(t, engineConfig, 0.25)
	out, code := d.decide(desc("big=1"), desc("unknown=1"), desc("free=1"), desc("shadow=s"))
	if code != "OK" || len(out) != 4 {
		t.Fatalf("code %s, %d statuses", code, len(out))
	}
	big := out[0]
	// Cluster burst 50 at w=1/4: local size 12.5, one drawn leaves 11.5 → 46 cluster-wide.
	if big.Limit == nil || big.Limit.RequestsPerUnit() != 6000 || big.Remaining != 46 {
		t.Fatalf("big: %+v", big)
	}
	// Time until full: 1 token at the local rate 6000/60/4 = 25/s is 40 ms.
	if big.Reset != 40*time.Millisecond {
		t.Fatalf("reset %v", big.Reset)
	}
	if out[1].Limit != nil || out[1].Code != OK {
		t.Fatalf("unmatched: %+v", out[1])
	}
	if out[2].Remaining != math.MaxUint32 || out[2].Limit == nil || !out[2].Limit.Unlimited() {
		t.Fatalf("unlimited: %+v", out[2])
	}
	out, _ = d.decide(desc("shadow=s"))
	if !out[0].Shadowed || out[0].Code != OK {
		t.Fatalf("shadow: %+v", out[0])
	}
}

func TestDecideRemainingCappedAtBurst(t *testing.T) {
	// A limit of 10 at weight 1/7 floors the local size at 1.43; remaining is
	// tokens ÷ weight and never claims more than the cluster burst.
	d := newDecider(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3}\n", 0.1)
	out, _ := d.decide(&commonv3.RateLimitDescriptor{Entries: entries("k=v"), HitsAddend: wrapperspb.UInt64(0)})
	if out[0].Remaining != 3 {
		t.Fatalf("remaining %d, want the burst 3", out[0].Remaining)
	}
}

func TestHitsAddend(t *testing.T) {
	d := newDecider(t, engineConfig, 1)
	check := func(n uint64) *commonv3.RateLimitDescriptor {
		return &commonv3.RateLimitDescriptor{Entries: entries("fixed=one"), HitsAddend: wrapperspb.UInt64(n)}
	}
	// Request-level addend 0 counts as 1; 2 takes two tokens.
	if _, code, _ := decide(d.e, "d", []*commonv3.RateLimitDescriptor{desc("fixed=one")}, 2, 0, nil); code != OK {
		t.Fatal(code)
	}
	// The descriptor's addend wins over the request's: 0 is check-only.
	out, code, _ := decide(d.e, "d", []*commonv3.RateLimitDescriptor{check(0)}, 5, 0, nil)
	if code != OK || out[0].Remaining != 1 {
		t.Fatalf("check-only changed the bucket or failed: %v %+v", code, out[0])
	}
	if _, code, _ = decide(d.e, "d", []*commonv3.RateLimitDescriptor{check(2)}, 0, 0, nil); code != OverLimit {
		t.Fatal("2 hits on 1 token passed")
	}
	// Negative hits give tokens back.
	neg := check(2)
	neg.IsNegativeHits = true
	if out, code, _ = decide(d.e, "d", []*commonv3.RateLimitDescriptor{neg}, 0, 0, nil); code != OK || out[0].Remaining != 3 {
		t.Fatalf("negative hits: %v %+v", code, out[0])
	}
}

func TestReplaces(t *testing.T) {
	d := newDecider(t, engineConfig, 1)
	// special (5/s) replaces general (100/s) within one request.
	out, _ := d.decide(desc("general=x"), desc("special=y"))
	if !out[0].Replaced || out[0].Limit != nil || out[0].Code != OK {
		t.Fatalf("general not replaced: %+v", out[0])
	}
	if out[1].Limit == nil || out[1].Limit.Name() != "special" {
		t.Fatalf("special: %+v", out[1])
	}
	// Alone, general applies.
	out, _ = d.decide(desc("general=x"))
	if out[0].Limit == nil || out[0].Replaced {
		t.Fatalf("general alone: %+v", out[0])
	}
}

func TestIdenticalDescriptorsDrawTwice(t *testing.T) {
	d := newDecider(t, engineConfig, 1)
	if got := d.codes(2, desc("fixed=one"), desc("fixed=one")); got != "OX" {
		t.Fatalf("got %s", got)
	}
}

func TestOverride(t *testing.T) {
	d := newDecider(t, engineConfig, 0.5)
	ov := func(rpu uint32, unit typev3.RateLimitUnit) *commonv3.RateLimitDescriptor {
		return &commonv3.RateLimitDescriptor{Entries: entries("fixed=one"),
			Limit: &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}}
	}
	// 4/s over 2 replicas: 2 locally, in a bucket of its own (the rule's 3/s is untouched).
	if got := d.codes(3, ov(4, typev3.RateLimitUnit_SECOND)); got != "OOX" {
		t.Fatalf("override: %s", got)
	}
	out, _ := d.decide(ov(4, typev3.RateLimitUnit_SECOND))
	if !out[0].Override || out[0].Limit.RequestsPerUnit() != 4 {
		t.Fatalf("status %+v", out[0])
	}
	if got := d.codes(1, desc("fixed=one")); got != "O" {
		t.Fatal("override shared the rule's bucket")
	}
	// A different override value is a different bucket.
	if got := d.codes(1, ov(6, typev3.RateLimitUnit_SECOND)); got != "O" {
		t.Fatal("override values not part of the bucket identity")
	}
	for _, bad := range []*commonv3.RateLimitDescriptor{ov(4, typev3.RateLimitUnit_UNKNOWN), ov(0, typev3.RateLimitUnit_SECOND), ov(4, 99)} {
		_, _, err := decide(d.e, "d", []*commonv3.RateLimitDescriptor{bad}, 0, 0, nil)
		if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), "descriptors[0].limit") {
			t.Fatalf("bad override %v: %v", bad.Limit, err)
		}
	}
}

func TestBadRequests(t *testing.T) {
	e := newEngine(t, mustParse(t, engineConfig), bucket.NewStore(0), Options{})
	many := make([]*commonv3.RateLimitDescriptor, MaxDescriptors+1)
	for i := range many {
		many[i] = desc("ip=1")
	}
	deep := desc(strings.Split(strings.Repeat("k=v,", MaxEntries+1), ",")[:MaxEntries+1]...)
	cases := []struct {
		name   string
		domain string
		descs  []*commonv3.RateLimitDescriptor
		field  string
	}{
		{"empty domain", "", []*commonv3.RateLimitDescriptor{desc("a=b")}, "domain"},
		{"no descriptors", "d", nil, "descriptors"},
		{"null descriptor", "d", []*commonv3.RateLimitDescriptor{nil}, "descriptors[0]"},
		{"no entries", "d", []*commonv3.RateLimitDescriptor{{}}, "descriptors[0].entries"},
		{"empty key", "d", []*commonv3.RateLimitDescriptor{desc("a=b", "=c")}, "descriptors[0].entries[1].key"},
		{"too many descriptors", "d", many, "descriptors"},
		{"too many entries", "d", []*commonv3.RateLimitDescriptor{deep}, "descriptors[0].entries"},
		{"key too long", "d", []*commonv3.RateLimitDescriptor{desc(strings.Repeat("k", MaxKeyBytes+1) + "=v")}, "descriptors[0].entries[0].key"},
		{"value too long", "d", []*commonv3.RateLimitDescriptor{desc("k=" + strings.Repeat("v", MaxValueBytes+1))}, "descriptors[0].entries[0].value"},
		{"hits too large", "d", []*commonv3.RateLimitDescriptor{{Entries: entries("a=b"), HitsAddend: wrapperspb.UInt64(MaxHits + 1)}}, "descriptors[0].hits_addend"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, code, err := decide(e, tc.domain, tc.descs, 0, 0, nil)
			var re *RequestError
			if !errors.As(err, &re) || !errors.Is(err, ErrInvalidRequest) || re.Field != tc.field {
				t.Fatalf("got %v (code %v), want a RequestError on %s", err, code, tc.field)
			}
		})
	}
	// The caps themselves are accepted.
	ok := make([]*commonv3.RateLimitDescriptor, MaxDescriptors)
	for i := range ok {
		ok[i] = desc("k=" + strings.Repeat("v", MaxValueBytes))
	}
	if _, _, err := decide(e, "d", ok, 0, 0, nil); err != nil {
		t.Fatalf("a request at the caps was refused: %v", err)
	}
}

func TestUnknownDomainIgnoresOverride(t *testing.T) {
	e := newEngine(t, mustParse(t, engineConfig), bucket.NewStore(0), Options{})
	out, code, err := decide(e, "nope", []*commonv3.RateLimitDescriptor{{Entries: entries("a=b"),
		Limit: &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_SECOND}}}, 0, 0, nil)
	if err != nil || code != OK || out[0].Limit != nil {
		t.Fatalf("unknown domain: %v %v %+v", err, code, out[0])
	}
}

func TestReloadKeepsUnchangedRulesState(t *testing.T) {
	d := newDecider(t, engineConfig, 1)
	d.codes(3, desc("fixed=one"))  // drained
	d.codes(2, desc("ip=1.2.3.4")) // drained
	// A new config: fixed unchanged, ip's limit changed, a rule added.
	next := strings.Replace(engineConfig, "{unit: second, requests_per_unit: 2}\n  - key: shadow", "{unit: second, requests_per_unit: 4}\n  - key: shadow", 1) +
		"  - key: added\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	d.e.Swap(mustParse(t, next))
	if got := d.codes(1, desc("fixed=one")); got != "X" {
		t.Fatal("unchanged rule lost its bucket state across the reload")
	}
	// The changed rule keeps its bucket's fill ratio: empty of 4 now, and
	// half full (2 of 4) half a second on.
	if got := d.codes(1, desc("ip=1.2.3.4")); got != "X" {
		t.Fatalf("changed rule handed out a fresh burst: %s", got)
	}
	d.advance(500 * time.Millisecond)
	if got := d.codes(3, desc("ip=1.2.3.4")); got != "OOX" {
		t.Fatalf("changed rule half a second on: %s, want OOX", got)
	}
	// The added rule starts full under Swap, as at start-up (SwapAt
	// ramps it).
	if got := d.codes(2, desc("added=x")); got != "OX" {
		t.Fatalf("added rule: %s", got)
	}
	// Swapping back to the original finds the original buckets again.
	d.e.Swap(mustParse(t, engineConfig))
	if got := d.codes(3, desc("fixed=one")); got != "OXX" {
		t.Fatalf("fixed=one after the swap back: %s, want OXX (1.5 tokens refilled in half a second)", got)
	}
}

func TestWeightChangeAppliesLive(t *testing.T) {
	d := newDecider(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100}\n", 1)
	d.codes(50, desc("k=v")) // half full: 50 of 100
	d.e.SetWeight(0.25, d.now)
	// Still half full, of 25: 12 more pass, the 13th does not.
	if got := d.codes(13, desc("k=v")); got != strings.Repeat("O", 12)+"X" {
		t.Fatalf("after re-division: %s", got)
	}
	d.e.SetWeight(0, d.now) // nonsense weights are ignored
	d.e.SetWeight(2, d.now)
	if w := d.e.Weight().W; w != 0.25 {
		t.Fatalf("weight %v", w)
	}
}

func TestDecideReusesOut(t *testing.T) {
	e := newEngine(t, mustParse(t, engineConfig), bucket.NewStore(0), Options{})
	buf := make([]Status, 0, 8)
	descs := []*commonv3.RateLimitDescriptor{desc("ip=1")}
	allocs := testing.AllocsPerRun(100, func() {
		out, _, _ := decide(e, "d", descs, 0, 0, buf)
		buf = out[:0]
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per decision on an existing bucket", allocs)
	}
}

// TestMergedDomainDecides: a domain merged from two files (the rules'
// TestMergeDomains) decides with the rule from the file that defines it.
func TestMergedDomainDecides(t *testing.T) {
	set, err := compileFilesWith(t, descriptors.CompileOptions{MergeDomains: true}, "../testdata/mergedomain/ok")
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, set, bucket.NewStore(0), Options{})
	sts, _, err := decide(e, "shop", descs(desc("checkout=x")), 0, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sts[0].Rule == nil || sts[0].Rule.Pos().File != "../testdata/mergedomain/ok/b.yaml" {
		t.Fatalf("checkout matched %v, want the rule from b.yaml", sts[0].Rule)
	}
	if _, code, _ := decide(e, "shop", descs(desc("checkout=x")), 0, 0, nil); code.String() != "OK" {
		t.Fatalf("second checkout: %s, want OK (2 per second)", code)
	}
	if _, code, _ := decide(e, "shop", descs(desc("checkout=x")), 0, 0, nil); code.String() != "OVER_LIMIT" {
		t.Fatalf("third checkout: %s, want OVER_LIMIT (2 per second)", code)
	}
}

// TestOverLimitReportsNothingRemaining: at weight 0.1 a 10/s limit has one
// local token; with half a token left, a request is OVER_LIMIT and must report
// limit_remaining 0, as upstream does, not the 5 that half a token ÷ 0.1 makes.
func TestOverLimitReportsNothingRemaining(t *testing.T) {
	d := newDecider(t, `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 10}
`, 0.1)
	if out, code := d.decide(desc("k=v")); code != "OK" || out[0].Remaining != 0 {
		t.Fatalf("first draw: %s remaining %d", code, out[0].Remaining)
	}
	d.now += int64(500 * time.Millisecond) // half a token back: 0.5 ÷ 0.1 = 5 "remaining"
	out, code := d.decide(desc("k=v"))
	if code != "OVER_LIMIT" || out[0].Remaining != 0 {
		t.Fatalf("OVER_LIMIT with remaining %d", out[0].Remaining)
	}
}

// TestOversizedWaitDrawIsOverLimitAtOnce: hits above the bucket size can never
// be served, so a wait rule answers OVER_LIMIT at once instead of reserving.
func TestOversizedWaitDrawIsOverLimitAtOnce(t *testing.T) {
	e := newEngine(t, mustParse(t, `
domain: d
descriptors:
  - key: wait
    rate_limit: {unit: second, requests_per_unit: 1000, burst: 2, policy: wait, max_wait: 15ms}
`), bucket.NewStore(0), Options{})
	out, code, err := decide(e, "d", []*commonv3.RateLimitDescriptor{{Entries: entries("wait=a"), HitsAddend: wrapperspb.UInt64(3)}}, 0, 0, nil)
	if err != nil || code != OverLimit || out[0].Wait != 0 {
		t.Fatalf("code %v wait %v err %v", code, out[0].Wait, err)
	}
	if e.Store().Live() != 0 {
		t.Fatal("a refused draw created a bucket")
	}
}
