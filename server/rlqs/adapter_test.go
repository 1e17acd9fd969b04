package rlqs

import (
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/descriptors/engine"
)

const adapterRules = `domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100, burst: 100}
  - key: open
    rate_limit: {unlimited: true}
  - key: daily
    rate_limit: {unit: day, requests_per_unit: 86400}
`

func realEngine(t *testing.T) *engine.Engine {
	t.Helper()
	set, err := descriptors.Parse("rules.yaml", strings.NewReader(adapterRules))
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(set, bucket.NewStore(0), engine.Options{Weight: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestAdapterResolves(t *testing.T) {
	t.Parallel()
	a := FromEngine(realEngine(t))
	for _, tc := range []struct {
		domain string
		id     map[string]string
		kind   Kind
	}{
		{"nowhere", tenantA, UnknownDomain},
		{"edge", map[string]string{"who": "x"}, NoRule},
		{"edge", map[string]string{"open": "x"}, Unlimited},
		{"edge", tenantA, Limited},
	} {
		if got := a.Resolve(tc.domain, tc.id); got.Kind != tc.kind {
			t.Errorf("%s %v: %v, want %v", tc.domain, tc.id, got.Kind, tc.kind)
		}
	}
	tg := a.Resolve("edge", tenantA)
	if tg.Rate != 100 || tg.Burst != 100 || tg.Weight != 0.5 || tg.WindowSeconds != 1 || tg.Rule == "" {
		t.Fatalf("target %+v", tg)
	}
	if d := a.Resolve("edge", map[string]string{"daily": "x"}); d.WindowSeconds != 86400 || fillSeconds(d.Rate, d.WindowSeconds) != 86400 {
		t.Fatalf("daily: %+v", d)
	}
}

// Through the real engine: the stream's assignment and RLS's leased draws
// on the same key together stay within the share.
func TestAdapterLeaseBoundsRLS(t *testing.T) {
	t.Parallel()
	e := realEngine(t)
	f := newFixture(t, func(o *Options) { o.Engine = FromEngine(e) })
	st, _ := f.stream()
	a := assignment(f.exchange(st, report("edge", usage(tenantA, 1, 0, 0))), tenantA)
	part := envoyRate(a)
	bs := e.BucketShare("edge", tenantA)
	if bs.Lease == nil || !bs.Lease.Active() {
		t.Fatal("no lease on the key")
	}
	if w := bs.Lease.Weight(); part <= 0 || part+w*100 > 50+1e-6 {
		t.Fatalf("stream %.3f/s + RLS %.3f/s over the share 50/s", part, w*100)
	}
	// RLS draws at one instant admit no more than the lease's burst.
	var dec engine.Decision
	descs := []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "a"}}}}
	admitted := 0
	now := f.clock.now()
	for range 200 {
		if err := e.Decide(&dec, "edge", descs, 1, now); err != nil {
			t.Fatal(err)
		}
		if dec.Code == engine.OK {
			admitted++
		}
	}
	tb := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if float64(admitted)+float64(tb.GetMaxTokens()) > 50+1 {
		t.Fatalf("RLS admitted %d at once beside the stream's burst %d, share 50", admitted, tb.GetMaxTokens())
	}
}

// The first Envoy limiter of a key starts full only if RLS has not drawn on
// it lately: through the real engine, a key RLS drained gets a ramping
// limiter; a key nobody drew on, a full one.
func TestFirstLimiterAfterRLSDrewRamps(t *testing.T) {
	t.Parallel()
	for _, drew := range []bool{true, false} {
		e := realEngine(t)
		f := newFixture(t, func(o *Options) { o.Engine = FromEngine(e) })
		if drew {
			var dec engine.Decision
			descs := []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "a"}}}}
			for range 60 { // the replica's share is 50: drained
				if err := e.Decide(&dec, "edge", descs, 1, f.clock.now()); err != nil {
					t.Fatal(err)
				}
			}
		}
		st, _ := f.stream()
		got := assignment(f.exchange(st, report("edge", usage(tenantA, 1, 0, 0))), tenantA).GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket().GetMaxTokens()
		switch {
		case drew && got != rampStart:
			t.Errorf("after RLS drained the key: max_tokens %d, want %d", got, rampStart)
		case !drew && got < 40:
			t.Errorf("a key nobody drew on: max_tokens %d, want about the share's 50", got)
		}
	}
}
