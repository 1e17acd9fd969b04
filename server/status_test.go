package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/source"
)

// newTinyAdmin serves the admin pages of a daemon with a 5-a-day limit and a
// 100-a-day one, divided among three static replicas: the figures the issue
// showed as 5.78704e-05 and 0.000385802.
func newTinyAdmin(t *testing.T) (*fixture, *Admin, string) {
	t.Helper()
	dir := t.TempDir()
	yaml := "domain: test\ndescriptors:\n" +
		"  - key: to_number\n    rate_limit: {unit: day, requests_per_unit: 5}\n" +
		"  - key: account\n    rate_limit: {unit: day, requests_per_unit: 100}\n" +
		"  - key: api\n    rate_limit: {unit: second, requests_per_unit: 50}\n"
	if err := os.WriteFile(filepath.Join(dir, "tiny.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	set, err := source.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixtureSet(t, Options{}, 1.0/3, set)
	a := NewAdmin(f.svc, f.engine, f.metrics, func() []View {
		return []View{{Source: "static", Total: 3, Local: 1, TotalWeight: 3, LocalWeight: 1, Weight: 1.0 / 3}}
	}, func() ReloadStatus { return ReloadStatus{Generation: 1, LoadedAt: time.Now().Add(-3 * time.Second)} })
	srv := newServer(t, a)
	return f, a, srv
}

func newServer(t *testing.T, a *Admin) string {
	t.Helper()
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestStatusPageHumanUnits: rates read in the rule's own unit, ages in
// seconds ago, and a static view says what applies instead of showing the
// rows of a Consul watch it does not have.
func TestStatusPageHumanUnits(t *testing.T) {
	_, _, url := newTinyAdmin(t)
	_, page := get(t, url+"/")
	for _, want := range []string{
		"1.67 per day",         // 5 a day over 3 replicas
		"33.3 per day",         // 100 a day over 3
		"16.7 per second",      // 50 a second over 3
		"static: --replicas 3", // what applies, instead of a Consul view's rows
		"3 s ago",              // the config's load
	} {
		if !strings.Contains(page, want) {
			t.Errorf("status page lacks %q", want)
		}
	}
	for _, bad := range []string{"e-05", "0.000385802", "never (0.0 s ago)", "view confirmed", "held change"} {
		if strings.Contains(page, bad) {
			t.Errorf("status page shows %q", bad)
		}
	}
	_, text := get(t, url+"/rlconfig")
	for _, want := range []string{
		"test.to_number: 5 per day; cluster 5 per day burst 5; local share 1.67 per day burst 1.67",
		"test.api: 50 per second; cluster 50 per second burst 50; local share 16.7 per second burst 16.7",
		"membership: source=static total=3 local=1 weight=0.333333 (33.3%): static, --replicas 3",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/rlconfig lacks %q:\n%s", want, text)
		}
	}
}

// TestStatusPageEscapesRequestValues: a descriptor value is chosen by a
// client, so the over-limit samples show it as text; and the page forbids
// inline script whatever gets through.
func TestStatusPageEscapesRequestValues(t *testing.T) {
	f, _, url := newTinyAdmin(t)
	for range 2 * sampleEvery {
		f.call(d(`to_number=<script>alert(1)</script>"'&`))
	}
	resp, err := http.Get(url + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	page := string(body)
	if strings.Contains(page, "<script") {
		t.Fatalf("a request's value reached the page as markup:\n%s", page)
	}
	if !strings.Contains(page, "to_number=&lt;script&gt;alert(1)&lt;/script&gt;&#34;&#39;&amp;") {
		t.Errorf("the over-limit sample is not shown as text:\n%s", page)
	}
	csp := resp.Header.Get("Content-Security-Policy")
	if !strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "script-src") || strings.Contains(csp, "unsafe-inline") {
		t.Errorf("Content-Security-Policy %q: want default-src 'none' and no script or inline source allowed", csp)
	}
	if got := resp.Header.Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("X-Content-Type-Options %q", got)
	}
}

// TestStatusPageSparklines: every rule on the page has its sparkline; the
// over-limit series counts the rejections, in the sampled slots and in the
// slot in progress; a reload and a share change are marked; and
// /rlconfig/history has the same counts.
func TestStatusPageSparklines(t *testing.T) {
	f, a, url := newTinyAdmin(t)
	for range 10 {
		f.call(d("to_number=+15550001")) // 5 a day over 3: one passes
	}
	a.sampleHistory(time.Now())
	a.Mark(MarkReload, "generation 2")
	f.engine.SetWeight(0.5, f.now)
	for range 4 {
		f.call(d("to_number=+15550002"))
	}
	_, page := get(t, url+"/")
	if n := strings.Count(page, `<svg class="spark"`); n != 3 {
		t.Errorf("%d sparklines for 3 rules", n)
	}
	for _, want := range []string{
		`<svg class="spark" data-rule="test.to_number"`,
		`<path class="over" data-total="11"`, // 9, then 2: at weight 1/2 a new key's bucket holds 2.5
		`<line class="mark reload"`,
		`<title>reload at `,
		`<line class="mark share"`,
		`<title>share 33.3% → 50%</title>`,
		`3 admitted, <span class="bad">11 over limit</span>`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("status page lacks %q", want)
		}
	}
	_, js := get(t, url+"/rlconfig/history")
	var h History
	if err := json.Unmarshal([]byte(js), &h); err != nil {
		t.Fatal(err)
	}
	if len(h.Starts) != 2 || len(h.Rules) != 3 || len(h.Marks) != 1 || h.StepSeconds != 10 {
		t.Fatalf("/rlconfig/history: %s", js)
	}
	r := h.Rules[2] // sorted: api, account, to_number
	if r.Rule != "test.to_number" || r.Unit != "day" || r.Over[0] != 9 || r.Over[1] != 2 || r.Admitted[0] != 1 || r.Admitted[1] != 2 || r.Share[0] != 1.0/3 || r.Share[1] != 0.5 {
		t.Errorf("to_number: %+v", r)
	}
}

// TestStatusPageBounded: with thousands of rules the page shows one page of
// them, says so, and stays small; the next pages are links.
func TestStatusPageBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: big\ndescriptors:\n")
	const rules = 5000
	for i := range rules {
		fmt.Fprintf(&b, "  - key: k%d\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", i, 100+i)
	}
	set, err := descriptors.Compile(descriptors.File{Name: "big.yaml", Data: []byte(b.String())})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixtureSet(t, Options{}, 0.25, set)
	a := NewAdmin(f.svc, f.engine, f.metrics, func() []View { return []View{{Source: "static", Total: 4, Local: 1, Weight: 0.25}} },
		func() ReloadStatus { return ReloadStatus{Generation: 1} })
	now := time.Now()
	for i := range historySlots + 2 {
		a.sampleHistory(now.Add(time.Duration(i) * HistoryStep))
	}
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	for _, c := range []struct {
		page, want string
		sparks     int
	}{
		{"", "Showing rules 1–100 of 5,000 (100 a page). <a href=\"/?page=2\">next</a>", 100},
		{"?page=50", "Showing rules 4901–5000 of 5,000 (100 a page). <a href=\"/?page=49\">previous</a>", 0},
		{"?page=999", "Showing rules 4901–5000", 0},
		{"?page=x", "Showing rules 1–100", 100},
	} {
		_, page := get(t, srv.URL+"/"+c.page)
		if !strings.Contains(page, c.want) {
			t.Errorf("/%s lacks %q", c.page, c.want)
		}
		// The first maxHistoryRules rules have a history; the rest say not.
		if n, want := strings.Count(page, `<svg class="spark"`), c.sparks; n != want {
			t.Errorf("/%s: %d sparklines, want %d", c.page, n, want)
		}
		if !strings.Contains(page, "3,000 rules have no history: at most 2,000 are kept.") {
			t.Errorf("/%s does not say which rules have no history", c.page)
		}
		if len(page) > 200<<10 {
			t.Errorf("/%s is %d bytes with %d rules", c.page, len(page), rules)
		}
		t.Logf("/%s: %d bytes with %d rules", c.page, len(page), rules)
	}
}
