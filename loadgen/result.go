package loadgen

import (
	"time"

	"google.golang.org/grpc/codes"
)

// Result is what one run measured. Counts and latencies cover the measured window
// only. Requests = OK + OverLimit + Unknown + Errors.
type Result struct {
	Label          string   `json:"label,omitempty"`
	Targets        []string `json:"targets"`
	Loop           string   `json:"loop"` // "closed" or "open"
	Rate           float64  `json:"rate,omitempty"`
	ConnsPerTarget int      `json:"conns_per_target"`
	Concurrency    int      `json:"concurrency"`
	Shape          Shape    `json:"shape"`
	Descriptors    int      `json:"descriptors"`
	Cardinality    int      `json:"cardinality"`
	HitsAddend     uint32   `json:"hits_addend"`
	Domain         string   `json:"domain"`

	Warmup time.Duration `json:"warmup_ns"`
	// Elapsed runs from the window's start to the last answer.
	Elapsed time.Duration `json:"elapsed_ns"`

	Requests  uint64 `json:"requests"`
	OK        uint64 `json:"ok"`
	OverLimit uint64 `json:"over_limit"`
	// Unknown counts answers whose overall_code was neither OK nor OVER_LIMIT.
	Unknown uint64 `json:"unknown"`
	Errors  uint64 `json:"errors"`
	// ErrorsByCode counts failed calls by gRPC status code name.
	ErrorsByCode map[string]uint64 `json:"errors_by_code,omitempty"`
	// Throughput is Requests per second of Elapsed.
	Throughput float64 `json:"requests_per_second"`
	// Late (open loop) counts requests sent after their scheduled time because no
	// worker was free; their latency includes the wait.
	Late uint64 `json:"late,omitempty"`
	// Missed (open loop) counts requests scheduled inside the window but not sent
	// before it closed: the backlog a saturated target leaves.
	Missed uint64 `json:"missed,omitempty"`
	// Latency covers answered calls (not errors).
	Latency Latency `json:"latency"`

	// Server is the target process's CPU time over the window, when ServerPID was
	// given.
	Server *CPUUsage `json:"server_cpu,omitempty"`
	// Client is this process's own CPU time over the window: on a shared machine it
	// is CPU the server did not get.
	Client CPUUsage `json:"client_cpu"`

	// Interrupted is set when the caller's context ended the run early.
	Interrupted bool `json:"interrupted,omitempty"`
}

// Latency summarizes a latency histogram. Quantiles are within
// HistogramRelativeError; Min, Max and Mean are exact.
type Latency struct {
	Min  time.Duration `json:"min_ns"`
	P50  time.Duration `json:"p50_ns"`
	P90  time.Duration `json:"p90_ns"`
	P99  time.Duration `json:"p99_ns"`
	P999 time.Duration `json:"p999_ns"`
	Max  time.Duration `json:"max_ns"`
	Mean time.Duration `json:"mean_ns"`
}

// Summarize reads the usual quantiles off h.
func Summarize(h *Histogram) Latency {
	return Latency{
		Min:  h.Min(),
		P50:  h.Quantile(0.50),
		P90:  h.Quantile(0.90),
		P99:  h.Quantile(0.99),
		P999: h.Quantile(0.999),
		Max:  h.Max(),
		Mean: h.Mean(),
	}
}

// CPUUsage is CPU time (user plus system) spent over a window. A decision is one
// ShouldRateLimit call, whatever its number of descriptors.
type CPUUsage struct {
	PID         int           `json:"pid,omitempty"`
	Total       time.Duration `json:"total_ns"`
	PerDecision time.Duration `json:"per_decision_ns"`
}

func perDecision(pid int, total time.Duration, n uint64) CPUUsage {
	u := CPUUsage{PID: pid, Total: total}
	if n > 0 {
		u.PerDecision = time.Duration(float64(total) / float64(n))
	}
	return u
}

// assemble adds up the workers' counters and histograms.
func assemble(cfg *Config, workers []*worker, out phaseOutcome) Result {
	res := Result{
		Label:          cfg.Label,
		Targets:        append([]string(nil), cfg.Targets...),
		Loop:           "closed",
		ConnsPerTarget: cfg.Conns,
		Concurrency:    cfg.Concurrency,
		Shape:          cfg.Shape,
		Descriptors:    cfg.Descriptors,
		Cardinality:    cfg.Cardinality,
		HitsAddend:     cfg.HitsAddend,
		Domain:         cfg.Domain,
		Warmup:         cfg.Warmup,
		Elapsed:        out.elapsed,
	}
	if cfg.Rate > 0 {
		res.Loop = "open"
		res.Rate = cfg.Rate
	}
	var h Histogram
	var byCode [numCodes]uint64
	for _, w := range workers {
		h.Merge(&w.hist)
		res.OK += w.ok.Load()
		res.OverLimit += w.over.Load()
		res.Unknown += w.unknown.Load()
		res.Errors += w.failed.Load()
		res.Late += w.late
		for c, n := range w.byCode {
			byCode[c] += n
		}
	}
	res.Requests = res.OK + res.OverLimit + res.Unknown + res.Errors
	for c, n := range byCode {
		if n > 0 {
			if res.ErrorsByCode == nil {
				res.ErrorsByCode = make(map[string]uint64)
			}
			res.ErrorsByCode[codes.Code(c).String()] = n
		}
	}
	if out.scheduled > res.Requests {
		res.Missed = out.scheduled - res.Requests
	}
	if out.elapsed > 0 {
		res.Throughput = float64(res.Requests) / out.elapsed.Seconds()
	}
	res.Latency = Summarize(&h)
	return res
}
