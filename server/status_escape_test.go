package server

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// Hostile strings everywhere the page shows one: rule keys and values from
// YAML, a mark's note, a service name, xDS versions and errors.
func TestStatusPageHostileStrings(t *testing.T) {
	evil := `</title><script>alert(1)</script><svg onload=alert(2)>"'&`
	yml := "domain: test\ndescriptors:\n" +
		"  - key: \"k" + strings.ReplaceAll(evil, `"`, `\"`) + "\"\n    value: \"v" + strings.ReplaceAll(evil, `"`, `\"`) + "\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	set := parseSet(t, yml)
	f := newFixtureSet(t, Options{}, 0.5, set)
	a := NewAdmin(f.svc, f.engine, f.metrics, func() []View {
		return []View{{Source: "consul", Service: evil, Domains: []string{evil}, Total: 2, Local: 1, Weight: 0.5, LastError: evil,
			Pending: &Pending{Weight: 1}, Demand: &DemandStatus{Leader: evil, Rules: []DemandRule{{Rule: evil, Value: evil}},
				Division: []DemandReplica{{Rule: evil, Value: evil, Node: evil}}}}}
	}, func() ReloadStatus {
		return ReloadStatus{Generation: 1, LastError: evil, Files: []string{evil}, Source: SourceStatus{Kind: "xds", Location: evil,
			Version: evil, LastError: evil, LastNack: &Nack{Version: evil, Error: evil, At: time.Now()}}}
	})
	for range 20 {
		f.call(d("k" + evil + "=v" + evil))
	}
	a.sampleHistory(time.Now())
	a.Mark(MarkMembership, evil)
	a.Mark(evil, evil)
	f.engine.SetWeight(0.25, f.now)
	rec := httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	page := rec.Body.String()
	if !strings.Contains(page, `<svg class="spark"`) {
		t.Fatalf("no sparkline:\n%s", page)
	}
	if i := strings.Index(page, `<svg class="spark"`); i >= 0 {
		t.Logf("%s", page[i:min(len(page), i+3000)])
	}
	for _, bad := range []string{"<script", "<svg onload", "</title><script"} {
		if strings.Contains(page, bad) {
			i := strings.Index(page, bad)
			t.Errorf("page has %q: %s", bad, page[max(0, i-200):min(len(page), i+100)])
		}
	}
}
