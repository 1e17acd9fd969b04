package membership

// Tests against an httptest server, only for what a real agent cannot be made
// to do on demand: indexes that go backwards or stay 0, bursts of errors,
// garbage, hanging requests, a catalog that never stops changing, absurd
// counts, a server echoing the token.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// request is what the fake server saw of one health query.
type request struct {
	at    time.Time
	query url.Values
	token string
}

func (r request) index() string { return r.query.Get("index") }
func (r request) blocking() bool {
	return r.query.Has("index") || r.query.Has("wait")
}

// fakeConsul answers /v1/agent/self as node "fake-node" and hands every health
// query, numbered from 0, to answer.
type fakeConsul struct {
	srv    *httptest.Server
	answer func(n int, w http.ResponseWriter, r *http.Request)

	mu   sync.Mutex
	reqs []request
}

func newFake(t *testing.T, answer func(n int, w http.ResponseWriter, r *http.Request)) *fakeConsul {
	t.Helper()
	f := &fakeConsul{answer: answer}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v1/agent/self":
			fmt.Fprint(w, `{"Config":{"NodeName":"fake-node","Datacenter":"dc1"}}`)
		case strings.HasPrefix(r.URL.Path, "/v1/health/service/"):
			f.mu.Lock()
			n := len(f.reqs)
			f.reqs = append(f.reqs, request{at: time.Now(), query: r.URL.Query(), token: r.Header.Get("X-Consul-Token")})
			f.mu.Unlock()
			f.answer(n, w, r)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(f.srv.Close) // registered before watch's cleanup, so it runs after Run ended
	return f
}

func (f *fakeConsul) addr() string { return strings.TrimPrefix(f.srv.URL, "http://") }

func (f *fakeConsul) requests() []request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]request(nil), f.reqs...)
}

func (f *fakeConsul) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.reqs)
}

// entries renders a health answer with one passing instance per node name.
func entries(nodes ...string) []byte {
	type node struct{ Node string }
	type check struct{ Status string }
	type entry struct {
		Node    node
		Service struct{ ID, Service string }
		Checks  []check
	}
	out := make([]entry, len(nodes))
	for i, n := range nodes {
		out[i].Node.Node = n
		out[i].Service.ID = fmt.Sprintf("web-%d", i)
		out[i].Service.Service = "web"
		out[i].Checks = []check{{"passing"}}
	}
	b, err := json.Marshal(out)
	if err != nil {
		panic(err)
	}
	return b
}

func reply(w http.ResponseWriter, index uint64, body []byte) {
	w.Header().Set("X-Consul-Index", strconv.FormatUint(index, 10))
	w.Header().Set("Content-Type", "application/json")
	w.Write(body)
}

// hold waits as a blocking query would: until d passes or the client leaves.
func hold(r *http.Request, d time.Duration) {
	select {
	case <-r.Context().Done():
	case <-time.After(d):
	}
}

// fast is a config whose pacing and back-off keep tests short.
func fast(cfg ConsulConfig) ConsulConfig {
	if cfg.Service == "" {
		cfg.Service = "web"
	}
	if cfg.Node == "" {
		cfg.Node = "node-a"
	}
	if cfg.QueryRate == 0 {
		cfg.QueryRate = 1000
		cfg.QueryBurst = 1000
	}
	if cfg.WaitTime == 0 {
		cfg.WaitTime = 200 * time.Millisecond
	}
	if cfg.Grace == 0 {
		// The fake's answers are each a catalog of their own: count what
		// each lists passing (the roster's grace has tests of its own).
		cfg.Grace = -1
	}
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase = 10 * time.Millisecond
		cfg.BackoffMax = 80 * time.Millisecond
	}
	return cfg
}

func TestFakeQueryParameters(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		cfg   ConsulConfig
		check func(url.Values) string
	}{
		{"every instance, not stale by default", ConsulConfig{}, func(q url.Values) string {
			// Not ?passing: the roster counts a registered instance that
			// does not pass (yet, or for now) for its grace.
			if q.Has("passing") || q.Has("stale") || q.Has("dc") || q.Has("filter") {
				return "want no passing, stale, dc or filter"
			}
			return ""
		}},
		{"stale", ConsulConfig{Stale: true}, func(q url.Values) string {
			if !q.Has("stale") {
				return "want stale"
			}
			return ""
		}},
		{"filter and datacenter", ConsulConfig{Filter: `Service.Tags contains "v2"`, Datacenter: "dc2"}, func(q url.Values) string {
			if q.Get("filter") != `Service.Tags contains "v2"` || q.Get("dc") != "dc2" {
				return "want the filter and dc2"
			}
			return ""
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if n > 0 {
					hold(r, time.Minute)
				}
				reply(w, 10, entries("node-a"))
			})
			c := watch(t, fast(tc.cfg), newClient(t, f.addr(), ""))
			waitView(t, c, counts(1, 1), "one instance on node-a")
			testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return f.count() >= 2 }, "a blocking query"))
			for i, r := range f.requests() {
				if msg := tc.check(r.query); msg != "" {
					t.Errorf("request %d has query %v: %s", i, r.query, msg)
				}
			}
		})
	}
}

func TestFakeIndexGoesBackwards(t *testing.T) {
	t.Parallel()
	indexes := []uint64{100, 100, 50, 60}
	f := newFake(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n >= len(indexes) {
			hold(r, time.Minute)
			reply(w, 60, entries("node-a"))
			return
		}
		nodes := []string{"node-a", "node-b"}[:1+n%2]
		reply(w, indexes[n], entries(nodes...))
	})
	c := watch(t, fast(ConsulConfig{}), newClient(t, f.addr(), ""))
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return f.count() > len(indexes) }, "the watch to block after the reset"))
	reqs := f.requests()
	want := []string{"", "100", "100", "", "60"} // "" is a non-blocking query
	for i, w := range want {
		if got := reqs[i].index(); got != w {
			t.Errorf("request %d has index %q, want %q", i, got, w)
		}
		if w == "" && reqs[i].blocking() {
			t.Errorf("request %d blocks (%v); after an index reset it must not", i, reqs[i].query)
		}
		if w != "" && reqs[i].query.Get("wait") == "" {
			t.Errorf("request %d blocks on %s with no wait", i, w)
		}
	}
	// The answer that carried the backwards index is still a good answer.
	waitView(t, c, counts(2, 1), "the answers after the reset")
}

func TestFakeIndexZero(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		header func(w http.ResponseWriter)
	}{
		{"index 0", func(w http.ResponseWriter) { w.Header().Set("X-Consul-Index", "0") }},
		{"no index header", func(w http.ResponseWriter) {}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t, func(n int, w http.ResponseWriter, r *http.Request) {
				tc.header(w)
				w.Write(entries("node-a", "node-b", "node-c"))
			})
			const rate, burst = 20, 2
			start := time.Now()
			c := watch(t, fast(ConsulConfig{QueryRate: rate, QueryBurst: burst}), newClient(t, f.addr(), ""))
			waitView(t, c, counts(3, 1), "three instances")
			// Enough requests past the burst that only the bucket can have
			// paced them.
			testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return f.count() >= burst+10 }, "ten requests past the burst"))
			n, elapsed := f.count(), time.Since(start)
			for i, r := range f.requests() {
				if r.blocking() {
					t.Fatalf("request %d is a blocking query (%v) though Consul never gave an index above 0", i, r.query)
				}
			}
			// Answers come back at once, so only the token bucket paces the loop.
			if limit := burst + int(rate*elapsed.Seconds()) + 1; n > limit {
				t.Fatalf("%d requests in %s, want at most %d at %d/s", n, elapsed, limit, rate)
			}
			if n < 3 {
				t.Fatalf("only %d requests in %s: the loop is not polling at all", n, elapsed)
			}
		})
	}
}

// TestFakeQueryRateBounded models a catalog that changes 100 times a second:
// every blocking query returns within 10 ms with a new index.
func TestFakeQueryRateBounded(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		rate  float64
		burst int
	}{
		{"defaults", 0, 0},
		{"10 per second", 10, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			epoch := time.Now()
			tick := func() uint64 { return uint64(time.Since(epoch)/(10*time.Millisecond)) + 1 }
			f := newFake(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if idx, _ := strconv.ParseUint(r.URL.Query().Get("index"), 10, 64); idx > 0 {
					for tick() <= idx {
						hold(r, time.Millisecond)
					}
				}
				reply(w, tick(), entries("node-a"))
			})
			cfg := fast(ConsulConfig{QueryRate: tc.rate, QueryBurst: tc.burst})
			if tc.rate == 0 {
				cfg.QueryRate, cfg.QueryBurst = 0, 0 // the defaults under test
			}
			c := watch(t, cfg, newClient(t, f.addr(), ""))
			rate, burst := c.cfg.QueryRate, c.cfg.QueryBurst
			start := time.Now()
			testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return f.count() >= burst+5 }, "five queries past the burst"))
			// The bound is a rate: it needs a span long enough that a pace
			// a quarter too fast shows (1.25 × 10/s over 1.5 s is 19
			// queries against a bound of 17), whenever the five came.
			if rest := 1500*time.Millisecond - time.Since(start); rest > 0 {
				time.Sleep(rest)
			}
			n, elapsed := f.count(), time.Since(start)
			limit := burst + int(rate*elapsed.Seconds()) + 1
			t.Logf("catalog changing 100/s: %d queries in %s at QueryRate %v, QueryBurst %d (bound %d)", n, elapsed.Round(time.Millisecond), rate, burst, limit)
			if n > limit {
				t.Fatalf("%d queries in %s, want at most %d", n, elapsed, limit)
			}
			if n < 2 {
				t.Fatalf("only %d queries in %s: the watch is stuck", n, elapsed)
			}
		})
	}
}

func TestFakeErrorBursts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code int
		body string
	}{
		{http.StatusInternalServerError, "rpc error making call: No cluster leader"},
		{http.StatusTooManyRequests, "rate limit exceeded"},
		{http.StatusForbidden, "Permission denied: token with AccessorID 'a1b2' lacks permission 'service:read' on \"web\""},
		{http.StatusBadGateway, "<html>bad gateway</html>"},
	}
	for _, tc := range tests {
		t.Run(strconv.Itoa(tc.code), func(t *testing.T) {
			t.Parallel()
			var failing atomic.Bool
			failing.Store(true)
			f := newFake(t, func(n int, w http.ResponseWriter, r *http.Request) {
				switch {
				case n == 0:
					reply(w, 10, entries("node-a", "node-b"))
				case failing.Load():
					http.Error(w, tc.body, tc.code)
				default:
					reply(w, 20, entries("node-a", "node-b", "node-c"))
				}
			})
			var logs logBuffer
			cfg := fast(ConsulConfig{Logger: logs.logger()})
			c := watch(t, cfg, newClient(t, f.addr(), ""))
			good := waitView(t, c, counts(2, 1), "the first answer")
			start := time.Now()
			retries := regexp.MustCompile(`retry_in=(\S+)`)
			// At least 700 ms of errors, long enough for a loop without
			// back-off to make thousands of requests.
			testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool {
				return time.Since(start) >= 700*time.Millisecond && c.View().Errors >= 3 && len(retries.FindAllString(logs.String(), -1)) >= 3
			}, "700 ms and three failed requests, each with its back-off logged"))
			v := c.View()
			reqs := f.requests()

			if v.Total != 2 || v.Local != 1 || v.Weight != 0.5 || !v.ObservedAt.Equal(good.ObservedAt) {
				t.Errorf("view during errors = %+v; want the last good one (%+v) to stand", v, good)
			}
			if !strings.Contains(v.LastError, strconv.Itoa(tc.code)) {
				t.Errorf("LastError = %q, want it to name HTTP %d", v.LastError, tc.code)
			}
			// The view was read first, so at most one more failure may have
			// reached the server without being counted yet.
			if failed := uint64(len(reqs) - 1); v.Errors < 3 || v.Errors > failed || v.Errors+1 < failed {
				t.Errorf("Errors = %d after %d failed requests", v.Errors, failed)
			}
			// Back-off: without it the loop would make thousands of requests
			// here; with full jitter over 10..80 ms it makes a few dozen at
			// most. The waits it chose are read from its own log (retry_in),
			// not from when requests arrived: a busy machine delays those,
			// never the choice.
			elapsed := time.Since(start)
			if n := len(reqs) - 1; n > 80 {
				t.Errorf("%d failed requests in %s: no back-off", n, elapsed)
			}
			var waits []time.Duration
			for _, m := range regexp.MustCompile(`retry_in=(\S+)`).FindAllStringSubmatch(logs.String(), -1) {
				d, err := time.ParseDuration(m[1])
				if err != nil {
					t.Fatalf("retry_in=%s: %v", m[1], err)
				}
				waits = append(waits, d)
			}
			if len(waits) < 3 {
				t.Fatalf("%d back-off waits logged:\n%s", len(waits), logs.String())
			}
			lo, hi := slices.Min(waits), slices.Max(waits)
			if hi-lo < 5*time.Millisecond {
				t.Errorf("back-off waits all within %s..%s: no jitter", lo, hi)
			}
			if hi > cfg.BackoffMax {
				t.Errorf("a back-off wait of %s exceeds the cap %s", hi, cfg.BackoffMax)
			}
			t.Logf("HTTP %d: %d retries in %s, waits %s..%s", tc.code, len(reqs)-1, elapsed.Round(time.Millisecond), lo, hi)

			failing.Store(false)
			v = waitView(t, c, counts(3, 1), "recovery after the errors")
			if v.LastError != "" || v.ObservedAt.Before(good.ObservedAt) || v.Errors < 3 {
				t.Errorf("view after recovery = %+v; want LastError cleared, a newer ObservedAt, Errors kept", v)
			}
		})
	}
}

func TestFakeGarbage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		body string
	}{
		{"not json", "{not json"},
		{"html", "<html><body>502 Bad Gateway</body></html>"},
		{"object", `{"Node":{"Node":"node-a"}}`},
		{"wrong element types", `[1, "two", [3]]`},
		{"truncated", `[{"Node":{"Node":"node-a"},"Checks":[]},{"Node":`},
		{"string", `"hello"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if n == 0 {
					reply(w, 10, entries("node-a", "node-b"))
					return
				}
				reply(w, 11, []byte(tc.body))
			})
			c := watch(t, fast(ConsulConfig{}), newClient(t, f.addr(), ""))
			good := waitView(t, c, counts(2, 1), "the first answer")
			v := waitView(t, c, func(v View) bool { return v.Errors >= 3 }, "three decode errors")
			if v.Total != 2 || v.Local != 1 || !v.ObservedAt.Equal(good.ObservedAt) || v.LastError == "" {
				t.Fatalf("view after garbage = %+v; want the last good view with LastError set", v)
			}
		})
	}
	t.Run("before the first answer", func(t *testing.T) {
		t.Parallel()
		f := newFake(t, func(n int, w http.ResponseWriter, r *http.Request) { reply(w, 10, []byte("{garbage")) })
		c := watch(t, fast(ConsulConfig{Replicas: 5}), newClient(t, f.addr(), ""))
		v := waitView(t, c, func(v View) bool { return v.Errors >= 3 }, "three decode errors")
		if v.Source != "consul" || v.Total != 5 || v.Weight != 0.2 || !v.ObservedAt.IsZero() || v.LastError == "" {
			t.Fatalf("view = %+v; want the --replicas view (5, weight 0.2, never observed) with LastError set", v)
		}
	})
}

func TestFakeHangingRequest(t *testing.T) {
	t.Parallel()
	f := newFake(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 0 {
			reply(w, 10, entries("node-a", "node-b"))
			return
		}
		<-r.Context().Done() // never answers; the client must give up
	})
	cfg := fast(ConsulConfig{WaitTime: 100 * time.Millisecond, RequestTimeout: 300 * time.Millisecond})
	c, err := NewConsul(cfg, newClient(t, f.addr(), ""))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	v := waitView(t, c, func(v View) bool { return v.Errors >= 2 }, "two timed-out requests")
	if v.Total != 2 || !strings.Contains(v.LastError, "no answer within 300ms") {
		t.Errorf("view = %+v; want the first answer to stand and LastError to report the timeout", v)
	}
	// A request is hanging right now, or about to; cancel must still end Run.
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v after cancel, want nil", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Run did not return within 2 s of cancel while a request hung")
	}
}

func TestFakeAbsurdCount(t *testing.T) {
	t.Parallel()
	// The smallest entries Consul could send, so that decoding 100k of them
	// stays quick under the race detector: no checks aggregate to passing.
	var b strings.Builder
	b.WriteString(`[{"Node":{"Node":"node-a"}},{"Node":{"Node":"node-a"}}`)
	for i := 2; i < 100_000; i++ {
		fmt.Fprintf(&b, `,{"Node":{"Node":"n%d"}}`, i%5000)
	}
	b.WriteString("]")
	huge := []byte(b.String())
	tests := []struct {
		name         string
		maxInstances int
		want         func(View) bool
		desc         string
	}{
		{"rejected by default", 0, func(v View) bool {
			return v.Total == 2 && v.Errors >= 1 && strings.Contains(v.LastError, "100000 listed, limit 10000")
		}, "the last good view to stand with the count reported"},
		{"accepted when allowed", 200_000, counts(100_000, 2), "100000 instances, 2 on node-a"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t, func(n int, w http.ResponseWriter, r *http.Request) {
				switch n {
				case 0:
					reply(w, 10, entries("node-a", "node-b"))
				case 1:
					reply(w, 11, huge)
				default:
					hold(r, time.Minute)
					reply(w, 11, huge)
				}
			})
			c := watch(t, fast(ConsulConfig{MaxInstances: tc.maxInstances}), newClient(t, f.addr(), ""))
			v := waitView(t, c, tc.want, "%s", tc.desc)
			if v.Weight <= 0 || v.Weight > 1 {
				t.Fatalf("weight %v outside (0, 1]", v.Weight)
			}
		})
	}
}

func TestFakeZeroPassing(t *testing.T) {
	t.Parallel()
	// Four instances, then none: an emptied catalog must not make every
	// replica enforce each limit whole. The last view stands, reported.
	f := newFake(t, func(n int, w http.ResponseWriter, r *http.Request) {
		switch n {
		case 0:
			reply(w, 10, entries("node-a", "node-b", "node-c", "node-d"))
		case 1:
			reply(w, 11, []byte("[]"))
		default:
			hold(r, time.Minute)
			reply(w, 11, []byte("[]"))
		}
	})
	var logs logBuffer
	c := watch(t, fast(ConsulConfig{Replicas: 3, Logger: logs.logger()}), newClient(t, f.addr(), ""))
	v := waitView(t, c, func(v View) bool { return v.Errors >= 1 }, "the empty answer reported")
	if v.Total != 4 || v.Weight != 0.25 || !strings.Contains(v.LastError, "none passing") {
		t.Fatalf("view = %+v; want the last view (4 instances, weight 1/4) with the condition reported", v)
	}
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return strings.Contains(logs.String(), "none passing") }, "a warning about zero instances"))
	if !strings.Contains(logs.String(), "level=WARN") {
		t.Fatalf("zero instances not logged at warn:\n%s", logs.String())
	}
}

func TestFakeNodeFromAgentSelfRetries(t *testing.T) {
	t.Parallel()
	var selfCalls atomic.Int32
	health := func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("index") {
			hold(r, time.Minute)
		}
		reply(w, 10, entries("fake-node", "other", "fake-node"))
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/agent/self" {
			if selfCalls.Add(1) <= 2 {
				http.Error(w, "agent not ready", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprint(w, `{"Config":{"NodeName":"fake-node"}}`)
			return
		}
		health(w, r)
	}))
	t.Cleanup(srv.Close)
	cfg := fast(ConsulConfig{Replicas: 7})
	cfg.Node = "" // resolve it from the agent
	c := watch(t, cfg, newClient(t, strings.TrimPrefix(srv.URL, "http://"), ""))
	v := waitView(t, c, counts(3, 2), "two of three instances on the agent's node")
	if v.Node != "fake-node" || v.Errors != 2 || selfCalls.Load() != 3 {
		t.Fatalf("view = %+v after %d calls of agent/self; want node fake-node and the 2 failures counted", v, selfCalls.Load())
	}
}

func TestFakeTokenNeverLeaks(t *testing.T) {
	t.Parallel()
	const token = "8f6c2a4e-1d3b-4c5a-9e7f-0a1b2c3d4e5f"
	f := newFake(t, func(n int, w http.ResponseWriter, r *http.Request) {
		// A careless proxy that echoes the request back in its error.
		http.Error(w, "token "+r.Header.Get("X-Consul-Token")+" lacks service:read", http.StatusForbidden)
	})
	var logs logBuffer
	var mu sync.Mutex
	var seen []View
	cfg := fast(ConsulConfig{Token: token, Logger: logs.logger(), OnUpdate: func(v View) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, v)
	}})
	c := watch(t, cfg, newClient(t, f.addr(), token))
	v := waitView(t, c, func(v View) bool { return v.Errors >= 3 }, "three refusals")
	if got := f.requests()[0].token; got != token {
		t.Fatalf("the server saw token %q; the test would prove nothing", got)
	}
	if !strings.Contains(v.LastError, "403") || !strings.Contains(v.LastError, "[redacted]") {
		t.Errorf("LastError = %q; want the 403 reported with the token redacted", v.LastError)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, sv := range append(seen, v) {
		if strings.Contains(sv.LastError, token) {
			t.Errorf("a published view carries the token: %q", sv.LastError)
		}
	}
	if out := logs.String(); strings.Contains(out, token) || !strings.Contains(out, "403") {
		t.Errorf("logs carry the token or miss the error:\n%s", out)
	}
}

// TestFakeImpossibleCount feeds the watch counts no catalog can hold, such as
// more instances on this node than in the whole service, or weights that
// disagree with the counts. No body the fake can send makes the roster
// produce one, so the counter is swapped; the rest is
// the real watch loop. Such an answer must be a fault like any other: the
// last view stands, the error is counted and reported, and the next sane
// answer is taken again.
func TestFakeImpossibleCount(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		count func(t tally) tally
	}{
		{"local above total", func(t tally) tally {
			t.local, t.localWeight = t.total+2, t.totalWeight+2
			return t
		}},
		{"negative local", func(t tally) tally { t.local, t.localWeight = -1, -1; return t }},
		{"negative total", func(t tally) tally {
			t.total, t.totalWeight, t.local, t.localWeight = -t.total, -t.totalWeight, 0, 0
			return t
		}},
		{"local weight above total weight", func(t tally) tally { t.localWeight = t.totalWeight + 1; return t }},
		{"weights below the counts", func(t tally) tally { t.totalWeight = t.total - 1; return t }},
		{"a local instance weighing 0", func(t tally) tally { t.localWeight = 0; return t }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// 0: an honest first answer; 1: impossible counts; 2: sane again.
			var phase atomic.Int32
			f := newFake(t, func(n int, w http.ResponseWriter, r *http.Request) {
				switch phase.Load() {
				case 0:
					reply(w, 10, entries("node-a", "node-b"))
				case 1:
					reply(w, uint64(10+n), entries("node-a", "node-b", "node-c"))
				default:
					reply(w, uint64(10+n), entries("node-a", "node-a", "node-b", "node-c"))
				}
			})
			var logs logBuffer
			c, err := NewConsul(fast(ConsulConfig{Logger: logs.logger()}), newClient(t, f.addr(), ""))
			if err != nil {
				t.Fatal(err)
			}
			c.count = func(e []*api.ServiceEntry, node string) tally {
				t := c.tallyCounted(e, node)
				if phase.Load() == 1 {
					return tc.count(t)
				}
				return t
			}
			run(t, c)
			waitView(t, c, counts(2, 1), "the first answer")
			phase.Store(1)
			// An honest answer already on its way may still land after the
			// switch; once the first impossible one is counted, the watch (which
			// asks one query at a time) sees only impossible ones.
			first := waitView(t, c, func(v View) bool { return v.Errors >= 1 }, "the first impossible answer reported")
			v := waitView(t, c, func(v View) bool { return v.Errors >= 3 }, "three impossible answers reported")
			if v.Total != 2 || v.Local != 1 || v.Weight != 0.5 || !v.ObservedAt.Equal(first.ObservedAt) {
				t.Fatalf("view after impossible answers = %+v; want the last good one (%+v) to stand", v, first)
			}
			if !strings.Contains(v.LastError, "impossible") {
				t.Fatalf("LastError = %q; want it to report the impossible count", v.LastError)
			}
			if out := logs.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "impossible") {
				t.Fatalf("impossible count not logged at warn:\n%s", out)
			}
			phase.Store(2)
			v = waitView(t, c, counts(4, 2), "the sane answer after the impossible ones")
			if v.LastError != "" || v.Errors < 3 {
				t.Fatalf("view after recovery = %+v; want LastError cleared, Errors kept", v)
			}
		})
	}
}
