package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// scriptedRLS answers by the generic_key value of the first descriptor, so that
// a test knows exactly how many of each answer to expect, and records what it saw.
type scriptedRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	mu     sync.Mutex
	calls  int
	values map[string]int
	bad    []string
}

func (s *scriptedRLS) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	v := req.GetDescriptors()[0].GetEntries()[0].GetValue()
	s.mu.Lock()
	s.calls++
	s.values[v]++
	if req.GetDomain() != "scripted" || req.GetHitsAddend() != 2 {
		s.bad = append(s.bad, req.String())
	}
	s.mu.Unlock()
	switch v {
	case "key-0":
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}, nil
	case "key-1":
		return nil, status.Error(codes.ResourceExhausted, "scripted")
	case "key-2":
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_UNKNOWN}, nil
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

func startGRPC(t *testing.T, register func(*grpc.Server)) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	register(s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(lis)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
	return lis.Addr().String()
}

// checkCounts asserts the invariants every Result must hold.
func checkCounts(t *testing.T, res Result) {
	t.Helper()
	if res.OK+res.OverLimit+res.Unknown+res.Errors != res.Requests {
		t.Fatalf("ok %d + over %d + unknown %d + errors %d != requests %d", res.OK, res.OverLimit, res.Unknown, res.Errors, res.Requests)
	}
	var byCode uint64
	for _, n := range res.ErrorsByCode {
		byCode += n
	}
	if byCode != res.Errors {
		t.Fatalf("errors by code add up to %d, errors = %d", byCode, res.Errors)
	}
	l := res.Latency
	if answered := res.Requests - res.Errors; answered > 0 {
		if !(0 < l.P50 && l.Min <= l.P50 && l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.P999 && l.P999 <= l.Max) {
			t.Fatalf("latency quantiles out of order: %+v", l)
		}
	}
}

func TestRunAgainstNoop(t *testing.T) {
	t.Parallel()
	addr := startNoop(t)
	tests := []struct {
		name  string
		cfg   Config
		check func(t *testing.T, res Result)
	}{
		{
			name: "closed loop bounded by requests",
			cfg:  Config{Requests: 2000, Concurrency: 8},
			check: func(t *testing.T, res Result) {
				if res.Requests != 2000 || res.OK != 2000 {
					t.Fatalf("requests %d, ok %d; want exactly 2000", res.Requests, res.OK)
				}
			},
		},
		{
			name: "closed loop bounded by duration",
			cfg:  Config{Duration: 300 * time.Millisecond, Conns: 2, Shape: ShapeNested, Descriptors: 3, Cardinality: 100000},
			check: func(t *testing.T, res Result) {
				if res.Requests == 0 || res.OK != res.Requests {
					t.Fatalf("requests %d, ok %d", res.Requests, res.OK)
				}
				if res.Elapsed < 300*time.Millisecond || res.Elapsed > 300*time.Millisecond+stopGrace {
					t.Fatalf("elapsed %v for a 300ms window", res.Elapsed)
				}
			},
		},
		{
			name: "open loop at a modest rate",
			cfg:  Config{Rate: 1000, Duration: 500 * time.Millisecond, Warmup: 100 * time.Millisecond, Shape: ShapeRemoteAddress, Cardinality: 50},
			check: func(t *testing.T, res Result) {
				// What a loaded machine cannot change: the schedule is 500 slots,
				// each either sent or missed, and the run never outpaces it.
				const scheduled = 500 // 1000/s for 0.5s
				if res.Requests+res.Missed != scheduled {
					t.Fatalf("requests %d + missed %d != %d scheduled", res.Requests, res.Missed, scheduled)
				}
				if res.Throughput > 1100 {
					t.Fatalf("%.0f req/s at a 1000 req/s schedule", res.Throughput)
				}
				// Sanity only: a test machine may be busy.
				if res.Requests < scheduled/10 {
					t.Fatalf("only %d of %d scheduled requests sent", res.Requests, scheduled)
				}
				if res.Loop != "open" || res.Concurrency != DefaultConcurrency {
					t.Fatalf("loop %q with %d workers", res.Loop, res.Concurrency)
				}
			},
		},
		{
			name: "open loop bounded by requests",
			cfg:  Config{Rate: 5000, Requests: 300, Concurrency: 4},
			check: func(t *testing.T, res Result) {
				if res.Requests != 300 || res.Missed != 0 {
					t.Fatalf("requests %d, missed %d; want 300, 0", res.Requests, res.Missed)
				}
			},
		},
		{
			name: "server cpu of this process",
			cfg:  Config{Duration: 200 * time.Millisecond, ServerPID: os.Getpid()},
			check: func(t *testing.T, res Result) {
				if res.Server == nil || res.Server.PID != os.Getpid() || res.Server.Total < 0 {
					t.Fatalf("server cpu %+v", res.Server)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := tc.cfg
			cfg.Targets = []string{addr}
			res, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			checkCounts(t, res)
			if res.Errors != 0 || res.Unknown != 0 || res.OverLimit != 0 {
				t.Fatalf("against the no-op server: errors %d (%v), unknown %d, over %d", res.Errors, res.ErrorsByCode, res.Unknown, res.OverLimit)
			}
			tc.check(t, res)

			var buf bytes.Buffer
			if err := res.WriteJSON(&buf); err != nil {
				t.Fatal(err)
			}
			var parsed struct {
				Requests uint64 `json:"requests"`
				OK       uint64 `json:"ok"`
				Latency  struct {
					P99 int64 `json:"p99_ns"`
				} `json:"latency"`
			}
			if err := json.Unmarshal(buf.Bytes(), &parsed); err != nil {
				t.Fatalf("JSON output does not parse: %v\n%s", err, buf.String())
			}
			if parsed.Requests != res.Requests || parsed.OK != res.OK || parsed.Latency.P99 != int64(res.Latency.P99) {
				t.Fatalf("JSON %+v does not match the result", parsed)
			}
			buf.Reset()
			if err := res.WriteTable(&buf); err != nil || !strings.Contains(buf.String(), "p99.9") {
				t.Fatalf("table: %v\n%s", err, buf.String())
			}
		})
	}
}

func TestRunCountsEveryAnswer(t *testing.T) {
	t.Parallel()
	rec := &scriptedRLS{values: make(map[string]int)}
	a := startGRPC(t, func(s *grpc.Server) { rlsv3.RegisterRateLimitServiceServer(s, rec) })
	b := startGRPC(t, func(s *grpc.Server) { rlsv3.RegisterRateLimitServiceServer(s, rec) })
	res, err := Run(context.Background(), Config{
		Targets:     []string{a, b},
		Conns:       2,
		Concurrency: 6,
		Requests:    400,
		Cardinality: 4,
		Domain:      "scripted",
		HitsAddend:  2,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	checkCounts(t, res)
	// Keys walk round-robin from key-0 and there is no warmup: exactly 100 each.
	if res.OverLimit != 100 || res.Errors != 100 || res.Unknown != 100 || res.OK != 100 {
		t.Fatalf("ok %d, over %d, errors %d, unknown %d; want 100 each", res.OK, res.OverLimit, res.Errors, res.Unknown)
	}
	if res.ErrorsByCode[codes.ResourceExhausted.String()] != 100 {
		t.Fatalf("errors by code %v", res.ErrorsByCode)
	}
	var table bytes.Buffer
	if err := res.WriteTable(&table); err != nil || !strings.Contains(table.String(), "errors      ResourceExhausted 100") {
		t.Fatalf("table does not break errors down by code: %v\n%s", err, table.String())
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.bad) > 0 {
		t.Fatalf("server saw requests without the domain and hits_addend: %v", rec.bad[0])
	}
	// 4 probes (2 targets x 2 connections) plus the 400 requests.
	if rec.calls != 404 || len(rec.values) != 4 {
		t.Fatalf("server saw %d calls over %d values", rec.calls, len(rec.values))
	}
}

func TestRunFailsFast(t *testing.T) {
	t.Parallel()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := closed.Addr().String()
	closed.Close()
	unimplemented := startGRPC(t, func(*grpc.Server) {})

	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"invalid config", Config{Targets: []string{"x"}}, "both are zero"},
		{"connection refused", Config{Targets: []string{refused}, Requests: 10}, "probe " + refused},
		{"no rate-limit service", Config{Targets: []string{unimplemented}, Requests: 10}, "Unimplemented"},
		{"server pid missing", Config{Targets: []string{unimplemented}, Requests: 10, ServerPID: 1 << 30}, "read cpu time"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			_, err := Run(context.Background(), tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run: %v, want an error containing %q", err, tc.want)
			}
			if time.Since(start) > connectTimeout {
				t.Fatalf("took %v to fail", time.Since(start))
			}
		})
	}
}

func TestRunInterrupted(t *testing.T) {
	t.Parallel()
	addr := startNoop(t)
	for _, rate := range []float64{0, 50} { // open loop: workers asleep on the schedule
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(300*time.Millisecond, cancel)
		start := time.Now()
		res, err := Run(ctx, Config{Targets: []string{addr}, Duration: time.Minute, Rate: rate, Concurrency: 4})
		cancel()
		if !errors.Is(err, context.Canceled) || !res.Interrupted {
			t.Fatalf("rate %g: Run = %v, interrupted %v; want context.Canceled", rate, err, res.Interrupted)
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("rate %g: cancel took %v to stop the run", rate, time.Since(start))
		}
		checkCounts(t, res)
		if res.Errors != 0 {
			t.Fatalf("rate %g: calls cut short by the cancel were counted as errors: %v", rate, res.ErrorsByCode)
		}
	}
}

func TestCompare(t *testing.T) {
	t.Parallel()
	a, b := startNoop(t), startNoop(t)
	c, err := Compare(context.Background(), CompareConfig{
		Load:   Config{Requests: 300, Concurrency: 4},
		A:      Side{Label: "noop", Targets: []string{a}, ServerPID: os.Getpid()},
		B:      Side{Targets: []string{b}},
		Rounds: 2,
	})
	if err != nil {
		t.Fatalf("Compare: %v", err)
	}
	if len(c.A.Runs) != 2 || len(c.B.Runs) != 2 || c.A.Label != "noop" || c.B.Label != "B" {
		t.Fatalf("runs %d/%d labels %q/%q", len(c.A.Runs), len(c.B.Runs), c.A.Label, c.B.Label)
	}
	for _, r := range append(c.A.Runs, c.B.Runs...) {
		checkCounts(t, r)
		if r.OK != 300 {
			t.Fatalf("run %s: ok %d, want 300", r.Label, r.OK)
		}
	}
	if c.Ratio.Throughput <= 0 || c.Ratio.P99 <= 0 || c.Ratio.ServerCPUPerDecision != 0 {
		t.Fatalf("ratios %+v: want throughput and p99, and no CPU ratio without B's pid", c.Ratio)
	}
	var buf bytes.Buffer
	if err := c.WriteTable(&buf); err != nil || !strings.Contains(buf.String(), "B/A") || !strings.Contains(buf.String(), "median") {
		t.Fatalf("table: %v\n%s", err, buf.String())
	}
	buf.Reset()
	if err := c.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var parsed Comparison
	if err := json.Unmarshal(buf.Bytes(), &parsed); err != nil || len(parsed.B.Runs) != 2 {
		t.Fatalf("JSON: %v\n%s", err, buf.String())
	}
}

func TestMedian(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	}
	for _, tc := range tests {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// BenchmarkRunNoop measures the generator and the no-op server together, in one
// process: allocations per request are both sides'.
func BenchmarkRunNoop(b *testing.B) {
	addr := startNoop(b)
	for _, shape := range Shapes() {
		b.Run(string(shape), func(b *testing.B) {
			b.ReportAllocs()
			descs := 3
			if shape == ShapeMix {
				descs = 1 // it sends its own 3 or 4
			}
			res, err := Run(context.Background(), Config{
				Targets: []string{addr}, Requests: uint64(b.N), Concurrency: 16,
				Shape: shape, Cardinality: 1000, Descriptors: descs,
			})
			if err != nil {
				b.Fatal(err)
			}
			if res.OK != uint64(b.N) {
				b.Fatalf("ok %d of %d requests", res.OK, b.N)
			}
			b.ReportMetric(res.Throughput, "req/s")
		})
	}
}

func TestRunProgress(t *testing.T) {
	t.Parallel()
	addr := startNoop(t)
	var progress testutil.Buffer
	res, err := Run(context.Background(), Config{
		Targets: []string{addr}, Duration: 2 * time.Second, Concurrency: 2,
		Progress: &progress, Label: "noop",
	})
	if err != nil {
		t.Fatal(err)
	}
	checkCounts(t, res)
	if out := progress.String(); !strings.Contains(out, "bench: noop ") || !strings.Contains(out, "s/2s ") || !strings.Contains(out, "req/s") {
		t.Fatalf("progress output %q", out)
	}
}

func TestNoopAnswersEveryDescriptor(t *testing.T) {
	t.Parallel()
	svc := newNoopService()
	for _, n := range []int{0, 1, noopSharedStatuses, noopSharedStatuses + 44} {
		req := newRequestBuilder(newKeySpace(ShapeGenericKey, 10), "bench", max(n, 1), 0).build(0)
		req.Descriptors = req.Descriptors[:n]
		resp, err := svc.ShouldRateLimit(context.Background(), req)
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetStatuses()) != n {
			t.Fatalf("%d descriptors: %v, %v with %d statuses", n, err, resp.GetOverallCode(), len(resp.GetStatuses()))
		}
		for i, st := range resp.GetStatuses() {
			if st.GetCode() != rlsv3.RateLimitResponse_OK {
				t.Fatalf("%d descriptors: status %d is %v", n, i, st.GetCode())
			}
		}
	}
}

func TestFmtDur(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   time.Duration
		want string
	}{
		{0, "0ns"},
		{999, "999ns"},
		{241300, "241.3µs"},
		{1920 * time.Microsecond, "1.92ms"},
		{2500 * time.Millisecond, "2.50s"},
	}
	for _, tc := range tests {
		if got := fmtDur(tc.in); got != tc.want {
			t.Errorf("fmtDur(%d) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
