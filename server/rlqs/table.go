package rlqs

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sharelimit/sharelimit/descriptors/engine"
)

// idEntry is one distinct (domain, bucket id): what it resolved to, the
// streams reporting it, and what ended streams may still enforce for it.
type idEntry struct {
	key       string // domain and canonical id (idKey)
	domain    string
	id        map[string]string
	target    Target
	share     *share // nil unless target is Limited and leased
	consumers map[*stream]*consumer
	reserved  []reservation
	// unleased: its target is Limited, but its key could not be leased; it
	// is denied until a retry (retryLeases) leases it.
	unleased bool
	size     int // its keys' and values' bytes, counted in idBytes
}

// reservation is a part an ended or abandoned consumer's Envoy may still
// enforce, until its assignment's time to live has passed.
type reservation struct {
	part  Part
	until int64
}

// shareKey identifies one share: the engine's bucket key in a domain.
type shareKey struct {
	domain string
	key    uint64
}

// share is this replica's share of one bucket key, divided among the
// consumers of its ids and the RLS lease.
type share struct {
	key     shareKey
	target  Target // as of the last division
	fill    int64  // whole seconds, fixed for the rule
	lease   Lease
	rls     held
	entries map[*idEntry]struct{}
	// offered and at are the lease's count and the time of the last
	// division, for RLS's demand.
	offered   uint64
	at        int64
	rlsDemand float64
	dirty     bool
	now       bool // listed to be divided before the report's answer
	// assigned is the sum of the parts given at the last division,
	// reservations included; budget is the share then.
	assigned, budget Part
	drawn            bool // RLS had drawn on the key before the lease
}

// consumer is one stream's use of one bucket id.
type consumer struct {
	st     *stream
	e      *idEntry
	demand float64
	known  bool // demand was measured over a period
	// admits is the rate the Envoy reported admitting; owed is what the
	// meter flow has yet to count, offered and admitted (meter.go).
	admits  float64
	period  float64 // seconds the last report covered
	owed    [2]float64
	metered bool
	// meterUntil: once c is dropped, its demand stays metered until then,
	// when its last assignment expires.
	meterUntil int64
	reported   int64
	active     int64 // last report with requests in it
	part       held
	sent       encoded
	hasSent    bool
	// maxAt is when the max_tokens sent last changed, sentAt when the last
	// assignment was sent (ramp.go).
	maxAt, sentAt int64
	// inherited: its first report had a period behind it (StartHold).
	inherited bool
	// firstFull: its first assignment may start full (ramp.go paced).
	firstFull bool
	queued    bool // an action for it waits in st.out
}

// held is a part whose grows wait for the hold.
type held struct {
	cur, pending Part
	set, growing bool
	since        int64
}

// stream is one open RLQS stream.
type stream struct {
	id        uint64
	peer      string
	domain    string
	opened    int64
	reports   uint64
	queue     chan answer
	unsent    atomic.Int64 // bytes in queue
	end       context.CancelCauseFunc
	consumers map[*idEntry]*consumer
	// out are actions waiting for flush (abandons, denials of ids not
	// held); pending are consumers whose assignment waits for it.
	out      []*rlqsv3.RateLimitQuotaResponse_BucketAction
	pending  []*consumer
	flushing bool // listed in Service.flushing
	ended    bool
}

// answer is one flush's responses to a stream, and their size.
type answer struct {
	msgs  []*rlqsv3.RateLimitQuotaResponse
	bytes int64
}

// validate checks a report before anything of it is used: a domain (this
// message's or the stream's first), and bucket ids within the limits RLS
// requests have. An empty report is fine (Envoy sends one when it holds no
// bucket).
func validate(r *rlqsv3.RateLimitQuotaUsageReports, st *stream) error {
	if len(r.GetDomain()) > engine.MaxValueBytes {
		return status.Errorf(codes.InvalidArgument, "rlqs: domain: %d bytes, at most %d allowed", len(r.GetDomain()), engine.MaxValueBytes)
	}
	if r.GetDomain() == "" && st.domain == "" {
		return status.Error(codes.InvalidArgument, "rlqs: domain: the stream's first report names no domain")
	}
	for i, u := range r.GetBucketQuotaUsages() {
		if err := validID(u.GetBucketId().GetBucket()); err != nil {
			return status.Errorf(codes.InvalidArgument, "rlqs: bucket_quota_usages[%d].bucket_id: %s", i, err)
		}
	}
	return nil
}

// MaxIDBytes bounds the keys and values of one bucket id together. Each
// distinct id is stored (twice: its map and its key in the table) for as
// long as it is reported, up to --max-buckets of them, so the entry limits
// RLS has for a request it forgets at once (64 entries of up to 4 KiB) are
// too loose here. Envoy's ids are a few short strings (a rule name, a
// header's value, an address); 8 KiB still takes a value as long as RLS
// takes, beside a few short ones.
const MaxIDBytes = 8 << 10

// validID is the limits of a bucket id.
func validID(id map[string]string) error {
	switch {
	case len(id) == 0:
		return fmt.Errorf("empty")
	case len(id) > engine.MaxDescriptors:
		return fmt.Errorf("%d entries, at most %d allowed", len(id), engine.MaxDescriptors)
	}
	size := 0
	for k, v := range id {
		switch {
		case k == "":
			return fmt.Errorf("an empty key")
		case len(k) > engine.MaxKeyBytes:
			return fmt.Errorf("a key of %d bytes, at most %d allowed", len(k), engine.MaxKeyBytes)
		case len(v) > engine.MaxValueBytes:
			return fmt.Errorf("key %.64q: a value of %d bytes, at most %d allowed", k, len(v), engine.MaxValueBytes)
		}
		size += len(k) + len(v)
	}
	if size > MaxIDBytes {
		return fmt.Errorf("%d bytes of keys and values, at most %d allowed", size, MaxIDBytes)
	}
	return nil
}

// idKey is the map key of (domain, id): lengths then text, keys sorted, so
// distinct ids never collide.
func idKey(domain string, id map[string]string) string {
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "%d:%s", len(domain), domain)
	for _, k := range keys {
		fmt.Fprintf(&b, "|%d:%s=%d:%s", len(k), k, len(id[k]), id[k])
	}
	return b.String()
}

// open registers a new stream; nil when MaxStreams are open.
func (s *Service) open(end context.CancelCauseFunc, peer string) *stream {
	s.everOpened.Store(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.streams) >= s.opt.MaxStreams {
		return nil
	}
	s.nextStream++
	st := &stream{id: s.nextStream, peer: peer, opened: s.opt.Clock(), end: end,
		queue: make(chan answer, s.opt.Queue), consumers: map[*idEntry]*consumer{}}
	s.streams[st.id] = st
	return st
}

// close ends st: its consumers' last assignments stay reserved until their
// time to live has passed, since its Envoy keeps enforcing them.
func (s *Service) close(st *stream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeLocked(st, s.opt.Clock())
}

func (s *Service) closeLocked(st *stream, now int64) {
	if st.ended {
		return
	}
	st.ended = true
	st.out, st.pending = nil, nil
	delete(s.streams, st.id)
	for e, c := range st.consumers {
		s.drop(c, now)
		delete(st.consumers, e)
	}
}

// drop removes c from its id, reserving what its Envoy may still enforce,
// and keeps its reported demand metered for as long.
func (s *Service) drop(c *consumer, now int64) {
	e := c.e
	delete(e.consumers, c.st)
	s.npairs--
	c.meterUntil = now + s.ttl
	if e.share != nil && c.part.set {
		p := c.part.cur
		if c.hasSent {
			p = maxPart(p, c.sentPart(e.share))
		}
		e.reserved = append(e.reserved, reservation{part: p, until: now + s.ttl})
		s.markDirty(e.share)
	}
	s.prune(e, now)
}

// report records r from st and answers it: new ids are divided at once,
// known ones renew their assignment.
func (s *Service) report(st *stream, r *rlqsv3.RateLimitQuotaUsageReports) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.ended {
		return
	}
	now := s.opt.Clock()
	st.reports++
	var divideNow []*share
	domain := r.GetDomain()
	if domain == "" {
		domain = st.domain
	} else if st.domain == "" {
		st.domain = domain
	}
	for _, u := range r.GetBucketQuotaUsages() {
		id := u.GetBucketId().GetBucket()
		e := s.entry(domain, id, now)
		if e == nil {
			s.refuse(reasonOverflow)
			st.out = append(st.out, action(id, Blanket(s.opt.ShadowMode), s.ttl))
			s.noteOut(st)
			continue
		}
		c, fresh := st.consumers[e], false
		if c == nil {
			if s.npairs >= s.opt.MaxBuckets {
				// Each stream that reports an id holds state for it: the
				// pairs are bounded as the ids are.
				s.refuse(reasonOverflow)
				st.out = append(st.out, action(id, Blanket(s.opt.ShadowMode), s.ttl))
				s.noteOut(st)
				s.prune(e, now)
				continue
			}
			// A first report with a period behind it is a bucket its Envoy
			// had before this stream: it may enforce an assignment this
			// process never gave (StartHold).
			c, fresh = &consumer{st: st, e: e, active: now, inherited: u.GetTimeElapsed().AsDuration() > 0}, true
			st.consumers[e] = c
			e.consumers[st] = c
			s.npairs++
		}
		c.record(u, now)
		s.meterFrom(c)
		if e.share != nil {
			if fresh && !e.share.now {
				// A new id is answered in this report, after one division
				// of its share for all the new ids the report names.
				e.share.now = true
				divideNow = append(divideNow, e.share)
			}
			s.markDirty(e.share)
		}
		s.queue(c)
	}
	for _, sh := range divideNow {
		sh.now = false
		s.divide(sh, now)
	}
	s.flush(now)
}

// maxReportedRate bounds the demand one report can claim for one bucket, in
// requests a second: far above what one Envoy serves, and low enough that
// what the meters count from it (meter.go) can never wrap them or drown
// every other replica's demand. Counts near 2^64, or over a nanosecond, are
// no Envoy's.
const maxReportedRate = 1e7

// record takes one usage report's demand: requests (allowed and denied)
// over the period, Envoy's or, when Envoy says 0 s, this clock's, at most
// maxReportedRate.
func (c *consumer) record(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, now int64) {
	n := float64(u.GetNumRequestsAllowed()) + float64(u.GetNumRequestsDenied())
	elapsed := u.GetTimeElapsed().AsDuration().Seconds()
	if !(elapsed > 0) && c.reported != 0 {
		elapsed = float64(now-c.reported) / 1e9
	}
	if elapsed > 0 {
		c.demand, c.known = min(n/elapsed, maxReportedRate), true
		c.admits = min(float64(u.GetNumRequestsAllowed())/elapsed, c.demand)
		c.period = elapsed
	}
	c.reported = now
	if n > 0 {
		c.active = now
	}
}

// bind attaches e to the share of t (a Limited one), leasing the key for a
// new share. A key that cannot be leased is denied over RLQS until a retry
// leases it; false then.
func (s *Service) bind(e *idEntry, t Target, now int64) bool {
	e.target = t
	retry := e.unleased
	if retry {
		e.unleased = false
		delete(s.unleased, e)
	}
	if t.Kind != Limited {
		switch t.Kind {
		case UnknownDomain:
			s.refuse(reasonUnknownDomain)
		case NoRule, NoLimit:
			s.refuse(reasonNoRule)
		}
		return true
	}
	k := shareKey{e.domain, t.Key}
	sh := s.shares[k]
	if sh == nil {
		lease, err := s.opt.Engine.Lease(t, now)
		if err != nil {
			if !retry {
				s.refuse(reasonLease)
				s.log.Warn("rlqs: no lease for a bucket key; its ids are denied over RLQS until one can be had", "domain", e.domain, "rule", t.Rule, "err", err)
			}
			e.target.Kind = NoLimit
			e.unleased = true
			s.unleased[e] = struct{}{}
			return false
		}
		sh = &share{key: k, target: t, fill: fillSeconds(t.Rate, t.WindowSeconds), lease: lease,
			entries: map[*idEntry]struct{}{}, at: now, drawn: drawnBefore(lease)}
		sh.offered, _ = lease.Counts()
		// RLS had the whole share until now: its part starts there.
		sh.rls = held{cur: Part{t.Rate * t.Weight, t.Burst * t.Weight}, set: true}
		s.shares[k] = sh
	}
	sh.entries[e] = struct{}{}
	e.share = sh
	return true
}

// unbind detaches e from its share, releasing a share left with no ids.
func (s *Service) unbind(e *idEntry, now int64) {
	sh := e.share
	if sh == nil {
		return
	}
	e.share = nil
	delete(sh.entries, e)
	if len(sh.entries) == 0 {
		sh.lease.Release(now)
		delete(s.shares, sh.key)
		return
	}
	s.markDirty(sh)
}

// prune drops e's expired reservations, and e itself once nothing uses it.
func (s *Service) prune(e *idEntry, now int64) {
	e.reserved = slices.DeleteFunc(e.reserved, func(r reservation) bool { return r.until <= now })
	if len(e.consumers) == 0 && len(e.reserved) == 0 {
		s.unbind(e, now)
		delete(s.ids, e.key)
		delete(s.unleased, e)
		s.idBytes -= e.size
	}
}

func (s *Service) markDirty(sh *share) {
	if !sh.dirty {
		sh.dirty = true
		s.dirty = append(s.dirty, sh)
	}
}

func maxPart(a, b Part) Part { return Part{max(a.Rate, b.Rate), max(a.Burst, b.Burst)} }
func minPart(a, b Part) Part { return Part{min(a.Rate, b.Rate), min(a.Burst, b.Burst)} }
