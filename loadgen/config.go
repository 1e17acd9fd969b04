package loadgen

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// Bounds on a run. A run always ends by itself: MaxDuration caps it even when only
// a request count bounds it.
const (
	MaxDuration       = time.Hour
	MaxWarmup         = 10 * time.Minute
	MaxConcurrency    = 10_000
	MaxConnsPerTarget = 256
	MaxDescriptors    = 256
	MaxRate           = 10_000_000
)

// Defaults for the zero values of Config.
const (
	DefaultDomain      = "bench"
	DefaultConcurrency = 16
)

// openLoopLookahead sizes the automatic open-loop worker count: enough workers
// to cover this much of the schedule. Go's timers can fire a millisecond late on
// an idle Linux process, and a worker is only free to take its next slot once it
// has slept through the last one.
const openLoopLookahead = 4 * time.Millisecond

// Config describes one load run.
//
// The zero value is not runnable: set Targets and at least one of Duration and
// Requests. Every other zero field takes the default noted beside it.
type Config struct {
	// Targets are host:port or unix:/path addresses. Workers are spread over all
	// connections to all targets round-robin.
	Targets []string
	// Conns is the number of gRPC (HTTP/2) connections per target; 0 means 1.
	Conns int
	// Concurrency is the number of workers, which is also the most calls in
	// flight. 0 means DefaultConcurrency in closed loop, and in open loop enough
	// workers to cover openLoopLookahead of the schedule (at least
	// DefaultConcurrency).
	Concurrency int
	// Duration is the measured window; 0 means the window ends after Requests.
	Duration time.Duration
	// Requests ends the measured window after this many requests; 0 means the
	// window ends after Duration. With both, whichever comes first.
	Requests uint64
	// Rate is the total requests per second in open loop; 0 means closed loop,
	// where each worker sends its next request as soon as the last is answered.
	Rate float64
	// Descriptors is the number of descriptors per request; 0 means 1.
	Descriptors int
	// Shape of each descriptor; "" means ShapeGenericKey.
	Shape Shape
	// Cardinality is the number of distinct descriptor values cycled through, round
	// robin; 0 means 1.
	Cardinality int
	// HitsAddend is the request's hits_addend (0 means 1 to the server).
	HitsAddend uint32
	// Domain of every request; "" means DefaultDomain.
	Domain string
	// Warmup runs the same load for this long before the measured window, and
	// discards it.
	Warmup time.Duration
	// Timeout is a per-call deadline, as Envoy's filter sets one; 0 means none.
	Timeout time.Duration
	// ServerPID, when not 0, is the process whose CPU time is read from /proc
	// around the measured window.
	ServerPID int
	// Progress, when not nil, receives a line every second while load runs.
	Progress io.Writer
	// Label prefixes progress lines and is copied into the Result.
	Label string
}

// Validate reports every problem with c at once. It is a flat list of
// independent checks, one per field, in the order of the fields: its
// complexity is their count, not nesting.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(c.Targets) == 0 {
		bad("target: none given")
	}
	for _, t := range c.Targets {
		if strings.TrimSpace(t) == "" {
			bad("target: empty address")
		}
	}
	if c.Conns < 0 || c.Conns > MaxConnsPerTarget {
		bad("conns: %d is outside 1..%d", c.Conns, MaxConnsPerTarget)
	}
	if c.Concurrency < 0 || c.Concurrency > MaxConcurrency {
		bad("concurrency: %d is outside 1..%d", c.Concurrency, MaxConcurrency)
	}
	if c.Duration < 0 || c.Duration > MaxDuration {
		bad("duration: %s is outside 0..%s", c.Duration, MaxDuration)
	}
	if c.Duration == 0 && c.Requests == 0 {
		bad("duration and requests: both are zero, so the run would never end; set one")
	}
	if c.Rate < 0 || c.Rate > MaxRate || math.IsNaN(c.Rate) {
		bad("rate: %g is outside 0..%d", c.Rate, MaxRate)
	}
	if c.Descriptors < 0 || c.Descriptors > MaxDescriptors {
		bad("descriptors: %d is outside 1..%d", c.Descriptors, MaxDescriptors)
	}
	if c.Shape != "" {
		if _, err := ParseShape(string(c.Shape)); err != nil {
			bad("shape: %w", err)
		}
		if c.Shape == ShapeMix && c.Descriptors > 1 {
			bad("descriptors: shape mix sends its own 3 or 4 descriptors; leave descriptors at 1")
		}
	}
	if c.Cardinality < 0 || c.Cardinality > MaxCardinality {
		bad("cardinality: %d is outside 1..%d", c.Cardinality, MaxCardinality)
	}
	if c.Warmup < 0 || c.Warmup > MaxWarmup {
		bad("warmup: %s is outside 0..%s", c.Warmup, MaxWarmup)
	}
	if c.Timeout < 0 {
		bad("timeout: %s is negative", c.Timeout)
	}
	if c.ServerPID < 0 {
		bad("server pid: %d is negative", c.ServerPID)
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	if c.Conns == 0 {
		c.Conns = 1
	}
	if c.Descriptors == 0 {
		c.Descriptors = 1
	}
	if c.Shape == "" {
		c.Shape = ShapeGenericKey
	}
	if c.Cardinality == 0 {
		c.Cardinality = 1
	}
	if c.Domain == "" {
		c.Domain = DefaultDomain
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
		if c.Rate > 0 {
			need := int(math.Ceil(c.Rate * openLoopLookahead.Seconds()))
			c.Concurrency = min(max(need, DefaultConcurrency), MaxConcurrency)
		}
	}
	return c
}
