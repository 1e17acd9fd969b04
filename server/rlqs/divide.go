package rlqs

import (
	"cmp"
	"context"
	"slices"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sharelimit/sharelimit/demand"
)

// sweepEvery is how often the divider looks at every share (RLS demand,
// held grows, expired reservations, idle buckets), not only changed ones.
const sweepEvery = time.Second

// Run divides until ctx ends, one tick at a time.
func (s *Service) Run(ctx context.Context) error {
	t := time.NewTicker(s.opt.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.Tick()
		}
	}
}

// Reshare re-divides every share at the next tick: weights changed
// (membership, demand shares, hot values).
func (s *Service) Reshare() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sh := range s.shares {
		s.markDirty(sh)
	}
}

// Reload re-resolves every bucket id at the next tick: the rules changed.
func (s *Service) Reload() {
	s.mu.Lock()
	s.reload = true
	s.mu.Unlock()
}

// Tick is one round of the divider: re-resolve after a reload, divide the
// changed shares, and every sweepEvery all of them (with idle buckets
// abandoned), then push what changed.
func (s *Service) Tick() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opt.Clock()
	if s.reload {
		s.reload = false
		s.rebind(now)
	}
	s.meter(now)
	if now-s.lastSweep >= int64(sweepEvery) {
		s.lastSweep = now
		s.sweep(now)
	}
	dirty := s.dirty
	s.dirty = nil
	for _, sh := range dirty {
		if sh.dirty && s.shares[sh.key] == sh {
			s.divide(sh, now)
		}
		sh.dirty = false
	}
	s.flush(now)
}

// rebind resolves every id again, moving it to its new share.
func (s *Service) rebind(now int64) {
	for _, e := range s.ids {
		t := s.opt.Engine.Resolve(e.domain, e.id)
		if e.share != nil && t.Kind == Limited && t.Key == e.share.key.key {
			e.target = t
			s.markDirty(e.share)
			continue
		}
		// A new rule. The parts given so far are gone with the old share, but
		// not the reservations of streams that ended: their Envoys enforce
		// their last assignments until those expire, whatever the rules say
		// now, so they count against the id's new share.
		s.unbind(e, now)
		for _, c := range e.consumers {
			c.part = held{}
			s.queue(c)
		}
		s.bind(e, t, now)
		if e.share != nil {
			s.markDirty(e.share)
		}
	}
}

// sweep abandons idle consumers, drops expired reservations and marks every
// share for division.
func (s *Service) sweep(now int64) {
	idle := int64(s.opt.AbandonAfter)
	for _, e := range s.ids {
		for _, c := range e.consumers {
			if now-c.active >= idle {
				c.st.out = append(c.st.out, abandon(e.id))
				s.noteOut(c.st)
				delete(c.st.consumers, e)
				s.drop(c, now)
			}
		}
		if s.ids[e.key] == e {
			s.prune(e, now)
		}
	}
	for _, sh := range s.shares {
		s.markDirty(sh)
	}
}

// divide divides sh among its consumers and RLS: the share now (w·R, w·B),
// less what ended consumers may still enforce, by demand.Apportion; a shrink
// applies at once, a grow after the hold. Changed assignments are queued.
func (s *Service) divide(sh *share, now int64) {
	s.divisions.Add(1)
	sh.dirty = false
	var rep *idEntry
	var cs []*consumer
	var reserved Part
	for e := range sh.entries {
		rep = e
		for _, r := range e.reserved {
			if r.until > now {
				reserved.Rate += r.part.Rate
				reserved.Burst += r.part.Burst
			}
		}
		for _, c := range e.consumers {
			cs = append(cs, c)
		}
	}
	if rep == nil {
		return
	}
	// Weights move with membership and demand: read the one in force now.
	if t := s.opt.Engine.Resolve(rep.domain, rep.id); t.Kind == Limited && t.Key == sh.key.key {
		sh.target = t
	}
	t := sh.target
	budget := Part{t.Rate * t.Weight, t.Burst * t.Weight}
	avail := Part{max(0, budget.Rate-reserved.Rate), max(0, budget.Burst-reserved.Burst)}
	slices.SortFunc(cs, func(a, b *consumer) int {
		return cmp.Or(cmp.Compare(a.st.id, b.st.id), cmp.Compare(a.e.key, b.e.key))
	})
	offered, _ := sh.lease.Counts()
	if now > sh.at {
		sh.rlsDemand = float64(offered-sh.offered) / (float64(now-sh.at) / 1e9)
		sh.offered, sh.at = offered, now
	}
	wants := make([]demand.Want, len(cs)+1)
	for i, c := range cs {
		wants[i] = demand.Want{Units: 1, Offered: c.demand, Absent: !c.known}
	}
	// RLS takes part once it has drawn on the key: until then its floor
	// would be a part of the share nobody uses. Its first draws meet the
	// lease's least weight, and its part follows at the next division.
	var rlsUnits uint32
	if offered > 0 {
		rlsUnits = 1
	}
	wants[len(cs)] = demand.Want{Units: rlsUnits, Offered: sh.rlsDemand}
	_, rates := demand.Apportion(avail.Rate, 0, wants, demand.DefaultHeadroom, demand.DefaultFloor)
	part := func(i int) Part {
		if !(avail.Rate > 0) {
			return Part{}
		}
		return Part{rates[i], avail.Burst * rates[i] / avail.Rate}
	}
	sh.budget, sh.assigned = budget, reserved
	for i, c := range cs {
		c.part.step(part(i), now, int64(s.opt.Hold))
		sh.assigned = addPart(sh.assigned, c.part.cur)
		if !c.hasSent || encode(s.strategy(c)) != c.sent {
			s.queue(c)
		}
	}
	sh.rls.step(part(len(cs)), now, int64(s.opt.Hold))
	sh.assigned = addPart(sh.assigned, sh.rls.cur)
	w := 0.0
	if t.Rate > 0 && t.Burst > 0 {
		w = min(sh.rls.cur.Rate/t.Rate, sh.rls.cur.Burst/t.Burst)
	} else if t.Rate > 0 {
		w = sh.rls.cur.Rate / t.Rate
	}
	sh.lease.Set(w, now)
}

// step moves h toward target: a first part or a shrink at once; a grow once
// it has held for hold, to the least target seen meanwhile.
func (h *held) step(target Part, now, hold int64) {
	if !h.set {
		h.cur, h.set, h.growing = target, true, false
		return
	}
	kept := minPart(h.cur, target)
	if target.Rate <= h.cur.Rate && target.Burst <= h.cur.Burst {
		h.cur, h.growing = kept, false
		return
	}
	if !h.growing {
		h.growing, h.since, h.pending = true, now, target
	}
	h.pending = minPart(h.pending, target)
	if now-h.since >= hold {
		h.cur, h.growing = maxPart(kept, h.pending), false
		return
	}
	h.cur = kept
}

func addPart(a, b Part) Part { return Part{a.Rate + b.Rate, a.Burst + b.Burst} }

// strategy is c's assignment now.
func (s *Service) strategy(c *consumer) *typev3.RateLimitStrategy {
	e := c.e
	switch {
	case e.target.Kind == Unlimited:
		return Blanket(true)
	case e.share == nil || !c.part.set:
		return Blanket(false)
	}
	return Strategy(c.part.cur, e.share.fill)
}

// sentPart is the part c's last assignment lets its Envoy admit.
func (c *consumer) sentPart(sh *share) Part {
	if c.sent.blanket != 0 || c.sent.fill == 0 {
		return Part{}
	}
	return Part{float64(c.sent.perFill) / float64(c.sent.fill), float64(c.sent.maxTokens)}
}

// queue puts c's assignment in its stream's next response.
func (s *Service) queue(c *consumer) {
	if c.queued || c.st.ended {
		return
	}
	c.queued = true
	s.noteOut(c.st)
	c.st.pending = append(c.st.pending, c)
}

func (s *Service) noteOut(st *stream) {
	if !st.flushing {
		st.flushing = true
		s.flushing = append(s.flushing, st)
	}
}

// flush sends every stream its queued actions, in responses of at most
// maxActions. A stream whose queue is full is ended: it is not reading.
func (s *Service) flush(now int64) {
	list := s.flushing
	s.flushing = nil
	for _, st := range list {
		st.flushing = false
		if st.ended {
			continue
		}
		out := st.out
		for _, c := range st.pending {
			c.queued = false
			if st.consumers[c.e] != c {
				continue // abandoned meanwhile
			}
			strat := s.strategy(c)
			c.sent, c.hasSent = encode(strat), true
			out = append(out, action(c.e.id, strat, s.ttl))
		}
		st.out, st.pending = nil, nil
		for len(out) > 0 {
			n := min(len(out), maxActions)
			select {
			case st.queue <- &rlqsv3.RateLimitQuotaResponse{BucketAction: out[:n:n]}:
				s.pushes.Add(1)
			default:
				s.refuse(reasonSlowClient)
				st.end(errSlow)
				s.closeLocked(st, now)
				out = nil
				continue
			}
			out = out[n:]
		}
	}
}

// action is an assignment for id.
func action(id map[string]string, strat *typev3.RateLimitStrategy, ttl int64) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: &rlqsv3.BucketId{Bucket: id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: &durationpb.Duration{Seconds: ttl / int64(time.Second)},
				RateLimitStrategy:    strat,
			}},
	}
}

// abandon tells Envoy to drop id.
func abandon(id map[string]string) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId:     &rlqsv3.BucketId{Bucket: id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
	}
}
