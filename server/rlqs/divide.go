package rlqs

import (
	"cmp"
	"context"
	"math"
	"slices"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
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
	// A share with a burst still ramping is divided again at the next tick.
	for _, sh := range s.ramping {
		s.markDirty(sh)
	}
	s.ramping = s.ramping[:0]
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

// retryLeases binds again the ids whose key could not be leased: a lease
// fails when the engine has no weight group free, and groups come free as
// other keys are released and values cool. Until one succeeds the ids stay
// denied. A failure ends the round: the next key would find no group free
// either, and each try takes the engine's lock.
func (s *Service) retryLeases(now int64) {
	for e := range s.unleased {
		if !s.bind(e, s.opt.Engine.Resolve(e.domain, e.id), now) {
			return
		}
		for _, c := range e.consumers {
			s.queue(c)
		}
	}
}

// sweep abandons idle consumers, drops expired reservations, retries the
// leases that failed and marks every share for division.
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
	s.retryLeases(now)
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
	parts := make([]Part, len(cs))
	for i := range cs {
		parts[i] = part(i)
	}
	rls := part(len(cs))
	wholeTokens(parts, Part{avail.Rate - rls.Rate, avail.Burst - rls.Burst})
	if now-s.startedAt < int64(s.opt.StartHold) {
		for i, c := range cs {
			parts[i] = startCap(parts[i], c, budget.Burst)
		}
	}
	sh.budget, sh.assigned = budget, reserved
	unused := !sh.drawn && offered == 0 && reserved == (Part{})
	for _, c := range cs {
		unused = unused && !c.hasSent
	}
	for i, c := range cs {
		c.firstFull = unused && !c.inherited // see paced
		c.part.step(parts[i], now, int64(s.opt.Hold))
		sh.assigned = addPart(sh.assigned, c.part.cur)
		if c.pacing(clampUint32(c.part.cur.Burst), now, s.ttl) { // Strategy's max_tokens
			s.ramping = append(s.ramping, sh)
		}
		if !c.hasSent || encode(s.strategy(c, now)) != c.sent {
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

// wholeTokens rounds the streams' parts to what Envoy can enforce when one
// of them would fall under one token at once: Envoy's max_tokens is whole,
// so such a part is DENY_ALL, and parts of a small share divided among
// several streams would all be (a share of one token over two streams: two
// halves, nothing admitted). Then each part keeps its whole tokens, the
// tokens left over go one each to the parts with none, the largest first
// (the most demand), and a part left with no token gives its rate to those
// with, in proportion. The tokens and rates come from budget, the streams'
// part of the share (what demand.Apportion gave them may fall short of it
// by a rounding error, and so of a whole token), so the parts stay within
// the share; streams whose part of the share is under one token stay
// DENY_ALL.
func wholeTokens(parts []Part, budget Part) {
	short := false
	for _, p := range parts {
		short = short || p.Rate > 0 && p.Burst < 1
	}
	if !short {
		return
	}
	left := math.Floor(budget.Burst + 1e-9)
	tokens := make([]float64, len(parts))
	for i, p := range parts {
		tokens[i] = math.Floor(p.Burst)
		left -= tokens[i]
	}
	order := make([]int, len(parts))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(parts[b].Rate, parts[a].Rate) })
	for _, i := range order {
		if left < 1 {
			break
		}
		if tokens[i] == 0 && parts[i].Rate > 0 {
			tokens[i]++
			left--
		}
	}
	var kept float64
	for i, p := range parts {
		if tokens[i] > 0 {
			kept += p.Rate
		}
	}
	for i, p := range parts {
		if tokens[i] == 0 {
			parts[i] = Part{}
			continue
		}
		parts[i] = Part{budget.Rate * p.Rate / kept, tokens[i]}
	}
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

// strategy is c's assignment at now: its part, its burst's grows paced
// (ramp.go); under the global shadow mode ALLOW_ALL,
// as a shadow-mode rule's (adapter.go), whatever the part.
func (s *Service) strategy(c *consumer, now int64) *typev3.RateLimitStrategy {
	e := c.e
	switch {
	case e.target.Kind == Unlimited || s.opt.ShadowMode:
		return Blanket(true)
	case e.share == nil || !c.part.set:
		return Blanket(false)
	}
	return c.paced(Strategy(c.part.cur, e.share.fill), now, s.ttl)
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

// flush sends every stream its queued actions, as one answer of responses
// of at most maxResponseBytes. A stream whose queue is full, or holds
// maxUnsentBytes unsent, is ended: it is not reading.
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
			strat := s.strategy(c, now)
			c.noteSent(strat, now, s.ttl)
			out = append(out, action(c.e.id, strat, s.ttl))
		}
		st.out, st.pending = nil, nil
		if len(out) == 0 {
			continue
		}
		a := split(out)
		sent := false
		if st.unsent.Load() < maxUnsentBytes {
			st.unsent.Add(a.bytes)
			select {
			case st.queue <- a:
				s.pushes.Add(uint64(len(a.msgs)))
				sent = true
			default:
			}
		}
		if !sent {
			s.refuse(reasonSlowClient)
			st.end(errSlow)
			s.closeLocked(st, now)
		}
	}
}

// split puts actions in responses of at most maxResponseBytes each (one
// action alone is far smaller: MaxIDBytes and a strategy).
func split(actions []*rlqsv3.RateLimitQuotaResponse_BucketAction) answer {
	var a answer
	start, size := 0, 0
	for i, x := range actions {
		n := proto.Size(x)
		n += protowire.SizeTag(1) + protowire.SizeVarint(uint64(n))
		if size+n > maxResponseBytes && i > start {
			a.msgs = append(a.msgs, &rlqsv3.RateLimitQuotaResponse{BucketAction: actions[start:i:i]})
			start, size = i, 0
		}
		size += n
		a.bytes += int64(n)
	}
	a.msgs = append(a.msgs, &rlqsv3.RateLimitQuotaResponse{BucketAction: actions[start:]})
	return a
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
