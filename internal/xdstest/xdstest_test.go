package xdstest

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestParseConfigs: YAML and JSON bodies, both spellings of field names, units
// by name and by number; a bad item is reported with its index.
func TestParseConfigs(t *testing.T) {
	cs, err := ParseConfigs([]byte(`
- name: a
  domain: a
  descriptors:
    - key: k
      rate_limit: {unit: SECOND, requests_per_unit: 10}
      descriptors: [{key: sub, rateLimit: {unit: 7, requestsPerUnit: 1}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 1 || cs[0].GetDomain() != "a" || cs[0].Descriptors[0].RateLimit.RequestsPerUnit != 10 ||
		cs[0].Descriptors[0].Descriptors[0].RateLimit.Unit != 7 {
		t.Fatalf("configs %v", cs)
	}
	if cs, err := ParseConfigs([]byte(`[{"name": "b", "domain": "b"}]`)); err != nil || len(cs) != 1 || cs[0].GetName() != "b" {
		t.Fatalf("JSON: %v %v", cs, err)
	}
	if cs, err := ParseConfigs(nil); err != nil || len(cs) != 0 {
		t.Fatalf("empty: %v %v", cs, err)
	}
	for _, bad := range []string{"domain: a", `[{"domain": "a"}, {"bogus": 1}]`, "- [1, 2]"} {
		if _, err := ParseConfigs([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := ParseConfigs([]byte(`[{"domain": "a"}, {"bogus": 1}]`)); !strings.Contains(err.Error(), "config 1:") {
		t.Errorf("error does not name the item: %v", err)
	}
}

// TestHandler: the control endpoint sets snapshots and lists requests.
func TestHandler(t *testing.T) {
	srv, err := Start("127.0.0.1:0", "n")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	h := srv.Handler()
	do := func(method, target, body string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(method, target, strings.NewReader(body)))
		return w
	}
	if w := do(http.MethodPut, "/snapshot?version=1", "- {name: a, domain: a}"); w.Code != http.StatusNoContent {
		t.Fatalf("PUT: %d %s", w.Code, w.Body)
	}
	if w := do(http.MethodPut, "/snapshot", "[]"); w.Code != http.StatusBadRequest {
		t.Fatalf("PUT without a version: %d", w.Code)
	}
	if w := do(http.MethodPut, "/snapshot?version=2", "not: [a list"); w.Code != http.StatusBadRequest {
		t.Fatalf("PUT of a bad body: %d", w.Code)
	}
	for _, path := range []string{"/nacks", "/requests"} {
		w := do(http.MethodGet, path, "")
		var got []Request
		if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Code != http.StatusOK || got == nil {
			t.Fatalf("GET %s: %d %q %v", path, w.Code, w.Body, err)
		}
	}
}
