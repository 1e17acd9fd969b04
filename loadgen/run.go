package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
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

const (
	// connectTimeout bounds the probe call that checks each connection before load.
	connectTimeout = 5 * time.Second
	// stopGrace is how long calls still in flight when the window closes may take
	// before they are cancelled and counted as errors, so a stuck server cannot
	// hold a run open.
	stopGrace = 5 * time.Second
	// openLoopLookahead sizes the automatic open-loop worker count: enough workers
	// to cover this much of the schedule. Go's timers can fire a millisecond late on
	// an idle Linux process, and a worker is only free to take its next slot once it
	// has slept through the last one.
	openLoopLookahead = 4 * time.Millisecond
)

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

// Validate reports every problem with c at once.
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

// Run dials cfg.Targets, checks each connection with one request, runs the warmup
// and then the measured window, and returns what it measured. It stops by itself.
// If ctx ends first, Run returns what it measured so far, marked Interrupted, with
// an error wrapping ctx's.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	cfg = cfg.withDefaults()
	if cfg.ServerPID != 0 {
		if _, err := procCPU(cfg.ServerPID); err != nil {
			return Result{}, err
		}
	}
	keys := newKeySpace(cfg.Shape, cfg.Cardinality)
	conns, err := dial(ctx, &cfg, keys)
	if err != nil {
		return Result{}, err
	}
	defer closeConns(conns)

	workers := make([]*worker, cfg.Concurrency)
	for i := range workers {
		workers[i] = newWorker(conns[i%len(conns)], newRequestBuilder(keys, cfg.Domain, cfg.Descriptors, cfg.HitsAddend))
	}
	defer func() {
		for _, w := range workers {
			w.timer.Stop()
		}
	}()

	var seq uint64
	if cfg.Warmup > 0 {
		out := runPhase(ctx, &cfg, workers, phaseSpec{seqBase: 0, window: cfg.Warmup, label: strings.TrimSpace(cfg.Label + " warmup")})
		seq = out.claimed
		for _, w := range workers {
			w.reset()
		}
		if ctx.Err() != nil {
			return Result{Label: cfg.Label, Interrupted: true}, fmt.Errorf("run warmup: %w", ctx.Err())
		}
	}

	var srv0 time.Duration
	if cfg.ServerPID != 0 {
		if srv0, err = procCPU(cfg.ServerPID); err != nil {
			return Result{}, err
		}
	}
	cli0 := selfCPU()
	out := runPhase(ctx, &cfg, workers, phaseSpec{seqBase: seq, window: cfg.Duration, requests: cfg.Requests, label: cfg.Label})
	cli1 := selfCPU()
	res := assemble(&cfg, workers, out)
	res.Client = perDecision(0, cli1-cli0, res.Requests)
	if cfg.ServerPID != 0 {
		srv1, err := procCPU(cfg.ServerPID)
		if err != nil {
			return res, err
		}
		u := perDecision(cfg.ServerPID, srv1-srv0, res.Requests)
		res.Server = &u
	}
	if ctx.Err() != nil {
		res.Interrupted = true
		res.Missed = 0
		return res, fmt.Errorf("run: %w", ctx.Err())
	}
	return res, nil
}

func perDecision(pid int, total time.Duration, n uint64) CPUUsage {
	u := CPUUsage{PID: pid, Total: total}
	if n > 0 {
		u.PerDecision = time.Duration(float64(total) / float64(n))
	}
	return u
}

// grpcTarget turns an address into a grpc-go target. A bare host:port goes
// through the passthrough resolver: no DNS lookups and no resolver goroutine.
func grpcTarget(addr string) string {
	if strings.HasPrefix(addr, "unix:") || strings.Contains(addr, "://") {
		return addr
	}
	return "passthrough:///" + addr
}

// dial opens cfg.Conns connections to every target, interleaved so that
// consecutive workers land on different targets, and proves each one answers
// ShouldRateLimit before any load is measured.
func dial(ctx context.Context, cfg *Config, keys *keySpace) ([]*grpc.ClientConn, error) {
	conns := make([]*grpc.ClientConn, 0, cfg.Conns*len(cfg.Targets))
	names := make([]string, 0, cap(conns))
	for range cfg.Conns {
		for _, t := range cfg.Targets {
			cc, err := grpc.NewClient(grpcTarget(t), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				closeConns(conns)
				return nil, fmt.Errorf("dial %s: %w", t, err)
			}
			conns = append(conns, cc)
			names = append(names, t)
		}
	}
	req := newRequestBuilder(keys, cfg.Domain, cfg.Descriptors, cfg.HitsAddend).build(0)
	for i, cc := range conns {
		if err := probe(ctx, cc, req); err != nil {
			closeConns(conns)
			return nil, fmt.Errorf("probe %s: %w", names[i], err)
		}
	}
	return conns, nil
}

// probe makes one fail-fast call, so that a refused connection, a server that does
// not implement the service, or one that rejects the request shape, stops the run
// with the server's own message instead of a table of errors.
func probe(ctx context.Context, cc *grpc.ClientConn, req *rlsv3.RateLimitRequest) error {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	var resp rlsv3.RateLimitResponse
	return cc.Invoke(ctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, req, &resp)
}

func closeConns(conns []*grpc.ClientConn) {
	for _, cc := range conns {
		_ = cc.Close() // only fails when already closed
	}
}

// numCodes covers every gRPC status code; out-of-range codes count as Unknown.
const numCodes = int(codes.Unauthenticated) + 1

// worker sends requests one at a time. Its counters are atomics only so that the
// progress line can read them while it runs; each has a single writer.
type worker struct {
	conn  *grpc.ClientConn
	b     *requestBuilder
	resp  *rlsv3.RateLimitResponse
	timer *time.Timer
	hist  Histogram

	ok, over, unknown, failed atomic.Uint64

	byCode [numCodes]uint64
	late   uint64
}

func newWorker(conn *grpc.ClientConn, b *requestBuilder) *worker {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &worker{conn: conn, b: b, resp: &rlsv3.RateLimitResponse{}, timer: t}
}

func (w *worker) reset() {
	w.hist.Reset()
	w.ok.Store(0)
	w.over.Store(0)
	w.unknown.Store(0)
	w.failed.Store(0)
	w.byCode = [numCodes]uint64{}
	w.late = 0
}

func (w *worker) sent() uint64 {
	return w.ok.Load() + w.over.Load() + w.unknown.Load() + w.failed.Load()
}

// phase is the shared, read-mostly state of one window.
type phase struct {
	seq      atomic.Uint64 // next slot to claim, relative to the window
	seqBase  uint64        // key sequence offset, so the window continues the warmup's walk
	start    time.Time
	stopAt   time.Time
	limit    uint64  // 0: no request bound
	interval float64 // nanoseconds between scheduled sends; 0: closed loop
	timeout  time.Duration
}

// due is when open-loop slot r is scheduled.
func (p *phase) due(r uint64) time.Time {
	return p.start.Add(time.Duration(float64(r) * p.interval))
}

// run claims slots until the window closes, the request bound is reached, or ctx
// ends.
//
// Open loop corrects for coordinated omission: a slot claimed after its scheduled
// time (every worker was busy) is timed from the schedule, so the wait shows in the
// latency. A slot claimed early is timed from when the worker woke to send it: the
// lateness of Go's timers is the load generator's, not the server's.
func (w *worker) run(ctx, callCtx context.Context, p *phase) {
	for {
		r := p.seq.Add(1) - 1
		if p.limit > 0 && r >= p.limit {
			return
		}
		var from time.Time
		if p.interval == 0 {
			from = time.Now()
			if !from.Before(p.stopAt) {
				return
			}
		} else {
			due := p.due(r)
			now := time.Now()
			if !due.Before(p.stopAt) || !now.Before(p.stopAt) {
				return
			}
			if now.Before(due) {
				if !w.sleep(ctx, due.Sub(now)) {
					return
				}
				from = time.Now()
			} else {
				from = due
				w.late++
			}
		}
		if !w.call(ctx, callCtx, p, p.seqBase+r, from) {
			return
		}
	}
}

// sleep waits for d, or returns false if ctx ends first.
func (w *worker) sleep(ctx context.Context, d time.Duration) bool {
	w.timer.Reset(d)
	select {
	case <-w.timer.C:
		return true
	case <-ctx.Done():
		w.timer.Stop()
		return false
	}
}

// call sends request seq and records the outcome. It returns false when the
// worker must stop: the caller's context ended (the call is not counted) or the
// window's grace ran out (it is counted as an error).
func (w *worker) call(ctx, callCtx context.Context, p *phase, seq uint64, from time.Time) bool {
	req := w.b.build(seq)
	// A codec that merges instead of replacing (vtproto's UnmarshalVT does) would
	// otherwise grow the reused response.
	w.resp.Reset()
	cctx, cancel := callCtx, context.CancelFunc(nil)
	if p.timeout > 0 {
		cctx, cancel = context.WithTimeout(callCtx, p.timeout)
	}
	err := w.conn.Invoke(cctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, req, w.resp)
	if cancel != nil {
		cancel()
	}
	if err != nil {
		if ctx.Err() != nil {
			return false
		}
		c := int(status.Code(err))
		if c < 0 || c >= numCodes {
			c = int(codes.Unknown)
		}
		w.byCode[c]++
		w.failed.Add(1)
		return callCtx.Err() == nil
	}
	w.hist.Record(time.Since(from))
	switch w.resp.GetOverallCode() {
	case rlsv3.RateLimitResponse_OK:
		w.ok.Add(1)
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		w.over.Add(1)
	default:
		w.unknown.Add(1)
	}
	return true
}

type phaseSpec struct {
	seqBase  uint64
	window   time.Duration // 0: MaxDuration
	requests uint64        // 0: none
	label    string
}

type phaseOutcome struct {
	elapsed   time.Duration
	claimed   uint64 // slots claimed, a key-sequence offset for what follows
	scheduled uint64 // open loop: slots due inside the window
}

// runPhase runs every worker through one window and waits for all of them.
func runPhase(ctx context.Context, cfg *Config, workers []*worker, spec phaseSpec) phaseOutcome {
	window := spec.window
	if window == 0 {
		window = MaxDuration
	}
	callCtx, cancelCalls := context.WithCancel(ctx)
	defer cancelCalls()

	p := &phase{seqBase: spec.seqBase, limit: spec.requests, timeout: cfg.Timeout}
	if cfg.Rate > 0 {
		p.interval = float64(time.Second) / cfg.Rate
	}
	p.start = time.Now()
	p.stopAt = p.start.Add(window)
	hard := time.AfterFunc(window+stopGrace+cfg.Timeout, cancelCalls)
	defer hard.Stop()

	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() { w.run(ctx, callCtx, p) })
	}
	stopProgress := startProgress(cfg.Progress, spec.label, workers, p.start, spec.window)
	wg.Wait()
	elapsed := time.Since(p.start)
	stopProgress()

	out := phaseOutcome{elapsed: elapsed, claimed: p.seq.Load()}
	if p.interval > 0 {
		out.scheduled = slotsBefore(p, window)
		if spec.requests > 0 {
			out.scheduled = min(out.scheduled, spec.requests)
		}
	}
	return out
}

// slotsBefore counts the open-loop slots scheduled before the window closes, with
// the same arithmetic the workers use.
func slotsBefore(p *phase, window time.Duration) uint64 {
	off := func(r uint64) time.Duration { return time.Duration(float64(r) * p.interval) }
	n := uint64(math.Ceil(window.Seconds() * float64(time.Second) / p.interval))
	for n > 0 && off(n-1) >= window {
		n--
	}
	for off(n) < window {
		n++
	}
	return n
}

// startProgress prints a line to w every second until the returned func is
// called; that func returns once the printer has stopped.
func startProgress(w io.Writer, label string, workers []*worker, start time.Time, window time.Duration) (stop func()) {
	if w == nil {
		return func() {}
	}
	if label != "" {
		label += " "
	}
	of := ""
	if window > 0 {
		of = "/" + window.Round(time.Second).String()
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		var last uint64
		lastAt := start
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				var sent, ok, over, failed uint64
				for _, wk := range workers {
					ok += wk.ok.Load()
					over += wk.over.Load()
					failed += wk.failed.Load()
					sent += wk.sent()
				}
				rate := float64(sent-last) / now.Sub(lastAt).Seconds()
				last, lastAt = sent, now
				fmt.Fprintf(w, "bench: %s%s%s  %.0f req/s  sent %d  ok %d  over_limit %d  errors %d\n",
					label, now.Sub(start).Round(time.Second), of, rate, sent, ok, over, failed)
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
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
