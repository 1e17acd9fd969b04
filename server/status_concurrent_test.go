package server

import (
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/descriptors"
)

// The sampler, marks, the page, /rlconfig/history and /rlconfig/admitted,
// traffic and reloads all at once, under -race.
func TestStatusPageConcurrent(t *testing.T) {
	var big strings.Builder
	big.WriteString("domain: test\ndescriptors:\n")
	for i := range 150 {
		fmt.Fprintf(&big, "  - key: pad%d\n    rate_limit: {unit: second, requests_per_unit: 5}\n", i)
	}
	hot := "  - key: hot\n    rate_limit: {unit: second, requests_per_unit: 3}\n"
	big.WriteString(hot)
	sets := []*descriptors.Set{parseSet(t, big.String()), parseSet(t, "domain: test\ndescriptors:\n"+hot)}
	f := newFixtureSet(t, Options{}, 0.5, sets[0])
	a := NewAdmin(f.svc, f.engine, f.metrics, func() []View { return []View{{Source: "static", Total: 2, Local: 1, Weight: 0.5}} },
		func() ReloadStatus { return ReloadStatus{Generation: 1} })
	h := a.Handler()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	run := func(fn func(i int)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				fn(i)
			}
		}()
	}
	now := time.Now()
	run(func(i int) { a.sampleHistory(now.Add(time.Duration(i) * HistoryStep)) })
	run(func(i int) { a.Mark(MarkReload, fmt.Sprint("generation ", i)) })
	run(func(i int) { f.call(d("hot=x"), d(fmt.Sprintf("pad%d=y", i%150))) })
	run(func(i int) {
		for _, p := range []string{"/", "/?page=2", "/rlconfig/history", "/rlconfig/admitted", "/rlconfig"} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("GET", p, nil))
			if rec.Code != 200 {
				t.Errorf("GET %s: %d %s", p, rec.Code, rec.Body)
			}
			io.Copy(io.Discard, rec.Body)
		}
	})
	run(func(i int) {
		next := sets[i%2]
		f.metrics.Bind(next)
		if old := f.engine.Swap(next); old != nil {
			f.metrics.Unbind(old)
		}
		f.engine.SetWeight([]float64{0.5, 0.25}[i%2], f.now)
	})
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
}
