package server

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors"
)

// The page is said to stay a bounded size, but a client over limit picks
// what the over-limit table shows: 20 rows of up to 32 entries of 4096-byte
// values, each '<' four bytes once escaped.
func TestStatusPageSizeChosenByClient(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: test\ndescriptors:\n")
	ind := ""
	for i := range descriptors.MaxEntries {
		fmt.Fprintf(&b, "%s  - key: k%d\n", ind, i)
		if i < descriptors.MaxEntries-1 {
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
		for i := range descriptors.MaxEntries {
			es = append(es, &commonv3.RateLimitDescriptor_Entry{Key: fmt.Sprintf("k%d", i), Value: fmt.Sprintf("%04d", n) + strings.Repeat("<", descriptors.MaxValueBytes-4)})
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
