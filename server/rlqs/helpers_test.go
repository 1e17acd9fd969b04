package rlqs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// fakeEngine resolves ids from a table: "domain|k=v,..." to a target.
// Domains not in domains are unknown; ids not in the table match no rule.
type fakeEngine struct {
	mu       sync.Mutex
	domains  map[string]bool
	targets  map[string]Target
	wild     map[string]Target // domain|key: any id of that one key
	leases   map[uint64]*fakeLease
	noLease  bool
	reported uint64
	admitted uint64
	// wrapped: a Reported call took reported past 2^64.
	wrapped bool
}

func newFakeEngine() *fakeEngine {
	return &fakeEngine{domains: map[string]bool{}, targets: map[string]Target{}, wild: map[string]Target{}, leases: map[uint64]*fakeLease{}}
}

// limit adds a limited rule for id (as "k=v,...") in domain with key key.
func (f *fakeEngine) limit(domain, id string, key uint64, rate, burst, w float64) {
	f.set(domain, id, Target{Kind: Limited, Rule: "rule" + fmt.Sprint(key), Key: key, Rate: rate, Burst: burst, Weight: w, WindowSeconds: 1})
}

func (f *fakeEngine) set(domain, id string, t Target) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.domains[domain] = true
	f.targets[domain+"|"+id] = t
}

// wildcard adds a limited rule that every id of the one key key selects,
// all of them sharing one bucket (a wildcard with share_threshold).
func (f *fakeEngine) wildcard(domain, key string, bucket uint64, rate, burst, w float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.domains[domain] = true
	f.wild[domain+"|"+key] = Target{Kind: Limited, Rule: "wild" + key, Key: bucket, Rate: rate, Burst: burst, Weight: w, WindowSeconds: 1}
}

// bucketUsage is one bucket's part of a report.
type bucketUsage = rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage

// pairs is how many stream and id pairs the service holds.
func (s *Service) pairs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, st := range s.streams {
		n += len(st.consumers)
	}
	return n
}

// weight sets every target's weight.
func (f *fakeEngine) weight(w float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, t := range f.targets {
		t.Weight = w
		f.targets[k] = t
	}
}

func (f *fakeEngine) Resolve(domain string, id map[string]string) Target {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.domains[domain] {
		return Target{Kind: UnknownDomain}
	}
	if t, ok := f.targets[domain+"|"+idString(id)]; ok {
		return t
	}
	if len(id) == 1 {
		for k := range id {
			if t, ok := f.wild[domain+"|"+k]; ok {
				return t
			}
		}
	}
	return Target{Kind: NoRule}
}

func (f *fakeEngine) Lease(t Target, now int64) (Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.noLease {
		return nil, errors.New("no weight group free")
	}
	l := &fakeLease{w: t.Weight}
	l.w2.Store(t.Weight)
	f.leases[t.Key] = l
	return l, nil
}

func (f *fakeEngine) Reported(t Target, offered, admitted uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.wrapped = f.wrapped || f.reported+offered < f.reported
	f.reported += offered
	f.admitted += admitted
}

func (f *fakeEngine) reportedTotal() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reported
}

func (f *fakeEngine) reportedTotals() (offered, admitted uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reported, f.admitted
}

func (f *fakeEngine) lease(key uint64) *fakeLease {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.leases[key]
}

func (f *fakeEngine) liveLeases() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, l := range f.leases {
		if !l.released.Load() {
			n++
		}
	}
	return n
}

type fakeLease struct {
	w        float64
	w2       atomicFloat
	offered  atomic.Uint64
	released atomic.Bool
}

type atomicFloat struct{ v atomic.Value }

func (a *atomicFloat) Store(f float64) { a.v.Store(f) }
func (a *atomicFloat) Load() float64 {
	f, _ := a.v.Load().(float64)
	return f
}

func (l *fakeLease) Set(w float64, now int64) { l.w2.Store(w) }
func (l *fakeLease) Counts() (uint64, uint64) { n := l.offered.Load(); return n, n }
func (l *fakeLease) Release(now int64)        { l.released.Store(true) }
func (l *fakeLease) weight() float64          { return l.w2.Load() }

// fakeClock is a clock the test moves.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() int64              { return c.ns.Load() }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// fixture is a service on a real gRPC server over loopback TCP.
type fixture struct {
	t      *testing.T
	eng    *fakeEngine
	clock  *fakeClock
	svc    *Service
	conn   *grpc.ClientConn
	client rlqsv3.RateLimitQuotaServiceClient
}

func newFixture(t *testing.T, mod func(*Options)) *fixture {
	t.Helper()
	f := &fixture{t: t, eng: newFakeEngine(), clock: &fakeClock{}}
	f.clock.ns.Store(int64(time.Hour))
	opt := Options{Engine: f.eng, Clock: f.clock.now, Hold: 2 * time.Second, AbandonAfter: time.Minute}
	if mod != nil {
		mod(&opt)
	}
	svc, err := New(opt)
	if err != nil {
		t.Fatal(err)
	}
	f.svc = svc
	gs := grpc.NewServer()
	rlqsv3.RegisterRateLimitQuotaServiceServer(gs, svc)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	f.conn, err = grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.conn.Close() })
	f.client = rlqsv3.NewRateLimitQuotaServiceClient(f.conn)
	return f
}

type clientStream = grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]

// client is a stream whose responses one goroutine reads into a channel, so
// a test can wait for one with a timeout.
type client struct {
	clientStream
	got chan result
}

type result struct {
	r   *rlqsv3.RateLimitQuotaResponse
	err error
}

func (f *fixture) stream() (*client, context.CancelFunc) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	st, err := f.client.StreamRateLimitQuotas(ctx)
	if err != nil {
		cancel()
		f.t.Fatal(err)
	}
	f.t.Cleanup(cancel)
	c := &client{clientStream: st, got: make(chan result, 1024)}
	go func() {
		for {
			r, err := st.Recv()
			c.got <- result{r, err}
			if err != nil {
				return
			}
		}
	}()
	return c, cancel
}

// usage is one bucket's report.
func usage(id map[string]string, allowed, denied uint64, elapsed time.Duration) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: id},
		NumRequestsAllowed: allowed, NumRequestsDenied: denied, TimeElapsed: durationpb.New(elapsed)}
}

func report(domain string, us ...*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) *rlqsv3.RateLimitQuotaUsageReports {
	return &rlqsv3.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: us}
}

// exchange sends r and reads one response.
func (f *fixture) exchange(st *client, r *rlqsv3.RateLimitQuotaUsageReports) *rlqsv3.RateLimitQuotaResponse {
	f.t.Helper()
	if err := st.Send(r); err != nil {
		f.t.Fatalf("send: %v", err)
	}
	resp, err := recvWithin(f.t, st, 10*time.Second)
	if err != nil {
		f.t.Fatalf("recv: %v", err)
	}
	return resp
}

// recvWithin reads one response, or errTimeout after d.
func recvWithin(t *testing.T, st *client, d time.Duration) (*rlqsv3.RateLimitQuotaResponse, error) {
	t.Helper()
	select {
	case r := <-st.got:
		return r.r, r.err
	case <-time.After(d):
		return nil, errTimeout
	}
}

var errTimeout = errors.New("no response in time")

// assignment finds id's action in r.
func assignment(r *rlqsv3.RateLimitQuotaResponse, id map[string]string) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	for _, a := range r.GetBucketAction() {
		if idString(a.GetBucketId().GetBucket()) == idString(id) {
			return a
		}
	}
	return nil
}

// envoyRate is the rate Envoy enforces for a.
func envoyRate(a *rlqsv3.RateLimitQuotaResponse_BucketAction) float64 {
	tb := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if tb == nil || tb.GetFillInterval().GetSeconds() == 0 {
		return 0
	}
	return float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().GetSeconds())
}

// eventually polls cond for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, testutil.Cond(cond, "%s", what))
}
