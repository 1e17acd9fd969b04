package examples_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/sharelimit/sharelimit/internal/testutil"
)

// exported is what a /metrics scrape showed, by the names a query reads:
// metric name -> label -> values.
type exported map[string]map[string]map[string]bool

func (e exported) add(name string, pairs []*dto.LabelPair, extra ...string) {
	labels := e[name]
	if labels == nil {
		labels = map[string]map[string]bool{}
		e[name] = labels
	}
	put := func(k, v string) {
		if labels[k] == nil {
			labels[k] = map[string]bool{}
		}
		labels[k][v] = true
	}
	for _, lp := range pairs {
		put(lp.GetName(), lp.GetValue())
	}
	for i := 0; i+1 < len(extra); i += 2 {
		put(extra[i], extra[i+1])
	}
}

// parseExposition reads Prometheus' text format with expfmt and names each
// sample as a query does: a histogram's as _bucket (with le), _sum and
// _count. Only samples count: a family with no series yet exports nothing a
// query could find.
func parseExposition(r io.Reader) (exported, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	// As the text format writes them: 1e-06, 0.25, +Inf.
	bound := func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
	out := exported{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				for _, b := range m.GetHistogram().GetBucket() {
					out.add(name+"_bucket", m.GetLabel(), "le", bound(b.GetUpperBound()))
				}
				out.add(name+"_bucket", m.GetLabel(), "le", "+Inf")
				out.add(name+"_sum", m.GetLabel())
				out.add(name+"_count", m.GetLabel())
			case dto.MetricType_SUMMARY:
				for _, q := range m.GetSummary().GetQuantile() {
					out.add(name, m.GetLabel(), "quantile", bound(q.GetQuantile()))
				}
				out.add(name+"_sum", m.GetLabel())
				out.add(name+"_count", m.GetLabel())
			default:
				out.add(name, m.GetLabel())
			}
		}
	}
	return out, nil
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

// promqlToken matches one token of PromQL at the start of the text: a
// string, a range or subquery, a label-matcher block, a Grafana $variable, a
// number or duration, an identifier, a parenthesis or an operator. Its groups
// say which; an unterminated string or a bad matcher matches none.
var promqlToken = regexp.MustCompile(`^(?:` +
	`("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')` + // 1 string
	`|(\[[^\]]*\])` + // 2 range
	`|(\{(?:\s*[a-zA-Z_]\w*\s*(?:=~|!~|!=|=)\s*(?:"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')\s*,?)*\s*\})` + // 3 matchers
	`|(\$(?:\{[^}]*\}|[A-Za-z_]\w*))` + // 4 variable
	`|((?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)(?:ms|[smhdwy])?)` + // 5 number
	`|([a-zA-Z_:][a-zA-Z0-9_:]*)` + // 6 identifier
	`|([()])` + // 7 parenthesis
	`|([-+*/%^=!<>,])` + // 8 operator
	`)`)

var promqlMatcher = regexp.MustCompile(`([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)')`)

// promqlGrouping are the keywords followed by a list of labels.
var promqlGrouping = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// parsePromQL finds the selectors of an expression and the labels its by(),
// without(), on() and ignoring() clauses name. It is a lexer, not a parser: it
// knows enough PromQL to find every name a typo could hide in, and rejects
// what it does not understand. Grafana's $variables are placeholders.
func parsePromQL(expr string) (sels []selector, grouping []string, err error) {
	type token struct {
		kind int // the group of promqlToken that matched
		text string
	}
	var toks []token
	for s := strings.TrimSpace(expr); s != ""; s = strings.TrimLeft(s, " \t\r\n") {
		m := promqlToken.FindStringSubmatchIndex(s)
		if m == nil {
			return nil, nil, fmt.Errorf("unexpected %q in %q", s, expr)
		}
		kind := 1
		for m[2*kind] < 0 {
			kind++
		}
		toks = append(toks, token{kind, s[:m[1]]})
		s = s[m[1]:]
	}
	matchers := func(block string) []matcher {
		var ms []matcher
		for _, m := range promqlMatcher.FindAllStringSubmatch(block, -1) {
			ms = append(ms, matcher{m[1], m[2], m[3] + m[4]})
		}
		return ms
	}
	depth := 0
	for i := 0; i < len(toks); i++ {
		tok, next := toks[i], token{}
		if i+1 < len(toks) {
			next = toks[i+1]
		}
		switch {
		case tok.text == "(":
			depth++
		case tok.text == ")":
			if depth--; depth < 0 {
				return nil, nil, fmt.Errorf("unbalanced ) in %q", expr)
			}
		case tok.kind == 3: // {__name__="a"}
			sel := selector{matchers: matchers(tok.text)}
			for _, m := range sel.matchers {
				if m.label == "__name__" && m.op == "=" {
					sel.metric = m.value
				}
			}
			if sel.metric == "" {
				return nil, nil, fmt.Errorf("a selector with no metric name in %q", expr)
			}
			sels = append(sels, sel)
		case tok.kind != 6:
		case promqlGrouping[tok.text]:
			// by (a, b); group_left may have no list.
			for i++; i < len(toks) && next.text == "(" && toks[i].text != ")"; i++ {
				if toks[i].kind == 6 {
					grouping = append(grouping, toks[i].text)
				}
			}
			if next.text != "(" {
				i--
			} else if i == len(toks) {
				return nil, nil, fmt.Errorf("unclosed label list in %q", expr)
			}
		case promqlKeywords[strings.ToLower(tok.text)]:
		case promqlAggregations[tok.text] && promqlGrouping[next.text]:
			// sum by (code) (...): the clause comes before the parenthesis.
		case next.text == "(":
			if !promqlFuncs[tok.text] {
				return nil, nil, fmt.Errorf("%s() is not a PromQL function", tok.text)
			}
		default:
			sel := selector{metric: tok.text}
			if next.kind == 3 {
				sel.matchers = matchers(next.text)
				i++
			}
			sels = append(sels, sel)
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
	grpcAddr, httpAddr, metricsAddr := testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t)
	cmd := exec.Command(testutil.Build(t, command), "serve", "--config-dir", filepath.Join(repo, "examples", "config"),
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
	testutil.Eventually(t, 30*time.Second, func() error {
		select {
		case <-exited:
			t.Fatalf("sharelimit exited:\n%s", logs.String())
		default:
		}
		resp, err := client.Get("http://" + httpAddr + "/healthcheck")
		if err != nil {
			return fmt.Errorf("sharelimit never became healthy: %w\n%s", err, logs.String())
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("sharelimit never became healthy: /healthcheck %d\n%s", resp.StatusCode, logs.String())
		}
		return nil
	})

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
		{expr: `sum by (a`, err: true},
		{expr: `a # b`, err: true},
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
