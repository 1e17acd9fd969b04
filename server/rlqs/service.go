package rlqs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sharelimit/sharelimit/internal/monotime"
)

// Defaults of Options.
const (
	DefaultTTL          = 15 * time.Second
	DefaultAbandonAfter = 2 * time.Minute
	DefaultTick         = 100 * time.Millisecond
	DefaultQueue        = 16
	DefaultMaxStreams   = 4096
	// maxResponseBytes bounds one response, so that an answer to a large
	// report, or a push to a stream of many buckets, stays well under a
	// client's message limit (gRPC's default is 4 MiB): an answer is split
	// into as many responses as it needs.
	maxResponseBytes = 1 << 20
	// maxUnsentBytes bounds what a stream holds unsent: past it, the next
	// answer ends the stream as a slow client. An answer is always queued
	// when less is waiting, so one stream pins at most this and one answer
	// (which holds no more than its stream's buckets, or one report's).
	maxUnsentBytes = 8 << 20
)

// Options configure a Service. Engine and Clock are required.
type Options struct {
	Engine Engine
	Clock  monotime.Clock
	// TTL is every assignment's time to live, whole seconds, at least 1 s.
	TTL time.Duration
	// AbandonAfter: a bucket a stream reports idle (no requests) this long
	// is abandoned on that stream, since Envoy never drops one itself.
	AbandonAfter time.Duration
	// Hold is how long a grow of an assignment waits (the daemon gives 200 ms:
	// the share's own grows have waited already, before the weight moved).
	Hold time.Duration
	// StartHold: for this long after New, a stream's part of a bucket its
	// Envoy had before the stream (its first report covered a period) is at
	// most the rate its Envoy reported admitting, less the share's burst
	// over that period, and a new bucket gets DENY_ALL (startCap). After a
	// restart the node's Envoys still enforce the previous process's
	// assignments, which this one does not know, until each has reported
	// here: within Envoy's 5 s report interval. 0 leaves parts uncapped
	// from the start.
	StartHold time.Duration
	// MaxBuckets caps the distinct bucket ids held; past it, new ids are
	// denied, unstored (--max-buckets).
	MaxBuckets int
	// MaxIDBytes caps the bytes (keys and values) of the bucket ids held;
	// past it, new ids are denied, unstored, as past MaxBuckets. 0 is
	// DefaultMaxIDBytes.
	MaxIDBytes int
	// MaxStreams caps the open streams; past it a new one is refused.
	MaxStreams int
	// Tick is the divider's period.
	Tick time.Duration
	// Queue is each stream's bound of answers (to a report, or a push of
	// the divider's) not yet sent, each one or more responses; a client
	// that lets it fill, or leaves 8 MiB of them unsent, has its stream
	// ended.
	Queue int
	// ShadowMode is the global --shadow-mode: every assignment is
	// ALLOW_ALL, as RLS then answers OK to every request, while the shares
	// are still divided, so the pages and metrics show the parts each
	// stream would have had.
	ShadowMode bool
	Logger     *slog.Logger
}

// Service is the RateLimitQuotaService. Safe for concurrent use; its zero
// value is not usable (New). Its divider runs in Run.
type Service struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer

	opt Options
	ttl int64 // nanoseconds, whole seconds
	// startedAt is New's time, from which StartHold runs.
	startedAt int64
	log       *slog.Logger

	mu      sync.Mutex
	ids     map[string]*idEntry
	shares  map[shareKey]*share
	streams map[uint64]*stream
	dirty   []*share
	// ramping are the shares divided in this tick with a burst still
	// ramping (ramp.go).
	ramping []*share
	// flushing are the streams with actions waiting for flush.
	flushing   []*stream
	nextStream uint64
	reload     bool // re-resolve every id at the next tick
	lastSweep  int64
	overflowed bool // logged the first overflow
	idBytes    int  // the bytes of the ids held (ids.go)
	// metered are the consumers whose reported demand is counted in the
	// engine's meters as a flow (meter.go), and lastMeter when it last was.
	metered   []*consumer
	lastMeter int64
	// npairs counts the stream and id pairs held, bounded by MaxBuckets.
	npairs int
	// unleased are the ids denied because their key could not be leased.
	unleased map[*idEntry]struct{}

	everOpened atomic.Bool
	divisions  atomic.Uint64 // shares divided, for tests
	reports    atomic.Uint64
	pushes     atomic.Uint64
	refusals   [numReasons]atomic.Uint64
}

// Reasons a report, id or stream is refused or denied.
const (
	reasonInvalid = iota
	reasonUnknownDomain
	reasonNoRule
	reasonOverflow
	reasonLease
	reasonSlowClient
	reasonStreams
	numReasons
)

var reasonNames = [numReasons]string{"invalid", "unknown_domain", "no_rule", "overflow", "lease", "slow_client", "too_many_streams"}

var _ rlqsv3.RateLimitQuotaServiceServer = (*Service)(nil)

// New returns a service with opt; zero figures take their defaults.
func New(opt Options) (*Service, error) {
	if opt.Engine == nil || opt.Clock == nil {
		return nil, errors.New("rlqs: new: an engine and a clock are required")
	}
	if opt.TTL == 0 {
		opt.TTL = DefaultTTL
	}
	if opt.TTL < time.Second || opt.TTL%time.Second != 0 {
		return nil, fmt.Errorf("rlqs: new: ttl %s is not a whole number of seconds ≥ 1s", opt.TTL)
	}
	opt.AbandonAfter = cmpOr(opt.AbandonAfter, DefaultAbandonAfter)
	opt.Tick = cmpOr(opt.Tick, DefaultTick)
	opt.Queue = cmpOr(opt.Queue, DefaultQueue)
	opt.MaxStreams = cmpOr(opt.MaxStreams, DefaultMaxStreams)
	opt.MaxBuckets = cmpOr(opt.MaxBuckets, 1_000_000)
	opt.MaxIDBytes = cmpOr(opt.MaxIDBytes, DefaultMaxIDBytes)
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{opt: opt, ttl: int64(opt.TTL), log: opt.Logger, ids: map[string]*idEntry{},
		shares: map[shareKey]*share{}, streams: map[uint64]*stream{}, unleased: map[*idEntry]struct{}{},
		startedAt: opt.Clock()}, nil
}

// Serving starts StartHold afresh, now: the daemon calls it when its gRPC
// listener starts serving, which can be long after New (it first waits for
// its first xDS config), and Envoys can report only from then on.
func (s *Service) Serving() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.startedAt = s.opt.Clock()
}

func cmpOr[T int | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// errHalfClosed ends a stream whose client closed its side: nothing more
// will be reported on it.
var errHalfClosed = errors.New("rlqs: the client closed its side")

// errSlow ends a stream whose client does not read its responses.
var errSlow = status.Error(codes.ResourceExhausted, "rlqs: the client is not reading its responses; stream ended")

// StreamRateLimitQuotas serves one Envoy's stream: each report is recorded
// and answered with the assignments of its buckets (which also renews their
// time to live); the divider pushes changes in between.
func (s *Service) StreamRateLimitQuotas(ss grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	ctx, end := context.WithCancelCause(ss.Context())
	defer end(nil)
	st := s.open(end, peerOf(ctx))
	if st == nil {
		s.refuse(reasonStreams)
		return status.Errorf(codes.ResourceExhausted, "rlqs: %d streams are open, the most allowed", s.opt.MaxStreams)
	}
	defer s.close(st)
	go send(ctx, ss, st, end)
	reports := make(chan *rlqsv3.RateLimitQuotaUsageReports)
	go s.receive(ctx, ss, reports, end)
	for {
		select {
		case <-ctx.Done():
			return streamErr(ctx)
		case r := <-reports:
			s.reports.Add(1)
			if err := validate(r, st); err != nil {
				s.refuse(reasonInvalid)
				return err
			}
			s.report(st, r)
		}
	}
}

// streamErr is the status a stream ends with: its cause, unless the client
// went away (then no one reads it).
func streamErr(ctx context.Context) error {
	err := context.Cause(ctx)
	if errors.Is(err, errHalfClosed) {
		return nil
	}
	if _, ok := status.FromError(err); ok && !errors.Is(err, context.Canceled) {
		return err
	}
	return status.FromContextError(ctx.Err()).Err()
}

// receive reads reports until the stream ends, then ends it with the cause.
func (s *Service) receive(ctx context.Context, ss grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse],
	out chan<- *rlqsv3.RateLimitQuotaUsageReports, end context.CancelCauseFunc) {
	for {
		r, err := ss.Recv()
		if err != nil {
			err = recvErr(err)
			if status.Code(err) == codes.InvalidArgument {
				s.refuse(reasonInvalid)
			}
			end(err)
			return
		}
		select {
		case out <- r:
		case <-ctx.Done():
			return
		}
	}
}

// recvErr is the status for a failed read: a message that does not decode
// is the client's error, not ours. (grpc-go has already ended the stream
// with Internal by then; this is what the handler records.)
func recvErr(err error) error {
	if errors.Is(err, io.EOF) {
		return errHalfClosed
	}
	if st, ok := status.FromError(err); ok && st.Code() == codes.Internal {
		return status.Errorf(codes.InvalidArgument, "rlqs: read report: malformed message: %s", st.Message())
	}
	return err
}

// send writes st's queued answers until the stream ends. A write that
// fails ends the stream.
func send(ctx context.Context, ss grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse],
	st *stream, end context.CancelCauseFunc) {
	for {
		select {
		case <-ctx.Done():
			return
		case a := <-st.queue:
			for _, r := range a.msgs {
				if err := ss.Send(r); err != nil {
					end(err)
					return
				}
			}
			st.unsent.Add(-a.bytes)
		}
	}
}

func peerOf(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

func (s *Service) refuse(reason int) { s.refusals[reason].Add(1) }
