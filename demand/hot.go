package demand

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// Per-value rules. A rule with a bucket per value (a per-client limit) is
// divided value by value, for its hottest values only: each replica
// reports, per such rule, its demand for every value the last parameters
// made hot (0 included: a replica that gives up a value's share must say
// so) and for its own hottest other values, as candidates; the leader
// makes the values with the most demand in the cluster hot (Hottest) and
// divides each as a rule of its own. Every other value keeps the equal
// share on every replica.

// Stickiness: a value already hot ranks with its demand raised by this
// part, so two values of about the same demand do not swap places (and
// hand their slots back and forth) every division.
const Stickiness = 0.25

// QualifyRatio: a value can be made hot only when some replica offers it
// more than this part of that replica's equal share. Below it every replica
// has what it wants under equal shares, and dividing the value gains
// nothing.
const QualifyRatio = 0.5

// Hottest picks the hot values of one rule: at most k of those that
// qualify, by total demand over the replicas (a value in hot counting
// 1+Stickiness times its demand), the highest first, ties by the lower ID.
// It returns them sorted by ID.
func Hottest(total map[uint64]float64, qualifies map[uint64]bool, hot map[uint64]bool, k int) []uint64 {
	type ranked struct {
		id    uint64
		score float64
	}
	var all []ranked
	for id, t := range total {
		if !qualifies[id] {
			continue
		}
		s := sane(t)
		if hot[id] {
			s *= 1 + Stickiness
		}
		all = append(all, ranked{id, s})
	}
	slices.SortFunc(all, func(a, b ranked) int { return cmp.Or(cmp.Compare(b.score, a.score), cmp.Compare(a.id, b.id)) })
	out := make([]uint64, 0, min(len(all), max(k, 0)))
	for _, r := range all[:min(len(all), max(k, 0))] {
		out = append(out, r.id)
	}
	slices.Sort(out)
	return out
}

// Candidates smooths a replica's sampled demand for the values of one
// per-value rule that are not hot into per-second rates, and keeps at most
// Cap of them: the ones it drops are those with the least demand, so a
// value carrying a large part of the rule's traffic is never dropped for
// the many that carry little. The zero value is ready once Cap is set.
type Candidates struct {
	Cap   int
	rates map[uint64]float64
	last  time.Time
}

// Observe folds in the sampled tokens counts of each value since the last
// call (each sampled token standing for scale tokens), read at now, with
// time constant tau. A value not in counts decays towards 0.
func (c *Candidates) Observe(counts map[uint64]uint64, scale float64, now time.Time, tau time.Duration) {
	if c.rates == nil {
		c.rates = make(map[uint64]float64)
	}
	if c.last.IsZero() {
		c.last = now
		return // the first call only primes: counts cover an unknown time
	}
	dt := now.Sub(c.last).Seconds()
	if dt <= 0 {
		return
	}
	c.last = now
	alpha := 1.0
	if tau > 0 {
		alpha = 1 - math.Exp(-dt/tau.Seconds())
	}
	for id, r := range c.rates {
		r += alpha * (float64(counts[id])*scale/dt - r)
		if r < 1e-3 {
			delete(c.rates, id)
			continue
		}
		c.rates[id] = r
	}
	for id, n := range counts {
		if _, ok := c.rates[id]; !ok && n > 0 {
			c.rates[id] = alpha * float64(n) * scale / dt
		}
	}
	if over := len(c.rates) - max(c.Cap, 0); over > 0 {
		for _, v := range c.Top(over + max(c.Cap, 0))[max(c.Cap, 0):] {
			delete(c.rates, v.ID)
		}
	}
}

// Rate is value id's smoothed rate, 0 when it is not a candidate.
func (c *Candidates) Rate(id uint64) float64 { return c.rates[id] }

// Forget drops value id (it became hot: its own meter takes over).
func (c *Candidates) Forget(id uint64) { delete(c.rates, id) }

// Len is the number of candidates kept.
func (c *Candidates) Len() int { return len(c.rates) }

// Top returns the n candidates with the highest rates, highest first, ties
// by the lower ID.
func (c *Candidates) Top(n int) []ValueDemand {
	out := make([]ValueDemand, 0, len(c.rates))
	for id, r := range c.rates {
		out = append(out, ValueDemand{ID: id, Offered: r})
	}
	slices.SortFunc(out, func(a, b ValueDemand) int { return cmp.Or(cmp.Compare(b.Offered, a.Offered), cmp.Compare(a.ID, b.ID)) })
	return out[:min(len(out), max(n, 0))]
}
