// Package simulate runs K replicas sharing one global limit in process, in
// virtual time, under a shape of traffic and membership events, with equal
// shares or shares that follow demand, and reports what the cluster admitted
// and what demand sharing cost Consul.
//
// Why a package: it answers an operator's question before any deployment
// (does my traffic shape tolerate local limits, and does demand sharing fix
// it?) and shows the design at scales no test machine runs (K = 1,000). It
// uses the real rule, encodings and report history of package demand, so the
// shares it computes are the ones the daemon computes; what it models is the
// rest: fluid token buckets, a watch delay, and Consul as a map.
package simulate

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/sharelimit/sharelimit/demand"
)

// Shapes of traffic.
const (
	Even   = "even"   // every replica offered the same
	Zipf   = "zipf"   // replica i offered in proportion to 1/(i+1)
	Hot    = "hot"    // 80% to one replica, the rest spread evenly
	Moving = "moving" // as hot, the hot spot moving to the next replica every third of the run
	Steps  = "steps"  // even, the total stepping 0.5×, 2×, 1×, 3× the offered rate by quarters
)

// Shapes lists the shapes.
var Shapes = []string{Even, Zipf, Hot, Moving, Steps}

// Event changes the membership at a time: Delta replicas join (> 0) or the
// last ones leave (< 0).
type Event struct {
	At    time.Duration
	Delta int
}

// Config is one simulation.
type Config struct {
	Replicas  int           // at the start
	Limit     float64       // L, per second
	Burst     float64       // B; 0 means L (one second's worth)
	Offered   float64       // total offered, per second
	Shape     string        // one of Shapes
	Duration  time.Duration // of the run
	Demand    bool          // demand shares; else equal shares
	Interval  time.Duration // --demand-interval
	MaxWrites float64       // --demand-max-writes
	Hold      time.Duration // --membership-hold, for equal shares' grows
	Events    []Event
}

// step is the simulation's time step; watchDelay is how long parameters
// take to reach the replicas after the leader writes them; queryGap is one
// query interval of the params watch at the default 2 queries a second.
const (
	step       = 10 * time.Millisecond
	watchDelay = 50 * time.Millisecond
	queryGap   = 500 * time.Millisecond
	growSlack  = 250 * time.Millisecond
	maxK       = 100_000
)

// Bin is one second of the run.
type Bin struct {
	T        time.Duration
	Admitted float64 // per second, the whole cluster
	Offered  float64
	Replicas int
	Writes   int     // demand reports written
	Shares   float64 // the shares in force at the bin's end, summed, as a fraction of L
}

// Result is what a run measured.
type Result struct {
	Config Config
	Bins   []Bin
	// PerReplica holds, for the replicas that were ever the busiest (up to
	// four), their admitted rate per bin.
	PerReplica map[string][]float64
	// Consul's load, per second, over the run.
	WritesPerSecond      float64
	LeaderReadBytesPerS  float64
	ParamsServedBytesPer float64
	ReportBytes          int // one report's size
	ParamsBytes          int // one parameter set's size
	MaxShareSum          float64
}

// replica is one simulated replica.
type replica struct {
	name      string
	tokens    float64
	w         float64 // the share in force, a fraction of L
	grows     []pendingGrow
	offered   uint64 // the meter, in thousandths of a token
	admitted  uint64
	rates     demand.Rates
	hist      demand.History
	last      *demand.Report
	lastWrite time.Duration
	wrote     bool
	seq       uint64
	params    *demand.Params
	admBin    float64
}

// pendingGrow is a larger share waiting until at.
type pendingGrow struct {
	w  float64
	at time.Duration
}

// kvReport is a report in the simulated KV.
type kvReport struct {
	rep   demand.Report
	index uint64
}

// Validate checks c.
func (c *Config) Validate() error {
	var errs []string
	if c.Replicas < 1 || c.Replicas > maxK {
		errs = append(errs, fmt.Sprintf("replicas %d: want 1 to %d", c.Replicas, maxK))
	}
	if !(c.Limit > 0) || math.IsInf(c.Limit, 0) {
		errs = append(errs, fmt.Sprintf("limit %v: want a positive rate", c.Limit))
	}
	if !(c.Offered >= 0) || math.IsInf(c.Offered, 0) {
		errs = append(errs, fmt.Sprintf("offered %v: want a rate", c.Offered))
	}
	if c.Burst < 0 || math.IsNaN(c.Burst) {
		errs = append(errs, fmt.Sprintf("burst %v", c.Burst))
	}
	if !slices.Contains(Shapes, c.Shape) {
		errs = append(errs, fmt.Sprintf("shape %q: want one of %s", c.Shape, strings.Join(Shapes, ", ")))
	}
	if c.Duration < time.Second || c.Duration > 24*time.Hour {
		errs = append(errs, fmt.Sprintf("duration %s: want 1s to 24h", c.Duration))
	}
	if c.Interval < 100*time.Millisecond || c.Interval > time.Minute {
		errs = append(errs, fmt.Sprintf("interval %s: want 100ms to 1m", c.Interval))
	}
	if !(c.MaxWrites >= 1) {
		errs = append(errs, fmt.Sprintf("max writes %v: want at least 1", c.MaxWrites))
	}
	if c.Hold < 0 {
		errs = append(errs, fmt.Sprintf("hold %s", c.Hold))
	}
	k := c.Replicas
	for _, e := range c.Events {
		k += e.Delta
		if e.At < 0 || e.At > c.Duration || k < 1 || k > maxK {
			errs = append(errs, fmt.Sprintf("event %+v: at %s leaves %d replicas", e, e.At, k))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("simulate: %s", strings.Join(errs, "; "))
	}
	return nil
}

// weights is the share of the offered load each of n replicas gets at t.
func (c *Config) weights(n int, t time.Duration, out []float64) (total float64) {
	total = c.Offered
	switch c.Shape {
	case Zipf:
		var sum float64
		for i := range n {
			out[i] = 1 / float64(i+1)
			sum += out[i]
		}
		for i := range n {
			out[i] /= sum
		}
		return total
	case Hot, Moving:
		hot := 0
		if c.Shape == Moving {
			hot = int(t/(c.Duration/3)) % n
		}
		for i := range n {
			out[i] = 0.2 / float64(max(n-1, 1))
		}
		if n == 1 {
			out[0] = 1
			return total
		}
		out[hot] = 0.8
		return total
	case Steps:
		total *= [...]float64{0.5, 2, 1, 3}[min(int(4*t/c.Duration), 3)]
	}
	for i := range n {
		out[i] = 1 / float64(n)
	}
	return total
}

// Run simulates c.
func Run(c Config) (*Result, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	burst := c.Burst
	if burst == 0 {
		burst = c.Limit
	}
	const id = demand.RuleID(1)
	res := &Result{Config: c, PerReplica: map[string][]float64{}}
	var reps []*replica
	named := 0
	add := func(n int, t time.Duration) {
		for range n {
			named++
			r := &replica{name: fmt.Sprintf("node%d", named)}
			reps = append(reps, r)
		}
		k := len(reps)
		for _, r := range reps {
			eq := 1 / float64(k)
			if r.w == 0 { // a newcomer: a full bucket at its equal share
				r.w = eq
				r.tokens = eq * burst
				r.lastWrite = t
			}
		}
	}
	add(c.Replicas, 0)
	// Every replica writes at the same stretched interval; the leader
	// divides twice per interval; its parameters reach the replicas after
	// the watch delay.
	var kv = map[string]kvReport{}
	var index uint64
	var pending []struct {
		at time.Duration
		p  demand.Params
	}
	nextDivide := time.Duration(0)
	var equalHoldAt time.Duration = -1 // equal shares: when a held grow applies
	var equalHoldW float64
	events := slices.Clone(c.Events)
	slices.SortFunc(events, func(a, b Event) int { return int(a.At - b.At) })
	var writes, leaderBytes, paramsBytes float64
	bins := int(c.Duration / time.Second)
	res.Bins = make([]Bin, bins)
	wts := make([]float64, 0)
	var bin Bin
	busiest := map[string]bool{}
	for t := time.Duration(0); t < c.Duration; t += step {
		for len(events) > 0 && events[0].At <= t {
			e := events[0]
			events = events[1:]
			if e.Delta > 0 {
				add(e.Delta, t)
			} else {
				for _, r := range reps[len(reps)+e.Delta:] {
					delete(kv, r.name) // deregistered: the leader drops its report
				}
				reps = reps[:len(reps)+e.Delta]
			}
		}
		k := len(reps)
		eq := 1 / float64(k)
		stretched := demand.Stretch(c.Interval, k, c.MaxWrites)
		now := time.Unix(0, 0).Add(t)
		if !c.Demand {
			// Equal shares, through the membership damper: a smaller
			// weight at once, a larger one once it has held.
			for _, r := range reps {
				switch {
				case eq < r.w:
					setShare(r, eq, burst)
					equalHoldAt = -1
				case eq > r.w && equalHoldAt < 0:
					equalHoldAt, equalHoldW = t+c.Hold, eq
				}
			}
			if equalHoldAt >= 0 && t >= equalHoldAt {
				for _, r := range reps {
					setShare(r, equalHoldW, burst)
				}
				equalHoldAt = -1
			}
		} else {
			// Leader: divide, encode, and hand the parameters to the
			// watch.
			if t >= nextDivide {
				nextDivide = t + stretched/2
				wants := make([]demand.Want, 0, len(kv))
				var admitted float64
				var counted []demand.ReportRef
				for _, name := range slices.Sorted(maps.Keys(kv)) { // a fixed order: the sums are the same every run
					x := kv[name]
					wants = append(wants, demand.Want{Units: x.rep.Units, Offered: x.rep.Rules[0].Offered})
					admitted += x.rep.Rules[0].Admitted
					counted = append(counted, demand.ReportRef{Index: x.index, Node: demand.TagOf(name)})
				}
				slices.SortFunc(counted, func(a, b demand.ReportRef) int { return cmp.Compare(a.Index, b.Index) })
				rule := demand.Divide(c.Limit, uint32(k), wants, demand.DefaultHeadroom, demand.DefaultFloor)
				p := demand.Params{At: now.UnixNano(), Snapshot: index, Reports: counted, Units: rule.Units, Headroom: rule.Headroom, Floor: rule.Floor, Leader: reps[0].name,
					Rules: []demand.RuleParams{{ID: id, Limit: rule.Limit, K: rule.K, R: rule.R, Admitted: admitted}}}
				b, err := demand.AppendParams(nil, &p)
				if err != nil {
					return nil, err
				}
				p, err = demand.DecodeParams(b)
				if err != nil {
					return nil, err
				}
				res.ParamsBytes = len(b)
				leaderBytes += float64(len(kv) * res.ReportBytes)
				paramsBytes += float64(k * len(b))
				index++
				pending = append(pending, struct {
					at time.Duration
					p  demand.Params
				}{t + watchDelay, p})
			}
			for len(pending) > 0 && pending[0].at <= t {
				p := pending[0].p
				pending = pending[1:]
				for _, r := range reps {
					r.params = &p
				}
			}
			for _, r := range reps {
				// The meter counts thousandths of a token (the buckets
				// are fluid); the rates are scaled back below.
				r.rates.Update(r.offered, r.admitted, now, c.Interval/4)
				offeredRate, admittedRate := r.rates.Offered/1000, r.rates.Admitted/1000
				// Write when due, as the daemon does.
				since := t - r.lastWrite
				due := !r.wrote || since >= 2*stretched
				if r.wrote && since >= stretched && r.last != nil && demand.Moved(r.last.Rules[0].Offered, offeredRate, 0.1, 1) {
					due = true
				}
				if r.wrote && since < stretched {
					due = false
				}
				if due {
					r.seq++
					rep := demand.Report{Seq: r.seq, At: now.UnixNano(), Units: 1, Node: r.name,
						Rules: []demand.RuleDemand{{ID: id, Offered: offeredRate, Admitted: admittedRate}}}
					b, err := demand.AppendReport(nil, &rep)
					if err != nil {
						return nil, err
					}
					dec, err := demand.DecodeReport(b)
					if err != nil {
						return nil, err
					}
					res.ReportBytes = len(b)
					index++
					kv[r.name] = kvReport{dec, index}
					r.hist.Add(index, dec)
					r.last, r.lastWrite, r.wrote = &dec, t, true
					writes++
					bin.Writes++
				}
				target := eq
				if p := r.params; p != nil {
					rp := p.Find(id)
					rep, standing := r.hist.Reported(p, r.name)
					units, offered, absent := uint32(1), 0.0, false
					switch standing {
					case demand.Counted:
						offered = rep.Rules[0].Offered
					case demand.Absent:
						absent = true
					}
					if rp != nil {
						if g, ok := demand.Share(p.Rule(rp), units, offered, absent, uint32(k)); ok {
							target = min(1, max(g/c.Limit, 1e-9))
						}
					}

				}
				// As the daemon: a smaller share at once; a larger one
				// after the grow delay from the parameters that asked for
				// it, a still larger one after its own.
				if target <= r.w {
					setShare(r, target, burst)
					r.grows = r.grows[:0]
				} else {
					if n := len(r.grows); n == 0 || target > r.grows[n-1].w {
						r.grows = append(r.grows, pendingGrow{w: target, at: t + queryGap + growSlack})
					}
					apply, keep := r.w, r.grows[:0]
					for _, g := range r.grows {
						g.w = min(g.w, target)
						if t >= g.at {
							apply = max(apply, g.w)
							continue
						}
						keep = append(keep, g)
					}
					r.grows = keep
					setShare(r, apply, burst)
				}
			}
		}
		// Traffic: fluid token buckets.
		wts = slices.Grow(wts[:0], k)[:k]
		total := c.weights(k, t, wts)
		dt := step.Seconds()
		var sumW float64
		for i, r := range reps {
			sumW += r.w
			r.tokens = min(r.tokens+r.w*c.Limit*dt, max(r.w*burst, 1))
			o := total * wts[i] * dt
			a := min(o, r.tokens)
			r.tokens -= a
			r.offered += uint64(o * 1000)
			r.admitted += uint64(a * 1000)
			r.admBin += a

			bin.Admitted += a
			bin.Offered += o
		}
		res.MaxShareSum = max(res.MaxShareSum, sumW)
		if end := t + step; end%time.Second == 0 {
			b := int(end/time.Second) - 1
			if b < bins {
				bin.T, bin.Replicas, bin.Shares = time.Duration(b)*time.Second, k, sumW
				res.Bins[b] = bin
				// Track the busiest replicas, for the chart.
				slices.SortFunc(reps, func(x, y *replica) int { return cmpDesc(x.admBin, y.admBin) })
				for _, r := range reps[:min(2, len(reps))] {
					if len(busiest) < 4 {
						busiest[r.name] = true
					}
				}
				for _, r := range reps {
					if busiest[r.name] {
						s := res.PerReplica[r.name]
						for len(s) < b {
							s = append(s, 0)
						}
						res.PerReplica[r.name] = append(s, r.admBin)
					}
					r.admBin = 0
				}
				slices.SortFunc(reps, func(x, y *replica) int { return strings.Compare(pad(x.name), pad(y.name)) })
			}
			bin = Bin{}
		}
	}
	for name, s := range res.PerReplica {
		for len(s) < bins {
			s = append(s, 0)
		}
		res.PerReplica[name] = s
	}
	secs := c.Duration.Seconds()
	res.WritesPerSecond = writes / secs
	res.LeaderReadBytesPerS = leaderBytes / secs
	res.ParamsServedBytesPer = paramsBytes / secs
	return res, nil
}

// setShare applies a share as the engine does: rate and size both, keeping
// the bucket's fill ratio.
func setShare(r *replica, w, burst float64) {
	if w == r.w {
		return
	}
	oldSize, newSize := max(r.w*burst, 1), max(w*burst, 1)
	r.tokens *= newSize / oldSize
	r.w = w
}

func cmpDesc(a, b float64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}

// pad makes node names sort by number.
func pad(name string) string { return fmt.Sprintf("%12s", name) }
