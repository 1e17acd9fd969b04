package envoymodel

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"

	"github.com/sharelimit/sharelimit/internal/monotime"
)

// DefaultInterval is Envoy's reporting interval: fixed at 5 s whatever the
// filter's reporting_interval says (FP:42-45).
const DefaultInterval = 5 * time.Second

// Config describes one model Envoy: one RLQS client, as Envoy has one per
// (RLQS server, domain) (FP:57-79), whose buckets all share one filter
// configuration.
type Config struct {
	// Conn is the connection to the RLQS server. Required.
	Conn grpc.ClientConnInterface
	// Domain goes on every report (GC:124, 146). Required.
	Domain string
	// NoAssignment is no_assignment_behavior.fallback_rate_limit: what a
	// bucket does before its first assignment and after its assignment and
	// fallback have expired. Nil is Envoy's default, ALLOW_ALL (F:149-163).
	// A blanket rule is enforced; requests_per_time_unit or an unset strategy
	// allow everything (F:313-321). A token bucket is refused by New: Envoy
	// would read a limiter it never built (F:312, GC:212-215).
	NoAssignment *typev3.RateLimitStrategy
	// Expired is expired_assignment_behavior.fallback_rate_limit: what a
	// bucket does for ExpiredTimeout once its assignment's TTL has run out.
	// Nil means no fallback: straight back to NoAssignment (GC:459-477).
	// reuse_last_assignment is not modelled because Envoy does not implement
	// it; it behaves as nil (F:168-173).
	Expired *typev3.RateLimitStrategy
	// ExpiredTimeout is expired_assignment_behavior_timeout, read in whole
	// seconds as Envoy does; 0 (unset) ends the fallback at once (F:174-186).
	ExpiredTimeout time.Duration
	// Interval is the time between periodic reports. Envoy's is fixed at
	// DefaultInterval, the default here; tests that need speed shorten it.
	Interval time.Duration
	// Ticks, when set, replaces the interval timer: Run sends a periodic
	// report on each value received, which lets a test with a fake Clock
	// decide when the timer fires.
	Ticks <-chan struct{}
	// Clock is the model's clock, for token buckets, TTLs, time_elapsed and
	// the admission slots. Nil is monotime.New().
	Clock monotime.Clock
	// Log receives what Envoy would log. Nil discards.
	Log *slog.Logger
}

// Model is a model Envoy's rate_limit_quota filter and its RLQS client.
// Allow is safe for concurrent use; Run must be running for reports to go out
// and assignments to come in. The zero value is not usable; call New.
type Model struct {
	client      rlqsv3.RateLimitQuotaServiceClient
	domain      string
	noAssign    *typev3.RateLimitStrategy
	fallback    *typev3.RateLimitStrategy
	fallbackFor int64
	interval    time.Duration
	ticks       <-chan struct{}
	clock       monotime.Clock
	log         *slog.Logger

	mu      sync.Mutex
	buckets map[string]*bucket
	initial []*rlqsv3.RateLimitQuotaUsageReports // for Run to send
	slots   slotCounter
	wake    chan struct{}

	allowed, denied atomic.Uint64

	// trace, when set, is told of "response" once a response is applied,
	// "tick" once a tick's report is sent or dropped, and "closed" once an
	// ended stream is forgotten; tests use it to know where the model is.
	trace func(event string)
}

// ErrConfig is returned by New for a configuration Envoy would refuse or
// could not run.
var ErrConfig = errors.New("envoymodel: bad config")

// New checks cfg and returns a model that has no buckets yet. It starts no
// goroutine; the caller runs Run.
func New(cfg Config) (*Model, error) {
	switch {
	case cfg.Conn == nil:
		return nil, fmt.Errorf("%w: no connection", ErrConfig)
	case cfg.Domain == "":
		return nil, fmt.Errorf("%w: empty domain", ErrConfig)
	case cfg.NoAssignment.GetTokenBucket() != nil:
		return nil, fmt.Errorf("%w: a token bucket as no_assignment_behavior has no limiter in Envoy", ErrConfig)
	case cfg.Interval < 0 || cfg.ExpiredTimeout < 0:
		return nil, fmt.Errorf("%w: negative interval or timeout", ErrConfig)
	}
	m := &Model{
		client:      rlqsv3.NewRateLimitQuotaServiceClient(cfg.Conn),
		domain:      cfg.Domain,
		noAssign:    cfg.NoAssignment,
		fallback:    cfg.Expired,
		fallbackFor: secondsToNanos(int64(cfg.ExpiredTimeout / time.Second)),
		interval:    cfg.Interval,
		ticks:       cfg.Ticks,
		clock:       cfg.Clock,
		log:         cfg.Log,
		buckets:     make(map[string]*bucket),
		wake:        make(chan struct{}, 1),
	}
	if m.interval == 0 {
		m.interval = DefaultInterval
	}
	if m.clock == nil {
		m.clock = monotime.New()
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	return m, nil
}

// Allow decides one request whose bucket id is id, as the filter does. A
// bucket seen for the first time follows NoAssignment, where only a DENY_ALL
// blanket rule denies (F:47-52), and queues the immediate one-bucket report
// (GC:212-220). Afterwards the bucket's action decides: its assignment, its
// fallback or NoAssignment (F's shouldAllowRequest). An empty id is a bucket
// like any other that no response can ever reach (GC:297-303).
func (m *Model) Allow(id map[string]string) bool {
	key := bucketKey(id)
	m.mu.Lock()
	now := m.clock()
	b, ok := m.buckets[key]
	var allow bool
	if ok {
		m.advance(b, now)
		s, l := m.noAssign, (*limiter)(nil)
		if b.phase != unassigned {
			s, l = b.action, b.limiter
		}
		allow = decide(s, l, now)
	} else {
		b = m.create(key, id, now)
		allow = decide(m.noAssign, nil, now)
	}
	if allow {
		b.allowed++
		m.slots.add(now)
	} else {
		b.denied++
	}
	if !ok {
		m.queueInitial(b, now)
	}
	m.mu.Unlock()
	if allow {
		m.allowed.Add(1)
	} else {
		m.denied.Add(1)
	}
	return allow
}

func (m *Model) create(key string, id map[string]string, now int64) *bucket {
	own := make(map[string]string, len(id))
	for k, v := range id {
		own[k] = v
	}
	b := &bucket{id: own, lastReport: now}
	m.buckets[key] = b
	return b
}

// queueInitial builds the new bucket's report at once, so its counters and
// its time of last report are reset now as in Envoy, and hands it to Run.
func (m *Model) queueInitial(b *bucket, now int64) {
	m.initial = append(m.initial, &rlqsv3.RateLimitQuotaUsageReports{
		Domain:            m.domain,
		BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(b, now)},
	})
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

func (m *Model) takeInitial() []*rlqsv3.RateLimitQuotaUsageReports {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.initial
	m.initial = nil
	return r
}

// report builds the periodic report: every bucket in the cache, hit or not
// (GC:132-149), in key order. It can be empty once every bucket has been
// abandoned (IT:1918-1926).
func (m *Model) report() *rlqsv3.RateLimitQuotaUsageReports {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	keys := make([]string, 0, len(m.buckets))
	for k := range m.buckets {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	r := &rlqsv3.RateLimitQuotaUsageReports{Domain: m.domain}
	for _, k := range keys {
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, usage(m.buckets[k], now))
	}
	return r
}

// apply processes one response as onQuotaResponseImpl does (GC:295-374).
// Actions with no id, or for a bucket not in the cache, are logged and
// dropped; abandon_action erases the bucket, which a later request creates
// afresh; an action with neither assignment nor abandon carries no strategy
// and no TTL, so it lets requests through until it expires, at once.
func (m *Model) apply(resp *rlqsv3.RateLimitQuotaResponse) {
	m.mu.Lock()
	now := m.clock()
	for _, a := range resp.GetBucketAction() {
		id := a.GetBucketId().GetBucket()
		if len(id) == 0 {
			m.log.Debug("rlqs action without a bucket id")
			continue
		}
		key := bucketKey(id)
		b, ok := m.buckets[key]
		if !ok {
			m.log.Debug("rlqs action for a bucket not in the cache", "bucket", id)
			continue
		}
		m.advance(b, now)
		switch act := a.GetBucketAction().(type) {
		case *rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_:
			delete(m.buckets, key)
		case *rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_:
			if !m.assign(b, act.QuotaAssignmentAction, now) {
				m.log.Debug("rlqs assignment skipped: strategy not supported", "bucket", id)
			}
		default:
			b.phase, b.action, b.limiter, b.until = assigned, nil, nil, now
		}
	}
	m.mu.Unlock()
	m.traced("response")
}

func (m *Model) traced(event string) {
	if m.trace != nil {
		m.trace(event)
	}
}

// Totals is what the model has decided since New: requests admitted and
// requests denied.
func (m *Model) Totals() (allowed, denied uint64) {
	return m.allowed.Load(), m.denied.Load()
}

// Admitted returns a copy of the admissions counted in SlotWidth slots on
// the model's clock.
func (m *Model) Admitted() Slots {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.slots.snapshot()
}
