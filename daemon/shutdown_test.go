package daemon

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sharelimit/sharelimit/internal/testutil"
	"github.com/sharelimit/sharelimit/server"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// slowRLS holds each ShouldRateLimit until release is closed: an in-flight
// call that a graceful stop must let finish.
type slowRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	entered chan struct{}
	release chan struct{}
}

func (s *slowRLS) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	close(s.entered)
	<-s.release
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// TestStopGRPCEndsOpenStreams runs the real server on loopback with a health
// Watch, a reflection stream and an unfinished unary call open. The streams
// must end at once, with Unavailable; the unary call must still be answered;
// and the stop must be graceful, not forced at the (long) timeout.
func TestStopGRPCEndsOpenStreams(t *testing.T) {
	svc := &slowRLS{entered: make(chan struct{}), release: make(chan struct{})}
	health := server.NewHealth()
	streams := server.NewStreamCloser()
	gs := server.NewGRPCServer(svc, health, nil, streams.ServerOption())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	defer gs.Stop() // on a failed assertion only; a no-op after the stop
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	watch, refl := testutil.OpenStreams(t, ctx, conn, "")
	unary := make(chan error, 1)
	go func() {
		_, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d"})
		unary <- err
	}()
	testutil.Within(t, svc.entered, "the unary call to arrive")

	health.Shutdown()
	if h, err := watch.Recv(); err != nil || h.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch after health.Shutdown: %v %v", h, err)
	}
	forced := make(chan bool, 1)
	go func() {
		forced <- shutdown{Timeout: 30 * time.Second, Log: quiet}.stopGRPC(gs, streams.Close)
	}()
	ended := make(chan error, 2)
	go func() { _, err := watch.Recv(); ended <- err }()
	go func() { _, err := refl.Recv(); ended <- err }()
	for range 2 {
		if err := testutil.Within(t, ended, "the streams to end"); status.Code(err) != codes.Unavailable {
			t.Errorf("stream ended with %v, want Unavailable", err)
		}
	}
	close(svc.release)
	if err := testutil.Within(t, unary, "the unary call"); err != nil {
		t.Errorf("in-flight call during a graceful stop: %v", err)
	}
	if testutil.Within(t, forced, "the stop") {
		t.Error("the stop was forced: something kept GracefulStop waiting")
	}
	if err := testutil.Within(t, served, "Serve to return"); err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// fakeStopper is a server whose GracefulStop, like grpc-go's, returns once
// in-flight calls end (when done is closed, if it is) or once Stop is called.
type fakeStopper struct {
	done     chan struct{} // nil: calls never end by themselves
	graceful chan struct{} // closed when GracefulStop starts
	stop     chan struct{}
	stopped  atomic.Bool
}

func newFakeStopper(callsEnd bool) *fakeStopper {
	f := &fakeStopper{graceful: make(chan struct{}), stop: make(chan struct{})}
	if callsEnd {
		f.done = make(chan struct{})
		close(f.done)
	}
	return f
}

func (f *fakeStopper) GracefulStop() {
	close(f.graceful)
	select {
	case <-f.done:
	case <-f.stop:
	}
}

func (f *fakeStopper) Stop() {
	if f.stopped.CompareAndSwap(false, true) {
		close(f.stop)
	}
}

// TestShutdownPaths: which way the stop goes, decided by events, never by
// how fast this machine is. Timers that must not fire are an hour long.
func TestShutdownPaths(t *testing.T) {
	closed := make(chan struct{})
	close(closed)
	cases := []struct {
		name          string
		s             shutdown
		callsEnd      bool
		nowDuringStop bool // close Now once GracefulStop has started
		forced        bool
	}{
		{name: "graceful", s: shutdown{Drain: 0, Timeout: time.Hour}, callsEnd: true},
		{name: "second signal before the drain ends", s: shutdown{Drain: time.Hour, Timeout: time.Hour, Now: closed}, callsEnd: true, forced: true},
		{name: "second signal during the graceful stop", s: shutdown{Timeout: time.Hour}, nowDuringStop: true, forced: true},
		{name: "calls outlast the timeout", s: shutdown{Timeout: time.Nanosecond}, forced: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			gs := newFakeStopper(tc.callsEnd)
			now := make(chan struct{})
			if tc.s.Now == nil {
				tc.s.Now = now
			}
			tc.s.Log = quiet
			var streamsClosed atomic.Bool
			result := make(chan bool, 1)
			go func() {
				result <- tc.s.run(gs, func() { streamsClosed.Store(true) }, &http.Server{})
			}()
			if tc.nowDuringStop {
				testutil.Within(t, gs.graceful, "GracefulStop")
				close(now)
			}
			forced := testutil.Within(t, result, "the shutdown")
			if forced != tc.forced {
				t.Errorf("forced %v, want %v", forced, tc.forced)
			}
			if gs.stopped.Load() != tc.forced {
				t.Errorf("Stop called: %v, want %v", gs.stopped.Load(), tc.forced)
			}
			if !streamsClosed.Load() {
				t.Error("long-lived streams were not closed")
			}
		})
	}
}
