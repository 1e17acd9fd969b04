package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sharelimit/sharelimit/internal/envoymodel"
	"github.com/sharelimit/sharelimit/internal/monotime"
	"github.com/sharelimit/sharelimit/loadgen"
)

// step is how often the offering goroutines catch up with their rate.
const step = 10 * time.Millisecond

// offer calls decide(i) at rates[i] a second on goroutine i, in steps, until
// ctx ends; the caller waits on the group it returns.
func offer(ctx context.Context, rates []float64, decide func(i int)) *sync.WaitGroup {
	var wg sync.WaitGroup
	for i, rate := range rates {
		wg.Go(func() {
			tk := time.NewTicker(step)
			defer tk.Stop()
			last, owed := time.Now(), 0.0
			for {
				select {
				case <-ctx.Done():
					return
				case now := <-tk.C:
					owed += rate * now.Sub(last).Seconds()
					last = now
					for ; owed >= 1 && ctx.Err() == nil; owed-- {
						decide(i)
					}
				}
			}
		})
	}
	return &wg
}

// sleep waits d, or returns ctx's error when it ends first.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func denyAll() *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
}

// envoys are model Envoys, each on its own connection to one daemon, set as
// the README recommends: DENY_ALL before the first assignment and after one
// expires.
type envoys struct {
	models []*envoymodel.Model
	conns  []*grpc.ClientConn
	cancel context.CancelFunc
	runs   sync.WaitGroup
}

func startEnvoys(ctx context.Context, addr string, n int, clock monotime.Clock) (*envoys, error) {
	ctx, cancel := context.WithCancel(ctx)
	e := &envoys{cancel: cancel}
	for range n {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			e.close()
			return nil, fmt.Errorf("connect a model envoy: %w", err)
		}
		e.conns = append(e.conns, conn)
		m, err := envoymodel.New(envoymodel.Config{Conn: conn, Domain: domain, NoAssignment: denyAll(),
			Expired: denyAll(), ExpiredTimeout: 10 * time.Second, Clock: clock})
		if err != nil {
			e.close()
			return nil, fmt.Errorf("start a model envoy: %w", err)
		}
		e.models = append(e.models, m)
		e.runs.Go(func() { _ = m.Run(ctx) }) // ends with ctx
	}
	return e, nil
}

// close ends the models' streams and connections.
func (e *envoys) close() {
	e.cancel()
	e.runs.Wait()
	for _, c := range e.conns {
		_ = c.Close()
	}
}

// totals are the requests the models decided and admitted since they began.
func (e *envoys) totals() (offered, admitted uint64) {
	for _, m := range e.models {
		a, d := m.Totals()
		offered += a + d
		admitted += a
	}
	return offered, admitted
}

// admitted sums the models' admission slots.
func (e *envoys) admitted() envoymodel.Slots {
	var s envoymodel.Slots
	for _, m := range e.models {
		s = s.Add(m.Admitted())
	}
	return s
}

// rlsCPU is one RLS phase: the load generator's open loop at s.offered a
// second over s.envoys connections, s.warmup then s.window measured. The
// daemon's CPU over the window is loadgen's reading of /proc/PID/stat.
func rlsCPU(ctx context.Context, d *daemon, s settings) (sample, loadgen.Result, error) {
	res, err := loadgen.Run(ctx, loadgen.Config{Targets: []string{d.grpc}, Conns: s.envoys, Concurrency: s.workers, Rate: s.offered,
		Duration: s.window, Warmup: s.warmup, Domain: domain, ServerPID: d.pid()})
	if err != nil {
		return sample{}, res, fmt.Errorf("rls phase: %w", err)
	}
	if res.Errors > 0 || res.Unknown > 0 || res.Server == nil {
		return sample{}, res, fmt.Errorf("rls phase: %d failed calls, %d unknown answers", res.Errors, res.Unknown)
	}
	return sample{cpu: res.Server.Total, elapsed: res.Elapsed, offered: res.Requests, admitted: res.OK}, res, nil
}

// rlqsCPU is one RLQS phase: s.envoys model Envoys offered s.offered a
// second in all, evenly, s.warmup then s.window measured.
func rlqsCPU(ctx context.Context, d *daemon, s settings, tick time.Duration) (sample, error) {
	ctx, cancel := context.WithCancel(ctx)
	env, err := startEnvoys(ctx, d.grpc, s.envoys, monotime.New())
	if err != nil {
		cancel()
		return sample{}, err
	}
	id := map[string]string{"generic_key": cpuValue}
	rates := make([]float64, s.envoys)
	for i := range rates {
		rates[i] = s.offered / float64(s.envoys)
	}
	wg := offer(ctx, rates, func(i int) { env.models[i].Allow(id) })
	defer func() {
		cancel()
		wg.Wait()
		env.close()
	}()
	if err := sleep(ctx, s.warmup); err != nil {
		return sample{}, err
	}
	return window(ctx, d.pid(), s.window, tick, env.totals)
}

// window measures pid's CPU and what counts counts over d.
func window(ctx context.Context, pid int, d, tick time.Duration, counts func() (offered, admitted uint64)) (sample, error) {
	cpu0, err := processCPU(pid, tick)
	if err != nil {
		return sample{}, err
	}
	o0, a0 := counts()
	t0 := time.Now()
	if err := sleep(ctx, d); err != nil {
		return sample{}, err
	}
	cpu1, err := processCPU(pid, tick)
	if err != nil {
		return sample{}, err
	}
	o1, a1 := counts()
	return sample{cpu: cpu1 - cpu0, elapsed: time.Since(t0), offered: o1 - o0, admitted: a1 - a0}, nil
}

// skewed is the accuracy phase's load: 2L in all, 80% on the first Envoy
// and the rest spread evenly over the others.
func skewed(n int, limit float64) []float64 {
	r := make([]float64, n)
	r[0] = 0.8 * 2 * limit
	for i := 1; i < n; i++ {
		r[i] = 0.2 * 2 * limit / float64(n-1)
	}
	return r
}

// accuracyResult is the accuracy phase's outcome for both protocols.
type accuracyResult struct {
	rls, rlqs        accuracy
	rlsFailed        uint64
	offered          float64
	rlsOK, rlqsTotal []uint64 // admitted by each Envoy over the whole phase
}

// accuracyRun offers the same skewed load at once over RLS to rlsD (one
// connection per Envoy, ShouldRateLimit calls, OK answers counted when they
// arrive) and over RLQS to rlqsD (model Envoys), and counts both from
// s.settle on for s.accWindow, on one clock.
func accuracyRun(ctx context.Context, rlsD, rlqsD *daemon, s settings) (accuracyResult, error) {
	clock := monotime.New()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	env, err := startEnvoys(ctx, rlqsD.grpc, s.envoys, clock)
	if err != nil {
		return accuracyResult{}, err
	}
	defer env.close()
	rls, err := newRLSEnvoys(rlsD.grpc, s.envoys, clock)
	if err != nil {
		return accuracyResult{}, err
	}
	defer rls.close()
	rates := skewed(s.envoys, float64(s.accLimit))
	id := map[string]string{"generic_key": accValue}
	start := clock()
	a := offer(ctx, rates, func(i int) { env.models[i].Allow(id) })
	b := offer(ctx, rates, func(i int) { rls.call(ctx, i) })
	err = sleep(ctx, s.settle+s.accWindow)
	cancel()
	a.Wait()
	b.Wait()
	if err != nil {
		return accuracyResult{}, err
	}
	from, to := slotOf(start+int64(s.settle)), slotOf(start+int64(s.settle+s.accWindow))
	out := accuracyResult{
		rls:       accuracyOf(rls.ok.snapshot(), from, to, float64(s.accLimit)),
		rlqs:      accuracyOf(env.admitted(), from, to, float64(s.accLimit)),
		rlsFailed: rls.failedBeforeEnd(),
		offered:   2 * float64(s.accLimit),
	}
	for i, m := range env.models {
		n, _ := m.Totals()
		out.rlqsTotal = append(out.rlqsTotal, n)
		out.rlsOK = append(out.rlsOK, rls.perEnvoy[i])
	}
	return out, nil
}

// rlsEnvoys stand in for Envoys that ask over RLS: one connection each, one
// call at a time, as the generated client sends it.
type rlsEnvoys struct {
	conns    []*grpc.ClientConn
	clients  []rlsv3.RateLimitServiceClient
	clock    monotime.Clock
	ok       slots
	mu       sync.Mutex
	perEnvoy []uint64
	failed   uint64
}

func newRLSEnvoys(addr string, n int, clock monotime.Clock) (*rlsEnvoys, error) {
	r := &rlsEnvoys{clock: clock, perEnvoy: make([]uint64, n)}
	for range n {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			r.close()
			return nil, fmt.Errorf("connect an rls client: %w", err)
		}
		r.conns = append(r.conns, conn)
		r.clients = append(r.clients, rlsv3.NewRateLimitServiceClient(conn))
	}
	return r, nil
}

var accRequest = &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{{
	Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "generic_key", Value: accValue}}}}}

// call asks once on Envoy i's connection and counts an OK answer in the
// slot of its arrival. A call that fails while ctx is still live counts as
// failed.
func (r *rlsEnvoys) call(ctx context.Context, i int) {
	resp, err := r.clients[i].ShouldRateLimit(ctx, accRequest)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err != nil:
		if ctx.Err() == nil {
			r.failed++
		}
	case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
		r.ok.add(r.clock())
		r.perEnvoy[i]++
	}
}

func (r *rlsEnvoys) failedBeforeEnd() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *rlsEnvoys) close() {
	for _, c := range r.conns {
		_ = c.Close()
	}
}
