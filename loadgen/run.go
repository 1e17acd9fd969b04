package loadgen

import (
	"context"
	"fmt"
	"strings"
	"time"
)

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
