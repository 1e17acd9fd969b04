package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// stateConfig is a per-IP limit of 10 a minute: a token every 6 s, so a
// drained key stays drained across a restart of a second or two.
const stateConfig = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"

type rls struct {
	t      *testing.T
	client rlsv3.RateLimitServiceClient
}

func dial(t *testing.T, d *process) *rls {
	t.Helper()
	conn, err := grpc.NewClient(d.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &rls{t: t, client: rlsv3.NewRateLimitServiceClient(conn)}
}

func (r *rls) ask(ip string) rlsv3.RateLimitResponse_Code {
	r.t.Helper()
	resp, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{
		{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: ip}}}}})
	if err != nil {
		r.t.Fatal(err)
	}
	return resp.OverallCode
}

// drain spends ip's whole bucket and checks that the next request is over.
func (r *rls) drain(ip string) time.Time {
	r.t.Helper()
	for i := range 10 {
		if c := r.ask(ip); c != rlsv3.RateLimitResponse_OK {
			r.t.Fatalf("request %d of a burst of 10: %v", i, c)
		}
	}
	at := time.Now()
	if c := r.ask(ip); c != rlsv3.RateLimitResponse_OVER_LIMIT {
		r.t.Fatalf("the 11th request: %v, want OVER_LIMIT", c)
	}
	return at
}

// okAgain polls ip until it is admitted and returns when, after drained.
func (r *rls) okAgain(ip string, drained time.Time) time.Duration {
	r.t.Helper()
	var back time.Duration
	testutil.Eventually(r.t, 30*time.Second, func() error {
		if c := r.ask(ip); c != rlsv3.RateLimitResponse_OK {
			return fmt.Errorf("%s never admitted again: %v", ip, c)
		}
		back = time.Since(drained)
		return nil
	})
	return back
}

func stateDir(t *testing.T) (config, file string) {
	t.Helper()
	dir := t.TempDir()
	config = filepath.Join(dir, "config")
	if err := os.Mkdir(config, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(config, "edge.yaml"), []byte(stateConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	return config, filepath.Join(dir, "state", "sharelimit.state")
}

// A key drained to OVER_LIMIT is still OVER_LIMIT after a SIGTERM and a
// restart with the same --state-file, and is admitted again once its refill
// time (6 s for a token) has passed since it was drained: the downtime
// counted.
func TestBinaryStateSurvivesRestart(t *testing.T) {
	config, file := stateDir(t)
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config-dir", config, "--state-file", file, "--drain", "0"}
	d := startDaemon(t, args...)
	drained := dial(t, d).drain("10.0.0.1")
	d.signal(syscall.SIGTERM)
	d.exitsCleanly("after SIGTERM")
	if !strings.Contains(d.logs.String(), `"msg":"state written"`) {
		t.Fatalf("no state written on shutdown:\n%s", d.logs.String())
	}
	d2 := startDaemon(t, args...)
	r := dial(t, d2)
	if c := r.ask("10.0.0.1"); c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("after the restart, %.1fs after it was drained, the key is %v, want OVER_LIMIT:\n%s", time.Since(drained).Seconds(), c, d2.logs.String())
	}
	if c := r.ask("10.0.0.2"); c != rlsv3.RateLimitResponse_OK {
		t.Fatalf("another key: %v", c)
	}
	back := r.okAgain("10.0.0.1", drained)
	t.Logf("the drained key was admitted again %.1fs after it was drained (a token takes 6 s)", back.Seconds())
	if back < 5*time.Second {
		t.Errorf("admitted again %v after it was drained, before its token could refill", back)
	}
}

// With --state-interval 1s, a SIGKILL loses at most a second: a key drained
// before the checkpoints that followed it is still OVER_LIMIT after a
// restart.
func TestBinaryStateSurvivesKill(t *testing.T) {
	config, file := stateDir(t)
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	// 10 an hour: the key stays drained however long a loaded machine
	// takes to kill and restart the daemon.
	hourly := strings.Replace(stateConfig, "unit: minute", "unit: hour", 1)
	if err := os.WriteFile(filepath.Join(config, "edge.yaml"), []byte(hourly), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config-dir", config, "--state-file", file, "--state-interval", "1s"}
	d := startDaemon(t, args...)
	drained := dial(t, d).drain("10.0.0.1")
	// SIGKILL loses at most --state-interval: the daemon checkpoints at
	// that pace, by its own count. A 1 s pace writes 3 or 4 in 4 s; at
	// least 2 are asked, so a pace slower than 2 s fails (one 8 times too
	// slow writes at most 1), and a loaded machine has 2 s to spare.
	before := stateWrites(t, d)
	time.Sleep(4 * time.Second)
	if n := stateWrites(t, d) - before; n < 2 {
		t.Fatalf("%d checkpoints in 4 s at --state-interval 1s", n)
	}
	// A checkpoint under way as the drain ended may hold the state from
	// before it; the one after that was begun after it.
	after := stateWrites(t, d) + 2
	testutil.Eventually(t, 30*time.Second, func() error {
		if n := stateWrites(t, d); n < after {
			return fmt.Errorf("%d checkpoints written, waiting for %d", n, after)
		}
		return nil
	})
	d.signal(syscall.SIGKILL)
	<-d.exited
	d.exited <- nil
	d2 := startDaemon(t, args...)
	if c := dial(t, d2).ask("10.0.0.1"); c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("after SIGKILL and a restart, %.1fs after it was drained, the key is %v, want OVER_LIMIT:\n%s", time.Since(drained).Seconds(), c, d2.logs.String())
	}
}

// A corrupt state file is ignored with one warning: the daemon starts and
// serves as it would without one.
func TestBinaryCorruptStateStarts(t *testing.T) {
	config, file := stateDir(t)
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("SLS\x01 not a snapshot, whatever it claims to be"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, "--config-dir", config, "--state-file", file)
	if c := dial(t, d).ask("10.0.0.1"); c != rlsv3.RateLimitResponse_OK {
		t.Fatalf("%v", c)
	}
	if n := strings.Count(d.logs.String(), "state file not restored"); n != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, d.logs.String())
	}
}

// A state file that cannot be written (its directory is missing) is logged
// at shutdown, and the daemon still stops cleanly.
func TestBinaryStateUnwritable(t *testing.T) {
	config, file := stateDir(t) // the state directory is not created
	d := startDaemon(t, "--config-dir", config, "--state-file", file, "--drain", "0", "--shutdown-timeout", "2s")
	dial(t, d).drain("10.0.0.1")
	d.signal(syscall.SIGTERM)
	d.exitsCleanly("after SIGTERM")
	if !strings.Contains(d.logs.String(), "state file not written") {
		t.Fatalf("no error logged:\n%s", d.logs.String())
	}
}

// stateWrites is sharelimit_state_writes_total on d's /metrics.
func stateWrites(t *testing.T, d *process) int {
	t.Helper()
	const name = "sharelimit_state_writes_total "
	for _, line := range strings.Split(testutil.GetText(t, "http://"+d.httpAddr+"/metrics"), "\n") {
		if v, ok := strings.CutPrefix(line, name); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("%s%s: %v", name, v, err)
			}
			return n
		}
	}
	t.Fatalf("no %s on /metrics", name)
	return 0
}
