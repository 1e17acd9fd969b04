package loadgen

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// MaxRounds caps a comparison.
const MaxRounds = 100

// Side is one of the two servers a comparison alternates between.
type Side struct {
	Label     string
	Targets   []string
	ServerPID int // 0: no CPU figures for this side
}

// CompareConfig describes an A/B comparison: Rounds rounds, each running the same
// load against A and then against B. A is the baseline (usually the no-op floor)
// and ratios are B/A.
type CompareConfig struct {
	// Load is the load of every run. Its Targets, ServerPID and Label are ignored:
	// they come from A and B.
	Load   Config
	A, B   Side
	Rounds int // 0 means 4
}

// Validate reports every problem with c at once.
func (c CompareConfig) Validate() error {
	var errs []error
	if len(c.A.Targets) == 0 {
		errs = append(errs, errors.New("target-a: none given"))
	}
	if len(c.B.Targets) == 0 {
		errs = append(errs, errors.New("target-b: none given"))
	}
	if c.A.ServerPID < 0 || c.B.ServerPID < 0 {
		errs = append(errs, errors.New("pid-a, pid-b: negative"))
	}
	if c.Rounds < 0 || c.Rounds > MaxRounds {
		errs = append(errs, fmt.Errorf("rounds: %d is outside 1..%d", c.Rounds, MaxRounds))
	}
	load := c.Load
	load.Targets, load.ServerPID = []string{"-"}, 0 // judged above
	if err := load.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Comparison is the outcome of Compare.
type Comparison struct {
	Rounds int        `json:"rounds"`
	A      SideResult `json:"a"`
	B      SideResult `json:"b"`
	// Ratio is B's medians over A's.
	Ratio Ratios `json:"ratio_b_over_a"`
}

// SideResult holds one side's runs, in round order, and their medians.
type SideResult struct {
	Label     string   `json:"label"`
	Targets   []string `json:"targets"`
	ServerPID int      `json:"server_pid,omitempty"`
	Runs      []Result `json:"runs"`
	Median    Summary  `json:"median"`
}

// Summary is the median of each figure across a side's runs, taken separately.
type Summary struct {
	Throughput float64       `json:"requests_per_second"`
	P50        time.Duration `json:"p50_ns"`
	P90        time.Duration `json:"p90_ns"`
	P99        time.Duration `json:"p99_ns"`
	P999       time.Duration `json:"p999_ns"`
	Max        time.Duration `json:"max_ns"`
	// ServerCPUPerDecision is 0 when the side has no ServerPID.
	ServerCPUPerDecision time.Duration `json:"server_cpu_per_decision_ns,omitempty"`
}

// Ratios are B/A. A ratio is 0 when either side lacks the figure.
type Ratios struct {
	Throughput           float64 `json:"requests_per_second"`
	P50                  float64 `json:"p50"`
	P99                  float64 `json:"p99"`
	ServerCPUPerDecision float64 `json:"server_cpu_per_decision,omitempty"`
}

// Compare runs A, B, A, B, ... for cfg.Rounds rounds. Machines drift, so only
// figures from the same comparison are put side by side. It stops at the first
// failed run and returns the runs done so far with the error.
func Compare(ctx context.Context, cfg CompareConfig) (Comparison, error) {
	if err := cfg.Validate(); err != nil {
		return Comparison{}, err
	}
	if cfg.Rounds == 0 {
		cfg.Rounds = 4
	}
	c := Comparison{
		Rounds: cfg.Rounds,
		A:      SideResult{Label: labelOr(cfg.A.Label, "A"), Targets: cfg.A.Targets, ServerPID: cfg.A.ServerPID},
		B:      SideResult{Label: labelOr(cfg.B.Label, "B"), Targets: cfg.B.Targets, ServerPID: cfg.B.ServerPID},
	}
	for round := 1; round <= cfg.Rounds; round++ {
		for _, s := range []struct {
			side *Side
			out  *SideResult
		}{{&cfg.A, &c.A}, {&cfg.B, &c.B}} {
			load := cfg.Load
			load.Targets = s.side.Targets
			load.ServerPID = s.side.ServerPID
			load.Label = fmt.Sprintf("%s round %d/%d", s.out.Label, round, cfg.Rounds)
			res, err := Run(ctx, load)
			if err != nil {
				c.finish()
				return c, fmt.Errorf("compare %s: %w", load.Label, err)
			}
			res.Label = s.out.Label
			s.out.Runs = append(s.out.Runs, res)
		}
	}
	c.finish()
	return c, nil
}

func labelOr(l, def string) string {
	if l == "" {
		return def
	}
	return l
}

// finish computes the medians and ratios from the runs there are.
func (c *Comparison) finish() {
	c.A.Median = summarize(c.A.Runs)
	c.B.Median = summarize(c.B.Runs)
	c.Ratio = Ratios{
		Throughput:           ratio(c.B.Median.Throughput, c.A.Median.Throughput),
		P50:                  ratio(float64(c.B.Median.P50), float64(c.A.Median.P50)),
		P99:                  ratio(float64(c.B.Median.P99), float64(c.A.Median.P99)),
		ServerCPUPerDecision: ratio(float64(c.B.Median.ServerCPUPerDecision), float64(c.A.Median.ServerCPUPerDecision)),
	}
}

func ratio(b, a float64) float64 {
	if a == 0 || b == 0 {
		return 0
	}
	return b / a
}

func summarize(runs []Result) Summary {
	pick := func(f func(Result) float64) float64 {
		v := make([]float64, 0, len(runs))
		for _, r := range runs {
			v = append(v, f(r))
		}
		return median(v)
	}
	dur := func(f func(Result) time.Duration) time.Duration {
		return time.Duration(pick(func(r Result) float64 { return float64(f(r)) }))
	}
	s := Summary{
		Throughput: pick(func(r Result) float64 { return r.Throughput }),
		P50:        dur(func(r Result) time.Duration { return r.Latency.P50 }),
		P90:        dur(func(r Result) time.Duration { return r.Latency.P90 }),
		P99:        dur(func(r Result) time.Duration { return r.Latency.P99 }),
		P999:       dur(func(r Result) time.Duration { return r.Latency.P999 }),
		Max:        dur(func(r Result) time.Duration { return r.Latency.Max }),
	}
	s.ServerCPUPerDecision = dur(func(r Result) time.Duration {
		if r.Server == nil {
			return 0
		}
		return r.Server.PerDecision
	})
	return s
}

// median of v; the mean of the middle two for an even count; 0 when empty.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}
