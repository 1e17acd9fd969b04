package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
)

// run starts the daemons, runs every phase, prints the tables and stops the
// daemons.
func run(ctx context.Context, s settings, out, progress io.Writer) (err error) {
	dir, err := os.MkdirTemp("", "rlqsbench-")
	if err != nil {
		return err
	}
	defer func() {
		if err == nil {
			os.RemoveAll(dir)
		} else {
			err = fmt.Errorf("%w (daemon logs in %s)", err, dir)
		}
	}()
	if err := writeRules(dir, s.limit, s.accLimit); err != nil {
		return err
	}
	rls, err := startDaemon(ctx, s.bin, "rls", dir, dir)
	if err != nil {
		return err
	}
	defer rls.stop()
	rlqs, err := startDaemon(ctx, s.bin, "rlqs", dir, dir)
	if err != nil {
		return err
	}
	defer rlqs.stop()
	r := report{settings: s, loadBefore: loadAverage()}
	if err := measure(ctx, &r, rls, rlqs, progress); err != nil {
		return err
	}
	r.loadAfter = loadAverage()
	r.write(out)
	return nil
}

// measure runs the phases in order: both daemons idle, the CPU rounds, then
// the accuracy phase.
func measure(ctx context.Context, r *report, rls, rlqs *daemon, progress io.Writer) error {
	tick := clockTick()
	s := r.settings
	fmt.Fprintf(progress, "idle, %s\n", s.window)
	noCounts := func() (uint64, uint64) { return 0, 0 }
	idleDone := make(chan error, 1)
	go func() {
		var err error
		r.idleRLS, err = window(ctx, rls.pid(), s.window, tick, noCounts)
		idleDone <- err
	}()
	var err error
	r.idleRLQS, err = window(ctx, rlqs.pid(), s.window, tick, noCounts)
	if err := errors.Join(err, <-idleDone); err != nil {
		return err
	}
	for i := range s.rounds {
		fmt.Fprintf(progress, "round %d: RLS, %s + %s\n", i+1, s.warmup, s.window)
		smp, res, err := rlsCPU(ctx, rls, s)
		if err != nil {
			return err
		}
		r.rls = append(r.rls, smp)
		r.rlsLate, r.rlsMissed = r.rlsLate+res.Late, r.rlsMissed+res.Missed
		r.rlsWorkers = res.Concurrency
		fmt.Fprintf(progress, "round %d: RLQS, %s + %s\n", i+1, s.warmup, s.window)
		smp, err = rlqsCPU(ctx, rlqs, s, tick)
		if err != nil {
			return err
		}
		r.rlqs = append(r.rlqs, smp)
	}
	fmt.Fprintf(progress, "accuracy, both protocols at once, %s + %s\n", s.settle, s.accWindow)
	r.acc, err = accuracyRun(ctx, rls, rlqs, s)
	return err
}

// loadAverage is /proc/loadavg's three load averages, or why not.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return err.Error()
	}
	var a, b5, c string
	if _, err := fmt.Sscan(string(b), &a, &b5, &c); err != nil {
		return err.Error()
	}
	return a + ", " + b5 + ", " + c
}
