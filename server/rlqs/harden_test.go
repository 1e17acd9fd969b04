package rlqs

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sharelimit/sharelimit/descriptors/engine"
)

// recvActions reads responses until n bucket actions have arrived, failing
// on an error or a response over what a gRPC client takes by default.
func recvActions(t *testing.T, st *client, n int) []*rlqsv3.RateLimitQuotaResponse_BucketAction {
	t.Helper()
	var got []*rlqsv3.RateLimitQuotaResponse_BucketAction
	for len(got) < n {
		r, err := recvWithin(t, st, time.Minute)
		if err != nil {
			t.Fatalf("after %d of %d actions: %v", len(got), n, err)
		}
		if size := proto.Size(r); size > 4<<20 {
			t.Fatalf("a response of %d bytes, over gRPC's default 4 MiB", size)
		}
		got = append(got, r.GetBucketAction()...)
	}
	return got
}

// Envoy reports every bucket it holds in one periodic report. A report of
// many buckets is answered in full, in several responses, and is no reason
// to end the stream as a slow client.
func TestLargeReportIsAnswered(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.eng.wildcard("edge", "path", 1, 1e6, 1e6, 1)
	const n = 20_000
	us := make([]*bucketUsage, n)
	for i := range us {
		us[i] = usage(map[string]string{"path": fmt.Sprint("/p", i)}, 1, 0, 0)
	}
	st, _ := f.stream()
	if err := st.Send(report("edge", us...)); err != nil {
		t.Fatal(err)
	}
	recvActions(t, st, n)
	if s := f.svc.Snapshot(); len(s.Streams) != 1 || s.Refusals["slow_client"] != 0 {
		t.Fatalf("streams %d, refusals %v", len(s.Streams), s.Refusals)
	}
}

// A push of many changed assignments with long ids is split so that no
// response passes what a gRPC client takes (4 MiB by default).
func TestPushSplitUnderMessageLimit(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.Hold = 0 })
	f.eng.wildcard("edge", "path", 1, 1e6, 1e6, 1)
	st, _ := f.stream()
	pad := strings.Repeat("x", 3000)
	for r := range 4 {
		us := make([]*bucketUsage, 400)
		for i := range us {
			id := map[string]string{"path": fmt.Sprint(pad, r*1000+i), "q": pad}
			f.eng.limit("edge", idString(id), 1, 1e6, 1e6, 1)
			us[i] = usage(id, 1, 0, 0)
		}
		if err := st.Send(report("edge", us...)); err != nil {
			t.Fatal(err)
		}
		// The answer names the new ids and every older one, whose equal
		// part of the share shrank.
		recvActions(t, st, 400*(r+1))
	}
	f.eng.weight(0.5) // every part shrinks
	f.svc.Reshare()
	f.svc.Tick()
	recvActions(t, st, 1600)
}

// A key that cannot be leased (no weight group free) is denied, and leased
// once it can be: the ids recover without a reload.
func TestFailedLeaseIsRetried(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.eng.limit("edge", "tenant=a", 1, 100, 100, 1)
	f.eng.mu.Lock()
	f.eng.noLease = true
	f.eng.mu.Unlock()
	st, _ := f.stream()
	a := assignment(f.exchange(st, report("edge", usage(tenantA, 1, 0, 0))), tenantA)
	if !isBlanket(a, typev3.RateLimitStrategy_DENY_ALL) {
		t.Fatalf("without a lease: %v, want DENY_ALL", a)
	}
	f.eng.mu.Lock()
	f.eng.noLease = false
	f.eng.mu.Unlock()
	f.clock.advance(time.Second)
	f.svc.Tick()
	r, err := recvWithin(t, st, 5*time.Second)
	if err != nil {
		t.Fatalf("no assignment once the key could be leased: %v", err)
	}
	if tb := assignment(r, tenantA).GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket(); tb == nil || tb.GetMaxTokens() < 1 {
		t.Fatalf("once the key could be leased: %v, want a token bucket", r)
	}
	checkSums(t, f.svc.Snapshot())
	if n := f.svc.Snapshot().Refusals["lease"]; n != 1 {
		t.Fatalf("lease refusals %d, want 1: retries are not new refusals", n)
	}
}

// A share of at least one token whose parts would each fall under one token
// still admits: the stream with the most demand gets whole tokens, and the
// parts stay within the share.
func TestPartsUnderOneTokenStillAdmit(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.Hold = 0 })
	f.eng.limit("edge", "tenant=a", 1, 3, 3, 1.0/3) // 1/s, one token at once
	a, _ := f.stream()
	b, _ := f.stream()
	f.exchange(a, report("edge", usage(tenantA, 1, 0, 0)))
	f.exchange(b, report("edge", usage(tenantA, 1, 0, 0)))
	f.clock.advance(5 * time.Second)
	ra := f.exchange(a, report("edge", usage(tenantA, 4, 0, 5*time.Second)))
	f.exchange(b, report("edge", usage(tenantA, 1, 0, 5*time.Second)))
	f.svc.Tick()
	var last *rlqsv3.RateLimitQuotaResponse_BucketAction
	if x := assignment(ra, tenantA); x != nil {
		last = x
	}
	for {
		r, err := recvWithin(t, a, 300*time.Millisecond)
		if err != nil {
			break
		}
		if x := assignment(r, tenantA); x != nil {
			last = x
		}
	}
	tb := last.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if tb == nil || tb.GetMaxTokens() != 1 || !(envoyRate(last) > 0) || envoyRate(last) > 1 {
		t.Fatalf("the busier stream got %v; want one token, refilled at most 1/s", last)
	}
	s := f.svc.Snapshot()
	checkSums(t, s)
}

// Counts near 2^64, or over an instant, are no Envoy's: what a report adds
// to demand sharing's meters is bounded, and never wraps them.
func TestHugeReportedCountsAreClamped(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.eng.limit("edge", "tenant=a", 1, 100, 100, 1)
	st, _ := f.stream()
	f.exchange(st, report("edge", usage(tenantA, 1, 0, 0)))
	f.clock.advance(time.Second)
	u := usage(tenantA, math.MaxUint64, math.MaxUint64, 0)
	u.TimeElapsed = &durationpb.Duration{Nanos: 1}
	f.exchange(st, report("edge", u))
	f.svc.Tick()
	var prev uint64
	for range 30 {
		f.clock.advance(100 * time.Millisecond)
		f.svc.Tick()
		off, adm := f.eng.reportedTotals()
		if off < prev || adm > off {
			t.Fatalf("the meters went from %d to %d offered (%d admitted): wrapped", prev, off, adm)
		}
		prev = off
	}
	if prev == 0 || prev > 1e9 {
		t.Fatalf("3 s of one absurd report counted %d requests; want some, at most 1e9", prev)
	}
}

// isBlanket reports whether a is the blanket rule want (ALLOW_ALL is the
// enum's zero, so a token bucket reads as ALLOW_ALL through
// GetBlanketRule alone).
func isBlanket(a *rlqsv3.RateLimitQuotaResponse_BucketAction, want typev3.RateLimitStrategy_BlanketRule) bool {
	s := a.GetQuotaAssignmentAction().GetRateLimitStrategy()
	_, ok := s.GetStrategy().(*typev3.RateLimitStrategy_BlanketRule_)
	return ok && s.GetBlanketRule() == want
}

// Under the global shadow mode every assignment is ALLOW_ALL with the usual
// TTL, as RLS answers OK to every request, while the snapshot (the pages and
// metrics) still shows the parts each stream would have had.
func TestShadowModeAllowsAll(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.ShadowMode, o.MaxBuckets = true, 3 })
	f.eng.limit("edge", "tenant=a", 1, 100, 100, 0.5)
	a, _ := f.stream()
	b, _ := f.stream()
	nowhere := map[string]string{"tenant": "z"}
	over := map[string]string{"tenant": "y"}
	rb := f.exchange(b, report("edge", usage(tenantA, 1, 0, 0)))
	ra := f.exchange(a, report("edge", usage(tenantA, 1, 0, 0), usage(nowhere, 1, 0, 0), usage(over, 1, 0, 0)))
	for _, x := range []*rlqsv3.RateLimitQuotaResponse_BucketAction{assignment(ra, tenantA), assignment(ra, nowhere), assignment(ra, over), assignment(rb, tenantA)} {
		if !isBlanket(x, typev3.RateLimitStrategy_ALLOW_ALL) || x.GetQuotaAssignmentAction().GetAssignmentTimeToLive().GetSeconds() != 15 {
			t.Fatalf("got %v, want ALLOW_ALL for 15 s", x)
		}
	}
	f.svc.Tick()
	s := f.svc.Snapshot()
	checkSums(t, s)
	if !s.ShadowMode || len(s.Buckets) != 1 || !(s.Buckets[0].AssignedRate > 0) {
		t.Fatalf("snapshot %+v, want the parts each stream would have had", s)
	}
	for _, p := range s.Buckets[0].Parts {
		if p.Stream != 0 && !(p.Rate > 0 && p.Burst >= 1) {
			t.Fatalf("stream %d would have had %+v, want a part", p.Stream, p)
		}
	}
	// tenant=y is held as an id (no rule), but its pair with stream a is
	// one past --max-buckets.
	if s.Refusals["no_rule"] != 2 || s.Refusals["overflow"] != 1 {
		t.Fatalf("refusals %v, want the ids with no rule and the overflow counted", s.Refusals)
	}
}

// Through the real engine: once its weight groups are all leased, a new key
// is denied; when the keys holding them are released (their ids gone and
// their last assignments expired), the denied id is leased at the next
// sweep, without a reload.
func TestFailedLeaseRecoversWithTheEngine(t *testing.T) {
	t.Parallel()
	e := realEngine(t)
	f := newFixture(t, func(o *Options) { o.Engine = FromEngine(e) })
	many, cancel := f.stream()
	us := make([]*bucketUsage, engine.MaxGroups+10)
	for i := range us {
		us[i] = usage(map[string]string{"tenant": fmt.Sprint(i)}, 1, 0, 0)
	}
	if err := many.Send(report("edge", us...)); err != nil {
		t.Fatal(err)
	}
	recvActions(t, many, len(us))
	if f.svc.Snapshot().Refusals["lease"] == 0 {
		t.Fatal("every key was leased: the test needs the engine's groups used up")
	}
	st, _ := f.stream()
	late := map[string]string{"tenant": "late"}
	if a := assignment(f.exchange(st, report("edge", usage(late, 1, 0, 0))), late); !isBlanket(a, typev3.RateLimitStrategy_DENY_ALL) {
		t.Fatalf("with no group free: %v, want DENY_ALL", a)
	}
	cancel()
	eventually(t, "the stream to end", func() bool { return len(f.svc.Snapshot().Streams) == 1 })
	f.clock.advance(16 * time.Second) // its last assignments expired
	f.svc.Tick()
	r, err := recvWithin(t, st, 10*time.Second)
	if err != nil {
		t.Fatalf("no assignment once groups were free: %v", err)
	}
	if tb := assignment(r, late).GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket(); tb == nil || tb.GetMaxTokens() < 1 {
		t.Fatalf("once groups were free: %v, want a token bucket", r)
	}
	if bs := e.BucketShare("edge", late); bs.Lease == nil || !bs.Lease.Active() {
		t.Fatal("no lease on the key")
	}
}
