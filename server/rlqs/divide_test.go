package rlqs

import (
	"context"
	"errors"
	"fmt"
	"github.com/sharelimit/sharelimit/demand"
	"math"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// checkSums fails when any listed share hands out more than itself.
func checkSums(t *testing.T, s Snapshot) {
	t.Helper()
	for _, b := range s.Buckets {
		if b.AssignedRate > b.ShareRate*(1+1e-9)+1e-9 || b.AssignedBurst > b.ShareBurst*(1+1e-9)+1e-9 {
			t.Fatalf("bucket %v: assigned %.6f/s, %.6f at once, over the share %.6f/s, %.6f", b.IDs, b.AssignedRate, b.AssignedBurst, b.ShareRate, b.ShareBurst)
		}
	}
}

// A shrink of the share is pushed at once; a grow waits for the hold.
func TestShrinkAtOnceGrowHeld(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.eng.limit("edge", "tenant=a", 1, 100, 100, 1)
	st, _ := f.stream()
	first := envoyRate(assignment(f.exchange(st, report("edge", usage(tenantA, 1, 0, 0))), tenantA))

	f.eng.weight(0.5)
	f.svc.Reshare()
	f.svc.Tick()
	r, err := recvWithin(t, st, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	shrunk := envoyRate(assignment(r, tenantA))
	if !(shrunk < first) || shrunk > 50 {
		t.Fatalf("after the share halved: %.3f/s, before %.3f/s", shrunk, first)
	}
	checkSums(t, f.svc.Snapshot())

	f.eng.weight(1)
	f.svc.Reshare()
	f.svc.Tick()
	if r, err := recvWithin(t, st, 300*time.Millisecond); !errors.Is(err, errTimeout) {
		t.Fatalf("a grow was pushed before the hold: %v %v", r, err)
	}
	f.clock.advance(2 * time.Second)
	f.svc.Tick()
	r, err = recvWithin(t, st, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if grown := envoyRate(assignment(r, tenantA)); !(grown > shrunk) {
		t.Fatalf("after the hold: %.3f/s, want more than %.3f/s", grown, shrunk)
	}
	checkSums(t, f.svc.Snapshot())
}

// Two streams of one bucket are divided by their demand, and together with
// RLS stay within the share.
func TestDivideByDemand(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.Hold = 0 })
	f.eng.limit("edge", "tenant=a", 1, 100, 100, 1)
	a, _ := f.stream()
	b, _ := f.stream()
	f.exchange(a, report("edge", usage(tenantA, 1, 0, 0)))
	f.exchange(b, report("edge", usage(tenantA, 1, 0, 0)))
	recvWithin(t, a, 300*time.Millisecond) // a's shrink when b came
	f.clock.advance(5 * time.Second)
	ra := f.exchange(a, report("edge", usage(tenantA, 300, 100, 5*time.Second))) // 80/s
	rb := f.exchange(b, report("edge", usage(tenantA, 25, 0, 5*time.Second)))    // 5/s
	_, _ = ra, rb
	f.svc.Tick()
	s := f.svc.Snapshot()
	checkSums(t, s)
	byDemand := map[float64]float64{}
	rls := 0.0
	for _, p := range s.Buckets[0].Parts {
		if p.Stream == 0 {
			rls = p.Rate
		}
		byDemand[p.Demand] = p.Rate
	}
	// RLS never drew on the key, so the two streams divide the share as
	// demand.Apportion divides it between them.
	_, want := demand.Apportion(100, 0, []demand.Want{{Units: 1, Offered: 80}, {Units: 1, Offered: 5}}, demand.DefaultHeadroom, demand.DefaultFloor)
	if math.Abs(byDemand[80]-want[0]) > 1e-6 || math.Abs(byDemand[5]-want[1]) > 1e-6 || rls != 0 {
		t.Fatalf("parts by demand %v, RLS %v: want %v and RLS 0", byDemand, rls, want)
	}
	if l := f.eng.lease(1); l.weight()*100 > rls+1e-9 {
		t.Fatalf("lease weight %.4f, RLS part %.4f/s", l.weight(), rls)
	}
}

// A stream that ends keeps its part until its assignment's TTL has passed;
// only then can the others grow into it.
func TestEndedStreamCountsUntilTTL(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.Hold = 0 })
	f.eng.limit("edge", "tenant=a", 1, 100, 100, 1)
	a, cancelA := f.stream()
	b, _ := f.stream()
	f.exchange(a, report("edge", usage(tenantA, 1, 0, 0)))
	f.exchange(b, report("edge", usage(tenantA, 1, 0, 0)))
	f.clock.advance(5 * time.Second)
	f.exchange(a, report("edge", usage(tenantA, 250, 0, 5*time.Second)))
	f.exchange(b, report("edge", usage(tenantA, 250, 0, 5*time.Second)))
	f.svc.Tick()
	before := f.svc.Snapshot()
	cancelA()
	eventually(t, "stream a to end", func() bool { return len(f.svc.Snapshot().Streams) == 1 })
	f.svc.Tick()
	s := f.svc.Snapshot()
	checkSums(t, s)
	ended := 0
	for _, p := range s.Buckets[0].Parts {
		if p.Ended {
			ended++
		}
	}
	if ended != 1 || s.Buckets[0].AssignedRate < before.Buckets[0].AssignedRate-1e-9 {
		t.Fatalf("after a ended: %+v", s.Buckets[0])
	}
	f.clock.advance(16 * time.Second)
	f.exchange(b, report("edge", usage(tenantA, 800, 0, 16*time.Second)))
	f.svc.Tick()
	s = f.svc.Snapshot()
	checkSums(t, s)
	bID := s.Streams[0].ID
	for _, p := range s.Buckets[0].Parts {
		if p.Ended {
			t.Fatalf("reservation kept past its TTL: %+v", s.Buckets[0])
		}
		if p.Stream == bID && !(p.Rate > 60) {
			t.Fatalf("b did not grow into a's part: %+v", s.Buckets[0])
		}
	}
}

// A bucket reported idle for --rlqs-abandon-after is abandoned; once its
// TTL has passed nothing of it is left, and the lease is released.
func TestIdleBucketAbandoned(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.eng.limit("edge", "tenant=a", 1, 100, 100, 1)
	st, _ := f.stream()
	f.exchange(st, report("edge", usage(tenantA, 1, 0, 0)))
	for range 13 {
		f.clock.advance(5 * time.Second)
		f.exchange(st, report("edge", usage(tenantA, 0, 0, 5*time.Second)))
	}
	f.svc.Tick()
	var abandoned bool
	for !abandoned {
		r, err := recvWithin(t, st, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		abandoned = assignment(r, tenantA).GetAbandonAction() != nil
	}
	f.clock.advance(16 * time.Second)
	f.svc.Tick()
	s := f.svc.Snapshot()
	if s.IDs != 0 || s.Shares != 0 || f.eng.liveLeases() != 0 {
		t.Fatalf("after abandon and TTL: %d ids, %d shares, %d leases", s.IDs, s.Shares, f.eng.liveLeases())
	}
}

// A reload that moves an id to no rule denies it at once and releases the
// key's lease.
func TestReloadRebinds(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.eng.limit("edge", "tenant=a", 1, 100, 100, 1)
	st, _ := f.stream()
	f.exchange(st, report("edge", usage(tenantA, 1, 0, 0)))
	f.eng.set("edge", "tenant=a", Target{Kind: NoRule})
	f.svc.Reload()
	f.svc.Tick()
	r, err := recvWithin(t, st, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if s := assignment(r, tenantA).GetQuotaAssignmentAction().GetRateLimitStrategy(); s.GetTokenBucket() != nil || s.GetBlanketRule().String() != "DENY_ALL" {
		t.Fatalf("after reload: %v", s)
	}
	if f.eng.liveLeases() != 0 {
		t.Fatal("lease kept after its rule went")
	}
}

// rawCodec sends bytes as they are.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), b...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// A stream that sends bytes that are no report gets InvalidArgument.
func TestGarbageStream(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	desc := &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}
	cs, err := f.conn.NewStream(ctx, desc, "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas", grpc.ForceCodec(rawCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	garbage := []byte{0xff, 0xff, 0xff, 0xff, 0x0f, 0x01}
	if err := cs.SendMsg(&garbage); err != nil {
		t.Fatal(err)
	}
	var got []byte
	err = cs.RecvMsg(&got)
	// grpc-go itself ends a stream whose message does not decode, with
	// Internal, before the handler sees it.
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "failed to unmarshal") {
		t.Fatalf("got %v, want Internal: failed to unmarshal", err)
	}
	eventually(t, "the refusal to be counted", func() bool { return f.svc.Snapshot().Refusals["invalid"] == 1 })
}

// Distinct ids past --max-buckets are denied and not stored: the live
// entries never pass the cap however many ids arrive, and go when the
// stream does.
func TestMaxBucketsBoundsMemory(t *testing.T) {
	t.Parallel()
	const maxBuckets = 500
	f := newFixture(t, func(o *Options) { o.MaxBuckets = maxBuckets })
	f.eng.limit("edge", "tenant=0", 1, 100, 100, 1)
	st, cancel := f.stream()
	sent, denied := 0, 0
	for r := range 100 {
		us := make([]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, 1000)
		for i := range us {
			us[i] = usage(map[string]string{"tenant": fmt.Sprint(r*1000 + i)}, 1, 0, 0)
		}
		if err := st.Send(report("edge", us...)); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < len(us); {
			resp, err := recvWithin(t, st, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range resp.GetBucketAction() {
				got++
				if a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule().String() == "DENY_ALL" {
					denied++
				}
			}
		}
		sent += len(us)
		if n := f.svc.Snapshot().IDs; n > maxBuckets {
			t.Fatalf("%d ids held after %d sent, cap %d", n, sent, maxBuckets)
		}
	}
	if s := f.svc.Snapshot(); s.IDs != maxBuckets || s.Refusals["overflow"] != uint64(sent-maxBuckets) || denied != sent-1 {
		t.Fatalf("held %d, overflow %d, denied %d of %d", s.IDs, s.Refusals["overflow"], denied, sent)
	}
	cancel()
	eventually(t, "the stream to end", func() bool { return len(f.svc.Snapshot().Streams) == 0 })
	f.clock.advance(16 * time.Second)
	f.svc.Tick()
	if s := f.svc.Snapshot(); s.IDs != 0 || s.Shares != 0 {
		t.Fatalf("after the stream and the TTL: %d ids, %d shares", s.IDs, s.Shares)
	}
}

// A client that never reads gets its stream ended, without blocking the
// divider or anyone else, and its assignments still count.
func TestClientThatNeverReads(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.Queue = 2 })
	f.eng.limit("edge", "tenant=0", 1, 100, 100, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := f.client.StreamRateLimitQuotas(ctx) // never read
	if err != nil {
		t.Fatal(err)
	}
	us := make([]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, 1000)
	for i := range us {
		us[i] = usage(map[string]string{"tenant": fmt.Sprint(i), "pad": string(make([]byte, 200))}, 1, 0, 0)
	}
	us[0] = usage(map[string]string{"tenant": "0"}, 1, 0, 0)
	f.eng.limit("edge", "tenant=0", 1, 100, 100, 1)
	go func() {
		for range 200 {
			if st.Send(report("edge", us...)) != nil {
				return
			}
		}
	}()
	eventually(t, "the slow stream to end", func() bool {
		s := f.svc.Snapshot()
		return s.Refusals["slow_client"] > 0 && len(s.Streams) == 0
	})
	f.svc.Tick()
	s := f.svc.Snapshot()
	if len(s.Buckets) != 1 || !s.Buckets[0].Parts[0].Ended {
		t.Fatalf("the ended stream's part is not kept: %+v", s.Buckets)
	}
	// Others are served meanwhile.
	other, _ := f.stream()
	f.exchange(other, report("edge", usage(map[string]string{"tenant": "0"}, 1, 0, 0)))
	checkSums(t, f.svc.Snapshot())
}

// Streams past MaxStreams are refused.
func TestMaxStreams(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.MaxStreams = 2 })
	f.eng.limit("edge", "tenant=a", 1, 100, 100, 1)
	for range 2 {
		st, _ := f.stream()
		f.exchange(st, report("edge", usage(tenantA, 1, 0, 0)))
	}
	st, _ := f.stream()
	st.Send(report("edge", usage(tenantA, 1, 0, 0)))
	if _, err := recvWithin(t, st, 5*time.Second); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third stream: %v, want ResourceExhausted", err)
	}
}

// The series appear once a stream has been opened, and show it.
func TestCollector(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.eng.limit("edge", "tenant=a", 1, 100, 100, 1)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(f.svc.Collector())
	if fams, err := reg.Gather(); err != nil || len(fams) != 0 {
		t.Fatalf("before any stream: %v %v", fams, err)
	}
	st, _ := f.stream()
	f.exchange(st, report("edge", usage(tenantA, 1, 0, 0)))
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, fam := range fams {
		for _, m := range fam.GetMetric() {
			got[fam.GetName()] += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	if got["sharelimit_rlqs_streams"] != 1 || got["sharelimit_rlqs_bucket_ids"] != 1 || got["sharelimit_rlqs_reports_total"] != 1 ||
		!(got["sharelimit_rlqs_share_rate"] == 100) || !(got["sharelimit_rlqs_assigned_rate"] > 0) || got["sharelimit_rlqs_assigned_rate"] > 100 {
		t.Fatalf("series: %v", got)
	}
}

// RLS takes no part of a share until it draws on the key; once it has, it
// takes part by its demand, and the streams and RLS stay within the share.
func TestRLSTakesPartOnceItDraws(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.Hold = 0 })
	f.eng.limit("edge", "tenant=a", 1, 100, 100, 1)
	a, _ := f.stream()
	f.exchange(a, report("edge", usage(tenantA, 1, 0, 0)))
	f.clock.advance(5 * time.Second)
	f.exchange(a, report("edge", usage(tenantA, 400, 0, 5*time.Second))) // 80/s
	f.svc.Tick()
	if w := f.eng.lease(1).weight(); w != 0 {
		t.Fatalf("RLS never drew and holds weight %v", w)
	}
	f.eng.lease(1).offered.Add(30) // RLS draws: 30 over the next second
	f.clock.advance(time.Second)
	f.svc.Tick()
	f.clock.advance(time.Second) // the sweep divides every share
	f.svc.Tick()
	s := f.svc.Snapshot()
	checkSums(t, s)
	if w := f.eng.lease(1).weight(); !(w > 0) {
		t.Fatalf("RLS drew on the key and holds weight %v: %+v", w, s.Buckets[0])
	}
}
