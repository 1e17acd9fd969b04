package server

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sharelimit/sharelimit/descriptors"

	"github.com/sharelimit/sharelimit/descriptors/engine"
)

// Options are the request-path settings of the service.
type Options struct {
	// ShadowMode forces overall_code to OK; statuses still say what happened.
	ShadowMode bool
	// ResponseHeaders adds the limit, remaining and reset headers of the
	// descriptor closest to its limit, under these names.
	ResponseHeaders bool
	HeaderLimit     string
	HeaderRemaining string
	HeaderReset     string
	// DynamicMetadata adds upstream's response dynamic metadata (see
	// dynamicMetadata).
	DynamicMetadata bool
}

// Service answers ShouldRateLimit from the engine. Safe for concurrent use.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	engine *engine.Engine
	clock  func() int64
	// wall0 is the Unix time, in nanoseconds, at which clock read 0: a
	// reading's slot of the daemon's accounting is (wall0 + reading) ÷
	// AdmittedSlot. Fixed at start, so the slots follow the monotonic clock
	// and a step of the wall clock does not move them.
	wall0   int64
	metrics *Metrics
	opts    Options
	log     *slog.Logger
	pool    sync.Pool
	// parts are the response parts of the set in force (parts.go), built
	// here from the set: the metrics only count.
	parts partsCache
}

var _ rlsv3.RateLimitServiceServer = (*Service)(nil)

// NewService returns a service deciding with e on clock's time.
func NewService(e *engine.Engine, clock func() int64, metrics *Metrics, opts Options, log *slog.Logger) *Service {
	s := &Service{engine: e, clock: clock, wall0: time.Now().UnixNano() - clock(), metrics: metrics, opts: opts, log: log}
	s.pool.New = func() any { return &engine.Decision{Statuses: make([]engine.Status, 0, 8)} }
	return s
}

// ShouldRateLimit implements Envoy's RateLimitService: Answer, then, under a
// wait policy, the wait, which ends early with ctx.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := ctx.Err(); err != nil {
		// The client has given up on it: never decided, so it spends no
		// token, as on the direct transport.
		return nil, status.FromContextError(err).Err()
	}
	resp, wait, err := s.Answer(req)
	if err != nil || wait <= 0 {
		return resp, err
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return resp, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// Answer decides req without blocking. When a rule's policy is wait, the
// answer is to be sent only after wait: the tokens it reserved exist then.
// Its errors are gRPC statuses; a panic is recovered, counted and answered
// Internal.
func (s *Service) Answer(req *rlsv3.RateLimitRequest) (resp *rlsv3.RateLimitResponse, wait time.Duration, err error) {
	defer func() {
		if p := recover(); p != nil {
			s.metrics.panics.Inc()
			s.log.Error("recovered panic in ShouldRateLimit", "panic", p, "domain", req.GetDomain())
			resp, wait, err = nil, 0, status.Error(codes.Internal, "internal error (recovered; counted in sharelimit_panics_total)")
		}
	}()
	start := time.Now()
	dec := s.pool.Get().(*engine.Decision)
	defer s.pool.Put(dec)
	now := s.clock()
	err = s.engine.Decide(dec, req.GetDomain(), req.GetDescriptors(), req.GetHitsAddend(), now)
	sts, overall := dec.Statuses, dec.Code
	if err != nil {
		if errors.Is(err, engine.ErrInvalidRequest) {
			s.metrics.invalid.Inc()
			return nil, 0, status.Error(codes.InvalidArgument, err.Error())
		}
		return nil, 0, status.Error(codes.Internal, err.Error())
	}
	s.metrics.count(dec.Set, req.GetDomain(), req.GetDescriptors(), sts, req.GetHitsAddend(), s.slot(now))
	parts := s.parts.cur.Load() // the fast path of partsCache.of
	if parts == nil || parts.set != dec.Set {
		parts = s.parts.replace(dec.Set, s.engine)
	}
	if s.opts.ShadowMode {
		if overall == engine.OverLimit {
			s.metrics.globalShadow.Add(1)
		}
		overall = engine.OK
	}
	resp = s.response(overall, sts, parts)
	if s.opts.DynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, sts, parts)
	}
	s.metrics.observe(time.Since(start))
	if wait = maxWait(sts); wait > 0 {
		s.metrics.waits.Inc()
	}
	return resp, wait, nil
}

// slot is the number of the accounting slot (admitted.go) that holds the
// clock reading now.
func (s *Service) slot(now int64) int64 { return (s.wall0 + now) / int64(AdmittedSlot) }

func maxWait(sts []engine.Status) time.Duration {
	var w time.Duration
	for i := range sts {
		w = max(w, sts[i].Wait)
	}
	return w
}

// one holds a whole one-descriptor response in a single allocation, the shape
// of nearly every Envoy request.
type one struct {
	resp rlsv3.RateLimitResponse
	ptr  [1]*rlsv3.RateLimitResponse_DescriptorStatus
	statusBlock
}

// statusBlock keeps a status and its duration_until_reset side by side.
type statusBlock struct {
	st  rlsv3.RateLimitResponse_DescriptorStatus
	dur durationpb.Duration
}

func (s *Service) response(overall rlsv3.RateLimitResponse_Code, sts []engine.Status, p *setParts) *rlsv3.RateLimitResponse {
	var resp *rlsv3.RateLimitResponse
	if len(sts) == 1 {
		o := &one{}
		o.ptr[0] = &o.st
		o.resp.Statuses = o.ptr[:]
		o.fill(&sts[0], p)
		resp = &o.resp
	} else {
		// Three allocations for any count: the response, the pointer slice the
		// message needs, and one block holding every status with its duration.
		resp = &rlsv3.RateLimitResponse{Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(sts))}
		blocks := make([]statusBlock, len(sts))
		for i := range sts {
			blocks[i].fill(&sts[i], p)
			resp.Statuses[i] = &blocks[i].st
		}
	}
	resp.OverallCode = overall
	if s.opts.ResponseHeaders {
		resp.ResponseHeadersToAdd = s.headers(sts)
	}
	return resp
}

// fill writes st into the block. current_limit is the rule's message in p:
// built once per rule of the set in force, held only by this package, never
// by the rules themselves. A limit without one (an override, or a set
// replaced since it decided) gets a message of its own.
func (b *statusBlock) fill(st *engine.Status, p *setParts) {
	b.st.Code = st.Code
	l := st.Limit
	if l == nil {
		return
	}
	b.st.LimitRemaining = st.Remaining
	if l.Unlimited() {
		return // as upstream: OK, remaining MaxUint32, no current_limit
	}
	if b.st.CurrentLimit = p.limit(st); b.st.CurrentLimit == nil {
		b.st.CurrentLimit = currentLimit(l)
	}
	b.dur.Seconds = int64(st.Reset / time.Second)
	b.dur.Nanos = int32(st.Reset % time.Second)
	b.st.DurationUntilReset = &b.dur
}

// currentLimit is l as Envoy receives it in current_limit; nil when unlimited.
func currentLimit(l *descriptors.Limit) *rlsv3.RateLimitResponse_RateLimit {
	if l == nil || l.Unlimited() {
		return nil
	}
	out := &rlsv3.RateLimitResponse_RateLimit{
		Name:            l.Name(),
		RequestsPerUnit: l.RequestsPerUnit(),
		Unit:            rlsv3.RateLimitResponse_RateLimit_Unit(l.Unit()),
	}
	if m := l.UnitMultiplier(); m > 1 {
		out.UnitMultiplier = wrapperspb.UInt32(m)
	}
	return out
}

// headers describes the descriptor closest to its limit, as upstream does: an
// over-limit descriptor when there is one, so the headers explain the refusal.
func (s *Service) headers(sts []engine.Status) []*corev3.HeaderValue {
	best := -1
	for i := range sts {
		if sts[i].Limit == nil || sts[i].Limit.Unlimited() {
			continue
		}
		if best < 0 || closer(&sts[i], &sts[best]) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	st := &sts[best]
	reset := int64(math.Ceil(st.Reset.Seconds()))
	return []*corev3.HeaderValue{
		{Key: s.opts.HeaderLimit, Value: strconv.FormatUint(uint64(st.Limit.RequestsPerUnit()), 10)},
		{Key: s.opts.HeaderRemaining, Value: strconv.FormatUint(uint64(st.Remaining), 10)},
		{Key: s.opts.HeaderReset, Value: strconv.FormatInt(reset, 10)},
	}
}

// closer reports whether a is closer to its limit than b.
func closer(a, b *engine.Status) bool {
	aOver, bOver := a.Code == engine.OverLimit, b.Code == engine.OverLimit
	if aOver != bOver {
		return aOver
	}
	return a.Remaining < b.Remaining
}
