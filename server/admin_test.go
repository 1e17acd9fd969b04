package server

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func newAdmin(t *testing.T) (*fixture, *Admin, *httptest.Server) {
	f := newFixture(t, Options{}, 0.5)
	a := NewAdmin(f.svc, f.engine, f.metrics, func() []View {
		return []View{{Source: "static", Total: 2, Local: 1, TotalWeight: 2, LocalWeight: 1, Weight: 0.5, ObservedAt: time.Unix(1, 0)}}
	}, func() ReloadStatus { return ReloadStatus{Generation: 3, Files: []string{"testdata/rules.yaml"}} })
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	return f, a, srv
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestHealthcheck(t *testing.T) {
	_, a, srv := newAdmin(t)
	if code, _ := get(t, srv.URL+"/healthcheck"); code != 503 {
		t.Fatalf("before the first config: %d", code)
	}
	a.SetReady(true)
	if code, body := get(t, srv.URL+"/healthcheck"); code != 200 || body != "OK" {
		t.Fatalf("ready: %d %q", code, body)
	}
	a.SetDraining()
	if code, _ := get(t, srv.URL+"/healthcheck"); code != 503 {
		t.Fatalf("draining: %d", code)
	}
}

func TestJSONEndpoint(t *testing.T) {
	_, _, srv := newAdmin(t)
	post := func(body string) (int, string) {
		resp, err := http.Post(srv.URL+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	req := `{"domain":"test","descriptors":[{"entries":[{"key":"fixed","value":"one"}]}]}`
	// 2/s at weight 1/2: one passes, then 429.
	if code, body := post(req); code != 200 || !strings.Contains(body, `"overallCode":"OK"`) {
		t.Fatalf("first: %d %s", code, body)
	}
	if code, body := post(req); code != 429 || !strings.Contains(body, "OVER_LIMIT") {
		t.Fatalf("second: %d %s", code, body)
	}
	for _, bad := range []string{`{`, `{"domain":"test","descriptors":[{"entries":[{"key":"","value":"x"}]}]}`, `{"nope":1}`, `{"domain":"test"}`} {
		if code, _ := post(bad); code != 400 {
			t.Errorf("%s: %d, want 400", bad, code)
		}
	}
}

func TestRLConfig(t *testing.T) {
	_, _, srv := newAdmin(t)
	code, body := get(t, srv.URL+"/rlconfig")
	if code != 200 || !strings.Contains(body, "membership: source=static total=2 local=1 weight=0.5") ||
		!strings.Contains(body, "test.fixed_one: 2 per second; cluster 2 per second burst 2; local share 1 per second burst 1") {
		t.Fatalf("/rlconfig:\n%s", body)
	}
	code, body = get(t, srv.URL+"/rlconfig?format=json")
	var c RLConfig
	if code != 200 || json.Unmarshal([]byte(body), &c) != nil || c.Membership.Weight != 0.5 || len(c.Rules) != 8 || c.Reload.Generation != 3 {
		t.Fatalf("json: %d %s", code, body)
	}
}

func TestMetricsAndPprof(t *testing.T) {
	f, _, srv := newAdmin(t)
	f.call(d("fixed=one"))
	f.call(d("fixed=one"))
	f.call(d("shadow=s"))
	f.call(d("shadow=s"))
	f.call(d("detailed=v1"))
	_, body := get(t, srv.URL+"/metrics")
	for _, want := range []string{
		`sharelimit_decisions_total{code="OK",domain="test",rule="test.fixed_one"} 1`,
		`sharelimit_decisions_total{code="OVER_LIMIT",domain="test",rule="test.fixed_one"} 1`,
		`sharelimit_shadow_over_limit_total{domain="test",rule="test.shadow"} 1`,
		`sharelimit_decisions_detailed_total{code="OK",domain="test",key="test.detailed_v1",rule="test.detailed"} 1`,
		`sharelimit_buckets 3`,
		`sharelimit_request_duration_seconds_count 5`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("missing %s", want)
		}
	}
	if code, _ := get(t, srv.URL+"/debug/pprof/"); code != 200 {
		t.Fatalf("pprof %d", code)
	}
}

func TestDetailedMetricCardinalityBound(t *testing.T) {
	f, _, srv := newAdmin(t)
	for i := 0; i < maxDetailedValues+50; i++ {
		f.call(d("detailed=v" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + string(rune('a'+i/26))))
	}
	_, body := get(t, srv.URL+"/metrics")
	n := strings.Count(body, `sharelimit_decisions_detailed_total{code="OK"`)
	if n > maxDetailedValues+1 || !strings.Contains(body, `key="_other_"`) {
		t.Fatalf("%d detailed series", n)
	}
}

// TestStatusPage renders / on a running admin server and checks its figures
// against /rlconfig and /metrics read at the same moment.
func TestStatusPage(t *testing.T) {
	f, _, srv := newAdmin(t)
	f.call(d("fixed=one"))
	for i := 0; i < 40; i++ {
		f.call(d("ip=10.0.0.9")) // 3/min at weight 1/2: mostly over limit
	}
	code, page := get(t, srv.URL+"/")
	if code != 200 || !strings.Contains(page, "<title>sharelimit status</title>") || !strings.Contains(page, `http-equiv="refresh"`) {
		t.Fatalf("status page %d:\n%s", code, page)
	}
	_, js := get(t, srv.URL+"/rlconfig?format=json")
	var c RLConfig
	if err := json.Unmarshal([]byte(js), &c); err != nil {
		t.Fatal(err)
	}
	_, metrics := get(t, srv.URL+"/metrics")
	for _, want := range []string{
		`<td class="num" id="weight">0.5 (50%)</td>`,
		`<td class="num" id="generation">3</td>`,
		`<td class="num" id="live">2</td>`,
		`<td>test.fixed_one</td><td>2 per second</td><td class="num">2 per second</td><td class="num">2</td><td class="num">1 per second</td><td class="num">1</td>`,
		`<td>test.ip</td><td>ip=10.0.0.9</td>`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("status page lacks %s", want)
		}
	}
	if c.Buckets != 2 || !strings.Contains(metrics, "sharelimit_buckets 2\n") || c.Reload.Generation != 3 || c.Membership.Weight != 0.5 {
		t.Errorf("/rlconfig and /metrics disagree with the page: %+v", c)
	}
	if strings.Contains(page, "<script") || strings.Contains(page, "http://") || strings.Contains(page, "https://") {
		t.Error("the status page must need no external assets or scripts")
	}
	if code, _ := get(t, srv.URL+"/nope"); code != 404 {
		t.Errorf("unknown path: %d", code)
	}
}
