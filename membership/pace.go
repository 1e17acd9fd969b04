package membership

import (
	"context"
	"time"
)

// tokenBucket paces the watch loop. It is a reservation bucket: every request
// takes a token, and when none is left the caller learns how long to wait for
// its turn. Its arithmetic takes the time as an argument, so it is tested
// without sleeping. It is not safe for concurrent use; only Run's goroutine
// touches it.
type tokenBucket struct {
	rate   float64 // tokens per second, > 0
	burst  float64 // bucket size, >= 1
	tokens float64
	last   time.Time
}

func newTokenBucket(rate float64, burst int) *tokenBucket {
	return &tokenBucket{rate: rate, burst: float64(burst), tokens: float64(burst)}
}

// reserve takes one token at now and returns how long the caller must wait
// before using it; 0 means at once. A clock that steps backwards adds no tokens.
func (b *tokenBucket) reserve(now time.Time) time.Duration {
	if b.last.IsZero() {
		b.last = now
	}
	if elapsed := now.Sub(b.last); elapsed > 0 {
		b.tokens = min(b.burst, b.tokens+elapsed.Seconds()*b.rate)
		b.last = now
	}
	b.tokens--
	if b.tokens >= 0 {
		return 0
	}
	return time.Duration(-b.tokens / b.rate * float64(time.Second))
}

// backoff is the delay before retry number attempt (0 for the first retry):
// exponential growth from base, capped at ceiling, with full jitter, so that
// replicas which failed together do not retry together. r is a uniform random
// number in [0, 1).
func backoff(attempt int, base, ceiling time.Duration, r float64) time.Duration {
	d := base
	for i := 0; i < attempt && d < ceiling; i++ {
		d *= 2
	}
	d = min(d, ceiling)
	return time.Duration(r * float64(d))
}

// sleep waits for d or until ctx is done, and reports whether the full wait
// elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
