package h2_test

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/server"
	"github.com/sharelimit/sharelimit/source"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// daemon is a service on a real loopback listener, served directly or by
// grpc-go alone, with a clock the test moves.
type daemon struct {
	addr   string
	gs     server.GRPC
	health *health.Server
	now    *int64
	conn   *grpc.ClientConn
	rls    rlsv3.RateLimitServiceClient
}

func start(t testing.TB, direct bool, opts server.Options) *daemon {
	t.Helper()
	return startWith(t, direct, opts, nil)
}

// startWith is start with TLS when cfg is not nil; the daemon's client conn
// is plaintext all the same, for the tests that dial their own.
func startWith(t testing.TB, direct bool, opts server.Options, cfg *tls.Config) *daemon {
	t.Helper()
	set, err := source.Load("../testdata/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	store := bucket.NewStore(0)
	e, err := engine.New(nil, store, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	metrics := server.NewMetrics(store)
	metrics.Bind(set)
	e.Swap(set)
	now := new(int64)
	*now = int64(time.Hour)
	svc := server.NewService(e, func() int64 { return *now }, metrics, opts, quiet)
	d := &daemon{now: now, health: server.NewHealth()}
	if direct {
		d.gs = server.NewDirectServer(svc, d.health, cfg, quiet)
	} else {
		d.gs = server.NewGRPCServer(svc, d.health, cfg)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d.addr = lis.Addr().String()
	served := make(chan struct{})
	go func() {
		defer close(served)
		d.gs.Serve(lis)
	}()
	if d.conn, err = grpc.NewClient(d.addr, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	d.rls = rlsv3.NewRateLimitServiceClient(d.conn)
	t.Cleanup(func() {
		d.conn.Close()
		d.gs.Stop()
		<-served
	})
	return d
}

func desc(kvs ...string) *commonv3.RateLimitDescriptor {
	out := &commonv3.RateLimitDescriptor{}
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		out.Entries = append(out.Entries, &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return out
}

// exchanges are requests whose answers cover what an answer can be: OK,
// over the limit, unlimited, shadow, an override, hits_addend, many
// descriptors, and the errors.
func exchanges() []*rlsv3.RateLimitRequest {
	many := make([]*commonv3.RateLimitDescriptor, 10)
	for i := range many {
		many[i] = desc("ip=10.0.0." + string(rune('0'+i)))
	}
	tooMany := make([]*commonv3.RateLimitDescriptor, engine.MaxDescriptors+1)
	for i := range tooMany {
		tooMany[i] = desc("free=x")
	}
	override := desc("ip=override")
	override.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
	return []*rlsv3.RateLimitRequest{
		{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("fixed=one")}},
		{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("fixed=one")}},
		{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("fixed=one")}}, // over
		{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("free=1"), desc("shadow=s"), desc("shadow=s")}},
		{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{override, override}},
		{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("ip=h")}, HitsAddend: 3},
		{Domain: "test", Descriptors: many},
		{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("special=a"), desc("general=b"), desc("detailed=c")}},
		{Domain: "nope", Descriptors: []*commonv3.RateLimitDescriptor{desc("x=y")}},
		{Domain: "", Descriptors: []*commonv3.RateLimitDescriptor{desc("fixed=one")}},
		{Domain: "test"},
		{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("=v")}},
		{Domain: "test", Descriptors: tooMany},
		{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "ip", Value: strings.Repeat("v", 200<<10)}}}}},
		{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "ip", Value: strings.Repeat("v", 1<<20)}}}}},
	}
}

// TestAnswersAsGRPCGo sends the same requests to the daemon served directly
// and served by grpc-go: every answer and every error is the same.
func TestAnswersAsGRPCGo(t *testing.T) {
	for _, opts := range []server.Options{
		{},
		{ResponseHeaders: true, HeaderLimit: "X-Limit", HeaderRemaining: "X-Remaining", HeaderReset: "X-Reset"},
		{DynamicMetadata: true}, // answers the hand-written encoder does not write
		{ShadowMode: true},
	} {
		direct, grpcgo := start(t, true, opts), start(t, false, opts)
		for i, req := range exchanges() {
			want, wantErr := grpcgo.rls.ShouldRateLimit(context.Background(), req)
			got, err := direct.rls.ShouldRateLimit(context.Background(), req)
			if status.Code(err) != status.Code(wantErr) || status.Convert(err).Message() != status.Convert(wantErr).Message() {
				t.Fatalf("%+v: request %d: error %v, grpc-go %v", opts, i, err, wantErr)
			}
			if !proto.Equal(got, want) {
				t.Fatalf("%+v: request %d:\n got %v\nwant %v", opts, i, got, want)
			}
		}
	}
}

// TestConcurrentCallsNeverPassTheCap sends many calls at once over several
// connections for keys whose limits bind: each gets exactly one answer, and no
// key admits more than its limit.
func TestConcurrentCallsNeverPassTheCap(t *testing.T) {
	d := start(t, true, server.Options{})
	const conns, perConn, keys = 4, 400, 20
	var mu sync.Mutex
	admitted := map[string]int{}
	var wg sync.WaitGroup
	errs := make(chan error, conns*perConn)
	for range conns {
		cc, err := grpc.NewClient(d.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		client := rlsv3.NewRateLimitServiceClient(cc)
		for i := range perConn {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := "k" + string(rune('a'+i%keys))
				resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("ip=" + key)}})
				if err != nil {
					errs <- err
					return
				}
				if resp.OverallCode == rlsv3.RateLimitResponse_OK {
					mu.Lock()
					admitted[key]++
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for key, n := range admitted {
		if n > 3 { // ip: 3 a minute, and the clock stands still
			t.Fatalf("%s admitted %d, limit 3", key, n)
		}
	}
	if len(admitted) != keys {
		t.Fatalf("%d keys admitted anything, want %d", len(admitted), keys)
	}
}

// TestRelayedCalls: health and reflection answer through the relay, a health
// Watch streams changes, and an unknown method is Unimplemented.
func TestRelayedCalls(t *testing.T) {
	d := start(t, true, server.Options{})
	hc := healthpb.NewHealthClient(d.conn)
	resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "ratelimit"})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health check: %v %v", resp, err)
	}
	if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown service: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := w.Recv(); err != nil || m.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch: %v %v", m, err)
	}
	d.health.SetServingStatus("ratelimit", healthpb.HealthCheckResponse_NOT_SERVING)
	if m, err := w.Recv(); err != nil || m.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch after the change: %v %v", m, err)
	}
	cancel()

	rc, err := reflectionpb.NewServerReflectionClient(d.conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	got, err := rc.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range got.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	if !strings.Contains(strings.Join(names, " "), "envoy.service.ratelimit.v3.RateLimitService") {
		t.Fatalf("reflection lists %v", names)
	}
	// A large answer: the file descriptor of the RLS service and its imports,
	// more than one frame.
	if err := rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: "envoy.service.ratelimit.v3.RateLimitService"}}); err != nil {
		t.Fatal(err)
	}
	files, err := rc.Recv()
	if err != nil || len(files.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Fatalf("reflection file: %v %v", files, err)
	}
	rc.CloseSend()
	if _, err := rc.Recv(); err != io.EOF {
		t.Fatalf("reflection after CloseSend: %v", err)
	}

	err = d.conn.Invoke(context.Background(), "/no.Such/Method", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("unknown method: %v", err)
	}
	// The rate-limit call still works on the same connection.
	if _, err := d.rls.ShouldRateLimit(context.Background(), exchanges()[0]); err != nil {
		t.Fatal(err)
	}
}

// TestGracefulStopAnswersCallsInFlight: a call held back by a wait policy is
// answered during a graceful stop, which returns once it is.
func TestGracefulStopAnswersCallsInFlight(t *testing.T) {
	d := start(t, true, server.Options{})
	slow := &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("slow=a")}}
	if _, err := d.rls.ShouldRateLimit(context.Background(), slow); err != nil {
		t.Fatal(err)
	}
	// The bucket of 1 is empty and the clock stands still: the next call
	// reserves a token and is answered 50 ms later.
	answered := make(chan error, 1)
	go func() {
		resp, err := d.rls.ShouldRateLimit(context.Background(), slow)
		if err == nil && resp.OverallCode != rlsv3.RateLimitResponse_OK {
			err = status.Errorf(codes.Unknown, "answer %v", resp)
		}
		answered <- err
	}()
	time.Sleep(20 * time.Millisecond)
	stopped := make(chan struct{})
	go func() {
		d.gs.GracefulStop()
		close(stopped)
	}()
	if err := <-answered; err != nil {
		t.Fatalf("call in flight: %v", err)
	}
	<-stopped
	if _, err := net.DialTimeout("tcp", d.addr, time.Second); err == nil {
		t.Fatal("still accepting after the stop")
	}
}

// TestDeadlineBeforeTheWait: a client whose deadline comes before a wait
// policy's answer gets DeadlineExceeded, as with grpc-go.
func TestDeadlineBeforeTheWait(t *testing.T) {
	for _, direct := range []bool{true, false} {
		d := start(t, direct, server.Options{})
		slow := &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("slow=a")}}
		if _, err := d.rls.ShouldRateLimit(context.Background(), slow); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		_, err := d.rls.ShouldRateLimit(ctx, slow)
		cancel()
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("direct %v: %v", direct, err)
		}
	}
}

// TestStopEndsOpenStreams: Stop returns with a health Watch open, and the
// Watch ends.
func TestStopEndsOpenStreams(t *testing.T) {
	d := start(t, true, server.Options{})
	w, err := healthpb.NewHealthClient(d.conn).Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	d.gs.Stop()
	if _, err := w.Recv(); err == nil {
		t.Fatal("watch still open after Stop")
	}
}
