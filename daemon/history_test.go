package daemon

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/internal/testutil"
	"github.com/sharelimit/sharelimit/membership"
	"github.com/sharelimit/sharelimit/server"
)

// TestHistoryMarksReloadsAndMembership: the daemon marks a reload and a
// change of weight on the status page's history, and the slot in progress
// counts the decisions at once, without waiting for the 10 s sampler.
func TestHistoryMarksReloadsAndMembership(t *testing.T) {
	cfg := testConfig(t)
	cfg.ReloadDebounce = 10 * time.Millisecond
	r := start(t, cfg)
	addr := r.d.httpLis.Addr().String()
	for range 3 {
		r.call(t, "d", "k=1") // 1 a second: one passes
	}
	history := func() server.History {
		t.Helper()
		_, body := r.get(t, addr, "/rlconfig/history")
		var h server.History
		if err := json.Unmarshal([]byte(body), &h); err != nil {
			t.Fatalf("%v: %s", err, body)
		}
		return h
	}
	h := history()
	if len(h.Rules) != 1 || h.Rules[0].Rule != "d.k" || h.Rules[0].Over[len(h.Starts)-1] != 2 || h.Rules[0].Admitted[len(h.Starts)-1] != 1 {
		t.Fatalf("history before any sample: %+v", h)
	}
	writeRules(t, cfg.ConfigDir, "r.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n")
	testutil.Eventually(t, 30*time.Second, func() error {
		if h := history(); !hasMark(h, server.MarkReload, "generation 2") {
			return fmt.Errorf("no reload mark: %+v", h)
		}
		return nil
	})
	v := r.d.views[0]
	v.publish(membership.View{Source: "static", Total: 4, Local: 1, TotalWeight: 4, LocalWeight: 1, Weight: 0.25})
	if h := history(); !hasMark(h, server.MarkMembership, "default view: 4 replicas, weight 25%") {
		t.Fatalf("no membership mark: %+v", h.Marks)
	}
	if _, page := r.get(t, addr, "/"); !strings.Contains(page, `<line class="mark membership"`) || !strings.Contains(page, `<line class="mark reload"`) {
		t.Fatalf("the page draws no marks:\n%s", page)
	}
}

func hasMark(h server.History, kind, note string) bool {
	for _, m := range h.Marks {
		if m.Kind == kind && m.Note == note {
			return true
		}
	}
	return false
}
