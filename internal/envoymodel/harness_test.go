package envoymodel

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// script is an RLQS server that does only what the test tells it: every
// report it receives goes to reports, every stream it accepts to streams,
// and the test answers or ends a stream through that stream's channels.
type script struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	reports chan *rlqsv3.RateLimitQuotaUsageReports
	streams chan *scripted
}

type scripted struct {
	respond chan *rlqsv3.RateLimitQuotaResponse
	end     chan error
}

func (s *script) StreamRateLimitQuotas(st grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	sc := &scripted{respond: make(chan *rlqsv3.RateLimitQuotaResponse), end: make(chan error)}
	s.streams <- sc
	go func() {
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			s.reports <- r
		}
	}()
	for {
		select {
		case r := <-sc.respond:
			if err := st.Send(r); err != nil {
				return err
			}
		case err := <-sc.end:
			return err
		case <-st.Context().Done():
			return nil
		}
	}
}

// fakeClock is a Clock the test moves by hand.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() int64              { return c.ns.Load() }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// env is one model Envoy connected to one scripted server.
type env struct {
	t       *testing.T
	m       *Model
	srv     *script
	clock   *fakeClock
	ticks   chan struct{}
	applied chan struct{}
	ticked  chan struct{}
	closed  chan struct{}
	conn    *grpc.ClientConn
	addr    string
	gs      *grpc.Server
}

// serve starts a scripted server on addr ("" for any free port).
func (e *env) serve(addr string) {
	e.t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		e.t.Fatal(err)
	}
	e.addr = lis.Addr().String()
	e.gs = grpc.NewServer()
	rlqsv3.RegisterRateLimitQuotaServiceServer(e.gs, e.srv)
	gs := e.gs
	go func() { _ = gs.Serve(lis) }()
}

// start runs a model with cfg (Conn and Clock filled in; Ticks too unless
// realTimer) against a fresh scripted server.
func start(t *testing.T, cfg Config, realTimer bool) *env {
	t.Helper()
	e := &env{
		t:       t,
		srv:     &script{reports: make(chan *rlqsv3.RateLimitQuotaUsageReports, 1000), streams: make(chan *scripted, 100)},
		clock:   &fakeClock{},
		ticks:   make(chan struct{}),
		applied: make(chan struct{}, 1000),
		ticked:  make(chan struct{}, 1000),
		closed:  make(chan struct{}, 1000),
	}
	e.clock.ns.Store(int64(time.Hour))
	e.serve("")
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1, MaxDelay: 10 * time.Millisecond}, MinConnectTimeout: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	e.conn = conn
	cfg.Conn = conn
	if cfg.Domain == "" {
		cfg.Domain = "edge"
	}
	if !realTimer {
		cfg.Clock, cfg.Ticks = e.clock.now, e.ticks
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.trace = func(event string) {
		ch := map[string]chan struct{}{"response": e.applied, "tick": e.ticked, "closed": e.closed}[event]
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	e.m = m
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := testutil.Within(t, ran, "Run to return"); !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
		_ = conn.Close()
		e.gs.Stop()
	})
	return e
}

func (e *env) report() *rlqsv3.RateLimitQuotaUsageReports {
	e.t.Helper()
	return testutil.Within(e.t, e.srv.reports, "a report")
}

func (e *env) stream() *scripted {
	e.t.Helper()
	return testutil.Within(e.t, e.srv.streams, "a stream")
}

func (e *env) noReport() {
	e.t.Helper()
	select {
	case r := <-e.srv.reports:
		e.t.Fatalf("unexpected report %v", r)
	default:
	}
}

// tick fires the report timer and waits until Run has sent or dropped the
// report.
func (e *env) tick() {
	e.t.Helper()
	select {
	case e.ticks <- struct{}{}:
	case <-time.After(20 * time.Second):
		e.t.Fatal("timed out handing Run a tick")
	}
	testutil.Within(e.t, e.ticked, "the tick handled")
}

// respond sends actions on s and waits until the model has applied them.
func (e *env) respond(s *scripted, actions ...*rlqsv3.RateLimitQuotaResponse_BucketAction) {
	e.t.Helper()
	s.respond <- &rlqsv3.RateLimitQuotaResponse{BucketAction: actions}
	testutil.Within(e.t, e.applied, "the response applied")
}

// allowN makes n requests on id and returns how many were admitted.
func (e *env) allowN(id map[string]string, n int) int {
	got := 0
	for range n {
		if e.m.Allow(id) {
			got++
		}
	}
	return got
}

// first makes the first request on id, which opens the stream and sends the
// initial report, and returns the stream.
func (e *env) first(id map[string]string) *scripted {
	e.t.Helper()
	e.m.Allow(id)
	s := e.stream()
	e.report()
	return s
}

func tb(maxTokens, perFill uint32, fill time.Duration) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens: maxTokens, TokensPerFill: wrapperspb.UInt32(perFill), FillInterval: durationpb.New(fill),
	}}}
}

func blanket(r typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

var (
	allowAll = blanket(typev3.RateLimitStrategy_ALLOW_ALL)
	denyAll  = blanket(typev3.RateLimitStrategy_DENY_ALL)
	perUnit  = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_RequestsPerTimeUnit_{
		RequestsPerTimeUnit: &typev3.RateLimitStrategy_RequestsPerTimeUnit{RequestsPerTimeUnit: 1, TimeUnit: typev3.RateLimitUnit_SECOND}}}
)

func assignment(id map[string]string, s *typev3.RateLimitStrategy, ttl *durationpb.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: &rlqsv3.BucketId{Bucket: id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: ttl, RateLimitStrategy: s,
			}},
	}
}

func abandon(id map[string]string) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId:     &rlqsv3.BucketId{Bucket: id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
	}
}

func secs(s int64) *durationpb.Duration { return &durationpb.Duration{Seconds: s} }
