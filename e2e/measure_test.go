package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/server"
)

// How the scenarios measure a rate.
//
// What a cluster admitted is read from the daemons themselves: each counts
// its decisions of every rule per 100 ms slot of its own clock
// (/rlconfig/admitted), and the slots of daemons on one machine line up. So
// a window's admitted count is what the daemons admitted in it, whenever
// the load sent the requests or read the answers: a load that falls behind
// changes what is offered, never what is measured.
//
// What falling behind changes is what the daemons may admit. A token bucket
// keeps what it refills while no request comes, up to its size, so when the
// load (or a daemon) stalls and then catches up, the tokens of the stall
// are spent after it: in the second that follows, a correct cluster admits
// L plus what it saved. And decisions that come after a window's end were
// due in it: the tokens they spend were refilled in it. Both are bounded by
// the load's lag: at a moment d, the age of the oldest request due before d
// and not yet answered at d (answered, not decided: the bound errs towards
// allowing more). Over a window [a, b), a cluster that refills at R (the
// rate the assertion is about: L for the cap) and was drained by the offered
// load at a, as the scenarios' offered 2L keeps it, admits
//
//	at most  R·(b−a) + R·lag(a)       (carried in: what the stall before a saved)
//	at least R·(b−a) − R·maxlag[a, b] (carried out past b, or lost to a full bucket)
//
// and never more than was offered. So:
//
//   - The upper bound is always checked, in every window, with the
//     allowance R·lag(a) for what lateness can have carried in; on time, the
//     allowance is a few milliseconds of R (the dispatcher's tick).
//   - A lower bound is checked against what could have been admitted given
//     what was offered and when. If the load was so late that the bound falls
//     below half of R, the window cannot test it: that is logged, never
//     passed off as a pass, and never a failure for lack of CPU.
//   - A window the daemons' accounting does not cover (a daemon that died
//     before its slots were read) cannot be measured at all: a lone window
//     that cannot be measured fails the test, and so does a sliding check in
//     which no window could be.

// slotWidth is the width of the daemons' accounting slots.
const slotWidth = server.AdmittedSlot

// acct is what one daemon process counted of one rule, per slot of its
// clock, as read from its /rlconfig/admitted. Safe for concurrent use.
type acct struct {
	c          *cluster
	d          *daemon
	node, rule string

	mu    sync.Mutex
	slots map[int64][2]int64 // slot → admitted, over limit
	read  bool               // read at least once
	// from and known: slots in [from, known) are complete. The slot known
	// was still counting when last read.
	from, known int64
	gaps        [][2]int64 // slots that aged out of the ring before they were read
	// final: read after its last decision for the load; nothing came later.
	final bool
	err   error // the last read's error, nil if it succeeded
}

func newAcct(c *cluster, d *daemon, rule string) *acct {
	return &acct{c: c, d: d, node: d.node, rule: rule, slots: map[int64][2]int64{}}
}

// fetch reads the slots from the last one still counting on.
func (a *acct) fetch() error {
	a.mu.Lock()
	since := a.known
	a.mu.Unlock()
	adm, err := a.get(since)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		a.err = err
		return err
	}
	a.err = nil
	sum := map[int64][2]int64{}
	for _, r := range adm.Rules {
		if r.Rule != a.rule {
			continue
		}
		// A rule retired by a reload and the same rule come back add up.
		for i := range r.Admitted {
			n := adm.FirstSlot + int64(i)
			c := sum[n]
			sum[n] = [2]int64{c[0] + int64(r.Admitted[i]), c[1] + int64(r.Over[i])}
		}
	}
	last := floorDiv(adm.Now.UnixNano(), int64(slotWidth)) // the slot still counting
	if !a.read {
		a.from, a.read = adm.FirstSlot, true
	} else if adm.FirstSlot > since {
		a.gaps = append(a.gaps, [2]int64{since, adm.FirstSlot})
	}
	for n, c := range sum {
		old := a.slots[n]
		// Counts only grow: an answer read late never undoes a newer one.
		a.slots[n] = [2]int64{max(old[0], c[0]), max(old[1], c[1])}
	}
	a.known = max(a.known, last)
	return nil
}

func (a *acct) get(since int64) (*server.Admitted, error) {
	u := fmt.Sprintf("http://%s/rlconfig/admitted?since=%d&rule=%s", a.d.httpAddr, since, url.QueryEscape(a.rule))
	resp, err := a.c.admin.Get(u)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /rlconfig/admitted: %s", resp.Status)
	}
	var adm server.Admitted
	if err := json.NewDecoder(resp.Body).Decode(&adm); err != nil {
		return nil, fmt.Errorf("decode /rlconfig/admitted: %w", err)
	}
	return &adm, nil
}

// finish reads the slots a last time: the daemon decides nothing more for
// the load, so every later slot is known to be empty.
func (a *acct) finish() error {
	if err := a.fetch(); err != nil {
		return err
	}
	a.mu.Lock()
	a.final = true
	a.mu.Unlock()
	return nil
}

func (a *acct) isFinal() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.final
}

// knownThrough says up to when the slots are known, for a log line.
func (a *acct) knownThrough() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.read {
		return "never read"
	}
	return time.Unix(0, a.known*int64(slotWidth)).Format("15:04:05.0")
}

// at returns what slot n counted, and whether it is known.
func (a *acct) at(n int64) (ok, over int64, known bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case !a.read:
		return 0, 0, false
	case a.final && n >= a.known:
		return 0, 0, true
	case n < a.from || n >= a.known:
		return 0, 0, false
	}
	for _, g := range a.gaps {
		if n >= g[0] && n < g[1] {
			return 0, 0, false
		}
	}
	c := a.slots[n]
	return c[0], c[1], true
}

// slotAt is the slot that holds load time d.
func (l *load) slotAt(d time.Duration) int64 {
	return floorDiv(l.start.UnixNano()+int64(d), int64(slotWidth))
}

// boundary is the load time at which slot n starts.
func (l *load) boundary(n int64) time.Duration {
	return time.Duration(n*int64(slotWidth) - l.start.UnixNano())
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// window is a span of the load's time, [from, to), on slot boundaries.
type window struct{ from, to time.Duration }

func (w window) String() string {
	return fmt.Sprintf("[%.2fs, %.2fs)", w.from.Seconds(), w.to.Seconds())
}

func (w window) seconds() float64 { return (w.to - w.from).Seconds() }

// window is the longest span of whole slots within [from, to).
func (l *load) window(from, to time.Duration) window {
	a := l.slotAt(from - 1 + slotWidth) // the first boundary at or after from
	b := max(l.slotAt(to), a)
	return window{l.boundary(a), l.boundary(b)}
}

// slotsOf is the slot numbers [a, b) of a window.
func (l *load) slotsOf(w window) (a, b int64) { return l.slotAt(w.from), l.slotAt(w.to) }

// decided sums what the processes that served the given daemon slots
// (every slot when none is given) decided in w, and says whether all of it
// is known.
func (l *load) decided(w window, slots ...int) (ok, over int64, known bool) {
	l.mu.Lock()
	accts := l.accts
	l.mu.Unlock()
	if len(slots) == 0 {
		for i := range accts {
			slots = append(slots, i)
		}
	}
	known = true
	a, b := l.slotsOf(w)
	for _, s := range slots {
		for _, ac := range accts[s] {
			for n := a; n < b; n++ {
				o, v, k := ac.at(n)
				ok, over, known = ok+o, over+v, known && k
			}
		}
	}
	return ok, over, known
}

// shareRule says that other loads' requests are decided by l's rule too:
// their decisions are taken out of l's. The daemons count per rule, so
// which of them fell in a window is known only to within the requests in
// flight at its edges: the measurement becomes an interval. The other loads
// must be answered OK throughout; their own checks say so.
func (l *load) shareRule(others ...*load) { l.others = append(l.others, others...) }

// othersIn bounds how many requests of the other loads sharing l's rule the
// given daemon slots decided in w: at least those sent and answered within
// it, at most those in flight at any moment of it.
func (l *load) othersIn(w window, slots []int) (lo, hi int64) {
	for _, o := range l.others {
		// Convert w to o's time: the loads started at different moments.
		shift := o.start.Sub(l.start)
		from, to := w.from-shift, w.to-shift
		for _, r := range o.requests[:o.sent.Load()] {
			if r.outcome == unsent || (len(slots) > 0 && !contains(slots, r.slot)) {
				continue
			}
			if r.sent >= from && r.answered < to {
				lo++
			}
			if r.answered >= from && r.sent < to {
				hi++
			}
		}
	}
	return lo, hi
}

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// lagAt is how far behind the load ran at the start of slot n: the age of
// the oldest request due before then and not answered by then.
func (l *load) lagAt(n int64) time.Duration {
	if l.lags == nil {
		l.lags = map[int64]time.Duration{}
		for _, r := range l.requests[:l.sent.Load()] {
			if r.outcome == unsent {
				continue
			}
			for m := l.slotAt(r.due) + 1; l.boundary(m) < r.answered; m++ {
				l.lags[m] = max(l.lags[m], l.boundary(m)-r.due)
			}
		}
	}
	return l.lags[n]
}

// maxLag is the most the load lagged at any slot boundary of w, both ends
// included.
func (l *load) maxLag(w window) time.Duration {
	a, b := l.slotsOf(w)
	var m time.Duration
	for n := a; n <= b; n++ {
		m = max(m, l.lagAt(n))
	}
	return m
}

// rate is what the daemons admitted in a window, per second, and what the
// checks of it need.
type rate struct {
	w window
	// lo and hi bound the admitted rate. They differ only when other loads
	// share the rule: see shareRule.
	lo, hi float64
	// offered is what the daemons decided (admitted or not), at most.
	offered float64
	// lagFrom is the load's lag at the window's start; lagMax the most at
	// any boundary of it.
	lagFrom, lagMax time.Duration
	known           bool
}

// measure reads what the daemons of the given slots (all when none)
// admitted in w. It needs the load stopped.
func (l *load) measure(w window, slots ...int) rate {
	select {
	case <-l.finished:
	default:
		panic("e2e: a load is measured before it has stopped")
	}
	ok, over, known := l.decided(w, slots...)
	lo, hi := l.othersIn(w, slots)
	s := w.seconds()
	r := rate{w: w, lo: float64(ok-hi) / s, hi: float64(ok-lo) / s, offered: float64(ok+over-lo) / s, known: known,
		lagFrom: l.lagAt(l.slotAt(w.from)), lagMax: l.maxLag(w)}
	if s <= 0 {
		r.known = false
	}
	return r
}

// admitted is the admitted rate of the given slots in w, for the tables:
// the middle of its bounds.
func (l *load) admitted(w window, slots ...int) float64 {
	r := l.measure(w, slots...)
	return (r.lo + r.hi) / 2
}

// offered is what the given slots decided in w, per second.
func (l *load) offered(w window, slots ...int) float64 { return l.measure(w, slots...).offered }

// ceiling is the most a cluster refilling at want may admit in r's window,
// per second, with tolerance tol: want·(1+tol), and what the load's lateness
// at the window's start may have carried in.
func (r rate) ceiling(want, tol float64) float64 {
	return want*(1+tol) + want*r.lagFrom.Seconds()/r.w.seconds()
}

// floor is the least a cluster refilling at want must admit in r's window,
// per second, with tolerance tol, given what was offered and when; tested
// is false when lateness leaves it below half of want, too little to test.
func (r rate) floor(want, tol float64) (f float64, tested bool) {
	f = want*(1-tol) - want*r.lagMax.Seconds()/r.w.seconds()
	f = min(f, r.offered*(1-tol))
	return f, f >= want/2
}

func (r rate) String() string {
	s := fmt.Sprintf("%.1f/s in %v", r.lo, r.w)
	if r.hi > r.lo {
		s = fmt.Sprintf("%.1f to %.1f/s in %v", r.lo, r.hi, r.w)
	}
	return s + fmt.Sprintf(" (offered %.1f/s; the load lagged %v at its start, at most %v)", r.offered,
		r.lagFrom.Round(time.Millisecond), r.lagMax.Round(time.Millisecond))
}

// atMost checks that the given slots admitted at most want·(1+tol) per
// second in w, less what lateness can have carried in. It fails the test if
// they did not, or if the daemons' accounting does not cover w.
func (l *load) atMost(t *testing.T, what string, w window, want, tol float64, slots ...int) rate {
	t.Helper()
	r := l.measure(w, slots...)
	if !r.known {
		t.Errorf("%s: cannot measure %v: %s", what, w, l.unknown(w, slots...))
		return r
	}
	if c := r.ceiling(want, tol); r.lo > c {
		t.Errorf("%s: admitted %v; want at most %.1f/s (%.1f/s + %.0f%%, and %.1f/s for the lag at its start)",
			what, r, c, want, 100*tol, c-want*(1+tol))
	}
	return r
}

// atLeast checks that the given slots admitted at least want·(1−tol) per
// second in w, or what could be admitted given what was offered and when.
// A window too late to test that is logged, not failed.
func (l *load) atLeast(t *testing.T, what string, w window, want, tol float64, slots ...int) rate {
	t.Helper()
	r := l.measure(w, slots...)
	if !r.known {
		t.Errorf("%s: cannot measure %v: %s", what, w, l.unknown(w, slots...))
		return r
	}
	f, tested := r.floor(want, tol)
	switch {
	case !tested:
		t.Logf("%s: NOT TESTED: the lower bound in %v: the load ran up to %v late, so a correct cluster might have admitted as little as %.1f/s (admitted %v)",
			what, w, r.lagMax.Round(time.Millisecond), f, r)
	case r.hi < f:
		t.Errorf("%s: admitted %v; want at least %.1f/s (%.1f/s − %.0f%%, less %.1f/s for the lag, and no more than offered)",
			what, r, f, want, 100*tol, want*(1-tol)-f)
	}
	return r
}

// near checks both: want ± tol, as atMost and atLeast do.
func (l *load) near(t *testing.T, what string, w window, want, tol float64, slots ...int) rate {
	t.Helper()
	l.atMost(t, what, w, want, tol, slots...)
	return l.atLeast(t, what, w, want, tol, slots...)
}

// unknown says which daemons' accounting does not cover w.
func (l *load) unknown(w window, slots ...int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(slots) == 0 {
		for i := range l.accts {
			slots = append(slots, i)
		}
	}
	a, b := l.slotsOf(w)
	var out []string
	for _, s := range slots {
		for _, ac := range l.accts[s] {
			for n := a; n < b; n++ {
				if _, _, k := ac.at(n); !k {
					ac.mu.Lock()
					out = append(out, fmt.Sprintf("%s's slots are known until %s (last read error: %v)", ac.node,
						time.Unix(0, ac.known*int64(slotWidth)).Format("15:04:05.0"), ac.err))
					ac.mu.Unlock()
					break
				}
			}
		}
	}
	return fmt.Sprint(out)
}

// seconds are the one-second windows in [from, to), sliding by slot.
func (l *load) seconds(from, to time.Duration) []window {
	var out []window
	per := int64(time.Second / slotWidth)
	a, b := l.slotAt(from-1+slotWidth), l.slotAt(to)
	for n := a; n+per <= b; n++ {
		out = append(out, window{l.boundary(n), l.boundary(n + per)})
	}
	return out
}

// capped checks every one-second window in [from, to) against limit + tol,
// as atMost does, and returns the window closest to its ceiling. Windows the
// accounting does not cover are counted and logged; if no window can be
// measured, the test fails.
func (l *load) capped(t *testing.T, what string, from, to time.Duration, limit, tol float64) rate {
	t.Helper()
	var worst rate
	var worstRatio, allowance float64
	measured, windows, above := 0, 0, 0
	for _, w := range l.seconds(from, to) {
		windows++
		r := l.measure(w)
		if !r.known {
			continue
		}
		measured++
		c := r.ceiling(limit, tol)
		allowance = max(allowance, c-limit*(1+tol))
		if r.lo > c {
			above++
		}
		if ratio := r.lo / c; measured == 1 || ratio > worstRatio {
			worst, worstRatio = r, ratio
		}
	}
	switch {
	case windows == 0:
		t.Errorf("%s: no one-second window in [%v, %v)", what, from, to)
	case measured == 0:
		t.Errorf("%s: none of the %d one-second windows in [%v, %v) can be measured: %s", what, windows, from, to, l.unknown(window{from, to}))
	case above > 0:
		c := worst.ceiling(limit, tol)
		t.Errorf("%s: %d of %d one-second windows admitted more than L=%.0f/s + %.0f%% and their lag allowance; the furthest over admitted %v, against at most %.1f/s (%.1f/s for the lag at its start)",
			what, above, measured, limit, 100*tol, worst, c, c-limit*(1+tol))
	default:
		t.Logf("%s: %d of %d one-second windows in [%v, %v) measured, each at most L=%.0f/s + %.0f%% plus its lag allowance (at most %.1f/s); the closest to its ceiling admitted %v",
			what, measured, windows, from.Round(time.Millisecond), to.Round(time.Millisecond), limit, 100*tol, allowance, worst)
	}
	if measured > 0 && measured < windows {
		t.Logf("%s: %d one-second windows could not be measured: %s", what, windows-measured, l.unknown(window{from, to}))
	}
	return worst
}

// busiest is the one-second window in [from, to) that admitted the most,
// for the record: no bound is checked.
func (l *load) busiest(from, to time.Duration) rate {
	var worst rate
	for _, w := range l.seconds(from, to) {
		if r := l.measure(w); r.known && r.hi > worst.hi {
			worst = r
		}
	}
	return worst
}

// recovered is how long after at the cluster admitted at least want − tol
// again, by one-second windows ending from at + 1 s on (as atLeast judges
// them, lateness included); -1 if never. tested says whether any window
// ending by until could test it.
func (l *load) recovered(at, until time.Duration, want, tol float64) (back time.Duration, tested bool) {
	for _, w := range l.seconds(at, l.lastAnswered()) {
		r := l.measure(w)
		if !r.known {
			continue
		}
		f, ok := r.floor(want, tol)
		tested = tested || (ok && w.to <= until)
		if r.hi >= f && ok {
			return w.to - at, true
		}
	}
	return -1, tested
}
