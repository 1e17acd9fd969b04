package examples_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// exported is what a /metrics scrape showed: metric name -> label -> values.
type exported map[string]map[string]map[string]bool

var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? `)
var labelPair = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// parseExposition reads Prometheus' text format. Only samples count: a family
// with no series yet exports nothing a query could find.
func parseExposition(r io.Reader) (exported, error) {
	out := exported{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := sampleLine.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("unparsable sample line %q", line)
		}
		labels := out[m[1]]
		if labels == nil {
			labels = map[string]map[string]bool{}
			out[m[1]] = labels
		}
		for _, lp := range labelPair.FindAllStringSubmatch(m[2], -1) {
			if labels[lp[1]] == nil {
				labels[lp[1]] = map[string]bool{}
			}
			labels[lp[1]][lp[2]] = true
		}
	}
	return out, sc.Err()
}

// The labels Prometheus adds to every series at scrape time.
var targetLabels = map[string]bool{"job": true, "instance": true}

// selector is one vector selector in a PromQL expression.
type selector struct {
	metric   string
	matchers []matcher
}

type matcher struct{ label, op, value string }

// promqlFuncs are PromQL's functions and aggregations: an identifier followed
// by "(" must be one of them.
var promqlFuncs = map[string]bool{}

func init() {
	for _, f := range strings.Fields(`abs absent absent_over_time avg_over_time ceil changes clamp clamp_max clamp_min
		count_over_time day_of_month day_of_week day_of_year days_in_month delta deriv exp floor
		histogram_avg histogram_count histogram_fraction histogram_quantile histogram_stddev histogram_stdvar histogram_sum
		holt_winters double_exponential_smoothing hour idelta increase irate label_join label_replace last_over_time ln log10 log2
		mad_over_time max_over_time min_over_time minute month predict_linear present_over_time quantile_over_time rate resets
		round scalar sgn sort sort_desc sort_by_label sort_by_label_desc sqrt stddev_over_time stdvar_over_time sum_over_time time timestamp vector year
		sin cos tan asin acos atan sinh cosh tanh asinh acosh atanh deg rad pi
		sum avg min max count group stddev stdvar topk bottomk quantile count_values limitk limit_ratio`) {
		promqlFuncs[f] = true
	}
}

var promqlAggregations = map[string]bool{"sum": true, "avg": true, "min": true, "max": true, "count": true, "group": true,
	"stddev": true, "stdvar": true, "topk": true, "bottomk": true, "quantile": true, "count_values": true, "limitk": true, "limit_ratio": true}

var promqlKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
	"group_right": true, "bool": true, "and": true, "or": true, "unless": true, "offset": true, "atan2": true,
	"inf": true, "nan": true}

// parsePromQL finds the selectors of an expression and the labels its by(),
// without(), on() and ignoring() clauses name. It is a lexer, not a parser: it
// knows enough PromQL to find every name a typo could hide in, and rejects
// what it does not understand. Grafana's $variables are placeholders.
func parsePromQL(expr string) (sels []selector, grouping []string, err error) {
	s := expr
	depth := 0
	skipSpace := func() { s = strings.TrimLeft(s, " \t\r\n") }
	readIdent := func() string {
		i := 0
		for i < len(s) && (s[i] == '_' || s[i] == ':' || s[i] >= 'a' && s[i] <= 'z' || s[i] >= 'A' && s[i] <= 'Z' || i > 0 && s[i] >= '0' && s[i] <= '9') {
			i++
		}
		id := s[:i]
		s = s[i:]
		return id
	}
	readString := func() (string, error) {
		q := s[0]
		for i := 1; i < len(s); i++ {
			switch s[i] {
			case '\\':
				i++
			case q:
				v := s[1:i]
				s = s[i+1:]
				return v, nil
			}
		}
		return "", fmt.Errorf("unterminated string in %q", expr)
	}
	// readLabelList reads "(a, b)" after a grouping keyword.
	readLabelList := func() error {
		skipSpace()
		if !strings.HasPrefix(s, "(") {
			return nil // group_left without labels
		}
		end := strings.IndexByte(s, ')')
		if end < 0 {
			return fmt.Errorf("unclosed label list in %q", expr)
		}
		for _, l := range strings.Split(s[1:end], ",") {
			if l = strings.TrimSpace(l); l != "" {
				grouping = append(grouping, l)
			}
		}
		s = s[end+1:]
		return nil
	}
	readMatchers := func() ([]matcher, error) {
		s = s[1:] // {
		var ms []matcher
		for {
			skipSpace()
			if strings.HasPrefix(s, "}") {
				s = s[1:]
				return ms, nil
			}
			label := readIdent()
			skipSpace()
			op := ""
			for _, o := range []string{"=~", "!~", "!=", "="} {
				if strings.HasPrefix(s, o) {
					op = o
					break
				}
			}
			if label == "" || op == "" {
				return nil, fmt.Errorf("bad label matcher at %q in %q", s, expr)
			}
			s = s[len(op):]
			skipSpace()
			if s == "" || (s[0] != '"' && s[0] != '\'') {
				return nil, fmt.Errorf("label %s: want a quoted value in %q", label, expr)
			}
			v, err := readString()
			if err != nil {
				return nil, err
			}
			ms = append(ms, matcher{label, op, v})
			skipSpace()
			s = strings.TrimPrefix(s, ",")
		}
	}
	number := regexp.MustCompile(`^(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)(?:ms|[smhdwy])?`)
	variable := regexp.MustCompile(`^\$(?:\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)`)
	for {
		skipSpace()
		if s == "" {
			break
		}
		switch c := s[0]; {
		case c == '"' || c == '\'':
			if _, err := readString(); err != nil {
				return nil, nil, err
			}
		case c == '[':
			end := strings.IndexByte(s, ']')
			if end < 0 {
				return nil, nil, fmt.Errorf("unclosed range in %q", expr)
			}
			s = s[end+1:]
		case c == '{':
			ms, err := readMatchers()
			if err != nil {
				return nil, nil, err
			}
			name := ""
			for _, m := range ms {
				if m.label == "__name__" && m.op == "=" {
					name = m.value
				}
			}
			if name == "" {
				return nil, nil, fmt.Errorf("a selector with no metric name in %q", expr)
			}
			sels = append(sels, selector{name, ms})
		case c == '$':
			m := variable.FindString(s)
			if m == "" {
				return nil, nil, fmt.Errorf("bad variable at %q", s)
			}
			s = s[len(m):]
		case c >= '0' && c <= '9' || c == '.':
			m := number.FindString(s)
			if m == "" {
				return nil, nil, fmt.Errorf("bad number at %q", s)
			}
			s = s[len(m):]
		case c == '(':
			depth++
			s = s[1:]
		case c == ')':
			depth--
			if depth < 0 {
				return nil, nil, fmt.Errorf("unbalanced ) in %q", expr)
			}
			s = s[1:]
		case strings.ContainsRune("+-*/%^=!<>,", rune(c)):
			s = s[1:]
		case c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			id := readIdent()
			skipSpace()
			switch {
			case id == "by" || id == "without" || id == "on" || id == "ignoring" || id == "group_left" || id == "group_right":
				if err := readLabelList(); err != nil {
					return nil, nil, err
				}
			case promqlKeywords[strings.ToLower(id)]:
			case promqlAggregations[id] && (strings.HasPrefix(s, "by") || strings.HasPrefix(s, "without")):
				// sum by (code) (...): the clause comes before the parenthesis.
			case strings.HasPrefix(s, "("):
				if !promqlFuncs[id] {
					return nil, nil, fmt.Errorf("%s() is not a PromQL function", id)
				}
			default:
				sel := selector{metric: id}
				if strings.HasPrefix(s, "{") {
					ms, err := readMatchers()
					if err != nil {
						return nil, nil, err
					}
					sel.matchers = ms
				}
				sels = append(sels, sel)
			}
		default:
			return nil, nil, fmt.Errorf("unexpected %q in %q", c, expr)
		}
	}
	if depth != 0 {
		return nil, nil, fmt.Errorf("unbalanced ( in %q", expr)
	}
	return sels, grouping, nil
}

// checkPromQL checks one expression against a scrape: every metric exists,
// every label it matches or groups by is one those metrics carry (or one
// Prometheus adds), and every literal value it matches with = occurs.
func checkPromQL(p *problems, where, expr string, got exported) []string {
	sels, grouping, err := parsePromQL(expr)
	if err != nil {
		p.addf("%s: %v", where, err)
		return nil
	}
	if len(sels) == 0 {
		p.addf("%s: %q reads no metric", where, expr)
	}
	var names []string
	labelsOf := map[string]bool{}
	for _, sel := range sels {
		names = append(names, sel.metric)
		labels, ok := got[sel.metric]
		if !ok {
			p.addf("%s: %s: the daemon exports no such series", where, sel.metric)
			continue
		}
		for l := range labels {
			labelsOf[l] = true
		}
		for _, m := range sel.matchers {
			switch {
			case m.label == "__name__" || targetLabels[m.label]:
			case labels[m.label] == nil:
				p.addf("%s: %s has no label %q", where, sel.metric, m.label)
			case m.op == "=" && !strings.Contains(m.value, "$") && !labels[m.label][m.value]:
				p.addf("%s: %s{%s=%q}: the daemon exports no such value (it has %v)", where, sel.metric, m.label, m.value, sortedKeys(labels[m.label]))
			}
		}
	}
	for _, l := range grouping {
		if !labelsOf[l] && !targetLabels[l] {
			p.addf("%s: groups by %q, which none of %v carries", where, l, names)
		}
	}
	return names
}

// dashboard is the part of a Grafana dashboard the checks read.
type dashboard struct {
	Title      string                   `json:"title"`
	UID        string                   `json:"uid"`
	Panels     []grafPanel              `json:"panels"`
	Templating struct{ List []grafVar } `json:"templating"`
}

type grafPanel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource map[string]any `json:"datasource"`
	Targets    []struct {
		RefID      string         `json:"refId"`
		Expr       string         `json:"expr"`
		Datasource map[string]any `json:"datasource"`
	} `json:"targets"`
	Panels []grafPanel `json:"panels"` // a collapsed row's
}

type grafVar struct {
	Name       string         `json:"name"`
	Type       string         `json:"type"`
	Query      any            `json:"query"`
	Datasource map[string]any `json:"datasource"`
}

// mustCover are the families an operator needs on the dashboard.
var mustCover = []string{
	"sharelimit_decisions_total", "sharelimit_shadow_over_limit_total",
	"sharelimit_membership_total", "sharelimit_membership_local", "sharelimit_membership_weight", "sharelimit_membership_age_seconds",
	"sharelimit_config_reloads_total", "sharelimit_config_generation",
	"sharelimit_request_duration_seconds_bucket",
	"sharelimit_buckets", "sharelimit_bucket_overflow_total",
	"sharelimit_panics_total", "sharelimit_invalid_requests_total",
}

var labelValues = regexp.MustCompile(`^label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

// checkDashboard checks every query of the dashboard against a scrape.
func checkDashboard(p *problems, data []byte, got exported) {
	const where = "examples/grafana/sharelimit.json"
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		p.addf("%s: %v", where, err)
		return
	}
	if d.UID == "" || d.Title == "" {
		p.addf("%s: want a uid and a title", where)
	}
	hasDS := false
	for _, v := range d.Templating.List {
		if v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus" {
			hasDS = true
		}
		if v.Type != "query" {
			continue
		}
		q := v.Query
		if m, ok := q.(map[string]any); ok {
			q = m["query"]
		}
		qs, _ := q.(string)
		m := labelValues.FindStringSubmatch(qs)
		if m == nil {
			p.addf("%s: variable %s: want label_values(metric, label), got %q", where, v.Name, qs)
			continue
		}
		names := checkPromQL(p, where+": variable "+v.Name, m[1], got)
		for _, n := range names {
			if got[n] != nil && got[n][m[2]] == nil && !targetLabels[m[2]] {
				p.addf("%s: variable %s: %s has no label %q", where, v.Name, n, m[2])
			}
		}
	}
	if !hasDS {
		p.addf("%s: want a datasource variable of type prometheus, so the dashboard imports anywhere", where)
	}
	usesDS := func(ds map[string]any) bool {
		uid, _ := ds["uid"].(string)
		return uid == "${datasource}" || uid == "$datasource"
	}
	covered := map[string]bool{}
	ids := map[int]bool{}
	var walk func([]grafPanel)
	walk = func(panels []grafPanel) {
		for _, pn := range panels {
			pwhere := fmt.Sprintf("%s: panel %q", where, pn.Title)
			if ids[pn.ID] {
				p.addf("%s: id %d is used twice", pwhere, pn.ID)
			}
			ids[pn.ID] = true
			walk(pn.Panels)
			if pn.Type == "row" {
				continue
			}
			if len(pn.Targets) == 0 {
				p.addf("%s: no queries", pwhere)
			}
			if !usesDS(pn.Datasource) {
				p.addf("%s: datasource %v: use ${datasource}", pwhere, pn.Datasource)
			}
			for _, tg := range pn.Targets {
				if !usesDS(tg.Datasource) {
					p.addf("%s: query %s: datasource %v: use ${datasource}", pwhere, tg.RefID, tg.Datasource)
				}
				for _, n := range checkPromQL(p, pwhere, tg.Expr, got) {
					covered[n] = true
				}
			}
		}
	}
	walk(d.Panels)
	for _, n := range mustCover {
		if !covered[n] {
			p.addf("%s: no panel shows %s", where, n)
		}
	}
}

// freeAddr returns a loopback address nothing listens on at the moment.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// scrapeRunningDaemon starts the real binary on the example config, drives
// traffic that gives every decision family a series (OK, OVER_LIMIT, an
// unmatched descriptor, an invalid request), and returns its /metrics.
func scrapeRunningDaemon(t *testing.T) exported {
	t.Helper()
	admin, _ := scrapeRunningDaemonBoth(t)
	return admin
}

// scrapeRunningDaemonBoth is scrapeRunningDaemon that also returns what the
// metrics listener (--metrics-addr, where examples/kubernetes points
// Prometheus) serves at /metrics.
func scrapeRunningDaemonBoth(t *testing.T) (admin, listener exported) {
	t.Helper()
	grpcAddr, httpAddr, metricsAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	cmd := exec.Command(sharelimitBin, "serve", "--config-dir", filepath.Join(repo, "examples", "config"),
		"--grpc-addr", grpcAddr, "--http-addr", httpAddr, "--metrics-addr", metricsAddr, "--drain", "0", "--shutdown-timeout", "1s")
	var logs testutil.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})

	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := client.Get("http://" + httpAddr + "/healthcheck")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-exited:
			t.Fatalf("sharelimit exited:\n%s", logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("sharelimit never became healthy:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	desc := func(kv ...string) *commonv3.RateLimitDescriptor {
		d := &commonv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		return d
	}
	// login-per-ip allows 10 a minute: the 11th is over the limit.
	login := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{
		desc("header_match", "login", "remote_address", "192.0.2.10"), desc("generic_key", "api"), desc("generic_key", "nope")}}
	sawOver := false
	for range 11 {
		resp, err := rls.ShouldRateLimit(ctx, login)
		if err != nil {
			t.Fatal(err)
		}
		sawOver = sawOver || resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if !sawOver {
		t.Fatal("11 requests against 10 a minute never went over the limit: the traffic this test relies on is wrong")
	}
	if _, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: ""}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("an empty domain: got %v, want InvalidArgument", err)
	}

	scrape := func(addr string) exported {
		resp, err := client.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, err := parseExposition(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) < 20 || got["sharelimit_decisions_total"] == nil {
			t.Fatalf("the scrape of %s holds only %v: the check would test nothing", addr, sortedKeys(got))
		}
		return got
	}
	return scrape(httpAddr), scrape(metricsAddr)
}

func TestGrafanaDashboard(t *testing.T) {
	t.Parallel()
	admin, listener := scrapeRunningDaemonBoth(t)
	// The dashboard works on either scrape: the admin listener's, and the
	// metrics listener's, which examples/kubernetes gives Prometheus.
	for _, got := range []exported{admin, listener} {
		var p problems
		checkDashboard(&p, readFile(t, "examples/grafana/sharelimit.json"), got)
		p.report(t)
	}
	// An upstream dashboard's queries find upstream's series there too.
	var p problems
	for _, expr := range []string{
		`sum by (domain, key1, key2) (rate(ratelimit_service_rate_limit_total_hits{domain="edge"}[5m]))`,
		`sum by (domain, key1) (rate(ratelimit_service_rate_limit_over_limit[5m])) / sum by (domain, key1) (rate(ratelimit_service_rate_limit_total_hits[5m]))`,
		`sum(rate(ratelimit_service_rate_limit_within_limit[5m]))`,
		`sum(rate(ratelimit_service_rate_limit_near_limit[5m]))`,
		`sum(rate(ratelimit_service_rate_limit_shadow_mode[5m]))`,
		`sum by (err_type) (rate(ratelimit_service_should_rate_limit_error[5m]))`,
		`sum by (grpc_method) (rate(ratelimit_service_total_requests[5m]))`,
		`histogram_quantile(0.99, sum by (le) (rate(ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit"}[5m])))`,
		`increase(ratelimit_service_config_load_success[1h]) + increase(ratelimit_service_config_load_error[1h])`,
	} {
		checkPromQL(&p, "an upstream dashboard", expr, listener)
	}
	p.report(t)
}

// TestParsePromQL pins the lexer the dashboard check relies on.
func TestParsePromQL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		expr     string
		metrics  string // comma-separated
		grouping string
		err      bool
	}{
		{expr: `sum by (code) (rate(a_total{x="1", y=~"$v"}[$__rate_interval]))`, metrics: "a_total", grouping: "code"},
		{expr: `sum(rate(a[5m])) by (le, instance) / ignoring(code) group_left b`, metrics: "a,b", grouping: "le,instance,code"},
		{expr: `histogram_quantile(0.99, sum by (le) (rate(h_bucket[1m])))`, metrics: "h_bucket", grouping: "le"},
		{expr: `time() - t and t > 0`, metrics: "t,t"},
		{expr: `topk(10, x) offset 5m`, metrics: "x"},
		{expr: `clamp_min(a, 1e-9) * 100`, metrics: "a"},
		{expr: `{__name__="a"}`, metrics: "a"},
		{expr: `histogram_quantil(0.9, a)`, err: true},
		{expr: `sum(a`, err: true},
		{expr: `a{x~"1"}`, err: true},
		{expr: `a{x="1}`, err: true},
	} {
		sels, grouping, err := parsePromQL(tc.expr)
		if tc.err {
			if err == nil {
				t.Errorf("parsePromQL(%q): no error", tc.expr)
			}
			continue
		}
		if err != nil {
			t.Errorf("parsePromQL(%q): %v", tc.expr, err)
			continue
		}
		var names []string
		for _, s := range sels {
			names = append(names, s.metric)
		}
		if got := strings.Join(names, ","); got != tc.metrics {
			t.Errorf("parsePromQL(%q) metrics = %s, want %s", tc.expr, got, tc.metrics)
		}
		if got := strings.Join(grouping, ","); got != tc.grouping {
			t.Errorf("parsePromQL(%q) grouping = %s, want %s", tc.expr, got, tc.grouping)
		}
	}
}
