package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// xdsServer is the management server process: its xDS and control addresses.
type xdsServer struct {
	cmd          *exec.Cmd
	xds, control string
	done         chan struct{}
}

// startXDSServer runs xdsserver on addr ("127.0.0.1:0" for any port) and
// reads the addresses it prints once it listens.
func startXDSServer(t *testing.T, addr string) *xdsServer {
	t.Helper()
	s := &xdsServer{cmd: exec.Command(xdsserverBin(t), "--addr", addr, "--node-id", "edge-node", "--control-addr", "127.0.0.1:0"), done: make(chan struct{})}
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s.cmd.Stderr = os.Stderr
	configureProcess(s.cmd)
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	for s.xds == "" || s.control == "" {
		if !sc.Scan() {
			t.Fatalf("xdsserver exited before printing its addresses: %v", sc.Err())
		}
		if a, ok := strings.CutPrefix(sc.Text(), "xds "); ok {
			s.xds = a
		} else if a, ok := strings.CutPrefix(sc.Text(), "control "); ok {
			s.control = a
		}
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	t.Cleanup(s.kill)
	return s
}

// kill ends the server as a crash would.
func (s *xdsServer) kill() {
	select {
	case <-s.done:
	default:
		s.cmd.Process.Signal(syscall.SIGKILL)
		<-s.done
	}
}

func (s *xdsServer) put(t *testing.T, version, yaml string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, "http://"+s.control+"/snapshot?version="+version, strings.NewReader(yaml))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("PUT snapshot %s: %s", version, resp.Status)
	}
}

func (s *xdsServer) nacks(t *testing.T) []struct{ Version, Error string } {
	t.Helper()
	resp, err := http.Get("http://" + s.control + "/nacks")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []struct{ Version, Error string }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

func xdsRules(rpu int, extra string) string {
	return fmt.Sprintf(`
- name: edge
  domain: edge
  descriptors:
    - key: user
      rate_limit: {unit: HOUR, requests_per_unit: %d}
%s`, rpu, extra)
}

// TestXDSManagementServer: the real binary takes its rules from a real
// go-control-plane management server running as a process of its own,
// configured with upstream's variables only: the initial push is served, an
// update is applied, a bad update is NACKed with the rules (and their spent
// buckets) kept, the server killed leaves the rules standing, and once it is
// back on its address the daemon reconnects and takes the next version, whose
// changed limit keeps the spent bucket spent.
func TestXDSManagementServer(t *testing.T) {
	srv := startXDSServer(t, "127.0.0.1:0")
	grpcAddr, httpAddr, localAddr, debugAddr := testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t)
	p := startProc(t, []string{
		"PATH=" + os.Getenv("PATH"),
		// Upstream's environment puts the admin port beyond loopback,
		// where it serves /healthcheck and /json alone: sharelimit's
		// /rlconfig is on the loopback admin listener.
		"SHARELIMIT_LOCAL_HTTP_ADDR=" + localAddr,
		"DEBUG_PORT=" + port(debugAddr),
		"CONFIG_TYPE=GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL=" + srv.xds,
		"CONFIG_GRPC_XDS_NODE_ID=edge-node",
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=100ms",
		"XDS_CLIENT_BACKOFF_MAX_INTERVAL=500ms",
		"GRPC_PORT=" + port(grpcAddr),
		"PORT=" + port(httpAddr),
		"LOG_FORMAT=json",
	})
	rlconfig := func() string {
		_, body, _ := httpGet("http://" + localAddr + "/rlconfig")
		return body
	}
	awaitRlconfig := func(what string, parts ...string) {
		t.Helper()
		p.await(t, what, startTimeout, func() error {
			body := rlconfig()
			for _, part := range parts {
				if !strings.Contains(body, part) {
					return fmt.Errorf("/rlconfig lacks %q:\n%s", part, body)
				}
			}
			return nil
		})
	}

	srv.put(t, "v1", xdsRules(2, ""))
	p.awaitHealthy(t, "/healthcheck after the initial push", httpAddr)
	rls := rlsClient(t, grpcAddr)
	decide := func(domain, value string, n int) string {
		t.Helper()
		var b strings.Builder
		for range n {
			resp, err := rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain,
				Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "user", Value: value}}}}})
			if err != nil {
				t.Fatal(err)
			}
			if resp.OverallCode == rlsv3.RateLimitResponse_OK {
				b.WriteByte('O')
			} else {
				b.WriteByte('X')
			}
		}
		return b.String()
	}
	if got := decide("edge", "a", 3); got != "OOX" {
		t.Fatalf("v1, 2 per hour: %s, want OOX", got)
	}

	// An update: a second domain. edge's rule is unchanged, so a's spent
	// bucket is kept.
	srv.put(t, "v2", xdsRules(2, `
- name: api
  domain: api
  descriptors:
    - key: user
      rate_limit: {unit: HOUR, requests_per_unit: 1}
`))
	awaitRlconfig("v2 applied", `version="v2"`, "api.user")
	if got := decide("edge", "a", 1) + decide("api", "b", 2); got != "XOX" {
		t.Fatalf("v2: %s, want XOX", got)
	}

	// A bad update is NACKed; v2's rules and buckets stay.
	srv.put(t, "v3", xdsRules(2, `
- name: bad
  domain: bad
  descriptors:
    - key: ""
      rate_limit: {unit: HOUR, requests_per_unit: 1}
`))
	p.await(t, "the NACK of v3", startTimeout, func() error {
		for _, n := range srv.nacks(t) {
			if n.Version == "v2" || n.Version == "v3" {
				if strings.Contains(n.Error, "descriptor has empty key") {
					return nil
				}
			}
		}
		return fmt.Errorf("no NACK naming the empty key: %v", srv.nacks(t))
	})
	awaitRlconfig("the NACK on /rlconfig", `version="v2"`, `last_nack_version="v3"`, "descriptor has empty key")
	if got := decide("edge", "a", 1) + decide("api", "b", 1); got != "XX" {
		t.Fatalf("after the NACK: %s, want XX", got)
	}

	// The server dies: the rules stand.
	addr := srv.xds
	srv.kill()
	awaitRlconfig("disconnected", "connected=false", `version="v2"`)
	if got := decide("edge", "a", 1) + decide("edge", "c", 1); got != "XO" {
		t.Fatalf("server down: %s, want XO", got)
	}

	// Back on the same address: the daemon reconnects and takes v4.
	srv = startXDSServer(t, addr)
	srv.put(t, "v4", xdsRules(5, ""))
	awaitRlconfig("v4 after the restart", "connected=true", `version="v4"`)
	if strings.Contains(rlconfig(), "api.user") {
		t.Fatal("v4 dropped domain api, but /rlconfig still lists it")
	}
	// edge's limit changed (5 per hour): a's bucket keeps its fill ratio
	// (spent: none of the 5), never a fresh burst; a new key gets all 5.
	if got := decide("edge", "a", 1) + decide("edge", "d", 6); got != "XOOOOOX" {
		t.Fatalf("v4, 5 per hour: %s, want XOOOOOX", got)
	}
}
