package demand

import (
	"math"
	"time"
)

// Rates smooths a rule's monotonic counters into per-second rates: an
// exponentially weighted moving average whose weight decays with time
// constant Tau, so irregular sampling is weighed by the time it covers.
// The zero value is ready; the first Update only primes it.
type Rates struct {
	Offered, Admitted float64
	// Warm makes the first measurement the rates as they are, not a step
	// of the average from 0: a meter started on a value that is busy
	// already (one that just became hot) reads its rate from its first
	// window rather than climbing to it over several time constants.
	Warm         bool
	lastOffered  uint64
	lastAdmitted uint64
	last         time.Time
	primed       bool
	measured     bool
}

// Update folds in the counters as read at now.
func (r *Rates) Update(offered, admitted uint64, now time.Time, tau time.Duration) {
	if !r.primed {
		r.lastOffered, r.lastAdmitted, r.last, r.primed = offered, admitted, now, true
		return
	}
	dt := now.Sub(r.last).Seconds()
	if dt <= 0 {
		return
	}
	// A counter that went backwards (a rule re-created) restarts the window.
	do, da := float64(offered-r.lastOffered), float64(admitted-r.lastAdmitted)
	if offered < r.lastOffered || admitted < r.lastAdmitted {
		do, da = 0, 0
	}
	alpha := 1.0
	if tau > 0 && !(r.Warm && !r.measured) {
		alpha = 1 - math.Exp(-dt/tau.Seconds())
	}
	r.measured = true
	r.Offered += alpha * (do/dt - r.Offered)
	r.Admitted += alpha * (da/dt - r.Admitted)
	r.lastOffered, r.lastAdmitted, r.last = offered, admitted, now
}

// HistoryLen is how many of its own reports a replica remembers: parameters
// that counted a report older than that many are read as if the replica's
// report were unknown (the floor), which is never looser.
const HistoryLen = 8

// History is a replica's record of the reports it wrote, as decoded (the
// leader divided the decoded figures, so the replica must read the same),
// with the Consul index each write got. The zero value is empty.
type History struct {
	entries [HistoryLen]sent
	n       int // entries added, total
	// pinned is the report the parameters in force counted, kept when the
	// ring moves past it (Pin); its index is 0 when none.
	pinned sent
}

type sent struct {
	index  uint64
	report Report
}

// Add records a report written at index. A write that failed is not
// recorded: if Consul applied it all the same and a division counted it,
// the parameters list this replica's node at an index it does not know,
// which Reported reads as Unknown.
func (h *History) Add(index uint64, r Report) {
	h.entries[h.n%HistoryLen] = sent{index: index, report: r}
	h.n++
}

// Pin keeps the report of node's that p counted, if this replica knows it,
// for as long as p is in force, however many reports follow: the
// parameters can stand unchanged for longer than HistoryLen reports (a
// leader keeps the division in force while a replica that left may still
// have Envoys enforcing its share), and the report they counted still
// gives this replica's share. Call it whenever p comes into force or a
// report is added.
func (h *History) Pin(p *Params, node string) {
	tag := TagOf(node)
	for _, ref := range p.Reports {
		if ref.Node != tag {
			continue
		}
		for i := range min(h.n, HistoryLen) {
			if e := h.entries[i]; e.index == ref.Index {
				h.pinned = e
				return
			}
		}
	}
}

// Reset forgets every report: the session that held them is gone, and with
// it the key (and, if Consul itself was replaced, the meaning of its
// indices).
func (h *History) Reset() { *h = History{} }

// Standing is what a replica can tell about its report in a division.
type Standing uint8

const (
	// Counted: the division counted a report this replica wrote and
	// remembers; it computes its share from that report, as the leader did.
	Counted Standing = iota
	// Absent: the division counted no report under this replica's node:
	// the leader left it its equal share, and it takes no more.
	Absent
	// Unknown: the division counted a report under this replica's node
	// that it did not write or no longer remembers (a previous process's,
	// one older than the history, a write whose outcome it never learnt,
	// or another node's with the same tag). Read it as the smallest share
	// a counted replica gets, which is never looser.
	Unknown
)

func (s Standing) String() string {
	switch s {
	case Counted:
		return "counted"
	case Absent:
		return "not counted"
	}
	return "unknown"
}

// Reported returns the report of node's that p's division counted, and
// what is known of it: only the reports p lists count, each by its index
// and its node's tag.
func (h *History) Reported(p *Params, node string) (Report, Standing) {
	tag := TagOf(node)
	listed := false
	var found *Report
	matches := 0
	for _, ref := range p.Reports {
		if ref.Node != tag {
			continue
		}
		listed = true
		inRing := false
		for i := range min(h.n, HistoryLen) {
			if e := &h.entries[i]; e.index == ref.Index {
				found = &e.report
				matches++
				inRing = true
			}
		}
		if e := &h.pinned; !inRing && e.index != 0 && e.index == ref.Index {
			found = &e.report
			matches++
		}
	}
	switch {
	case matches == 1:
		return *found, Counted
	case listed:
		return Report{}, Unknown
	}
	return Report{}, Absent
}

// Stretch is the write interval of one replica of n, so that the n together
// write at most maxWrites times a second: interval, or n/maxWrites seconds if
// that is longer.
func Stretch(interval time.Duration, n int, maxWrites float64) time.Duration {
	if maxWrites <= 0 || n <= 0 {
		return interval
	}
	return max(interval, time.Duration(float64(n)/maxWrites*float64(time.Second)))
}

// Moved reports whether a rule's offered demand moved enough since the last
// report to be worth a write: by more than threshold of the larger of the
// two rates, or by more than minimum per second (so that noise around 0 does
// not count).
func Moved(last, cur, threshold, minimum float64) bool {
	d := math.Abs(cur - last)
	return d > minimum && d > threshold*max(last, cur)
}
