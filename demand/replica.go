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
// divided from a snapshot older than that many reports are read as if the
// replica's report were unknown (the floor), which is never looser.
const HistoryLen = 8

// History is a replica's record of the reports it wrote, as decoded (the
// leader divided the decoded figures, so the replica must read the same),
// with the Consul index each write got. The zero value is empty.
type History struct {
	entries [HistoryLen]sent
	n       int    // entries added, total
	last    uint64 // the highest index recorded
}

type sent struct {
	index   uint64
	report  Report
	unknown bool // a write whose outcome is not known; index is a lower bound
}

// Add records a report written at index.
func (h *History) Add(index uint64, r Report) {
	h.push(sent{index: index, report: r})
}

// Failed records a write that returned an error: Consul may have applied it
// all the same, at an index after every one recorded and after known, the
// highest index this replica had seen committed before the write began (the
// parameters' own index, say). A snapshot that may hold it is read as Unknown
// until a later write is recorded; parameters from before it are not.
func (h *History) Failed(known uint64) {
	h.push(sent{index: max(h.last, known) + 1, unknown: true})
}

func (h *History) push(e sent) {
	h.entries[h.n%HistoryLen] = e
	h.n++
	h.last = max(h.last, e.index)
}

// Reset forgets every report: the session that held them is gone, and with
// it the key, so the leader counts this replica as absent from now on.
func (h *History) Reset() { *h = History{} }

// Standing is what a replica can tell about its report in a snapshot.
type Standing uint8

const (
	// Counted: the report is known; the leader divided with it.
	Counted Standing = iota
	// Absent: the replica had no report at or after the cutoff; the leader
	// counted it at its equal share.
	Absent
	// Unknown: what the leader divided with cannot be told (it is older than
	// the history, or a write's outcome is not known). Read it as the
	// smallest share a present replica gets, which is never looser.
	Unknown
)

// Reported returns the report p's snapshot held for this replica, and what
// is known of it.
func (h *History) Reported(p *Params) (Report, Standing) {
	var best *sent
	for i := range min(h.n, HistoryLen) {
		e := &h.entries[i]
		if e.index <= p.Snapshot && (best == nil || e.index > best.index) {
			best = e
		}
	}
	switch {
	case best != nil && best.unknown:
		return Report{}, Unknown
	case best != nil && best.index >= p.Cutoff:
		return best.report, Counted
	case best != nil:
		// Our newest report at the snapshot was older than the cutoff
		// (entries dropped from the history are older still).
		return Report{}, Absent
	case h.n <= HistoryLen:
		// Every write we made came after the snapshot, or there was none.
		return Report{}, Absent
	}
	// The newest report at the snapshot fell out of the history.
	return Report{}, Unknown
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
