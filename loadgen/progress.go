package loadgen

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// startProgress prints a line to w every second until the returned func is
// called; that func returns once the printer has stopped.
func startProgress(w io.Writer, label string, workers []*worker, start time.Time, window time.Duration) (stop func()) {
	if w == nil {
		return func() {}
	}
	if label != "" {
		label += " "
	}
	of := ""
	if window > 0 {
		of = "/" + window.Round(time.Second).String()
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		var last uint64
		lastAt := start
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				var sent, ok, over, failed uint64
				for _, wk := range workers {
					ok += wk.ok.Load()
					over += wk.over.Load()
					failed += wk.failed.Load()
					sent += wk.sent()
				}
				rate := float64(sent-last) / now.Sub(lastAt).Seconds()
				last, lastAt = sent, now
				fmt.Fprintf(w, "bench: %s%s%s  %.0f req/s  sent %d  ok %d  over_limit %d  errors %d\n",
					label, now.Sub(start).Round(time.Second), of, rate, sent, ok, over, failed)
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}
