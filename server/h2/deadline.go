package h2

// Deadlines: a call's grpc-timeout, read from its headers, ends it with
// DEADLINE_EXCEEDED whether or not its request has arrived, and a timer holds
// back the answer of a call a wait policy delays.

import (
	"fmt"
	"strconv"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
)

// errDeadline is grpc-go's message for a call ended at its deadline.
const errDeadline = "context deadline exceeded"

// answerLater holds an answer back for wait, or answers DeadlineExceeded at
// the client's deadline if that comes first.
func (c *conn) answerLater(st *stream, resp *rlsv3.RateLimitResponse, wait time.Duration) {
	if st.timed {
		if left := time.Until(st.deadline); left < wait {
			resp, wait = nil, max(left, 0)
		}
	}
	c.endAfter(st, wait, resp)
}

// endAfter sets st's timer to end it after d: with resp, or with
// DEADLINE_EXCEEDED when resp is nil. Nothing is written for a stream that
// ended meanwhile. Called with wmu held.
func (c *conn) endAfter(st *stream, d time.Duration, resp *rlsv3.RateLimitResponse) {
	st.timer = time.AfterFunc(d, func() {
		c.wmu.Lock()
		if st.done || c.closed {
			c.wmu.Unlock()
			return
		}
		if resp == nil {
			c.finish(st, codes.DeadlineExceeded, errDeadline)
		} else {
			c.answer(st, resp)
		}
		c.wmu.Unlock()
		c.flush()
	})
}

// armDeadlines gives each call opened with a deadline in the last batch of
// reads, and still waiting for its request, a timer that ends it with
// DEADLINE_EXCEEDED at that deadline, whether or not its request arrives.
func (c *conn) armDeadlines() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for i, st := range c.arriving {
		c.arriving[i] = nil
		if st.done || st.recvDone || st.timer != nil {
			continue
		}
		c.endAfter(st, time.Until(st.deadline), nil)
	}
	c.arriving = c.arriving[:0]
}

// parseTimeout reads a grpc-timeout: up to eight digits and a unit. Its
// errors read as grpc-go's, which clients may already match on.
func parseTimeout(s string) (time.Duration, error) {
	switch {
	case len(s) < 2:
		return 0, fmt.Errorf("transport: timeout string is too short: %q", s)
	case len(s) > 9:
		return 0, fmt.Errorf("transport: timeout string is too long: %q", s)
	}
	var unit time.Duration
	switch s[len(s)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, fmt.Errorf("transport: timeout unit is not recognized: %q", s)
	}
	v, err := strconv.ParseUint(s[:len(s)-1], 10, 64)
	if err != nil {
		return 0, err
	}
	if v > uint64(1<<63-1)/uint64(unit) {
		return 1<<63 - 1, nil
	}
	return time.Duration(v) * unit, nil
}
