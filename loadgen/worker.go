package loadgen

import (
	"context"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// numCodes covers every gRPC status code; out-of-range codes count as Unknown.
const numCodes = int(codes.Unauthenticated) + 1

// worker sends requests one at a time. Its counters are atomics only so that the
// progress line can read them while it runs; each has a single writer.
type worker struct {
	conn  *grpc.ClientConn
	b     *requestBuilder
	req   wireRequest // the request, encoded into a reused buffer
	ans   answer
	timer *time.Timer
	hist  Histogram

	ok, over, unknown, failed atomic.Uint64

	byCode [numCodes]uint64
	late   uint64
}

func newWorker(conn *grpc.ClientConn, b *requestBuilder) *worker {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &worker{conn: conn, b: b, timer: t}
}

func (w *worker) reset() {
	w.hist.Reset()
	w.ok.Store(0)
	w.over.Store(0)
	w.unknown.Store(0)
	w.failed.Store(0)
	w.byCode = [numCodes]uint64{}
	w.late = 0
}

func (w *worker) sent() uint64 {
	return w.ok.Load() + w.over.Load() + w.unknown.Load() + w.failed.Load()
}

// run claims slots until the window closes, the request bound is reached, or ctx
// ends.
//
// Open loop corrects for coordinated omission: a slot claimed after its scheduled
// time (every worker was busy) is timed from the schedule, so the wait shows in the
// latency. A slot claimed early is timed from when the worker woke to send it: the
// lateness of Go's timers is the load generator's, not the server's.
func (w *worker) run(ctx, callCtx context.Context, p *phase) {
	for {
		r := p.seq.Add(1) - 1
		if p.limit > 0 && r >= p.limit {
			return
		}
		var from time.Time
		if p.interval == 0 {
			from = time.Now()
			if !from.Before(p.stopAt) {
				return
			}
		} else {
			due := p.due(r)
			now := time.Now()
			if !due.Before(p.stopAt) || !now.Before(p.stopAt) {
				return
			}
			if now.Before(due) {
				if !w.sleep(ctx, due.Sub(now)) {
					return
				}
				from = time.Now()
			} else {
				from = due
				w.late++
			}
		}
		if !w.call(ctx, callCtx, p, p.seqBase+r, from) {
			return
		}
	}
}

// sleep waits for d, or returns false if ctx ends first.
func (w *worker) sleep(ctx context.Context, d time.Duration) bool {
	w.timer.Reset(d)
	select {
	case <-w.timer.C:
		return true
	case <-ctx.Done():
		w.timer.Stop()
		return false
	}
}

// call sends request seq and records the outcome. It returns false when the
// worker must stop: the caller's context ended (the call is not counted) or the
// window's grace ran out (it is counted as an error).
func (w *worker) call(ctx, callCtx context.Context, p *phase, seq uint64, from time.Time) bool {
	w.req.b = appendRequest(w.req.b[:0], w.b.build(seq))
	cctx, cancel := callCtx, context.CancelFunc(nil)
	if p.timeout > 0 {
		cctx, cancel = context.WithTimeout(callCtx, p.timeout)
	}
	err := w.conn.Invoke(cctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, &w.req, &w.ans)
	if cancel != nil {
		cancel()
	}
	if err != nil {
		if ctx.Err() != nil {
			return false
		}
		c := int(status.Code(err))
		if c < 0 || c >= numCodes {
			c = int(codes.Unknown)
		}
		w.byCode[c]++
		w.failed.Add(1)
		return callCtx.Err() == nil
	}
	w.hist.Record(time.Since(from))
	switch w.ans.code {
	case rlsv3.RateLimitResponse_OK:
		w.ok.Add(1)
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		w.over.Add(1)
	default:
		w.unknown.Add(1)
	}
	return true
}
