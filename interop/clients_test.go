package interop

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// plan is what clients/rls.py (C-core) and clients/rls.js (grpc-js) run:
// one channel to target, and steps, each printing one JSON line.
type plan struct {
	Target  string   `json:"target"`
	CA      string   `json:"ca,omitempty"` // TLS, with this CA
	Options [][2]any `json:"options,omitempty"`
	Watch   bool     `json:"watch,omitempty"` // C-core: note states, reconnect when idle
	Steps   []step   `json:"steps"`
}

type step struct {
	Op         string `json:"op"` // calls, sleep or load
	Calls      []call `json:"calls,omitempty"`
	Concurrent bool   `json:"concurrent,omitempty"`
	Ms         int    `json:"ms,omitempty"`
	// load: Workers calls at a time until a line arrives on stdin, then
	// until After calls started after it have succeeded.
	Req       *request `json:"req,omitempty"`
	Workers   int      `json:"workers,omitempty"`
	After     int      `json:"after,omitempty"`
	TimeoutMs int      `json:"timeout_ms,omitempty"`
}

type call struct {
	Req           request     `json:"req"`
	Metadata      [][2]string `json:"metadata,omitempty"`
	TimeoutMs     int         `json:"timeout_ms,omitempty"` // 0: 60 s
	CancelAfterMs *int        `json:"cancel_after_ms,omitempty"`
	Repeat        int         `json:"repeat,omitempty"`
}

func calls(concurrent bool, cs ...call) step {
	return step{Op: "calls", Calls: cs, Concurrent: concurrent}
}
func sleep(d time.Duration) step { return step{Op: "sleep", Ms: int(d / time.Millisecond)} }
func one(r request) call         { return call{Req: r} }
func ms(n int) *int              { return &n }

// gRPC clients: the two that encode and decode for themselves.
var grpcClients = []string{cCore, grpcJS}

func clientCmd(ctx context.Context, client, planFile string) *exec.Cmd {
	var cmd *exec.Cmd
	switch client {
	case cCore:
		cmd = exec.CommandContext(ctx, pythonBin, "clients/rls.py", planFile)
	case grpcJS:
		cmd = exec.CommandContext(ctx, "node", "clients/rls.js", planFile)
	default:
		panic("no such client " + client)
	}
	cmd.Env = daemonEnv() // no GRPC_* from the developer's environment
	configureProcess(cmd)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

func writePlan(t *testing.T, p plan) string {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "plan.json")
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// clientRun is a finished client: each step's output, C-core's states
// (with Watch) and its stderr (C-core's log).
type clientRun struct {
	client string
	steps  []json.RawMessage
	states [][2]any // [monotonic seconds, state]
	stderr string
}

// runPlan runs client with p and waits for it. A client that has not
// finished within timeout has stalled: the test fails, as it does when the
// client exits non-zero.
func runPlan(t *testing.T, client string, p plan, timeout time.Duration) *clientRun {
	t.Helper()
	need(t, client)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := clientCmd(ctx, client, writePlan(t, p))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s stalled: not finished within %s (calls that never complete)\nsteps done: %s\nstderr: %s",
			client, timeout, clip(stdout.String(), 2000), clip(stderr.String(), 2000))
	}
	if err != nil {
		t.Fatalf("%s: %v\nstdout: %s\nstderr: %s", client, err, clip(stdout.String(), 2000), clip(stderr.String(), 4000))
	}
	r := &clientRun{client: client, stderr: stderr.String()}
	for line := range strings.SplitSeq(strings.TrimSpace(stdout.String()), "\n") {
		var out struct {
			Step   *int            `json:"step"`
			Out    json.RawMessage `json:"out"`
			States [][2]any        `json:"states"`
		}
		if err := json.Unmarshal([]byte(line), &out); err != nil {
			t.Fatalf("%s: output line %q: %v", client, clip(line, 200), err)
		}
		switch {
		case out.Step != nil:
			r.steps = append(r.steps, out.Out)
		case out.States != nil:
			r.states = out.States
		}
	}
	if len(r.steps) != len(p.Steps) {
		t.Fatalf("%s: %d step results for %d steps:\n%s", client, len(r.steps), len(p.Steps), clip(stdout.String(), 2000))
	}
	return r
}

// results are the call results of step i.
func (r *clientRun) results(t *testing.T, i int) []result {
	t.Helper()
	var out []result
	if err := json.Unmarshal(r.steps[i], &out); err != nil {
		t.Fatalf("%s: step %d: %v: %s", r.client, i, err, clip(string(r.steps[i]), 500))
	}
	return out
}

// loadClient is a client running a load step, told through its stdin when
// the daemon is back.
type loadClient struct {
	client  string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	loading chan struct{} // closed at the first successful call
	result  chan loadCounts
	stderr  bytes.Buffer
	mu      sync.Mutex
	lines   []string
}

type loadCounts struct {
	Before map[string]int `json:"before"`
	After  map[string]int `json:"after"`
}

func startLoad(t *testing.T, client string, p plan, timeout time.Duration) *loadClient {
	t.Helper()
	need(t, client)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	lc := &loadClient{client: client, loading: make(chan struct{}), result: make(chan loadCounts, 1)}
	lc.cmd = clientCmd(ctx, client, writePlan(t, p))
	lc.cmd.Stderr = &lc.stderr
	var err error
	if lc.stdin, err = lc.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := lc.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.cmd.Start(); err != nil {
		t.Fatalf("%s: %v", client, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			lc.mu.Lock()
			lc.lines = append(lc.lines, sc.Text())
			lc.mu.Unlock()
			var out struct {
				Event string      `json:"event"`
				Out   *loadCounts `json:"out"`
			}
			if json.Unmarshal(sc.Bytes(), &out) != nil {
				continue
			}
			if out.Event == "loading" {
				close(lc.loading)
			}
			if out.Out != nil {
				lc.result <- *out.Out
			}
		}
	}()
	t.Cleanup(func() {
		lc.stdin.Close()
		_ = lc.cmd.Process.Kill()
		_ = lc.cmd.Wait()
	})
	return lc
}

func (lc *loadClient) output() string {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return clip(strings.Join(lc.lines, "\n"), 2000) + "\nstderr: " + clip(lc.stderr.String(), 2000)
}

// runTool runs a command and fails t if it has not finished within timeout:
// a raw HTTP/2 client waiting that long for answers has stalled.
func runTool(t *testing.T, timeout time.Duration, stdin io.Reader, name string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = daemonEnv()
	configureProcess(cmd)
	cmd.WaitDelay = 5 * time.Second
	cmd.Stdin = stdin
	var out, serr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &serr
	err = cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s stalled: not finished within %s\ncommand: %s\nstdout: %s\nstderr: %s",
			name, timeout, commandLine(name, args), clip(out.String(), 3000), clip(serr.String(), 2000))
	}
	return out.String(), serr.String(), err
}

// commandLine shows a command with each long argument cut short.
func commandLine(name string, args []string) string {
	parts := []string{name}
	for _, a := range args {
		parts = append(parts, strconv.Quote(clip(a, 60)))
	}
	return strings.Join(parts, " ")
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + fmt.Sprintf("…(%d bytes)", len(s))
	}
	return s
}

// writeBody writes body to a fresh file for curl, h2load or nghttp.
func writeBody(t *testing.T, body []byte) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "body.bin")
	if err := os.WriteFile(f, body, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// grpcHeaders are the request headers a gRPC call needs, as -H flags.
var grpcHeaders = []string{"-H", "content-type: application/grpc", "-H", "te: trailers"}

// curlCall posts r to url with curl (HTTP/2 with prior knowledge for
// http://, ALPN for https://) and returns the gRPC result from the headers and
// trailers curl prints and the body it saved.
func curlCall(t *testing.T, url string, r request, extra ...string) result {
	t.Helper()
	res, err := curlTry(t, url, r, extra...)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// curlTry is curlCall, returning curl's failure (an *exec.ExitError) instead
// of failing t.
func curlTry(t *testing.T, url string, r request, extra ...string) (result, error) {
	t.Helper()
	need(t, curl)
	dir := t.TempDir()
	hdr, out := filepath.Join(dir, "headers"), filepath.Join(dir, "out")
	args := []string{"-sS", "-D", hdr, "-o", out, "--data-binary", "@" + writeBody(t, r.body())}
	if strings.HasPrefix(url, "http:") {
		args = append(args, "--http2-prior-knowledge")
	} else {
		args = append(args, "--http2")
	}
	args = append(append(append(args, grpcHeaders...), extra...), url)
	_, stderr, err := runTool(t, 30*time.Second, nil, "curl", args...)
	if err != nil {
		return result{}, fmt.Errorf("curl: %w: %s", err, stderr)
	}
	h, _ := os.ReadFile(hdr)
	body, _ := os.ReadFile(out)
	res, err := curlResult(string(h), body)
	if err != nil {
		return result{}, fmt.Errorf("curl: %w\nheaders and trailers:\n%s", err, h)
	}
	return res, nil
}

// curlTapped is curlCall through tp. curl 7.88 reports an answer sent
// before the request's end and followed by RST_STREAM(NO_ERROR) (RFC 9113,
// 8.1: how a server answers a message over its cap, or an expired call,
// without reading the rest) as error 92, without printing it: that answer
// is read from the wire instead.
func curlTapped(t *testing.T, tp *tap, r request, extra ...string) result {
	t.Helper()
	res, err := curlTry(t, tp.url(), r, extra...)
	if exit := (*exec.ExitError)(nil); errors.As(err, &exit) && exit.ExitCode() == 92 {
		cs := tp.calls()
		if len(cs) == 0 {
			t.Fatalf("%v, and no call on the wire", err)
		}
		last := cs[len(cs)-1] // each curl has a connection of its own
		if last.err != nil {
			t.Fatalf("%v, and the daemon's answer: %v", err, last.err)
		}
		return last.result
	}
	if err != nil {
		t.Fatal(err)
	}
	return res
}

var httpStatusLine = regexp.MustCompile(`^HTTP/2 (\d+)`)

// curlResult reads what curl -D wrote (the headers, then the trailers) and
// the body.
func curlResult(hdr string, body []byte) (result, error) {
	if m := httpStatusLine.FindStringSubmatch(hdr); m == nil || m[1] != "200" {
		return result{}, fmt.Errorf("not an HTTP/2 200")
	}
	status, msg := "", ""
	for line := range strings.SplitSeq(hdr, "\n") {
		k, v, ok := strings.Cut(strings.TrimRight(line, "\r"), ":")
		if !ok {
			continue
		}
		switch strings.ToLower(k) {
		case "grpc-status":
			status = strings.TrimSpace(v)
		case "grpc-message":
			msg = strings.TrimSpace(v)
		}
	}
	code, err := strconv.Atoi(status)
	if err != nil {
		return result{}, fmt.Errorf("grpc-status %q", status)
	}
	if m, err := url.PathUnescape(msg); err == nil {
		msg = m
	}
	res := result{Code: code, Details: msg}
	if code == 0 {
		if res.Resp, err = decodeAnswer(body); err != nil {
			return result{}, err
		}
	}
	return res, nil
}

// h2loadRun is h2load's summary.
type h2loadRun struct {
	total, started, done, succeeded, failed, errored, timeout int
	status2xx                                                 int
	out                                                       string
}

var (
	h2loadRequests = regexp.MustCompile(`requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout`)
	h2loadStatus   = regexp.MustCompile(`status codes: (\d+) 2xx`)
)

// runH2load posts body with h2load and reads its summary.
func runH2load(t *testing.T, timeout time.Duration, body []byte, args ...string) h2loadRun {
	t.Helper()
	need(t, h2load)
	args = append(append([]string{"-d", writeBody(t, body)}, grpcHeaders...), args...)
	out, stderr, err := runTool(t, timeout, nil, "h2load", args...)
	if err != nil {
		t.Fatalf("h2load: %v\n%s\n%s", err, out, stderr)
	}
	m := h2loadRequests.FindStringSubmatch(out)
	s := h2loadStatus.FindStringSubmatch(out)
	if m == nil || s == nil {
		t.Fatalf("h2load: no summary:\n%s\n%s", out, stderr)
	}
	n := func(s string) int { v, _ := strconv.Atoi(s); return v }
	return h2loadRun{total: n(m[1]), started: n(m[2]), done: n(m[3]), succeeded: n(m[4]), failed: n(m[5]),
		errored: n(m[6]), timeout: n(m[7]), status2xx: n(s[1]), out: out}
}

// allSucceeded fails t unless every one of n requests got a 2xx.
func (r h2loadRun) allSucceeded(t *testing.T, n int) {
	t.Helper()
	if r.total != n || r.done != n || r.succeeded != n || r.status2xx != n {
		t.Fatalf("h2load: %d of %d requests done, %d succeeded, %d with 2xx (failed %d, errored %d, timeout %d):\n%s",
			r.done, n, r.succeeded, r.status2xx, r.failed, r.errored, r.timeout, r.out)
	}
}

// checkTapCalls fails t unless the tap saw n ShouldRateLimit calls, each
// ended by the daemon with w.
func checkTapCalls(t *testing.T, tp *tap, n int, w want) {
	t.Helper()
	checkTapCallsBy(t, tp, n, w.mismatch)
}

// checkTapCallsBy is checkTapCalls with a check of each result (which
// returns how it is wrong, or "").
func checkTapCallsBy(t *testing.T, tp *tap, n int, check func(result) string) {
	t.Helper()
	if errs := tp.parseErrors(); len(errs) > 0 {
		t.Fatalf("wire tap: %v", errors.Join(errs...))
	}
	cs := tp.calls()
	if len(cs) != n {
		t.Fatalf("wire tap: %d ShouldRateLimit streams, want %d", len(cs), n)
	}
	bad := 0
	for _, c := range cs {
		msg := ""
		switch {
		case c.err != nil:
			msg = c.err.Error()
		default:
			msg = check(c.result)
		}
		if msg != "" {
			if bad++; bad <= 5 {
				t.Errorf("wire tap: stream %d: %s", c.stream, msg)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("wire tap: %d of %d answers wrong", bad, n)
	}
}
