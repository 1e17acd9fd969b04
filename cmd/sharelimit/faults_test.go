package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

const secretToken = "tok-4f1e-9c2d-secret"

// fakeConsul answers the health query with four passing instances, then
// misbehaves as mode says: a real agent cannot be made to hang, answer garbage
// or refuse a token on demand.
type fakeConsul struct {
	mode atomic.Value // "ok", "hang", "garbage", "500", "403"
	hits atomic.Int64
}

func (f *fakeConsul) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.hits.Add(1)
	if !strings.HasPrefix(r.URL.Path, "/v1/health/service/app") {
		http.NotFound(w, r)
		return
	}
	mode := f.mode.Load().(string)
	blocking := r.URL.Query().Get("index") != "" && r.URL.Query().Get("index") != "0"
	switch {
	case mode == "hang" && blocking:
		<-r.Context().Done()
		return
	case mode == "garbage":
		w.Header().Set("X-Consul-Index", "11")
		io.WriteString(w, `[{"Node": {"Node": 12}, "Service": `)
		return
	case mode == "500":
		http.Error(w, "rpc error: no leader", 500)
		return
	case mode == "403":
		w.Header().Set("X-Echo-Token", r.Header.Get("X-Consul-Token"))
		http.Error(w, "Permission denied: token "+r.Header.Get("X-Consul-Token")+" lacks service:read", 403)
		return
	}
	w.Header().Set("X-Consul-Index", "10")
	var entries []map[string]any
	for i := 1; i <= 4; i++ {
		entries = append(entries, map[string]any{
			"Node":    map[string]any{"Node": fmt.Sprintf("n%d", i)},
			"Service": map[string]any{"ID": fmt.Sprintf("app-%d", i), "Service": "app"},
			"Checks":  []map[string]any{{"Status": "passing"}},
		})
	}
	json.NewEncoder(w).Encode(entries)
}

type rlconfig struct {
	Membership struct {
		Weight    float64 `json:"weight"`
		Total     int     `json:"total"`
		LastError string  `json:"last_error"`
		Errors    uint64  `json:"errors"`
	} `json:"membership"`
}

func getRLConfig(t *testing.T, httpAddr string) (rlconfig, string) {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/rlconfig?format=json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var c rlconfig
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("rlconfig: %v: %s", err, b)
	}
	return c, string(b)
}

// TestConsulFaultsNeverReachTheRequestPath runs the real binary against a
// Consul that hangs, answers garbage, 500s and 403s. Decisions keep flowing with
// the last view, none fails, none waits on the watch, and the ACL token appears
// nowhere: not in logs, /rlconfig or /metrics.
func TestConsulFaultsNeverReachTheRequestPath(t *testing.T) {
	fake := &fakeConsul{}
	fake.mode.Store("ok")
	consul := httptest.NewServer(fake)
	defer consul.Close()

	bin := testutil.Build(t, command)
	grpcAddr, httpAddr := testutil.FreeAddr(t), testutil.FreeAddr(t)
	cmd := exec.Command(bin, "serve", "--config-dir", "../../examples/config", "--grpc-addr", grpcAddr, "--http-addr", httpAddr,
		"--consul-service", "app", "--node", "n1", "--consul-query-rate", "50", "--consul-wait", "1s", "--drain", "0", "--log-level", "debug")
	cmd.Env = append(os.Environ(), "CONSUL_HTTP_ADDR="+strings.TrimPrefix(consul.URL, "http://"), "CONSUL_HTTP_TOKEN="+secretToken)
	var logs testutil.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })

	testutil.Eventually(t, 30*time.Second, func() error {
		resp, err := http.Get("http://" + httpAddr + "/healthcheck")
		if err != nil {
			return fmt.Errorf("waiting for the first view: %w; logs:\n%s", err, logs.String())
		}
		resp.Body.Close()
		if c, _ := getRLConfig(t, httpAddr); c.Membership.Weight != 0.25 {
			return fmt.Errorf("waiting for the first view: weight %v; logs:\n%s", c.Membership.Weight, logs.String())
		}
		return nil
	})

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{
		{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.9.9.9"}}}}}

	// measure sends requests for d and returns their latencies; any error fails.
	measure := func(d time.Duration) []time.Duration {
		var lat []time.Duration
		for end := time.Now().Add(d); time.Now().Before(end); {
			start := time.Now()
			resp, err := client.ShouldRateLimit(context.Background(), req)
			lat = append(lat, time.Since(start))
			if err != nil {
				t.Fatalf("decision failed during a Consul fault: %v", err)
			}
			if resp.OverallCode == rlsv3.RateLimitResponse_UNKNOWN {
				t.Fatal("UNKNOWN overall code")
			}
			time.Sleep(2 * time.Millisecond)
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		return lat
	}
	healthy := measure(time.Second)

	// The watch wedges: a blocking query that never answers, past the client's
	// request timeout (wait 1s + 1/16 + 5s), so the watch times out and retries.
	fake.mode.Store("hang")
	wedged := measure(7 * time.Second)
	c, _ := getRLConfig(t, httpAddr)
	if c.Membership.Weight != 0.25 {
		t.Fatalf("weight %v after the watch wedged, want the last view 0.25", c.Membership.Weight)
	}
	p99 := func(l []time.Duration) time.Duration { return l[len(l)*99/100] }
	t.Logf("decision latency: healthy p50 %v p99 %v max %v (%d calls); watch wedged p50 %v p99 %v max %v (%d calls); p99 ratio %.2f",
		healthy[len(healthy)/2], p99(healthy), healthy[len(healthy)-1], len(healthy),
		wedged[len(wedged)/2], p99(wedged), wedged[len(wedged)-1], len(wedged), float64(p99(wedged))/float64(p99(healthy)))
	// Not a speed assertion: a request path that waited on the watch would take
	// seconds; one that does not takes well under a second even on a loaded machine.
	if wedged[len(wedged)-1] > time.Second {
		t.Fatalf("a decision took %v while the watch was wedged", wedged[len(wedged)-1])
	}

	for _, mode := range []string{"garbage", "500", "403"} {
		before := c.Membership.Errors
		fake.mode.Store(mode)
		measure(1500 * time.Millisecond)
		testutil.Eventually(t, 30*time.Second, func() error {
			if c, _ = getRLConfig(t, httpAddr); c.Membership.Errors <= before || c.Membership.LastError == "" {
				return fmt.Errorf("waiting for %s to be counted as an error; logs:\n%s", mode, logs.String())
			}
			return nil
		})
		if c.Membership.Weight != 0.25 {
			t.Fatalf("%s: weight %v, want the last view 0.25", mode, c.Membership.Weight)
		}
		t.Logf("%s: last_error %q", mode, c.Membership.LastError)
	}

	// The token must appear nowhere the daemon writes.
	_, rl := getRLConfig(t, httpAddr)
	resp, _ := http.Get("http://" + httpAddr + "/rlconfig")
	rlText, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp, _ = http.Get("http://" + httpAddr + "/metrics")
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	cmd.Process.Signal(os.Interrupt)
	<-exited
	exited <- nil
	for name, text := range map[string]string{"logs": logs.String(), "/rlconfig json": rl, "/rlconfig": string(rlText), "/metrics": string(metrics)} {
		if strings.Contains(text, secretToken) {
			t.Errorf("the Consul ACL token appears in %s", name)
		}
	}
	if !strings.Contains(logs.String(), "403") {
		t.Errorf("the 403 was not logged:\n%s", logs.String())
	}
}
