package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/internal/testutil"
)

// baselineDaemon is serve, run in process by run as the binary runs it.
type baselineDaemon struct {
	t                          *testing.T
	grpc, http, debug, metrics string // the listeners' addresses, from the start-up record
	conn                       *grpc.ClientConn
	rls                        rlsv3.RateLimitServiceClient
	client                     *http.Client
	stop                       context.CancelFunc
	exited                     chan int
	logs                       *testutil.Buffer
}

// serving collects serve's log and hands over, once, its start-up record,
// which names the listeners' addresses. Safe for concurrent use.
type serving struct {
	testutil.Buffer
	mu   sync.Mutex
	line []byte
	seen chan map[string]any // buffered; sent to once
}

func (s *serving) Write(p []byte) (int, error) {
	n, err := s.Buffer.Write(p)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		return n, err
	}
	s.line = append(s.line, p...)
	for {
		i := bytes.IndexByte(s.line, '\n')
		if i < 0 {
			return n, err
		}
		var rec map[string]any
		if json.Unmarshal(s.line[:i], &rec) == nil && rec["msg"] == "sharelimit serving" {
			s.seen <- rec
			s.seen, s.line = nil, nil
			return n, err
		}
		s.line = s.line[i+1:]
	}
}

// startBaseline runs `sharelimit serve` on the baseline's rules with args
// besides those that give it free loopback ports, JSON logs and no drain.
func startBaseline(t *testing.T, args ...string) *baselineDaemon {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	seen := make(chan map[string]any, 1)
	logs := &serving{seen: seen}
	d := &baselineDaemon{t: t, stop: cancel, exited: make(chan int, 1), logs: &logs.Buffer}
	argv := append([]string{"sharelimit", "serve", "--config-dir", baselineDir + "/rules",
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-format", "json",
		"--drain", "0", "--sweep-interval", "1h"}, args...)
	go func() { d.exited <- run(ctx, argv, io.Discard, logs) }()
	var rec map[string]any
	select {
	case rec = <-seen:
	case code := <-d.exited:
		cancel()
		t.Fatalf("serve exited %d before serving:\n%s", code, logs.String())
	case <-time.After(20 * time.Second):
		cancel()
		testutil.Within(t, d.exited, "serve to stop")
		t.Fatalf("serve never logged that it serves:\n%s", logs.String())
	}
	str := func(k string) string { s, _ := rec[k].(string); return s }
	d.grpc, d.http, d.debug, d.metrics = str("grpc"), str("http"), str("debug"), str("metrics")
	conn, err := grpc.NewClient(d.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	d.conn, d.rls = conn, rlsv3.NewRateLimitServiceClient(conn)
	d.client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second}
	t.Cleanup(func() { d.shutdown() })
	return d
}

// shutdown stops the daemon as SIGTERM would and checks it exits 0.
func (d *baselineDaemon) shutdown() {
	if d.stop == nil {
		return
	}
	d.conn.Close()
	d.stop()
	d.stop = nil
	if code := testutil.Within(d.t, d.exited, "serve to stop"); code != 0 {
		d.t.Errorf("serve exited %d:\n%s", code, d.logs.String())
	}
}

// get records a GET: its status, content type and body.
func (d *baselineDaemon) get(url string) (int, string, string) {
	d.t.Helper()
	resp, err := d.client.Get(url)
	if err != nil {
		d.t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		d.t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(body)
}

func baselineDesc(kv ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func baselineReq(domain string, ds ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

// baselineStep is one request of the script.
type baselineStep struct {
	name string
	req  *rlsv3.RateLimitRequest
}

// baselineScript is the fixed request script, in order: each step's answer
// depends on the steps before it.
func baselineScript() []baselineStep {
	const dom = "baseline"
	desc, req := baselineDesc, baselineReq
	var steps []baselineStep
	add := func(name string, r *rlsv3.RateLimitRequest) { steps = append(steps, baselineStep{name, r}) }
	for i := range 3 {
		add(fmt.Sprintf("per-value bucket, draw %d", i+1), req(dom, desc("client", "alice")))
	}
	add("another value has a bucket of its own", req(dom, desc("client", "bob")))
	add("the request's hits_addend", &rlsv3.RateLimitRequest{Domain: dom, Descriptors: []*commonv3.RateLimitDescriptor{desc("client", "carol")}, HitsAddend: 2})
	check := desc("client", "dave")
	check.HitsAddend = wrapperspb.UInt64(0)
	add("the descriptor's hits_addend 0 only checks", req(dom, check))
	over := desc("client", "erin")
	over.HitsAddend = wrapperspb.UInt64(5)
	add("more hits than the bucket holds", req(dom, over))
	back := desc("client", "alice")
	back.HitsAddend = wrapperspb.UInt64(1)
	back.IsNegativeHits = true
	add("is_negative_hits gives a token back", &rlsv3.RateLimitRequest{Domain: dom, Descriptors: []*commonv3.RateLimitDescriptor{back}, HitsAddend: 1})
	add("after the give-back", req(dom, desc("client", "alice")))
	for i := range 2 {
		add(fmt.Sprintf("exact value, detailed_metric, metadata, draw %d", i+1), req(dom, desc("path", "/login")))
	}
	add("wildcard, value_to_metric", req(dom, desc("path", "/api/v1/users")))
	add("wildcard, another value", req(dom, desc("path", "/api/v2/orders")))
	add("replaces drops api", req(dom, desc("path", "/admin/x"), desc("path", "/api/v1/users")))
	add("shared wildcard, another value, one bucket", req(dom, desc("path", "/admin/y")))
	add("shared wildcard, over", req(dom, desc("path", "/admin/z")))
	add("a value no rule matches", req(dom, desc("path", "/static/app.js")))
	for i := range 3 {
		add(fmt.Sprintf("shadow mode, draw %d", i+1), req(dom, desc("uploader", "u1")))
	}
	for i := range 3 {
		add(fmt.Sprintf("quota mode beside a limit, draw %d", i+1), req(dom, desc("quota", "q1"), desc("client", "frank")))
	}
	add("quota mode alone, over", req(dom, desc("quota", "q1")))
	add("unlimited", req(dom, desc("generic_key", "healthcheck")))
	add("unlimited beside an over-limit descriptor", req(dom, desc("generic_key", "healthcheck"), desc("client", "alice")))
	add("blocked", req(dom, desc("blocked", "yes")))
	for i := range 3 {
		add(fmt.Sprintf("nested, window and burst, draw %d", i+1), req(dom, desc("tenant", "t1", "user", "u1")))
	}
	add("nested, the parent alone has no limit", req(dom, desc("tenant", "t1")))
	add("too deep: no limit", req(dom, desc("client", "alice", "user", "u1")))
	for i := range 3 {
		add(fmt.Sprintf("share: replica, draw %d", i+1), req(dom, desc("guard", "g1")))
	}
	for i := range 2 {
		add(fmt.Sprintf("policy wait, draw %d", i+1), req(dom, desc("slow", "s1")))
	}
	add("policy wait, the wait does not fit", req(dom, desc("slow", "s1")))
	for i := range 3 {
		add(fmt.Sprintf("share: demand, draw %d", i+1), req(dom, desc("checkout", "c1")))
	}
	add("share: demand, a bucket per value", req(dom, desc("search", "q/a")))
	add("share: demand, another value", req(dom, desc("search", "q/b")))
	override := desc("client", "grace")
	override.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10, Unit: typev3.RateLimitUnit_HOUR}
	add("a per-request override", req(dom, override))
	add("a per-request override, again", req(dom, override))
	unmatched := desc("nobody", "x")
	unmatched.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_DAY}
	add("an override on a descriptor no rule matches", req(dom, unmatched))
	add("an override in an unknown domain", req("nowhere", override))
	add("an unknown domain", req("nowhere", desc("client", "alice")))
	add("mixed: the headers describe the closest to its limit", req(dom, desc("client", "bob"), desc("path", "/api/v3/x"), desc("tenant", "t2", "user", "u2")))
	add("invalid: no domain", req("", desc("client", "alice")))
	add("invalid: no descriptors", req(dom))
	add("invalid: an empty key", req(dom, desc("", "x")))
	badUnit := desc("client", "alice")
	badUnit.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10, Unit: typev3.RateLimitUnit_UNKNOWN}
	add("invalid: an override with unit UNKNOWN", req(dom, badUnit))
	zero := desc("client", "alice")
	zero.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_HOUR}
	add("invalid: an override of 0", req(dom, zero))
	return steps
}

// TestBaselineDaemon runs the daemon as an operator would, in two setups,
// sends each the request script over real gRPC and a few requests to /json,
// and records every answer, then every page the daemon serves about itself.
//
// main: two static replicas (every limit divided), response headers and
// dynamic metadata on, the debug and metrics listeners open.
//
// global: one replica, global shadow and quota modes, every limit shared by
// demand (--share-mode demand), renamed headers, and every call through
// grpc-go's transport rather than the direct one.
//
// Both turn the join ramp off and the sweeper down (--join-ramp 0,
// --sweep-interval 1h): they change buckets as time passes, and the
// baseline is of what a request gets, not of when it was sent.
func TestBaselineDaemon(t *testing.T) {
	// serve reads the environment: none of the variables that set its
	// flags, upstream's among them, may leak in from the shell or CI. (Empty
	// counts as unset.)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "SHARELIMIT_") {
			t.Setenv(name, "")
		}
	}
	for _, v := range config.UpstreamVariables() {
		if prefix, family := strings.CutSuffix(v.Name, "*"); family {
			for _, kv := range os.Environ() {
				if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, prefix) {
					t.Setenv(name, "")
				}
			}
		} else if _, set := os.LookupEnv(v.Name); set {
			t.Setenv(v.Name, "")
		}
	}
	for _, sc := range []struct {
		name  string
		args  []string
		pages bool
	}{
		{"main", []string{"--replicas", "2", "--join-ramp", "0", "--response-headers", "--response-dynamic-metadata",
			"--debug-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"}, true},
		{"global", []string{"--replicas", "1", "--join-ramp", "0", "--shadow-mode", "--quota-mode", "--share-mode", "demand", "--grpc-transport", "grpc-go",
			"--response-headers", "--header-limit", "X-RL-Limit", "--header-remaining", "X-RL-Remaining", "--header-reset", "X-RL-Reset"}, false},
	} {
		t.Run(sc.name, func(t *testing.T) {
			d := startBaseline(t, sc.args...)
			golden := func(name, got string) { baselineGolden(t, "daemon/"+sc.name+"/"+name+".golden", got) }
			golden("answers", d.answers())
			golden("metrics", d.metricsPage("http://"+d.http+"/metrics"))
			golden("rlconfig.txt", d.page("http://"+d.http+"/rlconfig", maskText))
			if sc.pages {
				golden("rlconfig.json", d.page("http://"+d.http+"/rlconfig?format=json", maskJSON))
				golden("admitted.json", d.page("http://"+d.http+"/rlconfig/admitted", maskJSON))
				golden("history.json", d.page("http://"+d.http+"/rlconfig/history", maskJSON))
				golden("status.html", d.page("http://"+d.http+"/", maskText)+d.page("http://"+d.http+"/status.css", nil))
				golden("debug", d.page("http://"+d.debug+"/", nil)+d.page("http://"+d.debug+"/rlconfig", nil))
				golden("metrics-listener", d.metricsPage("http://"+d.metrics+"/metrics"))
			}
			d.shutdown()
			golden("log", d.logRecords())
		})
	}
}

// answers runs the script, then /json, then the gRPC health check, and
// records each request with its answer.
func (d *baselineDaemon) answers() string {
	var b strings.Builder
	for _, s := range baselineScript() {
		resp, err := d.rls.ShouldRateLimit(context.Background(), s.req)
		fmt.Fprintf(&b, "## %s\nrequest: %s\n", s.name, compactJSON(d.t, s.req))
		if err != nil {
			st := status.Convert(err)
			fmt.Fprintf(&b, "error: %s: %s\n\n", st.Code(), st.Message())
			continue
		}
		fmt.Fprintf(&b, "response: %s\n", answerJSON(d.t, resp))
	}
	for _, j := range []struct{ name, body string }{
		{"/json, draw 1", `{"domain":"baseline","descriptors":[{"entries":[{"key":"client","value":"json"}]}]}`},
		{"/json, draw 2", `{"domain":"baseline","descriptors":[{"entries":[{"key":"client","value":"json"}]}]}`},
		{"/json, draw 3 (over the limit at two replicas)", `{"domain":"baseline","descriptors":[{"entries":[{"key":"client","value":"json"}]}]}`},
		{"/json, hits_addend and two descriptors", `{"domain":"baseline","hits_addend":2,"descriptors":[{"entries":[{"key":"tenant","value":"j"},{"key":"user","value":"j"}]},{"entries":[{"key":"generic_key","value":"healthcheck"}]}]}`},
		{"/json, not JSON", `{"domain":`},
		{"/json, an unknown field", `{"domain":"baseline","nope":1}`},
		{"/json, no descriptors", `{"domain":"baseline"}`},
	} {
		resp, err := d.client.Post("http://"+d.http+"/json", "application/json", strings.NewReader(j.body))
		if err != nil {
			d.t.Fatalf("POST /json: %v", err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			d.t.Fatalf("POST /json: %v", err)
		}
		// protojson's errors put a space or a no-break space after "proto:",
		// chosen per build so that no one depends on its text: one space.
		out := strings.ReplaceAll(string(body), "\u00a0", " ")
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			out = normalJSON(d.t, body, maskAnswer) + "\n"
		}
		fmt.Fprintf(&b, "## %s\nrequest: %s\nanswer: %d %s\n%s\n", j.name, j.body, resp.StatusCode, resp.Header.Get("Content-Type"), out)
	}
	h, err := healthpb.NewHealthClient(d.conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		d.t.Fatalf("grpc.health.v1 Check: %v", err)
	}
	fmt.Fprintf(&b, "## grpc.health.v1 Check\nresponse: %s\n", answerJSON(d.t, h))
	b.WriteString("\n" + d.page("http://"+d.http+"/healthcheck", nil))
	return b.String()
}

// logRecords is serve's log from start to stop, one record a line, keys
// sorted, without the time, and with the listeners' free ports masked.
func (d *baselineDaemon) logRecords() string {
	d.t.Helper()
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimSpace(d.logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			d.t.Fatalf("a log line that is not a JSON record: %v\n%s", err, line)
		}
		delete(rec, "time")
		out, err := json.Marshal(rec)
		if err != nil {
			d.t.Fatal(err)
		}
		b.WriteString(loopbackPort.ReplaceAllString(maskText(d.t, string(out)), "127.0.0.1:<port>") + "\n")
	}
	return b.String()
}

// loopbackPort is a loopback listener's address: its port is the kernel's pick.
var loopbackPort = regexp.MustCompile(`127\.0\.0\.1:\d+`)

// page records a GET: the status, the content type and the body, masked.
func (d *baselineDaemon) page(url string, mask func(*testing.T, string) string) string {
	d.t.Helper()
	code, ct, body := d.get(url)
	if mask != nil {
		body = mask(d.t, body)
	}
	path := url[strings.Index(url[len("http://"):], "/")+len("http://"):]
	return fmt.Sprintf("## GET %s\n%d %s\n%s\n", path, code, ct, body)
}

// metricsPage records an exposition, parsed by expfmt as Prometheus reads
// it: each family's help and type, then its series, sorted, with the
// figures that measure time masked (baselineSeries).
func (d *baselineDaemon) metricsPage(url string) string {
	d.t.Helper()
	code, ct, body := d.get(url)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		d.t.Fatalf("parse %s: %v\n%s", url, err, body)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## GET %s\n%d %s\n", url[strings.Index(url[len("http://"):], "/")+len("http://"):], code, ct)
	for _, name := range slices.Sorted(maps.Keys(fams)) {
		b.WriteString(baselineSeries(fams[name]))
	}
	return b.String()
}
