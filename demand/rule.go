package demand

import "math"

// Defaults of the rule's two tuning figures.
const (
	// DefaultHeadroom is h: a replica that wants less than its equal share
	// gets 5% more than it wants, so demand that grows a little between two
	// reports is not cut at once. It is what the cluster gives up of L under
	// skew: at most h times the demand of the replicas under their share.
	DefaultHeadroom = 0.05
	// DefaultFloor is f: every live replica keeps at least 10% of its equal
	// share, so one whose demand jumps from nothing is not starved until its
	// next report is divided.
	DefaultFloor = 0.1
	// slack shrinks what the rule hands out by a relative 1e-9, so rounding
	// in the replicas' own evaluation of their shares (n equal shares of
	// L/n each can add up to L plus an ulp) can never add up to more than L.
	slack = 1e-9
)

// Want is one replica's entry in a snapshot.
type Want struct {
	// Units is the replica's weight (the sum of its instances' Consul
	// weights; 1 without weights). A replica with 0 units gets nothing.
	Units uint32
	// Offered is its smoothed offered demand, per second.
	Offered float64
	// Absent: it has no fresh report; it counts at its equal share.
	Absent bool
}

// Rule is the parameters of one limit's division: with them and its own
// report, each replica computes its own share (Share).
type Rule struct {
	Limit    float64 // L, per second, as the leader read it from its config
	Units    uint32  // U: the units the limit was divided among
	Headroom float64 // h
	Floor    float64 // f
	K        float64 // the part of their excess the replicas over their equal share get, in [0, 1]
	R        float64 // what is left, as a fraction of each equal share, ≥ 0
}

// Divide computes the parameters of one limit from one snapshot. units is
// the units of the leader's membership view; if the snapshot holds more, the
// snapshot's count is used, so the shares never sum past limit. Bad figures
// (NaN, negative, infinite demand; a negative limit) count as demand 0 or an
// empty division, never as more.
func Divide(limit float64, units uint32, wants []Want, headroom, floor float64) Rule {
	headroom, floor = clampTuning(headroom, floor)
	p := Rule{Limit: limit, Headroom: headroom, Floor: floor}
	var counted uint64
	for _, w := range wants {
		counted += uint64(w.Units)
	}
	total := max(uint64(units), counted)
	if !(limit > 0) || math.IsInf(limit, 0) || total == 0 || total > math.MaxUint32 {
		return p
	}
	p.Units = uint32(total)
	var saved, excess float64
	for _, w := range wants {
		if w.Absent || w.Units == 0 {
			continue
		}
		e := limit * float64(w.Units) / float64(total)
		d := sane(w.Offered)
		if d <= e {
			saved += e - under(d, e, headroom, floor)
		} else {
			excess += d - e
		}
	}
	p.K = 1
	if excess > 0 {
		p.K = min(1, saved/excess)
	}
	left := saved
	if excess > 0 {
		left = saved - p.K*excess
	}
	p.R = max(0, left/limit)
	p.K *= 1 - slack
	p.R *= 1 - slack
	return p
}

// Apportion divides budget among consumers by their demand, never looser
// than the budget: Divide, then each consumer's Share, in one call. units
// is the units the budget is divided among (a membership view's; 0 for the
// consumers' own); wants are the consumers; headroom and floor are the
// floor rule (Divide's). It returns the division, from which each consumer
// can compute its own share again (Share), and each consumer's share per
// second, in wants' order.
//
// The shares never sum above budget, an absent consumer's included; none is
// negative, and a consumer with no units gets 0. An absent consumer gets its
// equal share E_i and no more. A present one wanting no more than E_i gets
// at least the floor, min(E_i, max(d_i·(1+h), f·E_i)), plus an even part R
// of what is left; one wanting more gets at least E_i. A consumer's share
// never falls as its own demand rises, and never rises as another's does.
// A budget that cannot be divided (not positive, infinite, no units) gives
// every consumer 0.
func Apportion(budget float64, units uint32, wants []Want, headroom, floor float64) (Rule, []float64) {
	rule := Divide(budget, units, wants, headroom, floor)
	shares := make([]float64, len(wants))
	if rule.Units == 0 {
		return rule, shares
	}
	for i, w := range wants {
		shares[i], _ = Share(rule, w.Units, w.Offered, w.Absent, units)
	}
	return rule, shares
}

// Share is the share, per second, of a replica with the given units and
// offered demand under p; absent is a replica whose report the division did
// not count. viewUnits is the units of the replica's own membership view: when
// it counts more than p did (a replica joined since), the share shrinks in
// proportion, so the newcomer's equal share fits before the next division.
// ok is false when p cannot be evaluated (no limit, no units, or more units
// for this replica than p divided among): the replica then keeps its equal
// share by its own view, which is never looser.
func Share(p Rule, units uint32, offered float64, absent bool, viewUnits uint32) (share float64, ok bool) {
	if !(p.Limit > 0) || math.IsInf(p.Limit, 0) || p.Units == 0 || units == 0 || units > p.Units {
		return 0, false
	}
	headroom, floor := clampTuning(p.Headroom, p.Floor)
	k, r := p.K, p.R
	if !(k >= 0) || k > 1 {
		k = 0
	}
	if !(r >= 0) || r > 1 {
		r = 0
	}
	e := p.Limit * float64(units) / float64(p.Units)
	var g float64
	d := sane(offered)
	switch {
	case absent:
		// No more than the equal share, not even the leftover R: a
		// replica that was not in the division (one that joined since)
		// has none of it set aside.
		g = e
	case d <= e:
		g = under(d, e, headroom, floor) + r*e
	default:
		g = e + k*(d-e) + r*e
	}
	if viewUnits > p.Units {
		g *= float64(p.Units) / float64(viewUnits)
	}
	return min(g*(1-slack), p.Limit), true
}

// Equal is the equal share of a replica with units of total, per second.
func Equal(limit float64, units, total uint32) float64 {
	if total == 0 || units > total || !(limit > 0) {
		return 0
	}
	return limit * float64(units) / float64(total)
}

// under is the share of a replica that wants d ≤ e.
func under(d, e, headroom, floor float64) float64 {
	return min(e, max(d*(1+headroom), floor*e))
}

// sane is d as a demand: NaN, negative and infinite values are 0. (An
// infinite demand is garbage, not a large want; treating it as 0 keeps the
// replica that sent it at or under its equal share.)
func sane(d float64) float64 {
	if !(d > 0) || math.IsInf(d, 0) {
		return 0
	}
	return d
}

// clampTuning keeps headroom in [0, 10] and floor in [0, 1].
func clampTuning(headroom, floor float64) (float64, float64) {
	if !(headroom >= 0) {
		headroom = 0
	}
	if !(floor >= 0) {
		floor = 0
	}
	return min(headroom, 10), min(floor, 1)
}
