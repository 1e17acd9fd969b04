package envoymodel

import (
	"context"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
)

// stream is one StreamRateLimitQuotas call and the goroutine that reads it.
type stream struct {
	s      grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]
	cancel context.CancelFunc
	done   chan error // the reader's end, buffered
}

// Run is Envoy's main thread for this client: it sends the reports and, on
// a goroutine per stream, applies the responses. Like Envoy, it opens the
// stream and starts the report timer when the first bucket is created
// (GC:173-175); a stream that ends is only forgotten, keeping every
// assignment and its TTL (GC:383-390); on the next tick it builds the full
// report, resetting the counters, then opens a new stream and sends the
// report on it, or drops the report when the stream cannot be opened
// (GC:421-433). It never half-closes the stream (GC:236). Run returns
// ctx.Err() once ctx is done and its reader goroutines have ended. Call it
// once per model.
func (m *Model) Run(ctx context.Context) error {
	var (
		readers sync.WaitGroup
		cur     *stream
		started bool
		timer   *time.Timer
		tick    <-chan struct{}
		timerC  <-chan time.Time
	)
	defer func() {
		if cur != nil {
			cur.cancel()
		}
		if timer != nil {
			timer.Stop()
		}
		readers.Wait()
	}()
	for {
		var done chan error
		if cur != nil {
			done = cur.done
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.wake:
			for _, r := range m.takeInitial() {
				if !started {
					started = true
					if m.ticks != nil {
						tick = m.ticks
					} else {
						timer = time.NewTimer(m.interval)
						timerC = timer.C
					}
					cur = m.open(ctx, &readers)
				}
				cur = m.send(cur, r)
			}
		case <-tick:
			cur = m.tick(ctx, cur, &readers)
		case <-timerC:
			cur = m.tick(ctx, cur, &readers)
			timer.Reset(m.interval)
		case err := <-done:
			m.log.Debug("rlqs stream closed", "err", err)
			cur.cancel()
			cur = nil
			m.traced("closed")
		}
	}
}

// tick is the report timer firing (GC:421-433).
func (m *Model) tick(ctx context.Context, cur *stream, readers *sync.WaitGroup) *stream {
	defer m.traced("tick")
	r := m.report()
	if cur == nil {
		if cur = m.open(ctx, readers); cur == nil {
			m.log.Debug("rlqs stream not open; report dropped", "buckets", len(r.BucketQuotaUsages))
			return nil
		}
	}
	return m.send(cur, r)
}

// send sends r on cur, dropping it when there is no stream (GC:230-235). A
// failed send means the stream has ended; it is forgotten like a remote
// close.
func (m *Model) send(cur *stream, r *rlqsv3.RateLimitQuotaUsageReports) *stream {
	if cur == nil {
		m.log.Debug("rlqs stream not open; report dropped", "buckets", len(r.BucketQuotaUsages))
		return nil
	}
	if err := cur.s.Send(r); err != nil {
		m.log.Debug("rlqs send failed", "err", err)
		cur.cancel()
		return nil
	}
	return cur
}

// open starts a stream and its reader, or returns nil.
func (m *Model) open(ctx context.Context, readers *sync.WaitGroup) *stream {
	sctx, cancel := context.WithCancel(ctx)
	s, err := m.client.StreamRateLimitQuotas(sctx)
	if err != nil {
		cancel()
		m.log.Debug("rlqs stream failed to start", "err", err)
		return nil
	}
	st := &stream{s: s, cancel: cancel, done: make(chan error, 1)}
	readers.Go(func() {
		for {
			resp, err := s.Recv()
			if err != nil {
				st.done <- err
				return
			}
			m.apply(resp)
		}
	})
	return st
}
