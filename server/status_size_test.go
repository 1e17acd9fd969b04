package server

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors/engine"
)

// The page is said to stay a bounded size, but a client over limit picks
// what the over-limit table shows: 20 rows of up to 32 entries of 4096-byte
// values, each '<' four bytes once escaped.
func TestStatusPageSizeChosenByClient(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: test\ndescriptors:\n")
	ind := ""
	for i := range engine.MaxEntries {
		fmt.Fprintf(&b, "%s  - key: k%d\n", ind, i)
		if i < engine.MaxEntries-1 {
			fmt.Fprintf(&b, "%s    descriptors:\n", ind)
		}
		ind += "    "
	}
	fmt.Fprintf(&b, "%s    rate_limit: {unit: second, requests_per_unit: 0}\n", ind[:len(ind)-4])
	f := newFixtureSet(t, Options{}, 1, parseSet(t, b.String()))
	a := NewAdmin(f.svc, f.engine, f.metrics, func() []View { return []View{{Source: "static", Total: 1, Local: 1, Weight: 1}} },
		func() ReloadStatus { return ReloadStatus{Generation: 1} })
	for n := range 20 * sampleEvery {
		var es []*commonv3.RateLimitDescriptor_Entry
		for i := range engine.MaxEntries {
			es = append(es, &commonv3.RateLimitDescriptor_Entry{Key: fmt.Sprintf("k%d", i), Value: fmt.Sprintf("%04d", n) + strings.Repeat("<", engine.MaxValueBytes-4)})
		}
		f.call(&commonv3.RateLimitDescriptor{Entries: es})
	}
	rec := httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	page := rec.Body.String()
	t.Logf("%d bytes", len(page))
	if len(page) > 1<<20 {
		t.Errorf("the status page is %d bytes, chosen by a client's over-limit requests (refreshed every 5 s)", len(page))
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
