package loadgen

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// stopGrace is how long calls still in flight when the window closes may take
// before they are cancelled and counted as errors, so a stuck server cannot
// hold a run open.
const stopGrace = 5 * time.Second

// phase is the shared, read-mostly state of one window.
type phase struct {
	seq      atomic.Uint64 // next slot to claim, relative to the window
	seqBase  uint64        // key sequence offset, so the window continues the warmup's walk
	start    time.Time
	stopAt   time.Time
	limit    uint64  // 0: no request bound
	interval float64 // nanoseconds between scheduled sends; 0: closed loop
	timeout  time.Duration
}

// due is when open-loop slot r is scheduled.
func (p *phase) due(r uint64) time.Time {
	return p.start.Add(time.Duration(float64(r) * p.interval))
}

type phaseSpec struct {
	seqBase  uint64
	window   time.Duration // 0: MaxDuration
	requests uint64        // 0: none
	label    string
}

type phaseOutcome struct {
	elapsed   time.Duration
	claimed   uint64 // slots claimed, a key-sequence offset for what follows
	scheduled uint64 // open loop: slots due inside the window
}

// runPhase runs every worker through one window and waits for all of them.
func runPhase(ctx context.Context, cfg *Config, workers []*worker, spec phaseSpec) phaseOutcome {
	window := spec.window
	if window == 0 {
		window = MaxDuration
	}
	callCtx, cancelCalls := context.WithCancel(ctx)
	defer cancelCalls()

	p := &phase{seqBase: spec.seqBase, limit: spec.requests, timeout: cfg.Timeout}
	if cfg.Rate > 0 {
		p.interval = float64(time.Second) / cfg.Rate
	}
	p.start = time.Now()
	p.stopAt = p.start.Add(window)
	hard := time.AfterFunc(window+stopGrace+cfg.Timeout, cancelCalls)
	defer hard.Stop()

	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() { w.run(ctx, callCtx, p) })
	}
	stopProgress := startProgress(cfg.Progress, spec.label, workers, p.start, spec.window)
	wg.Wait()
	elapsed := time.Since(p.start)
	stopProgress()

	out := phaseOutcome{elapsed: elapsed, claimed: p.seq.Load()}
	if p.interval > 0 {
		out.scheduled = slotsBefore(p, window)
		if spec.requests > 0 {
			out.scheduled = min(out.scheduled, spec.requests)
		}
	}
	return out
}

// slotsBefore counts the open-loop slots scheduled before the window closes, with
// the same arithmetic the workers use.
func slotsBefore(p *phase, window time.Duration) uint64 {
	off := func(r uint64) time.Duration { return time.Duration(float64(r) * p.interval) }
	n := uint64(math.Ceil(window.Seconds() * float64(time.Second) / p.interval))
	for n > 0 && off(n-1) >= window {
		n--
	}
	for off(n) < window {
		n++
	}
	return n
}
