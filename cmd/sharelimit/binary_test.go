package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// command is this package's import path, for testutil.Build.
const command = "github.com/sharelimit/sharelimit/cmd/sharelimit"

// process is the real binary running serve.
type process struct {
	t                  *testing.T
	cmd                *exec.Cmd
	grpcAddr, httpAddr string
	logs               testutil.Buffer
	exited             chan error // the result of Wait, put back by whoever reads it
}

// startDaemon runs serve of the binary, built once for the package, on the
// example config with args, and waits until /healthcheck answers 200.
func startDaemon(t *testing.T, args ...string) *process {
	t.Helper()
	bin := testutil.Build(t, command)
	d := &process{t: t, grpcAddr: testutil.FreeAddr(t), httpAddr: testutil.FreeAddr(t), exited: make(chan error, 1)}
	d.cmd = exec.Command(bin, append([]string{"serve", "--config-dir", "../../examples/config", "--grpc-addr", d.grpcAddr}, args...)...)
	d.cmd.Env = append(os.Environ(), "SHARELIMIT_HTTP_ADDR="+d.httpAddr, "SHARELIMIT_LOG_FORMAT=json")
	d.cmd.Stdout, d.cmd.Stderr = &d.logs, &d.logs
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.exited <- d.cmd.Wait() }()
	t.Cleanup(func() {
		d.cmd.Process.Kill()
		<-d.exited
	})
	d.awaitHealth(http.StatusOK, "healthy")
	return d
}

// awaitHealth waits until /healthcheck answers code.
func (d *process) awaitHealth(code int, what string) {
	d.t.Helper()
	testutil.Eventually(d.t, 30*time.Second, func() error {
		resp, err := http.Get("http://" + d.httpAddr + "/healthcheck")
		if err != nil {
			return fmt.Errorf("daemon never %s: %w\n%s", what, err, d.logs.String())
		}
		resp.Body.Close()
		if resp.StatusCode != code {
			return fmt.Errorf("daemon never %s: /healthcheck %d\n%s", what, resp.StatusCode, d.logs.String())
		}
		return nil
	})
}

func (d *process) signal(sig os.Signal) {
	d.t.Helper()
	if err := d.cmd.Process.Signal(sig); err != nil {
		d.t.Fatal(err)
	}
}

// draining waits until /healthcheck reports the drain (503).
func (d *process) draining() {
	d.t.Helper()
	d.awaitHealth(http.StatusServiceUnavailable, "started draining")
}

// exitsCleanly waits, generously, for the process to exit 0. The deadline is
// only there so a hang fails the test instead of the test binary.
func (d *process) exitsCleanly(why string) {
	d.t.Helper()
	select {
	case err := <-d.exited:
		d.exited <- err
		if err != nil {
			d.t.Fatalf("exit %v:\n%s", err, d.logs.String())
		}
	case <-time.After(20 * time.Second):
		d.t.Fatalf("did not exit %s:\n%s", why, d.logs.String())
	}
}

// TestBinaryServesAndDrains builds the real binary, runs it on the example
// config, answers a request over gRPC, and stops it with SIGTERM: health turns
// NOT_SERVING during the drain, in-flight service continues, and it exits 0.
func TestBinaryServesAndDrains(t *testing.T) {
	d := startDaemon(t, "--drain", "1")
	conn, err := grpc.NewClient(d.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	ctx := context.Background()
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{
		{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "api"}}}}}
	resp, err := client.ShouldRateLimit(ctx, req)
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1000 {
		t.Fatalf("first request: %v %v", resp, err)
	}

	mresp, err := http.Get("http://" + d.httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	if !strings.Contains(string(metrics), "\nsharelimit_config_watch_polling 0\n") {
		t.Errorf("/metrics lacks sharelimit_config_watch_polling 0 (fsnotify works here)")
	}

	d.signal(syscall.SIGTERM)
	// During the drain: NOT_SERVING, and requests still answered.
	health := healthpb.NewHealthClient(conn)
	sawNotServing := false
	for i := 0; i < 100 && !sawNotServing; i++ {
		h, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
		if err == nil && h.Status == healthpb.HealthCheckResponse_NOT_SERVING {
			sawNotServing = true
			if _, err := client.ShouldRateLimit(ctx, req); err != nil {
				t.Fatalf("request during drain: %v", err)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !sawNotServing {
		t.Fatal("health never turned NOT_SERVING during the drain")
	}
	d.exitsCleanly("after SIGTERM")
}

// TestBinarySecondSignalCutsDrain: an operator who signals again during a
// drain wants the daemon gone now, not after --drain (an hour here).
func TestBinarySecondSignalCutsDrain(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			d := startDaemon(t, "--drain", "1h")
			d.signal(syscall.SIGTERM)
			d.draining()
			d.signal(sig)
			d.exitsCleanly("on a second signal during an hour's drain")
		})
	}
}

// TestBinaryStopsWithOpenStreams: a health Watch (as kubelet's or Envoy's
// gRPC health checking keeps) and a reflection stream (grpcurl) never end on
// their own. The stop must still be graceful, well before --shutdown-timeout
// (an hour here) and without forcing.
func TestBinaryStopsWithOpenStreams(t *testing.T) {
	d := startDaemon(t, "--drain", "0.2", "--shutdown-timeout", "1h")
	conn, err := grpc.NewClient(d.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watch, refl := testutil.OpenStreams(t, ctx, conn, "ratelimit")

	d.signal(syscall.SIGTERM)
	// The watcher is told, and then the stream ends.
	if h, err := watch.Recv(); err != nil || h.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch during the drain: %v %v", h, err)
	}
	d.exitsCleanly("with open streams")
	if _, err := watch.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("watch ended with %v, want Unavailable", err)
	}
	if _, err := refl.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("reflection stream ended with %v, want Unavailable", err)
	}
	if strings.Contains(d.logs.String(), "did not finish in time") {
		t.Errorf("the stop was forced:\n%s", d.logs.String())
	}
}
