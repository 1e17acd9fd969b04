package xds

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/internal/testutil"
	"github.com/sharelimit/sharelimit/internal/xdstest"
)

// TestProcessServer runs the test management server, command xdsserver, as a
// process of its own and drives it through its control endpoint: the source
// installs what is PUT, the server reports the NACK of a bad snapshot, and
// when the process dies the rules in force stand.
func TestProcessServer(t *testing.T) {
	t.Parallel()
	bin := testutil.Build(t, "github.com/sharelimit/sharelimit/internal/xdstest/cmd/xdsserver")
	cmd := exec.Command(bin, "--addr", "127.0.0.1:0", "--node-id", "proc-node", "--control-addr", "127.0.0.1:0")
	var stderr testutil.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		cmd.Process.Kill()
		testutil.Within(t, exited, "xdsserver to exit")
	})
	addrs := make(chan [2]string, 1)
	go func() {
		var a [2]string
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "xds "); ok {
				a[0] = v
			} else if v, ok := strings.CutPrefix(sc.Text(), "control "); ok {
				a[1] = v
			}
			if a[0] != "" && a[1] != "" {
				addrs <- a
				break
			}
		}
		io.Copy(io.Discard, stdout)
		exited <- cmd.Wait()
	}()
	a := testutil.Within(t, addrs, "xdsserver's addresses")
	xdsAddr, control := a[0], "http://"+a[1]

	var inForce atomic.Pointer[descriptors.Set]
	var logs testutil.Buffer
	src, err := New(Config{ServerURL: xdsAddr, NodeID: "proc-node", Backoff: testBackoff,
		Apply: func(s *descriptors.Set) error { inForce.Store(s); return nil },
		Log:   slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, src: src}
	r.run()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, func() error {
			if cond() {
				return nil
			}
			return fmt.Errorf("waiting for %s\nstatus %+v\nxdsserver stderr:\n%s\nlogs:\n%s", what, src.Status(), stderr.String(), logs.String())
		})
	}
	put := func(version, body string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPut, control+"/snapshot?version="+version, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("PUT snapshot %s: %s %s", version, resp.Status, msg)
		}
	}
	nacks := func() []xdstest.Request {
		resp, err := http.Get(control + "/nacks")
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		var out []xdstest.Request
		json.NewDecoder(resp.Body).Decode(&out)
		return out
	}
	rpu := func() int64 {
		s := inForce.Load()
		if s == nil || s.Domain("users") == nil {
			return -1
		}
		return int64(s.Domain("users").Rules()[0].Limit().RequestsPerUnit())
	}

	put("v1", `
- name: users
  domain: users
  descriptors:
    - key: user
      rate_limit: {unit: SECOND, requests_per_unit: 10}
`)
	testutil.Within(t, src.First(), "the first update")
	if rpu() != 10 {
		t.Fatalf("limit %d in force, want 10", rpu())
	}
	waitFor("v1 ACKed", func() bool { return src.Status().Version == "v1" })

	put("v2", `[{"name": "users", "domain": "users", "descriptors": [{"key": "user", "rateLimit": {"unit": "UNKNOWN", "requestsPerUnit": 20}}]}]`)
	waitFor("the NACK of v2 seen by the server", func() bool { return len(nacks()) > 0 })
	n := nacks()[0]
	if n.Version != "v1" || n.Node != "proc-node" || !strings.Contains(n.Error, "invalid rate limit unit 'UNKNOWN'") {
		t.Fatalf("NACK %+v", n)
	}
	if st := src.Status(); rpu() != 10 || st.LastNack.Version != "v2" || st.Version != "v1" {
		t.Fatalf("limit %d in force, status %+v", rpu(), st)
	}

	set := inForce.Load()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	waitFor("disconnected", func() bool { st := src.Status(); return !st.Connected && st.LastError != "" })
	if inForce.Load() != set {
		t.Fatal("rules changed when the server died")
	}
}
