package server

import (
	"cmp"
	"encoding/json"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
)

// The daemon's own account of what it decided: per rule, the decisions it
// admitted and refused in each AdmittedSlot of its clock, for the last
// admittedSlots of them. The slots are numbered from the Unix epoch, so the
// slots of daemons on one machine (one wall clock) line up, and their sum over
// any run of slots is what the cluster admitted then, whenever a client sent
// the requests or read the answers. /rlconfig/admitted serves them.
//
// Counting a decision costs two atomic loads and one atomic add, with no lock
// and no allocation: the first decision of a rule allocates its ring (4 KiB),
// and the first of each slot turns the slot over with one compare-and-swap.
const (
	// AdmittedSlot is the width of a slot.
	AdmittedSlot = 100 * time.Millisecond
	// admittedSlots is how many slots a ring keeps: 25.6 s.
	admittedSlots = 256
	// maxRetired bounds the rings kept for rules a reload removed.
	maxRetired = 256
	// turning marks a slot being turned over to a new number.
	turning = -1
)

// admittedSlot is one slot of a ring.
type admittedSlot struct {
	// n is the slot's number: the slot covers Unix time [n, n+1) ×
	// AdmittedSlot. 0 until first used; turning while it is reset.
	n atomic.Int64
	// counts packs the admitted decisions (low 32 bits) and the refused ones
	// (high 32 bits), so that counting either is one add. A slot would need
	// 4 billion decisions in 100 ms to overflow.
	counts atomic.Uint64
}

// admittedRing is one rule's slots. Safe for concurrent use; the zero value
// is an empty ring.
type admittedRing struct {
	slots [admittedSlots]admittedSlot
	// late counts decisions whose clock reading was older than the ring
	// when they were counted (a request held up for the ring's whole span):
	// they are in no slot.
	late atomic.Uint64
}

// add counts one decision, admitted unless over, in slot n.
func (r *admittedRing) add(n int64, over bool) {
	s := &r.slots[uint64(n)%admittedSlots]
	if s.n.Load() != n && !r.turn(s, n) {
		return
	}
	if over {
		s.counts.Add(1 << 32)
	} else {
		s.counts.Add(1)
	}
}

// turn makes s slot n, unless s already holds a later slot: then the reading
// is too old for the ring, and the decision is counted late. The counts are
// reset before the new number is published, so no decision of slot n is
// lost to the reset. (A decision whose reading was taken a whole ring
// earlier, and which is counted only now, could land in slot n: a request
// held up for 25 s.)
func (r *admittedRing) turn(s *admittedSlot, n int64) bool {
	for {
		switch cur := s.n.Load(); {
		case cur == n:
			return true
		case cur == turning:
			runtime.Gosched() // another decision is resetting it: a few instructions
		case cur > n:
			r.late.Add(1)
			return false
		case s.n.CompareAndSwap(cur, turning):
			s.counts.Store(0)
			s.n.Store(n)
			return true
		}
	}
}

// read returns the admitted and refused counts of slots [from, to]; a slot
// in which nothing was decided reads 0. Slots older than the ring are not
// asked for: callers keep from > to - admittedSlots + 1.
func (r *admittedRing) read(from, to int64) (ok, over []uint32) {
	ok, over = make([]uint32, to-from+1), make([]uint32, to-from+1)
	for n := from; n <= to; n++ {
		s := &r.slots[uint64(n)%admittedSlots]
		if s.n.Load() != n {
			continue // never reached, or being reset for it: nothing counted yet
		}
		c := s.counts.Load()
		if s.n.Load() != n {
			continue // turned over to a later slot while read
		}
		ok[n-from], over[n-from] = uint32(c), uint32(c>>32)
	}
	return ok, over
}

// account counts a decision of the series' rule in slot n. The rule's ring
// is made by its first decision.
func (s *ruleSeries) account(n int64, over bool) {
	r := s.admitted.Load()
	if r == nil {
		r = new(admittedRing)
		if !s.admitted.CompareAndSwap(nil, r) {
			r = s.admitted.Load()
		}
	}
	r.add(n, over)
}

// retiredRing is the ring of a rule a reload removed, kept until its slots
// have aged out: a script reading the slots around a reload sees what the
// rule decided up to it.
type retiredRing struct {
	domain, rule string
	ring         *admittedRing
	at           int64 // the last slot it had counted in when it was retired
}

// newest is the number of the latest slot the ring has counted in.
func (r *admittedRing) newest() int64 {
	var n int64
	for i := range r.slots {
		n = max(n, r.slots[i].n.Load())
	}
	return n
}

// retire keeps s's ring, if it has one, for as long as it has slots to show.
// Callers hold m.mu.
func (m *Metrics) retire(s *ruleSeries) {
	r := s.admitted.Load()
	if r == nil {
		return
	}
	now := r.newest()
	m.retired = slices.DeleteFunc(m.retired, func(x retiredRing) bool { return now-x.at >= admittedSlots })
	if len(m.retired) >= maxRetired {
		m.retired = slices.Delete(m.retired, 0, 1)
	}
	m.retired = append(m.retired, retiredRing{domain: s.domain, rule: s.rule, ring: r, at: now})
}

// Admitted is /rlconfig/admitted: per rule, what this daemon decided in each
// slot of its clock.
type Admitted struct {
	SlotSeconds float64 `json:"slot_seconds"`
	// FirstSlot numbers the first slot: slot n covers Unix time
	// [n, n+1) × SlotSeconds, by this daemon's clock.
	FirstSlot int64 `json:"first_slot"`
	// Start is when the first slot began.
	Start time.Time `json:"start"`
	// Now is the daemon's clock as it answered. The last slot, which holds
	// it, is still counting.
	Now   time.Time      `json:"now"`
	Rules []RuleAdmitted `json:"rules"`
}

// RuleAdmitted is one rule's slots, aligned with Admitted.FirstSlot.
type RuleAdmitted struct {
	Domain string `json:"domain"`
	// Rule names the rule as sharelimit_decisions_total's rule label does:
	// its config path, or "override" for a domain's per-request limits.
	Rule string `json:"rule"`
	// Retired: a reload removed the rule. Its slots stop at the reload
	// (but for requests decided across it). Should it come back, it is
	// listed again, not retired, from then on: the two add up.
	Retired  bool     `json:"retired,omitempty"`
	Admitted []uint32 `json:"admitted"`
	Over     []uint32 `json:"over_limit"`
	// Late counts decisions in no slot: their clock reading was older than
	// the ring by the time they were counted.
	Late uint64 `json:"late,omitempty"`
}

// admittedAt lists the slots from since (at most as far back as the ring
// reaches) to the slot of now, for the rules that have decided since they
// were loaded, or that a reload removed less than a ring ago. want, when not
// nil, keeps only the rules it says yes to.
func (m *Metrics) admittedAt(now, since int64, want func(domain, rule string) bool) Admitted {
	// Two slots short of the ring: the oldest may be turned over, for the
	// slot after now, while it is read.
	from := max(since, now-admittedSlots+2)
	from = min(from, now)
	out := Admitted{SlotSeconds: AdmittedSlot.Seconds(), FirstSlot: from, Start: time.Unix(0, from*int64(AdmittedSlot))}
	add := func(domain, rule string, retired bool, r *admittedRing) {
		if r == nil || (want != nil && !want(domain, rule)) {
			return
		}
		ra := RuleAdmitted{Domain: domain, Rule: rule, Retired: retired, Late: r.late.Load()}
		ra.Admitted, ra.Over = r.read(from, now)
		out.Rules = append(out.Rules, ra)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.rules {
		add(s.domain, s.rule, false, s.admitted.Load())
	}
	for _, s := range m.overrides {
		add(s.domain, s.rule, false, s.admitted.Load())
	}
	for _, x := range m.retired {
		if now-x.at < admittedSlots {
			add(x.domain, x.rule, true, x.ring)
		}
	}
	slices.SortFunc(out.Rules, func(a, b RuleAdmitted) int {
		switch {
		case a.Domain != b.Domain:
			return cmp.Compare(a.Domain, b.Domain)
		case a.Rule != b.Rule:
			return cmp.Compare(a.Rule, b.Rule)
		case a.Retired != b.Retired:
			if a.Retired {
				return -1
			}
			return 1
		}
		return 0
	})
	return out
}

// admittedJSON serves /rlconfig/admitted. ?since=N starts at slot N (a
// poller passes the last FirstSlot it read plus the slots it got, less one:
// the slot that was still counting); ?rule=PATH, repeated, keeps only those
// rules.
func (a *Admin) admittedJSON(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var since int64
	if s := q.Get("since"); s != "" {
		var err error
		if since, err = strconv.ParseInt(s, 10, 64); err != nil {
			http.Error(w, "since: not a slot number: "+err.Error(), http.StatusBadRequest)
			return
		}
	}
	var want func(domain, rule string) bool
	if rules := q["rule"]; len(rules) > 0 {
		want = func(_, rule string) bool { return slices.Contains(rules, rule) }
	}
	now := a.svc.clock()
	out := a.metrics.admittedAt(a.svc.slot(now), since, want)
	out.Now = time.Unix(0, a.svc.wall0+now)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}
