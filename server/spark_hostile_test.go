package server

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A share that moves by demand moves a little at every division. Each tiny
// move draws a "share changed" line whose title names the same share twice.
func TestSparkShareMarkForInvisibleChange(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	h := &History{StepSeconds: 10, Partial: 5}
	rh := &RuleHistory{Rule: "d.k", Unit: "second"}
	for i := range historySlots + 1 {
		h.Starts = append(h.Starts, t0.Add(time.Duration(i)*HistoryStep))
		rh.Admitted = append(rh.Admitted, 100)
		rh.Over = append(rh.Over, 0)
		rh.Shadow = append(rh.Shadow, 0)
		rh.Share = append(rh.Share, 0.25+float64(i%2)*1e-6) // demand noise
	}
	s := newSpark(h, rh)
	same := 0
	for _, m := range s.Marks {
		if m.Kind == MarkShare {
			parts := strings.Split(strings.TrimPrefix(m.Title, "share "), " → ")
			if len(parts) == 2 && parts[0] == parts[1] {
				same++
			}
		}
	}
	if same > 0 {
		t.Errorf("%d of the sparkline's %d marks say a share changed to itself (e.g. %q): a line in every slot",
			same, len(s.Marks), s.Marks[0].Title)
	}
}

// A page of 100 busy rules with demand-moved shares and membership flaps:
// how big is it? The bounded test only measures idle rules.
func TestStatusPageBusySize(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: big\ndescriptors:\n")
	for i := range 100 {
		fmt.Fprintf(&b, "  - key: k%d\n    rate_limit: {unit: second, requests_per_unit: 1000}\n", i)
	}
	f := newFixtureSet(t, Options{}, 0.25, parseSet(t, b.String()))
	a := NewAdmin(f.svc, f.engine, f.metrics, func() []View { return []View{{Source: "static", Total: 4, Local: 1, Weight: 0.25}} },
		func() ReloadStatus { return ReloadStatus{Generation: 1} })
	now := time.Now().Add(-time.Duration(historySlots) * HistoryStep)
	a.history.start = now
	for i := range historySlots {
		for k := range 100 {
			f.call(d(fmt.Sprintf("k%d=v", k)))
		}
		f.engine.SetWeight(0.25+float64(i%2)*1e-6, f.now)
		now = now.Add(HistoryStep)
		a.history.mu.Lock()
		a.history.mark(Mark{At: now.Add(-time.Second), Kind: MarkMembership, Note: "default view: 4 replicas, weight 25%"})
		a.history.mu.Unlock()
		a.sampleHistory(now)
	}
	rec := httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	page := rec.Body.String()
	lines := strings.Count(page, "<line ")
	t.Logf("%d bytes, %d mark lines for 100 rules", len(page), lines)
	if len(page) > 200<<10 {
		t.Errorf("page of 100 rules is %d bytes (%d mark lines); the idle page is held under 200 KiB", len(page), lines)
	}
}
