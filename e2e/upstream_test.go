package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// proc is one sharelimit process started with a given environment and no
// arguments, as a container runtime starts it.
type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func startProc(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	logf, err := os.CreateTemp(t.TempDir(), "sharelimit-*.log")
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	p := &proc{cmd: exec.Command(sharelimitBin(t), args...), log: logf.Name(), done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	configureProcess(p.cmd)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// await polls f until it returns nil, failing the test after timeout with
// the last error and the process's log.
func (p *proc) await(t *testing.T, what string, timeout time.Duration, f func() error) {
	t.Helper()
	testutil.Eventually(t, timeout, func() error {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			t.Fatalf("%s: the process exited (%v):\n%s", what, p.err, tail(p.log, 4000))
		default:
		}
		return fmt.Errorf("%s: %w\n%s", what, err, tail(p.log, 4000))
	})
}

// awaitHealthy waits until the admin listener at addr answers /healthcheck
// with 200.
func (p *proc) awaitHealthy(t *testing.T, what, addr string) {
	t.Helper()
	p.await(t, what, startTimeout, func() error {
		code, body, err := httpGet("http://" + addr + "/healthcheck")
		if err == nil && code != 200 {
			err = &httpError{code, body}
		}
		return err
	})
}

// rlsClient is a rate-limit client of the daemon at addr, closed when the test
// ends.
func rlsClient(t *testing.T, addr string) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func httpGet(url string) (int, string, error) {
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

func port(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }

// upstreamRules is a config written for upstream: an anchor and a merge key,
// a file without a .yaml name, and a second file in a subdirectory, all of
// which upstream's runtime loader reads.
var upstreamRules = map[string]string{
	"config.yaml": `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: &per_minute
      unit: minute
      requests_per_unit: 3
  - key: path
    value: /login
    rate_limit:
      <<: *per_minute
      requests_per_unit: 2
`,
	"extra": `
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 1}
`,
}

// TestUpstreamDeploymentEnvironment: the real binary, started with nothing
// but a typical upstream Kubernetes Deployment's environment (RUNTIME_*,
// ports, LOG_LEVEL, REDIS_*, USE_STATSD=false) and no arguments, serves the
// rules from upstream's directory, answers /healthcheck on PORT and
// /rlconfig on DEBUG_PORT, and names the ignored variables in one warning.
func TestUpstreamDeploymentEnvironment(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range upstreamRules {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	grpcAddr, httpAddr, debugAddr := testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t)
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"RUNTIME_ROOT=" + root,
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"RUNTIME_WATCH_ROOT=false",
		"RUNTIME_IGNOREDOTFILES=true",
		"USE_STATSD=false",
		"LOG_LEVEL=debug",
		"LOG_FORMAT=json",
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_URL=redis:6379",
		"GRPC_PORT=" + port(grpcAddr),
		"PORT=" + port(httpAddr),
		"DEBUG_PORT=" + port(debugAddr),
		"SHARELIMIT_LOCAL_HTTP_ADDR=" + testutil.FreeAddr(t), // not the fixed default, 127.0.0.1:8082
	}
	p := startProc(t, env)
	p.awaitHealthy(t, "/healthcheck on PORT", httpAddr)
	rls := rlsClient(t, grpcAddr)
	// Each rule admits its limit, then refuses: upstream's config, as
	// upstream's loader reads it, is in force.
	for _, tc := range []struct {
		domain, key, value string
		n                  int
	}{
		{"edge", "remote_address", "10.0.0.1", 4},
		{"edge", "path", "/login", 3}, // the merge key's override: 2, not 3
		{"api", "tenant", "acme", 2},  // from the file named "extra"
	} {
		ok, over := 0, 0
		for range tc.n {
			resp, err := rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: tc.domain,
				Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: tc.key, Value: tc.value}}}}})
			if err != nil {
				t.Fatal(err)
			}
			if resp.OverallCode == rlsv3.RateLimitResponse_OK {
				ok++
			} else {
				over++
			}
		}
		limit := map[string]int{"remote_address": 3, "path": 2, "tenant": 1}[tc.key]
		if ok != limit || over != tc.n-limit {
			t.Errorf("%s %s=%s: %d OK and %d OVER_LIMIT, want %d and %d", tc.domain, tc.key, tc.value, ok, over, limit, tc.n-limit)
		}
	}

	code, body, err := httpGet("http://" + debugAddr + "/rlconfig")
	if err != nil || code != 200 || !strings.Contains(body, "edge.path_/login") || !strings.Contains(body, "api.tenant") {
		t.Errorf("/rlconfig on DEBUG_PORT: %d %v\n%s", code, err, body)
	}

	log, _ := os.ReadFile(p.log)
	var warning string
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, `"level":"warning"`) && strings.Contains(line, "upstream variables ignored") {
			if warning != "" {
				t.Errorf("more than one ignored-variables warning:\n%s\n%s", warning, line)
			}
			warning = line
		}
	}
	for _, name := range []string{"REDIS_SOCKET_TYPE", "REDIS_URL", "USE_STATSD"} {
		if !strings.Contains(warning, name) {
			t.Errorf("the warning does not name %s: %q", name, warning)
		}
	}
	if strings.Contains(warning, "redis:6379") {
		t.Errorf("the warning shows a value: %q", warning)
	}
	if !strings.Contains(string(log), "LOG_LEVEL -> --log-level") {
		t.Errorf("the log does not say LOG_LEVEL was applied:\n%s", tail(p.log, 2000))
	}
}

type httpError struct {
	code int
	body string
}

func (e *httpError) Error() string { return http.StatusText(e.code) + ": " + e.body }
