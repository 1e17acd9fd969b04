package simulate

import (
	"cmp"
	"fmt"
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
	for _, e := range byTime(c.Events) { // in the order Run applies them
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

// Run simulates c: every step of virtual time, the membership events due,
// then the shares (equal, or the demand leader's and replicas' work), then
// the traffic, and at each second's end a bin.
func Run(c Config) (*Result, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	s := newSim(c)
	for t := time.Duration(0); t < c.Duration; t += step {
		if err := s.tick(t); err != nil {
			return nil, err
		}
	}
	return s.finish(), nil
}

// sim is one run's state. It is not safe for concurrent use.
type sim struct {
	c     Config
	burst float64 // B, Config.Burst or L
	res   *Result
	// reps are the live replicas, in the order of their names' numbers;
	// named is how many were ever created.
	reps  []*replica
	named int
	// events are those not yet applied, earliest first.
	events []Event

	// Demand shares: the KV the replicas write their reports to, its
	// index, the parameters the leader wrote and the watch has yet to
	// deliver, and when the leader divides next.
	kv         map[string]kvReport
	index      uint64
	pending    []pendingParams
	nextDivide time.Duration

	// What the run measured so far.
	writes, leaderBytes, paramsBytes float64
	bins                             int
	bin                              Bin // the second in progress
	busiest                          map[string]bool
	wts                              []float64 // scratch for weights
}

// pendingParams are parameters that reach the replicas at.
type pendingParams struct {
	at time.Duration
	p  demand.Params
}

// newSim starts a run of a valid c at time 0, with c.Replicas replicas.
func newSim(c Config) *sim {
	s := &sim{c: c, burst: c.Burst, kv: map[string]kvReport{}, busiest: map[string]bool{}}
	if s.burst == 0 {
		s.burst = c.Limit
	}
	s.bins = int(c.Duration / time.Second)
	s.res = &Result{Config: c, PerReplica: map[string][]float64{}, Bins: make([]Bin, s.bins)}
	s.events = byTime(c.Events)
	s.join(c.Replicas, 0)
	return s
}

// byTime returns a copy of events, earliest first, events at the same time
// in the order given.
func byTime(events []Event) []Event {
	out := slices.Clone(events)
	slices.SortStableFunc(out, func(a, b Event) int { return cmp.Compare(a.At, b.At) })
	return out
}

// tick runs the step that starts at t.
func (s *sim) tick(t time.Duration) error {
	s.applyEvents(t)
	if !s.c.Demand {
		s.equalShares(t)
	} else if err := s.demandShares(t); err != nil {
		return err
	}
	sumW := s.traffic(t)
	s.res.MaxShareSum = max(s.res.MaxShareSum, sumW)
	if end := t + step; end%time.Second == 0 {
		s.closeBin(end, sumW)
	}
	return nil
}

// finish pads every busiest replica's series to the whole run and turns
// the totals into rates.
func (s *sim) finish() *Result {
	res := s.res
	for name, v := range res.PerReplica {
		for len(v) < s.bins {
			v = append(v, 0)
		}
		res.PerReplica[name] = v
	}
	secs := s.c.Duration.Seconds()
	res.WritesPerSecond = s.writes / secs
	res.LeaderReadBytesPerS = s.leaderBytes / secs
	res.ParamsServedBytesPer = s.paramsBytes / secs
	return res
}

// join adds n replicas at t, each named for the next number. A newcomer
// starts with a full bucket at its equal share, among the replicas after
// the join; the others keep theirs until the shares change them.
func (s *sim) join(n int, t time.Duration) {
	for range n {
		s.named++
		s.reps = append(s.reps, &replica{name: fmt.Sprintf("node%d", s.named), num: s.named, holdAt: -1})
	}
	eq := 1 / float64(len(s.reps))
	for _, r := range s.reps {
		if r.w == 0 {
			r.w = eq
			r.tokens = eq * s.burst
			r.lastWrite = t
		}
	}
}

// leave removes the last n replicas. They deregister, so the leader drops
// their reports.
func (s *sim) leave(n int) {
	cut := len(s.reps) - n
	for _, r := range s.reps[cut:] {
		delete(s.kv, r.name)
	}
	s.reps = s.reps[:cut]
}

// applyEvents applies the membership events due at t.
func (s *sim) applyEvents(t time.Duration) {
	for len(s.events) > 0 && s.events[0].At <= t {
		e := s.events[0]
		s.events = s.events[1:]
		if e.Delta > 0 {
			s.join(e.Delta, t)
		} else {
			s.leave(-e.Delta)
		}
	}
}

// traffic offers one step's load at t to fluid token buckets, and returns
// the shares in force, summed.
func (s *sim) traffic(t time.Duration) (sumW float64) {
	c, k := &s.c, len(s.reps)
	s.wts = slices.Grow(s.wts[:0], k)[:k]
	total := c.weights(k, t, s.wts)
	dt := step.Seconds()
	for i, r := range s.reps {
		sumW += r.w
		r.tokens = min(r.tokens+r.w*c.Limit*dt, max(r.w*s.burst, 1))
		o := total * s.wts[i] * dt
		a := min(o, r.tokens)
		r.tokens -= a
		r.offered += uint64(o * 1000)
		r.admitted += uint64(a * 1000)
		r.admBin += a

		s.bin.Admitted += a
		s.bin.Offered += o
	}
	return sumW
}

// closeBin ends the second that ends at end: it stores the bin, with the
// shares summed to sumW, and each busiest replica's admitted figure. The
// two busiest replicas of a second join the busiest, up to four over the
// run; a series starts with zeros for the seconds before its replica
// joined them.
func (s *sim) closeBin(end time.Duration, sumW float64) {
	if b := int(end/time.Second) - 1; b < s.bins {
		s.bin.T, s.bin.Replicas, s.bin.Shares = time.Duration(b)*time.Second, len(s.reps), sumW
		s.res.Bins[b] = s.bin
		slices.SortFunc(s.reps, func(x, y *replica) int { return cmp.Compare(y.admBin, x.admBin) })
		for _, r := range s.reps[:min(2, len(s.reps))] {
			if len(s.busiest) < 4 {
				s.busiest[r.name] = true
			}
		}
		for _, r := range s.reps {
			if s.busiest[r.name] {
				v := s.res.PerReplica[r.name]
				for len(v) < b {
					v = append(v, 0)
				}
				s.res.PerReplica[r.name] = append(v, r.admBin)
			}
			r.admBin = 0
		}
		slices.SortFunc(s.reps, func(x, y *replica) int { return cmp.Compare(x.num, y.num) })
	}
	s.bin = Bin{}
}
