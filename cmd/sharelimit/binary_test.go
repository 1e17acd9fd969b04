package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// freePort returns a loopback port nothing listens on at the moment.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// TestBinaryServesAndDrains builds the real binary, runs it on the example
// config, answers a request over gRPC, and stops it with SIGTERM: health turns
// NOT_SERVING during the drain, in-flight service continues, and it exits 0.
func TestBinaryServesAndDrains(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "sharelimit")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	grpcAddr, httpAddr := "127.0.0.1:"+freePort(t), "127.0.0.1:"+freePort(t)
	cmd := exec.Command(bin, "serve", "--config-dir", "../../examples/config", "--grpc-addr", grpcAddr, "--drain", "1")
	cmd.Env = append(os.Environ(), "SHARELIMIT_HTTP_ADDR="+httpAddr, "SHARELIMIT_LOG_FORMAT=json")
	var logs testutil.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})

	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get("http://" + httpAddr + "/healthcheck")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon never became healthy:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
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

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
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
	select {
	case err := <-exited:
		exited <- err
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("exit %v:\n%s", err, logs.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("did not exit after SIGTERM:\n%s", logs.String())
	}
}
