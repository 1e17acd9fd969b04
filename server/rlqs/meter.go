package rlqs

import "math"

// Demand sharing reads the engine's meters every 100 ms, with a time
// constant of a fraction of a second. Envoy reports every 5 s: counted when
// it arrives, a report reads as a spike and then as nothing, and the leader
// gives the replica little more than a floor. So what a report says is
// counted as a flow instead: at the rate it reported, tick by tick, until the
// next report replaces the rate or the stream ends.

// meterFrom starts counting c's reported demand, when its bucket is limited
// and its demand known.
func (s *Service) meterFrom(c *consumer) {
	if !c.metered && c.known && c.e.target.Kind == Limited {
		c.metered = true
		s.metered = append(s.metered, c)
	}
}

// meter counts, for the time since the last tick, what each metered
// consumer's Envoy reported offering and admitting. A consumer whose stream
// ended or whose id was abandoned stays in the flow until its last
// assignment expires, since its Envoy may admit at it until then; one whose
// id was rebound to no limited rule leaves it.
func (s *Service) meter(now int64) {
	// At most a second: the first tick, or a divider that stalled, counts
	// less than was reported, never more.
	dt := min(float64(now-s.lastMeter)/1e9, 1)
	s.lastMeter = now
	if !(dt > 0) {
		dt = 0
	}
	keep := s.metered[:0]
	for _, c := range s.metered {
		gone := c.st.ended || c.st.consumers[c.e] != c
		if c.e.target.Kind != Limited || gone && now >= c.meterUntil {
			c.metered = false
			continue
		}
		keep = append(keep, c)
		c.owed[0] += c.demand * dt
		c.owed[1] += c.admits * dt
		off, adm := math.Floor(c.owed[0]), math.Floor(c.owed[1])
		if off >= 1 {
			adm = min(adm, off)
			c.owed[0] -= off
			c.owed[1] -= adm
			s.opt.Engine.Reported(c.e.target, uint64(off), uint64(adm))
		}
	}
	clear(s.metered[len(keep):])
	s.metered = keep
}
