package rlqs

import (
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var tenantA = map[string]string{"tenant": "a"}

// A new bucket is answered at once with a token bucket within the share,
// and the RLS lease is cut to what is left.
func TestNewBucketAnsweredAtOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.eng.limit("edge", "tenant=a", 1, 100, 200, 0.5)
	st, _ := f.stream()
	resp := f.exchange(st, report("edge", usage(tenantA, 1, 0, 0)))
	a := assignment(resp, tenantA)
	qa := a.GetQuotaAssignmentAction()
	if qa == nil || qa.GetAssignmentTimeToLive().GetSeconds() != 15 {
		t.Fatalf("got %v, want an assignment with a 15 s TTL", a)
	}
	tb := qa.GetRateLimitStrategy().GetTokenBucket()
	if tb == nil || tb.GetMaxTokens() < 1 {
		t.Fatalf("got %v, want a token bucket", qa)
	}
	// RLS has not drawn on the key: it takes no part of the share.
	lw := f.eng.lease(1).weight()
	if rls, part := lw*100, envoyRate(a); part <= 0 || rls != 0 || part+rls > 50+1e-9 {
		t.Fatalf("stream %.3f/s + RLS %.3f/s, want the stream > 0, RLS 0 (it never drew), at most the share 50/s", part, rls)
	}
	if float64(tb.GetMaxTokens())+lw*200 > 100+1e-9 {
		t.Fatalf("bursts %d + %.3f over the share's 100", tb.GetMaxTokens(), lw*200)
	}
}

// Blanket answers: unknown domain, no rule and a failed lease deny; an
// unlimited rule allows.
func TestBlanketAnswers(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		domain  string
		setup   func(*fakeEngine)
		allow   bool
		refusal string
	}{
		{"unknown domain", "nowhere", func(e *fakeEngine) {}, false, "unknown_domain"},
		{"no rule", "edge", func(e *fakeEngine) { e.limit("edge", "tenant=b", 1, 10, 10, 1) }, false, "no_rule"},
		{"no limit", "edge", func(e *fakeEngine) { e.set("edge", "tenant=a", Target{Kind: NoLimit}) }, false, "no_rule"},
		{"no lease", "edge", func(e *fakeEngine) { e.limit("edge", "tenant=a", 1, 10, 10, 1); e.noLease = true }, false, "lease"},
		{"unlimited", "edge", func(e *fakeEngine) { e.set("edge", "tenant=a", Target{Kind: Unlimited}) }, true, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, nil)
			tc.setup(f.eng)
			st, _ := f.stream()
			a := assignment(f.exchange(st, report(tc.domain, usage(tenantA, 1, 0, 0))), tenantA)
			want := typev3.RateLimitStrategy_DENY_ALL
			if tc.allow {
				want = typev3.RateLimitStrategy_ALLOW_ALL
			}
			s := a.GetQuotaAssignmentAction().GetRateLimitStrategy()
			if s.GetTokenBucket() != nil || s.GetBlanketRule() != want {
				t.Fatalf("got %v, want %v", s, want)
			}
			if tc.refusal != "" && f.svc.Snapshot().Refusals[tc.refusal] == 0 {
				t.Fatalf("refusal %q not counted: %v", tc.refusal, f.svc.Snapshot().Refusals)
			}
		})
	}
}

// Bad reports end the stream with InvalidArgument and a message that says
// what was wrong.
func TestBadReports(t *testing.T) {
	t.Parallel()
	huge := map[string]string{}
	for i := range 65 {
		huge[string(rune('a'+i%26))+string(rune('a'+i/26))] = "v"
	}
	long := make([]byte, 5000)
	for i := range long {
		long[i] = 'x'
	}
	cases := []struct {
		name string
		r    []*rlqsv3.RateLimitQuotaUsageReports
		want string
	}{
		{"empty id", []*rlqsv3.RateLimitQuotaUsageReports{report("edge", usage(map[string]string{}, 1, 0, 0))}, "bucket_id: empty"},
		{"too many entries", []*rlqsv3.RateLimitQuotaUsageReports{report("edge", usage(huge, 1, 0, 0))}, "65 entries"},
		{"empty key", []*rlqsv3.RateLimitQuotaUsageReports{report("edge", usage(map[string]string{"": "v"}, 1, 0, 0))}, "empty key"},
		{"huge key", []*rlqsv3.RateLimitQuotaUsageReports{report("edge", usage(map[string]string{string(long[:300]): "v"}, 1, 0, 0))}, "key of 300 bytes"},
		{"huge value", []*rlqsv3.RateLimitQuotaUsageReports{report("edge", usage(map[string]string{"k": string(long)}, 1, 0, 0))}, "value of 5000 bytes"},
		{"no domain", []*rlqsv3.RateLimitQuotaUsageReports{report("", usage(tenantA, 1, 0, 0))}, "names no domain"},
		{"huge id", []*rlqsv3.RateLimitQuotaUsageReports{report("edge", usage(map[string]string{"a": string(long[:4000]), "b": string(long[:4000]), "c": string(long[:4000])}, 1, 0, 0))}, "12003 bytes of keys and values, at most 8192"},
		{"huge domain", []*rlqsv3.RateLimitQuotaUsageReports{report(string(long), usage(tenantA, 1, 0, 0))}, "domain: 5000 bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, nil)
			f.eng.limit("edge", "tenant=a", 1, 10, 10, 1)
			st, _ := f.stream()
			for _, r := range tc.r {
				if err := st.Send(r); err != nil {
					t.Fatal(err)
				}
			}
			_, err := recvWithin(t, st, 10*time.Second)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
				t.Fatalf("got %v, want InvalidArgument saying %q", err, tc.want)
			}
			if f.svc.Snapshot().Refusals["invalid"] != 1 {
				t.Fatalf("refusals %v, want one invalid", f.svc.Snapshot().Refusals)
			}
			eventually(t, "the stream to close", func() bool { return len(f.svc.Snapshot().Streams) == 0 })
		})
	}
}

// An empty report and a later report without its domain are fine (Envoy
// sends both); time_elapsed 0 is fine.
func TestEnvoyQuirksAccepted(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.eng.limit("edge", "tenant=a", 1, 10, 10, 1)
	st, _ := f.stream()
	if err := st.Send(report("edge")); err != nil {
		t.Fatal(err)
	}
	resp := f.exchange(st, report("", usage(tenantA, 1, 0, 0)))
	if assignment(resp, tenantA).GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() == nil {
		t.Fatalf("got %v", resp)
	}
	if s := f.svc.Snapshot(); len(s.Streams) != 1 || s.Streams[0].Domain != "edge" || s.Reports != 2 {
		t.Fatalf("snapshot %+v", s)
	}
}
