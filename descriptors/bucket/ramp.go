package bucket

import (
	"math"
	"time"
)

// Ramp is a join ramp, or a rule's ramp. A join ramp: a replica that starts
// with no state while others serve would otherwise hand out a full bucket
// for every key, while the cluster's buckets for the same keys are spent.
// Under a join ramp (Store.SetRamp) a new bucket starts no fuller than the
// time since Start over the rule's ramp: 0 at Start, full after it. Buckets
// that exist already are not touched, and a bucket is never made fuller
// than it would be without the ramp: tighter for keys nobody used yet, never
// looser. A rule's ramp (Request.Ramp) is the same line for one rule that a
// reload added, and it holds the rule's existing buckets to it too.
type Ramp struct {
	Start int64 // on the store's clock
	// Fixed, when positive, is every rule's ramp; otherwise a rule's is its
	// burst time, Size ÷ Rate, at most Cap.
	Fixed, Cap time.Duration
}

// Duration is the ramp of a limit with p.
func (r *Ramp) Duration(p *Params) time.Duration {
	if r.Fixed > 0 {
		return r.Fixed
	}
	if p.Blocked() {
		return 0
	}
	return min(time.Duration(p.Size/p.Rate*float64(time.Second)), r.Cap)
}

// End is when every rule's ramp is over.
func (r *Ramp) End() int64 {
	if r.Fixed > 0 {
		return r.Start + int64(r.Fixed)
	}
	return r.Start + int64(r.Cap)
}

// Fill is the most a new bucket of p may start at, at now.
func (r *Ramp) Fill(p *Params, now int64) float64 {
	d := r.Duration(p)
	if d <= 0 || now-r.Start >= int64(d) {
		return 1
	}
	return math.Max(0, float64(now-r.Start)/float64(d))
}

// hold caps s at the ramp's fill at now. A rule's ramp (Request.Ramp) holds
// every bucket of the rule, the ones it finds as well as the ones it
// creates: a bucket left from an earlier life of the rule (a rename undone,
// a block lifted) is no fuller than a new one.
func (r *Ramp) hold(s *State, p *Params, now int64) {
	if f := r.Fill(p, now); s.Fill > f {
		s.Fill = f
	}
}

// SetRamp starts a join ramp, or ends one with nil.
func (s *Store) SetRamp(r *Ramp) { s.ramp.Store(r) }

// Ramp returns the ramp in progress at now, or nil when there is none or it
// is over.
func (s *Store) Ramp(now int64) *Ramp {
	r := s.ramp.Load()
	if r == nil || now >= r.End() {
		return nil
	}
	return r
}

// RampRejected is how many draws a join ramp refused outright: first draws
// on a key, which a bucket without the ramp would have admitted. Later
// draws on a ramped bucket are not told apart; RampWithheld bounds them.
func (s *Store) RampRejected() uint64 { return s.rampRejected.Load() }

// RampWithheld is the tokens a join ramp held back from the buckets it
// started: the most it can have refused, in all.
func (s *Store) RampWithheld() uint64 { return s.rampWithheld.Load() }
