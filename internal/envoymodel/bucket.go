package envoymodel

import (
	"sort"
	"strconv"
	"strings"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// phase is where a bucket is in Envoy's assignment life cycle.
type phase int

const (
	// unassigned: the bucket follows no_assignment_behavior (F:149-163).
	unassigned phase = iota
	// assigned: the server's action is in force until its TTL runs out.
	assigned
	// fallback: the TTL ran out and expired_assignment_behavior's fallback is
	// in force until its timeout runs out (GC:450-520).
	fallback
)

// bucket is one entry of Envoy's bucket cache (GC's CachedBucket): its id,
// its usage since the last report, and its action. Envoy runs a timer for
// the TTL and another for the fallback timeout; the model keeps their
// deadline in until and applies what they would have done when it next looks
// at the bucket (advance), at the instant the timer would have fired.
type bucket struct {
	id              map[string]string
	allowed, denied uint64
	lastReport      int64

	phase phase
	// action is the strategy in force while assigned or in fallback; nil
	// while assigned means an action that carried no strategy, which Envoy
	// lets every request through (F:317-321).
	action  *typev3.RateLimitStrategy
	limiter *limiter
	until   int64
}

// bucketKey is the cache key of an id: Envoy hashes the map deterministically
// (GC:306), so the order of the keys on the wire does not matter. Keys and
// values are length-prefixed so that no two maps share a key.
func bucketKey(id map[string]string) string {
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		for _, s := range []string{k, id[k]} {
			b.WriteString(strconv.Itoa(len(s)))
			b.WriteByte(':')
			b.WriteString(s)
		}
	}
	return b.String()
}

// advance fires, in order, the timers of b that are due by now.
func (m *Model) advance(b *bucket, now int64) {
	for b.phase != unassigned && now >= b.until {
		if b.phase == assigned {
			m.expire(b, b.until)
			continue
		}
		// The fallback timed out: back to no_assignment_behavior (GC:523-558).
		b.phase, b.action, b.limiter = unassigned, nil, nil
	}
}

// expire is the TTL timer firing at t (GC:450-520). With no fallback the
// bucket returns to no_assignment_behavior. With one, the fallback applies
// for the configured timeout; a token-bucket fallback keeps the current
// limiter when it is the same bucket and otherwise starts a new one at the
// current fill fraction (GC:488-504).
func (m *Model) expire(b *bucket, t int64) {
	fb := m.fallback
	if fb == nil {
		b.phase, b.action, b.limiter = unassigned, nil, nil
		return
	}
	var l *limiter
	if tb := fb.GetTokenBucket(); tb != nil {
		l = b.limiter
		if b.action.GetTokenBucket() == nil || !sameTokenBucket(tb, b.action.GetTokenBucket()) {
			l = newLimiter(tb, b.limiter, t)
		}
	}
	b.phase, b.action, b.limiter, b.until = fallback, fb, l, t+m.fallbackFor
}

// assign applies one quota_assignment_action at now, as onQuotaResponseImpl
// does (GC:332-374). It reports false for an action Envoy skips, leaving the
// bucket as it was, timer included: requests_per_time_unit (GC:356-359) and
// an unset strategy (GC:360-362).
func (m *Model) assign(b *bucket, qa *rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction, now int64) bool {
	s := qa.GetRateLimitStrategy()
	var l *limiter
	switch s.GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
	case *typev3.RateLimitStrategy_TokenBucket:
		l = b.limiter
		if b.action.GetTokenBucket() == nil || !sameTokenBucket(s.GetTokenBucket(), b.action.GetTokenBucket()) {
			l = newLimiter(s.GetTokenBucket(), b.limiter, now)
		}
	default:
		return false
	}
	b.phase, b.action, b.limiter = assigned, s, l
	b.until = now + ttl(qa.GetAssignmentTimeToLive())
	return true
}

// maxTimer bounds a timer so that now+timer cannot overflow: about 100 years.
const maxTimer = int64(100 * 365 * 24 * 3600 * 1e9)

// ttl is the assignment's lifetime in nanoseconds: Envoy arms the timer with
// the whole seconds only, so unset or under a second is 0 and the assignment
// expires at once (GC:443-447).
func ttl(d *durationpb.Duration) int64 {
	return secondsToNanos(d.GetSeconds())
}

func secondsToNanos(s int64) int64 {
	if s <= 0 {
		return 0
	}
	return min(s, maxTimer/1e9) * 1e9
}

// usage takes b's usage for a report at now, as getUsageFromBucket does
// (GC:91-113): the counters are swapped to zero and time_elapsed is the time
// since b was last in a report, truncated to whole seconds.
func usage(b *bucket, now int64) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	id := make(map[string]string, len(b.id))
	for k, v := range b.id {
		id[k] = v
	}
	u := &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		BucketId:           &rlqsv3.BucketId{Bucket: id},
		TimeElapsed:        &durationpb.Duration{Seconds: (now - b.lastReport) / 1e9},
		NumRequestsAllowed: b.allowed,
		NumRequestsDenied:  b.denied,
	}
	b.allowed, b.denied, b.lastReport = 0, 0, now
	return u
}
