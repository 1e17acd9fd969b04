package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultHold is how long a Damper holds a view that grows this replica's
// weight: longer than a flapping check takes to flip back, short enough that
// a replica's share catches up soon after a peer has really gone.
const DefaultHold = 2 * time.Second

// defaultMaxWindow bounds the views a Damper remembers. A source paced like
// Consul's (a few views a second) never needs more than a handful.
const defaultMaxWindow = 64

// ErrDamperRunning is returned by a second call of Damper.Run.
var ErrDamperRunning = errors.New("run membership damper: already running")

// DamperConfig configures a Damper. The zero value of every field is usable.
type DamperConfig struct {
	// Hold is how long a view that grows the weight must stand before it
	// applies (--membership-hold). Zero means DefaultHold, so a Damper
	// always damps: a caller that wants no damping (the daemon, given
	// --membership-hold 0) builds no Damper and subscribes to the source
	// directly. Negative is an error.
	Hold time.Duration
	// PeersLag is how much later than this replica its peers may see the
	// same change: 0 for a source whose replicas all watch one catalog
	// (Consul: milliseconds), DNS.PeersLag for a DNS source, whose peers
	// each resolve the name on their own Interval. When it is positive,
	// every grow waits Hold + PeersLag (Hold may then be 0), and a view
	// that counts this replica again after FaultAbsent is held like any
	// other grow rather than applied at once. Negative is an error.
	PeersLag time.Duration
	// OnUpdate, if set, receives the view in force after every Update, and
	// whenever a held view takes effect. Views reach it in order. It must
	// return quickly; it may call the Damper's View and Pending.
	OnUpdate func(View)
	// Logger receives held and applied grows. nil discards.
	Logger *slog.Logger
	// Clock and AfterFunc are the time the Damper runs on; tests fake them.
	// nil means time.Now and time.AfterFunc (AfterFunc returns its timer's
	// Stop).
	Clock     func() time.Time
	AfterFunc func(d time.Duration, f func()) (stop func() bool)
}

// Damper sits between a membership source and the view's subscriber, and
// holds back views that would make this replica's share larger until they
// have stood for Hold, so that a flapping check or a peer restarting never
// opens the cap, even for a moment.
//
// The rule is exact: the weight in force is the smallest weight among the
// views seen during the last Hold. A view is seen from when it arrives until
// the next one arrives; so a view that shrinks the weight applies at once,
// and one that grows it applies exactly Hold after it arrived, unless a
// smaller one comes meanwhile. The view in force carries the latest view's
// Errors and LastError, which describe the watch rather than the counts.
//
// A view that counts this replica when the view in force did not
// (FaultAbsent) also applies at once: the peers that count it shrink at once
// to leave it its share, so holding it back would only leave that unused.
// That holds for a source whose peers see a change when this replica does;
// with a PeersLag (DNS) they see it up to PeersLag later, so such a view is
// held like any other grow, for Hold + PeersLag.
//
// Views never confirmed by their source (a zero ObservedAt: the --replicas
// guess, with errors counted before Consul first answers) pass through as
// they come, and the first confirmed view applies at once, whichever way it
// moves the weight: the guess it replaces was never seen in the catalog, and
// a new replica must see itself at once. An initial view that its source did
// confirm (a non-zero ObservedAt, as a view restored from a state file has)
// was seen: it counts as the first confirmed view, from NewDamper on, and
// a view that grows the weight from it is held like any other grow.
//
// Held views take effect only while Run runs; without it a grow waits,
// which is tighter, never looser. A Damper is safe for concurrent use. It
// has no useful zero value; use NewDamper.
type Damper struct {
	hold      time.Duration
	onUpdate  func(View)
	log       *slog.Logger
	clock     func() time.Time
	afterFunc func(time.Duration, func()) func() bool
	maxWindow int // tests shrink it
	// recountAtOnce: a view counting this replica again after FaultAbsent
	// applies at once (no PeersLag).
	recountAtOnce bool

	running atomic.Bool

	mu sync.Mutex
	// window holds the views that can still be the smallest seen during
	// the last Hold, oldest first, with strictly rising weights: a view
	// arriving drops every view not smaller than itself, which it outlasts.
	// Its last element is the latest view; the first is in force.
	window    []span
	latest    View // the latest view given to Update, or the initial one
	inForce   View
	confirmed bool      // a confirmed view has arrived; the window is in use
	last      time.Time // the latest reading of clock, so time never runs back
	armed     bool      // Run runs: held views may take effect
	stop      func() bool
	gen       uint64 // counts timers set, so a stale timer does nothing
	seq       uint64 // counts views to publish, in order

	pub       sync.Mutex // orders calls of onUpdate
	published uint64     // the seq last handed to onUpdate
}

// span is a view in the window, and when it stopped being the latest view
// (zero while it is): it is seen until end+Hold.
type span struct {
	view View
	end  time.Time
}

// NewDamper returns a Damper with initial in force: the view its source
// starts with. An initial Weight outside (0, 1] is an error, as it is no
// view (Update drops such views): NaN or 0 or more than 1 would be in force
// until the first view arrived.
func NewDamper(initial View, cfg DamperConfig) (*Damper, error) {
	var errs []error
	if cfg.Hold < 0 || cfg.PeersLag < 0 {
		errs = append(errs, fmt.Errorf("new membership damper: hold %s or peers' lag %s is negative", cfg.Hold, cfg.PeersLag))
	}
	if !validWeight(initial.Weight) {
		errs = append(errs, fmt.Errorf("new membership damper: initial weight %v is outside (0, 1]", initial.Weight))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	d := &Damper{
		hold: cfg.Hold, onUpdate: cfg.OnUpdate, log: cfg.Logger, clock: cfg.Clock, afterFunc: cfg.AfterFunc,
		maxWindow: defaultMaxWindow, latest: initial, inForce: initial, recountAtOnce: cfg.PeersLag == 0,
	}
	if d.hold == 0 && cfg.PeersLag == 0 {
		d.hold = DefaultHold
	}
	d.hold += cfg.PeersLag
	if !initial.ObservedAt.IsZero() {
		// Seen already: what grows from it waits its Hold.
		d.confirmed = true
		d.window = []span{{view: initial}}
	}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if d.clock == nil {
		d.clock = time.Now
	}
	if d.afterFunc == nil {
		d.afterFunc = func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }
	}
	return d, nil
}

// View returns the view in force.
func (d *Damper) View() View {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.inForce
}

// Pending returns the view that will take effect next if nothing else
// arrives, and when; ok is false when the view in force is the latest one.
// While Run does not run, at may be past.
func (d *Damper) Pending() (view View, at time.Time, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.window) < 2 {
		return View{}, time.Time{}, false
	}
	// Views that stopped being the latest at the same instant as the one in
	// force leave the window with it, and never take effect.
	end := d.window[0].end
	next := 1
	for next < len(d.window)-1 && !d.window[next].end.After(end) {
		next++
	}
	return d.withErrors(d.window[next].view), end.Add(d.hold), true
}

// Update takes the source's latest view; it is the source's OnUpdate. A view
// whose Weight is outside (0, 1] is no view: it is dropped, with a warning.
func (d *Damper) Update(v View) {
	if !validWeight(v.Weight) {
		d.log.Warn("membership damper: view with a weight outside (0, 1] ignored", "weight", v.Weight, "source", v.Source)
		return
	}
	d.mu.Lock()
	now := d.now()
	d.latest = v
	switch {
	case !d.confirmed && v.ObservedAt.IsZero():
		// Still the guess: nothing seen yet to hold against.
	case !d.confirmed:
		d.confirmed = true
		d.window = append(d.window[:0], span{view: v})
	case d.recountAtOnce && d.inForce.Local == 0 && v.Local > 0:
		// Counted again, or for the first time (a newcomer registered): its
		// peers, watching the same catalog, shrink at once to leave it this
		// share, so it takes it at once too. Held, the grow would only
		// leave the share unused.
		d.window = append(d.window[:0], span{view: v})
	default:
		d.expire(now)
		d.window[len(d.window)-1].end = now
		for len(d.window) > 0 && d.window[len(d.window)-1].view.Weight >= v.Weight {
			d.window = d.window[:len(d.window)-1]
		}
		d.window = append(d.window, span{view: v})
		if n := len(d.window); n > d.maxWindow && n >= 3 {
			// Too many rising views within one Hold: let the smaller of the
			// two before the latest stand for both. It is seen longer than it
			// was, which is tighter, never looser.
			d.window[n-3].end = d.window[n-2].end
			d.window = append(d.window[:n-2], d.window[n-1])
		}
	}
	d.settle(now)
	if d.inForce.Weight < v.Weight {
		d.log.Debug("membership damper: weight grow held", "weight", v.Weight, "in_force", d.inForce.Weight,
			"next", d.window[1].view.Weight, "at", d.window[0].end.Add(d.hold))
	}
	d.commit()
}

// Run lets held views take effect, on time, until ctx is done; then it
// returns nil, and views that are still held stay held. It returns
// ErrDamperRunning if called again while, or after, it runs.
func (d *Damper) Run(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return ErrDamperRunning
	}
	d.mu.Lock()
	d.armed = true
	before := d.inForce
	d.expire(d.now())
	d.settle(d.now())
	if before != d.inForce {
		d.commit()
	} else {
		d.mu.Unlock()
	}

	<-ctx.Done()

	d.mu.Lock()
	d.armed = false
	d.disarm()
	d.mu.Unlock()
	return nil
}

// validWeight reports whether w is a share: in (0, 1], so not NaN.
func validWeight(w float64) bool { return w > 0 && w <= 1 }

// fire runs when the timer set as number gen expires.
func (d *Damper) fire(gen uint64) {
	d.mu.Lock()
	if gen != d.gen || !d.armed {
		d.mu.Unlock()
		return
	}
	d.stop = nil
	now := d.now()
	before := d.inForce
	d.expire(now)
	d.settle(now)
	if before == d.inForce {
		d.mu.Unlock()
		return
	}
	d.log.Info("membership damper: held weight grow applied", "weight", d.inForce.Weight, "previous", before.Weight,
		"total", d.inForce.Total, "local", d.inForce.Local, "hold", d.hold)
	d.commit()
}

// now reads the clock, never earlier than its last reading. Called with mu
// held.
func (d *Damper) now() time.Time {
	if t := d.clock(); t.After(d.last) {
		d.last = t
	}
	return d.last
}

// expire drops the views no longer seen at now. Called with mu held.
func (d *Damper) expire(now time.Time) {
	drop := 0
	for drop < len(d.window)-1 && !now.Before(d.window[drop].end.Add(d.hold)) {
		drop++
	}
	d.window = d.window[drop:]
}

// settle puts the window's smallest view in force and sets the timer for the
// next change. Called with mu held.
func (d *Damper) settle(now time.Time) {
	if len(d.window) == 0 {
		d.inForce = d.latest
		return
	}
	d.inForce = d.withErrors(d.window[0].view)
	d.disarm()
	if len(d.window) < 2 || !d.armed {
		return
	}
	d.gen++
	gen := d.gen
	d.stop = d.afterFunc(d.window[0].end.Add(d.hold).Sub(now), func() { d.fire(gen) })
}

// disarm stops the timer, if one is set. Called with mu held.
func (d *Damper) disarm() {
	if d.stop != nil {
		d.stop()
		d.stop = nil
	}
	d.gen++
}

// withErrors is v with the latest view's error fields, and its fault when
// that is the watch's (a failed query); FaultAbsent stays v's own, as it
// describes v's counts. Called with mu held.
func (d *Damper) withErrors(v View) View {
	v.Errors, v.LastError = d.latest.Errors, d.latest.LastError
	switch f := d.latest.Fault; {
	case f != "" && f != FaultAbsent:
		v.Fault = f
	case v.Fault != FaultAbsent:
		v.Fault = ""
	}
	return v
}

// commit hands the view in force to onUpdate and releases mu. onUpdate runs
// outside mu, so it may read the Damper; a view overtaken by a newer one on
// its way is dropped, so the subscriber never goes back to an older view.
// Called with mu held.
func (d *Damper) commit() {
	d.seq++
	seq, v := d.seq, d.inForce
	d.mu.Unlock()
	if d.onUpdate == nil {
		return
	}
	d.pub.Lock()
	defer d.pub.Unlock()
	if seq > d.published {
		d.published = seq
		d.onUpdate(v)
	}
}

// armedForTest reports whether Run has armed the Damper's timers.
func (d *Damper) armedForTest() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.armed
}

// windowLenForTest is how many views the Damper remembers.
func (d *Damper) windowLenForTest() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.window)
}
