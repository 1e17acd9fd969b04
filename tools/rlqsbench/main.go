package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// settings are the run's figures, from the flags.
type settings struct {
	bin       string
	envoys    int
	workers   int
	limit     int
	offered   float64
	warmup    time.Duration
	window    time.Duration
	rounds    int
	accLimit  int
	settle    time.Duration
	accWindow time.Duration
}

func (s *settings) register(fs *flag.FlagSet) {
	fs.StringVar(&s.bin, "bin", "", "the built sharelimit binary (required)")
	fs.IntVar(&s.envoys, "envoys", 4, "Envoys: model Envoys over RLQS, connections over RLS (2-64)")
	fs.IntVar(&s.workers, "rls-workers", 0, "CPU phases: the load generator's workers, the most RLS calls in flight; 0: loadgen's default for the rate")
	fs.IntVar(&s.limit, "limit", 100_000, "CPU phases: the rule's limit, requests a second")
	fs.Float64Var(&s.offered, "offered", 115_000, "CPU phases: requests a second offered in all, over the limit so that it binds")
	fs.DurationVar(&s.warmup, "warmup", 30*time.Second, "CPU phases: load before the window; an RLQS burst grows to full in about 22 s")
	fs.DurationVar(&s.window, "window", 20*time.Second, "CPU phases: the measured window")
	fs.IntVar(&s.rounds, "rounds", 2, "CPU phases: rounds of RLS then RLQS (1-10)")
	fs.IntVar(&s.accLimit, "acc-limit", 300, "accuracy phase: the limit L, requests a second; 2L is offered, 80% on one Envoy")
	fs.DurationVar(&s.settle, "settle", 30*time.Second, "accuracy phase: load before the counted slots; the heavy Envoy's RLQS burst grows to full in about 25 s")
	fs.DurationVar(&s.accWindow, "acc-window", 25*time.Second, "accuracy phase: the counted slots")
}

func (s *settings) validate() error {
	var errs []error
	if s.bin == "" {
		errs = append(errs, errors.New("-bin: required"))
	}
	if s.envoys < 2 || s.envoys > 64 || s.rounds < 1 || s.rounds > 10 || s.workers < 0 {
		errs = append(errs, errors.New("-envoys: 2 to 64; -rounds: 1 to 10; -rls-workers: 0 or more"))
	}
	if s.limit < 1 || s.accLimit < 1 || !(s.offered > 0) {
		errs = append(errs, errors.New("-limit, -acc-limit, -offered: positive"))
	}
	for _, d := range []time.Duration{s.warmup, s.window, s.settle, s.accWindow} {
		if d < time.Second || d > 10*time.Minute {
			errs = append(errs, fmt.Errorf("every duration: 1s to 10m, got %s", d))
		}
	}
	return errors.Join(errs...)
}

func main() {
	var s settings
	fs := flag.NewFlagSet("rlqsbench", flag.ContinueOnError)
	s.register(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if err := s.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "rlqsbench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, s, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "rlqsbench:", err)
		stop()
		os.Exit(1)
	}
}
