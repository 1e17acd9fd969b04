package server

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sharelimit/sharelimit/descriptors"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/source"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is a service on a real loopback gRPC listener, with a fake clock.
type fixture struct {
	t       *testing.T
	engine  *engine.Engine
	metrics *Metrics
	svc     *Service
	client  rlsv3.RateLimitServiceClient
	health  healthpb.HealthClient
	conn    *grpc.ClientConn
	now     int64
}

func newFixture(t *testing.T, opts Options, weight float64) *fixture {
	t.Helper()
	set, err := source.Load("testdata/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return newFixtureSet(t, opts, weight, set)
}

// newFixtureSet is newFixture deciding with set.
func newFixtureSet(t *testing.T, opts Options, weight float64, set *descriptors.Set) *fixture {
	t.Helper()
	return newFixtureEngine(t, opts, engine.Options{Weight: weight}, set)
}

// newEngine is engine.New, failing t on an error.
func newEngine(t testing.TB, set *descriptors.Set, store *bucket.Store, opts engine.Options) *engine.Engine {
	t.Helper()
	e, err := engine.New(set, store, opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// newFixtureEngine is newFixtureSet with an engine built with eopts.
func newFixtureEngine(t *testing.T, opts Options, eopts engine.Options, set *descriptors.Set) *fixture {
	t.Helper()
	f := &fixture{t: t}
	store := bucket.NewStore(0)
	f.engine = newEngine(t, nil, store, eopts)
	f.metrics = NewMetrics(store)
	f.metrics.Bind(set)
	f.engine.Swap(set)
	if opts.HeaderLimit == "" {
		opts.HeaderLimit, opts.HeaderRemaining, opts.HeaderReset = "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"
	}
	f.svc = NewService(f.engine, func() int64 { return f.now }, f.metrics, opts, slog.New(slog.NewTextHandler(io.Discard, nil)))
	h := NewHealth()
	gs := NewDirectServer(f.svc, h, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); gs.Stop() })
	f.conn = conn
	f.client = rlsv3.NewRateLimitServiceClient(conn)
	f.health = healthpb.NewHealthClient(conn)
	return f
}

func d(kvs ...string) *commonv3.RateLimitDescriptor {
	out := &commonv3.RateLimitDescriptor{}
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		out.Entries = append(out.Entries, &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return out
}

func (f *fixture) call(descs ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	f.t.Helper()
	resp, err := f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "test", Descriptors: descs})
	if err != nil {
		f.t.Fatal(err)
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_UNKNOWN {
		f.t.Fatal("overall code UNKNOWN: Envoy asserts on it")
	}
	if len(resp.Statuses) != len(descs) {
		f.t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(descs))
	}
	return resp
}

// codes returns the overall code and each status code as letters: O ok, X over.
func codesOf(r *rlsv3.RateLimitResponse) string {
	l := func(c rlsv3.RateLimitResponse_Code) string {
		if c == rlsv3.RateLimitResponse_OK {
			return "O"
		}
		return "X"
	}
	s := l(r.OverallCode) + ":"
	for _, st := range r.Statuses {
		s += l(st.Code)
	}
	return s
}

func TestShouldRateLimitRules(t *testing.T) {
	cases := []struct {
		name  string
		opts  Options
		w     float64
		calls [][]*commonv3.RateLimitDescriptor
		want  []string
	}{
		{"statuses in order, overall over if any is over", Options{}, 1,
			[][]*commonv3.RateLimitDescriptor{{d("fixed=one"), d("free=x")}, {d("fixed=one"), d("free=x")}, {d("free=x"), d("fixed=one")}},
			[]string{"O:OO", "O:OO", "X:OX"}},
		{"two identical descriptors draw twice", Options{}, 1,
			[][]*commonv3.RateLimitDescriptor{{d("fixed=one"), d("fixed=one")}, {d("fixed=one"), d("fixed=one")}},
			[]string{"O:OO", "X:XX"}},
		{"shadow plus non-shadow: only the non-shadow one counts", Options{}, 1,
			[][]*commonv3.RateLimitDescriptor{{d("shadow=s"), d("ip=1")}, {d("shadow=s"), d("ip=1")}},
			[]string{"O:OO", "O:OO"}},
		{"global shadow forces overall OK but keeps statuses", Options{ShadowMode: true}, 1,
			[][]*commonv3.RateLimitDescriptor{{d("fixed=one")}, {d("fixed=one")}, {d("fixed=one")}},
			[]string{"O:O", "O:O", "O:X"}},
		{"weight halves the share", Options{}, 0.5,
			[][]*commonv3.RateLimitDescriptor{{d("fixed=one")}, {d("fixed=one")}},
			[]string{"O:O", "X:X"}},
		{"unmatched descriptors are OK", Options{}, 1,
			[][]*commonv3.RateLimitDescriptor{{d("nothing=here")}, {d("fixed=two")}},
			[]string{"O:O", "O:O"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.opts, tc.w)
			for i, c := range tc.calls {
				if got := codesOf(f.call(c...)); got != tc.want[i] {
					t.Fatalf("call %d: got %s, want %s", i, got, tc.want[i])
				}
			}
		})
	}
}

func TestStatusFields(t *testing.T) {
	f := newFixture(t, Options{}, 0.25)
	r := f.call(d("ip=10.0.0.1"), d("free=1"), d("unknown=1"))
	ip := r.Statuses[0]
	// 3/min over 4 replicas: local bucket floored at 1 token, drawn: 0 remain.
	if ip.CurrentLimit.GetRequestsPerUnit() != 3 || ip.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
		t.Fatalf("current_limit is the configured cluster-wide limit: %v", ip.CurrentLimit)
	}
	if ip.LimitRemaining != 0 || ip.DurationUntilReset.AsDuration() != 80*time.Second {
		t.Fatalf("remaining %d reset %v", ip.LimitRemaining, ip.DurationUntilReset.AsDuration())
	}
	if free := r.Statuses[1]; free.LimitRemaining != 1<<32-1 || free.CurrentLimit != nil {
		t.Fatalf("unlimited: %v", free)
	}
	if un := r.Statuses[2]; un.CurrentLimit != nil || un.Code != rlsv3.RateLimitResponse_OK {
		t.Fatalf("unmatched: %v", un)
	}
}

func TestUnknownDomain(t *testing.T) {
	f := newFixture(t, Options{}, 1)
	resp, err := f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "other", Descriptors: []*commonv3.RateLimitDescriptor{d("fixed=one")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
		t.Fatalf("%v %v", resp, err)
	}
}

func TestHitsAddendRules(t *testing.T) {
	f := newFixture(t, Options{}, 1)
	ctx := context.Background()
	// Request-level addend 2 drains the fixed bucket of 2.
	resp, _ := f.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "test", HitsAddend: 2, Descriptors: []*commonv3.RateLimitDescriptor{d("fixed=one")}})
	if codesOf(resp) != "O:O" || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("addend 2: %v", resp)
	}
	// A descriptor addend of 0 is check-only, and wins over the request's.
	check := d("fixed=one")
	check.HitsAddend = wrapperspb.UInt64(0)
	resp, _ = f.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "test", HitsAddend: 5, Descriptors: []*commonv3.RateLimitDescriptor{check}})
	if codesOf(resp) != "X:X" {
		t.Fatalf("check-only on an empty bucket: %s", codesOf(resp))
	}
	// Negative hits give back.
	neg := d("fixed=one")
	neg.HitsAddend, neg.IsNegativeHits = wrapperspb.UInt64(2), true
	f.call(neg)
	if r := f.call(d("fixed=one")); codesOf(r) != "O:O" || r.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("after giving back: %v", r)
	}
}

func TestReplaces(t *testing.T) {
	f := newFixture(t, Options{}, 1)
	r := f.call(d("general=a"), d("special=b"))
	if r.Statuses[0].CurrentLimit != nil || r.Statuses[1].CurrentLimit.GetName() != "special" {
		t.Fatalf("replaces: %v", r)
	}
}

func TestInvalidArgumentKeepsServing(t *testing.T) {
	f := newFixture(t, Options{}, 1)
	ctx := context.Background()
	zeroUnit := d("fixed=one")
	zeroUnit.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10, Unit: typev3.RateLimitUnit_UNKNOWN}
	zeroRPU := d("fixed=one")
	zeroRPU.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_SECOND}
	bad := []struct {
		name  string
		req   *rlsv3.RateLimitRequest
		field string
	}{
		{"override unit 0 (crashes upstream)", &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{zeroUnit}}, "limit.unit"},
		{"override requests_per_unit 0", &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{zeroRPU}}, "limit.requests_per_unit"},
		{"empty domain", &rlsv3.RateLimitRequest{Descriptors: []*commonv3.RateLimitDescriptor{d("a=b")}}, "domain"},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "test"}, "descriptors"},
		{"empty key", &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{d("=b")}}, "key"},
	}
	for _, tc := range bad {
		_, err := f.client.ShouldRateLimit(ctx, tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.field) {
			t.Errorf("%s: got %v, want InvalidArgument naming %s", tc.name, err, tc.field)
		}
		// and the daemon keeps serving
		if r := f.call(d("free=x")); codesOf(r) != "O:O" {
			t.Fatalf("not serving after %s", tc.name)
		}
	}
	// A valid override works and has its own bucket.
	ov := d("fixed=one")
	ov.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_SECOND}
	if r := f.call(ov); codesOf(r) != "O:O" || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 {
		t.Fatalf("override: %v", r)
	}
	if r := f.call(ov); codesOf(r) != "X:X" {
		t.Fatalf("override bucket: %v", r)
	}
}

func TestMessageTooLarge(t *testing.T) {
	f := newFixture(t, Options{}, 1)
	big := d("k=" + strings.Repeat("x", MaxRecvMsgSize))
	_, err := f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{big}})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversized message: %v", err)
	}
	f.call(d("free=x"))
}

func TestResponseHeaders(t *testing.T) {
	f := newFixture(t, Options{ResponseHeaders: true, HeaderLimit: "X-Limit", HeaderRemaining: "X-Remaining", HeaderReset: "X-Reset"}, 1)
	r := f.call(d("ip=1"), d("fixed=one"), d("free=1"))
	got := map[string]string{}
	for _, h := range r.ResponseHeadersToAdd {
		got[h.Key] = h.Value
	}
	// fixed (2/s, 1 left) is closer to its limit than ip (3/min, 2 left).
	if got["X-Limit"] != "2" || got["X-Remaining"] != "1" || got["X-Reset"] != "1" {
		t.Fatalf("headers %v", got)
	}
}

func TestWaitPolicyHoldsTheAnswer(t *testing.T) {
	f := newFixture(t, Options{}, 1)
	f.call(d("slow=a")) // the bucket of 1 is empty now
	start := time.Now()
	r := f.call(d("slow=a")) // 1 token at 20/s: a 50 ms reservation, within max_wait 100ms
	if codesOf(r) != "O:O" {
		t.Fatalf("reservation refused: %v", r)
	}
	if el := time.Since(start); el < 45*time.Millisecond {
		t.Fatalf("answer not held for the reservation: %v", el)
	}
	// A third within the same instant would need 100 ms: over max_wait? exactly at it: allowed; a fourth is not.
	f.call(d("slow=a"))
	if r := f.call(d("slow=a")); codesOf(r) != "X:X" {
		t.Fatalf("reservation past max_wait accepted: %v", r)
	}
}

func TestHealthService(t *testing.T) {
	f := newFixture(t, Options{}, 1)
	for _, name := range HealthServices() {
		resp, err := f.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q: %v %v", name, resp, err)
		}
	}
}

func TestRecoveredPanicAnswersInternal(t *testing.T) {
	f := newFixture(t, Options{}, 1)
	f.svc.clock = func() int64 { panic("boom") }
	_, err := f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{d("fixed=one")}})
	if status.Code(err) != codes.Internal {
		t.Fatalf("got %v", err)
	}
	f.svc.clock = func() int64 { return 0 }
	f.call(d("free=x"))
	if got := testutilCounter(f.metrics.panics); got != 1 {
		t.Fatalf("panics counted %v", got)
	}
}

// TestCapsOverGRPC sends each documented cap + 1 through real gRPC: each gets
// InvalidArgument naming the field, and the next valid request is served.
func TestCapsOverGRPC(t *testing.T) {
	f := newFixture(t, Options{}, 1)
	many := make([]*commonv3.RateLimitDescriptor, engine.MaxDescriptors+1)
	for i := range many {
		many[i] = d("free=x")
	}
	deep := &commonv3.RateLimitDescriptor{}
	for i := 0; i <= engine.MaxEntries; i++ {
		deep.Entries = append(deep.Entries, &commonv3.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
	}
	hits := d("free=x")
	hits.HitsAddend = wrapperspb.UInt64(engine.MaxHits + 1)
	cases := []struct {
		name  string
		descs []*commonv3.RateLimitDescriptor
		field string
	}{
		{"descriptors per request", many, "descriptors"},
		{"entries per descriptor", []*commonv3.RateLimitDescriptor{deep}, "entries"},
		{"key length", []*commonv3.RateLimitDescriptor{d(strings.Repeat("k", engine.MaxKeyBytes+1) + "=v")}, "key"},
		{"value length", []*commonv3.RateLimitDescriptor{d("k=" + strings.Repeat("v", engine.MaxValueBytes+1))}, "value"},
		{"hits_addend", []*commonv3.RateLimitDescriptor{hits}, "hits_addend"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "test", Descriptors: tc.descs})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.field) {
				t.Fatalf("got %v", err)
			}
			f.call(d("free=x"))
		})
	}
}

// TestReflectionListsServices is what `grpcurl -plaintext 127.0.0.1:8081 list`
// does: the rate-limit service and health are discoverable without .proto files.
func TestReflectionListsServices(t *testing.T) {
	f := newFixture(t, Options{}, 1)
	stream, err := reflectionpb.NewServerReflectionClient(f.conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer stream.CloseSend()
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, s := range resp.GetListServicesResponse().GetService() {
		got[s.Name] = true
	}
	for _, want := range []string{"envoy.service.ratelimit.v3.RateLimitService", "grpc.health.v1.Health"} {
		if !got[want] {
			t.Errorf("reflection does not list %s: %v", want, got)
		}
	}
}
